//! The waitlists of a sharded SKU: one line per shard, one join order across them.
//!
//! A buyer joins the line of its own shard (the shard its claims route to,
//! [`super::shard_of_user`]), and its offer is made on that shard, so the offer is a held claim
//! counted in the same per-user count as every other claim of the buyer: one script sees all
//! of a buyer's units, and the per-user limit holds (invariant 3) as on a SKU of one shard.
//!
//! What no single-slot script can see is the other shards; three things bridge that, so the
//! SKU keeps one first-come-first-served line as a SKU of one shard does:
//!
//! - **Tickets.** Every join takes a ticket from shard 0 (`line_lease.lua`) and is ordered by
//!   it in its shard's line, so the heads of two lines compare exactly ([`position`] is the
//!   entry's place in the SKU's whole line).
//! - **The lease.** Before a buyer checks that every shard is dry ([`before_join`]), it sets
//!   a line lease on every shard. While a shard's lease lasts, a unit given back there (a
//!   hold cancelled or expired, an offer declined, a compensation, a restock, a transfer)
//!   goes to the shard's pool, not to open stock and not to its own line's head
//!   (`give_back`, lua/lib/lifecycle.lua): nobody outside the lines can take it, and no
//!   line is served before an earlier ticket on another shard.
//! - **The feed** ([`feed`]: the recovery task every second, and a buyer's cancel at once)
//!   offers pooled units in ticket order across every line: it merges the lines' heads,
//!   moves pooled units to the shards whose heads come next (fenced transfers,
//!   [`Source::Pool`]) and offers them there (`offer_pool.lua`). It renews the lease while
//!   anybody waits, and takes into the pools any open stock it finds then (units that came
//!   back without a lease: after a restore rebuilt a shard, or a lease that lapsed while no
//!   gateway fed); once nobody waits and the lease has lapsed, it gives the pools back to
//!   open stock (`release_pool.lua`).
//!
//! The price: a unit given back while anybody waits is offered at the next feed (within a
//! second), not in the same script; one given back within [`LEASE`] after the last waiter
//! went reaches open stock up to that much later. A SKU of one shard never takes a lease
//! and works as before.

use std::collections::BTreeMap;
use std::time::Duration;

use super::transfer::{self, Source};
use super::view::survey;
use super::Layout;
use crate::error::StoreError;
use crate::scripts::SCRIPTS;
use crate::store::Store;

/// How long a line lease lasts after the join or feed that set it. Longer than a join takes
/// from its lease to its entry (three bounded calls), and than a few feed rounds, so a
/// gateway's missed round does not open the pools while somebody waits.
pub const LEASE: Duration = Duration::from_secs(3);
/// Heads read from each line per feed: the most units one feed offers on a shard.
const HEADS: isize = 100;

/// What [`before_join`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JoinCheck {
    /// Units remain elsewhere: another shard holds stock, or a transfer between shards is
    /// still in flight (passed to `join_waitlist.lua`, which still answers an existing entry
    /// first).
    pub in_stock_elsewhere: bool,
    /// The join's ticket: its order in the SKU's one line.
    pub ticket: i64,
}

/// Leases every shard of `sku` and takes a ticket, then checks the shards other than `home`
/// (the joiner's) before a join on `home`'s line (not atomically with the join; the lease
/// keeps units given back after this check out of open stock, and `join_waitlist.lua` checks
/// `home`'s stock atomically).
///
/// # Errors
/// [`StoreError::SkuLost`] / [`StoreError::Stale`] when any shard fails closed (the SKU cannot
/// be said sold out), or a Redis error.
pub async fn before_join(
    store: &Store,
    sku: &str,
    layout: Layout,
    home: u16,
) -> Result<JoinCheck, StoreError> {
    let leased = lease_all(store, sku, layout, true).await?;
    let ticket = leased[0].ticket;
    let pending = leased.iter().any(|l| l.pending > 0);
    let in_stock_elsewhere = if pending {
        // Units in transit land on some shard (under the lease, in its pool): finish them,
        // as a refill would, then look again.
        for p in survey(store, sku, layout)
            .await?
            .iter()
            .flat_map(|s| &s.pending)
        {
            transfer::complete(store, sku, layout, p).await?;
        }
        // Pending once more: another gateway began a transfer meanwhile. Its units are on
        // their way to a shard, so the SKU is not sold out; the buyer's claim borrows them.
        survey(store, sku, layout)
            .await?
            .iter()
            .enumerate()
            .any(|(i, s)| !s.pending.is_empty() || (i != usize::from(home) && s.stock > 0))
    } else {
        leased
            .iter()
            .enumerate()
            .any(|(i, l)| i != usize::from(home) && l.stock > 0)
    };
    Ok(JoinCheck {
        in_stock_elsewhere,
        ticket,
    })
}

/// One shard's answer to `line_lease.lua`.
struct Leased {
    stock: i64,
    pending: i64,
    ticket: i64,
}

/// Sets the line lease on every shard of `sku` (all in flight together); with `ticket`, also
/// takes a join ticket from shard 0.
async fn lease_all(
    store: &Store,
    sku: &str,
    layout: Layout,
    ticket: bool,
) -> Result<Vec<Leased>, StoreError> {
    let calls = (0..layout.count() as u16).map(|i| async move {
        let keys = store.keys(&layout.name(sku, i));
        let mut con = store.hot();
        let (code, stock, pending, t): (i64, i64, i64, i64) = store
            .bounded(async {
                Ok(SCRIPTS
                    .line_lease
                    .key(keys.state())
                    .key(keys.transfers())
                    .arg(LEASE.as_millis() as u64)
                    .arg(if ticket && i == 0 { "1" } else { "0" })
                    .invoke_async(&mut con)
                    .await?)
            })
            .await?;
        match code {
            1 => Ok(Leased {
                stock,
                pending,
                ticket: t,
            }),
            -3 => Err(StoreError::Stale),
            _ => Err(StoreError::SkuLost),
        }
    });
    futures_util::future::try_join_all(calls).await
}

/// One shard's line and pool as [`feed`] reads them.
#[derive(Debug, Clone, PartialEq)]
struct Line {
    waiting: i64,
    /// The first [`HEADS`] tickets in line.
    heads: Vec<f64>,
    pool: i64,
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
pub async fn feed(store: &Store, sku: &str, layout: Layout) -> Result<i64, StoreError> {
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

async fn read_lines(store: &Store, sku: &str, layout: Layout) -> Result<Vec<Line>, StoreError> {
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
    let mut inv = match op {
        PoolOp::Offer(units) => {
            let mut inv = SCRIPTS.offer_pool.prepare_invoke();
            inv.arg(units).arg("0");
            inv
        }
        PoolOp::Gather => {
            let mut inv = SCRIPTS.offer_pool.prepare_invoke();
            inv.arg(0).arg("1");
            inv
        }
        PoolOp::Release => SCRIPTS.release_pool.prepare_invoke(),
    };
    for k in keys.lifecycle() {
        inv.key(k);
    }
    let mut con = store.hot();
    let call = store.bounded(async { Ok(inv.invoke_async(&mut con).await?) });
    let (code, units): (i64, i64) = crate::activity::with_mark(store, name, call).await?;
    match (op, code) {
        (PoolOp::Release, 0) => Ok(0),
        (PoolOp::Release, 1) => Ok(units),
        (PoolOp::Offer(_) | PoolOp::Gather, n) if n >= 0 => Ok(n),
        (_, -3) => Err(StoreError::Stale),
        _ => Err(StoreError::SkuLost),
    }
}

/// The place in the SKU's one line (1: next to be offered) of the waiting entry `entry_id` in
/// `home`'s line: the entries of every line with an earlier ticket, plus one. `None` when
/// the entry is not waiting there.
///
/// # Errors
/// A Redis error.
pub async fn position(
    store: &Store,
    sku: &str,
    layout: Layout,
    home: u16,
    entry_id: &str,
) -> Result<Option<i64>, StoreError> {
    let keys = store.keys(&layout.name(sku, home));
    let mut con = store.hot();
    let ticket: Option<f64> = store
        .bounded(async {
            Ok(redis::cmd("ZSCORE")
                .arg(keys.waitlist())
                .arg(entry_id)
                .query_async(&mut con)
                .await?)
        })
        .await?;
    let Some(ticket) = ticket else {
        return Ok(None);
    };
    let counts = (0..layout.count() as u16).map(|i| async move {
        let line = store.keys(&layout.name(sku, i)).waitlist();
        let mut con = store.hot();
        store
            .bounded(async {
                Ok(redis::cmd("ZCOUNT")
                    .arg(line)
                    .arg("-inf")
                    .arg(format!("({ticket}"))
                    .query_async::<i64>(&mut con)
                    .await?)
            })
            .await
    });
    let ahead: i64 = futures_util::future::try_join_all(counts)
        .await?
        .into_iter()
        .sum();
    Ok(Some(ahead + 1))
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
