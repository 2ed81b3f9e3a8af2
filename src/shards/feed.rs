//! The feed of a sharded SKU's waitlists (the lines, their tickets and their lease:
//! [`super::line`]): pooled units offered across the lines in ticket order, open stock taken
//! into the pools while anybody waits, the pools given back once nobody does. Run by the
//! recovery task every second ([`super::recovery`]) and at once after a buyer's cancel.

use std::collections::BTreeMap;

use super::line::lease_all;
use super::transfer::{self, Source};
use crate::error::StoreError;
use crate::layout::Layout;
use crate::scripts;
use crate::sku::SkuId;
use crate::store::Store;

/// Heads read from each line per feed: the most units one feed offers on a shard.
const HEADS: isize = 100;
/// How long a feed holds the SKU's feed lock at most (a feeder that died frees it then).
const FEED_LOCK: std::time::Duration = std::time::Duration::from_secs(2);
/// Passes of one feed, at most.
const FEED_PASSES: usize = 4;

/// One shard's line and pool as [`feed`] reads them.
#[derive(Debug, Clone, PartialEq)]
struct Line {
    waiting: i64,
    /// The first [`HEADS`] tickets in line.
    heads: Vec<f64>,
    pool: i64,
}

/// Feeds `sku`'s lines ([`feed_once`]) under the SKU's feed lock, pass after pass until a pass
/// offers nothing (units given back meanwhile are taken by the next pass). Returns the units
/// offered. A feed that finds the lock held returns at once: the holder's next pass, or the
/// next recovery round (a second), takes what it came for.
///
/// One feed at a time: two feeds reading the lines at once would each offer pooled units to
/// the heads they read, and the later would reach past heads the earlier had just served, to
/// an entry behind an earlier ticket on another shard.
///
/// # Errors
/// As [`feed_once`]; or the lock's Redis error.
pub async fn feed(store: &Store, sku: &SkuId, layout: Layout) -> Result<i64, StoreError> {
    if !layout.is_sharded() {
        return Ok(0);
    }
    let lock = store.keys(sku.as_str()).feed_lock();
    let token = uuid::Uuid::new_v4().to_string();
    let mut con = store.hot();
    let got: Option<String> = store
        .bounded(async {
            Ok(redis::cmd("SET")
                .arg(&lock)
                .arg(&token)
                .arg("NX")
                .arg("PX")
                .arg(FEED_LOCK.as_millis() as u64)
                .query_async(&mut con)
                .await?)
        })
        .await?;
    if got.is_none() {
        return Ok(0);
    }
    let mut offered = 0;
    let mut result = Ok(());
    for _ in 0..FEED_PASSES {
        match feed_once(store, sku, layout).await {
            Ok(0) => break,
            Ok(n) => offered += n,
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    // Best effort: a lock left behind lapses by itself.
    let unlocked = store
        .bounded(scripts::shards::unlock(&mut con, &lock, &token))
        .await;
    if let Err(e) = unlocked {
        tracing::debug!(sku = sku.as_str(), error = %e, "could not release the feed lock; it lapses");
    }
    result.map(|()| offered)
}

/// Offers the pooled units of `sku` to its lines in ticket order, across every shard (see
/// the module's docs); renews the lease while anybody waits, and gives the pools back once
/// nobody does and the lease has lapsed. Returns the units offered. Costs one pipelined read
/// per shard while nobody waits and nothing is pooled.
///
/// # Errors
/// [`StoreError::SkuLost`] / [`StoreError::Stale`] when a shard fails closed, or a Redis error
/// (a transfer left half done is finished by the recovery task; pooled units wait for the
/// next feed).
async fn feed_once(store: &Store, sku: &SkuId, layout: Layout) -> Result<i64, StoreError> {
    if !layout.is_sharded() {
        return Ok(0);
    }
    let mut lines = read_lines(store, sku, layout).await?;
    if lines.iter().all(|l| l.waiting == 0) {
        for (i, l) in lines.iter().enumerate() {
            if l.pool > 0 {
                pool_script(store, &layout.name(sku, i as u16), PoolOp::Release).await?;
            }
        }
        return Ok(0);
    }
    let leased = lease_all(store, sku, layout, false).await?;
    if leased.iter().any(|l| l.stock > 0) {
        // Open stock while somebody waits reached a shard without a lease (a restore
        // rebuilt it, or a lease lapsed while no gateway fed): it belongs to the lines.
        for (i, _) in leased.iter().enumerate().filter(|(_, l)| l.stock > 0) {
            pool_script(store, &layout.name(sku, i as u16), PoolOp::Gather).await?;
        }
        lines = read_lines(store, sku, layout).await?;
    }
    let pooled: i64 = lines.iter().map(|l| l.pool).sum();
    if pooled == 0 {
        return Ok(0);
    }
    let due = next_offers(&lines, pooled);
    // Pooled units where the next heads are not: moved to the shards whose heads are, the
    // earliest head's shard served first.
    let mut pools: Vec<i64> = lines.iter().map(|l| l.pool).collect();
    for (&to, &want) in &due {
        let mut short = want - pools[usize::from(to)];
        for from in 0..pools.len() {
            let spare = pools[from] - due.get(&(from as u16)).copied().unwrap_or(0);
            if short <= 0 {
                break;
            }
            if from == usize::from(to) || spare <= 0 {
                continue;
            }
            let n = short.min(spare);
            let got = transfer::transfer(store, sku, layout, (from as u16, to), n, n, Source::Pool)
                .await?;
            pools[from] -= got;
            pools[usize::from(to)] += got;
            short -= got;
        }
    }
    let mut offered = 0;
    for (&shard, &want) in &due {
        offered += pool_script(store, &layout.name(sku, shard), PoolOp::Offer(want)).await?;
    }
    Ok(offered)
}

/// Which shards the next `units` offers go to, by ticket across every line's heads: shard ->
/// units. Ties (never from tickets, which are unique) go to the lower shard, so every
/// gateway feeding the same SKU agrees.
fn next_offers(lines: &[Line], units: i64) -> BTreeMap<u16, i64> {
    let mut heads: Vec<(f64, u16)> = lines
        .iter()
        .enumerate()
        .flat_map(|(i, l)| l.heads.iter().map(move |&t| (t, i as u16)))
        .collect();
    heads.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut due = BTreeMap::new();
    for (_, shard) in heads.into_iter().take(units.max(0) as usize) {
        *due.entry(shard).or_insert(0) += 1;
    }
    due
}

async fn read_lines(store: &Store, sku: &SkuId, layout: Layout) -> Result<Vec<Line>, StoreError> {
    let names = layout.names(sku);
    let reads = names.iter().map(|name| read_line(store, name));
    futures_util::future::try_join_all(reads).await
}

async fn read_line(store: &Store, name: &str) -> Result<Line, StoreError> {
    let keys = store.keys(name);
    let mut con = store.hot();
    let (waiting, heads, pool): (i64, Vec<(String, f64)>, Option<i64>) = store
        .bounded(async {
            Ok(redis::pipe()
                .cmd("ZCARD")
                .arg(keys.waitlist())
                .cmd("ZRANGE")
                .arg(keys.waitlist())
                .arg(0)
                .arg(HEADS - 1)
                .arg("WITHSCORES")
                .cmd("HGET")
                .arg(keys.state())
                .arg("wl_pool")
                .query_async(&mut con)
                .await?)
        })
        .await?;
    Ok(Line {
        waiting,
        heads: heads.into_iter().map(|(_, t)| t).collect(),
        pool: pool.unwrap_or(0),
    })
}

#[derive(Debug, Clone, Copy)]
enum PoolOp {
    /// Offer up to this many pooled units to the shard's line.
    Offer(i64),
    /// Move the shard's open stock into its pool (somebody waits, and the lease is renewed).
    Gather,
    /// Give the pool back to open stock, if the lease has lapsed.
    Release,
}

/// Runs `offer_pool.lua` or `release_pool.lua` on the shard named `name`. Returns the units
/// offered or released.
async fn pool_script(store: &Store, name: &str, op: PoolOp) -> Result<i64, StoreError> {
    let keys = store.keys(name);
    let floor = store.floor(name);
    let mut con = store.hot();
    let call = store.bounded(async {
        match op {
            PoolOp::Offer(units) => {
                scripts::shards::offer_pool(&mut con, &keys, units, false, floor).await
            }
            PoolOp::Gather => scripts::shards::offer_pool(&mut con, &keys, 0, true, floor).await,
            PoolOp::Release => scripts::shards::release_pool(&mut con, &keys, floor).await,
        }
    });
    crate::activity::with_mark(store, name, call).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(heads: &[f64], pool: i64) -> Line {
        Line {
            waiting: heads.len() as i64,
            heads: heads.to_vec(),
            pool,
        }
    }

    #[test]
    fn pooled_units_go_to_the_earliest_tickets_across_every_line() {
        let lines = [
            line(&[2.0, 7.0], 0),
            line(&[], 3),
            line(&[1.0, 3.0, 4.0], 0),
        ];
        assert_eq!(next_offers(&lines, 3), BTreeMap::from([(0, 1), (2, 2)]));
        assert_eq!(next_offers(&lines, 5), BTreeMap::from([(0, 2), (2, 3)]));
        // More units than waiters: one unit an entry; the rest stays pooled.
        assert_eq!(next_offers(&lines, 9), BTreeMap::from([(0, 2), (2, 3)]));
        assert_eq!(next_offers(&lines, 0), BTreeMap::new());
    }
}
