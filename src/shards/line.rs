//! The waitlists of a sharded SKU: one line per shard. A buyer joins the line of its own shard
//! (the shard its claims route to, [`super::shard_of_user`]), and an offer is made by
//! `give_back` on that shard, so the offer is a held claim on the buyer's own shard, counted in
//! the same per-user count as every other claim of the buyer: one script sees all of a
//! buyer's units, and the per-user limit holds (invariant 3) as on a SKU of one shard.
//!
//! Every waitlist script (join, leave, the offers `give_back` makes) runs on one shard, so
//! each line and its offers are decided atomically there. What no single-slot script can see
//! is the other shards, and two steps here bridge that:
//!
//! - [`before_join`]: "the stock is 0" means every shard dry and nothing in transit. The
//!   gateway finishes the transfers it finds pending, then checks the shards other than the
//!   joiner's (not atomically with the join); `join_waitlist.lua` then checks the joiner's
//!   shard's stock atomically.
//! - [`feed`]: a unit that comes back on a shard (a hold cancelled or expired, a compensation)
//!   is offered to that shard's line first. On a shard whose line is empty it goes to open
//!   stock; while another shard's line has waiting entries, the recovery task (every second,
//!   [`super::recovery`]) and a buyer's cancel move that open stock by normal fenced
//!   transfers to the shards with waiters, the shard whose head joined first served first;
//!   `transfer_in.lua` gives the units back through `give_back`, so that line is offered them
//!   before open stock gets any. Until then (about a second at most) a buyer routed to the
//!   donor shard may take such a unit: see README "Sharding a hot SKU".
//!
//! FIFO is exact within a shard's line (one sorted set, one script) and approximate across a
//! SKU's lines: a unit that comes back on a shard with a line is offered to that line's head at
//! once, even if another shard's head joined earlier, and heads are compared by the time
//! Redis gave their joins (each shard numbers its own joins).

use super::transfer;
use super::view::survey;
use super::Layout;
use crate::error::StoreError;
use crate::lifecycle::records::Entry;
use crate::store::Store;

/// Checks the shards of `sku` other than `home` (the joiner's) before a join on `home`'s line.
/// Returns whether units remain elsewhere: another shard holds stock, or a transfer between
/// shards is still in flight (passed to `join_waitlist.lua`, which still answers an existing
/// entry first).
///
/// # Errors
/// [`StoreError::SkuLost`] / [`StoreError::Stale`] when any shard fails closed (the SKU cannot
/// be said sold out), or a Redis error.
pub async fn before_join(
    store: &Store,
    sku: &str,
    layout: Layout,
    home: u16,
) -> Result<bool, StoreError> {
    let mut states = survey(store, sku, layout).await?;
    if states.iter().any(|s| !s.pending.is_empty()) {
        // Units in transit land on some shard (where a line is, they are offered to it):
        // finish them, as a refill would, then look again.
        for p in states.iter().flat_map(|s| &s.pending) {
            transfer::complete(store, sku, layout, p).await?;
        }
        states = survey(store, sku, layout).await?;
    }
    // Pending once more: another gateway began a transfer meanwhile. Its units are on their
    // way to a shard, so the SKU is not sold out; the buyer's claim borrows them.
    Ok(states
        .iter()
        .enumerate()
        .any(|(i, s)| !s.pending.is_empty() || (i != usize::from(home) && s.stock > 0)))
}

/// One shard's line as [`feed`] reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Line {
    shard: u16,
    /// Entries waiting (offered ones have left the sorted set).
    waiting: i64,
    /// When the head joined, on Redis's clock (`i64::MAX` when unreadable: served last).
    head_joined_ms: i64,
}

/// Moves open stock of `sku` from the shards whose line is empty to the shards whose line has
/// waiting entries, the line whose head joined first served first, up to as many units as
/// each line waits for; `transfer_in.lua` offers them to the recipient's line first. Returns
/// the units moved. Costs one pipelined `ZCARD` + `ZRANGE` per shard while nobody waits.
///
/// # Errors
/// [`StoreError::SkuLost`] / [`StoreError::Stale`] when a shard fails closed, or a Redis error
/// (a transfer left half done is finished by the recovery task).
pub async fn feed(store: &Store, sku: &str, layout: Layout) -> Result<i64, StoreError> {
    if !layout.is_sharded() {
        return Ok(0);
    }
    let names = layout.names(sku);
    let reads = names
        .iter()
        .enumerate()
        .map(|(i, name)| read_line(store, name, i as u16));
    let lines = futures_util::future::try_join_all(reads).await?;
    let mut waiting: Vec<Line> = lines.iter().copied().filter(|l| l.waiting > 0).collect();
    if waiting.is_empty() {
        return Ok(0);
    }
    // Approximate FIFO across shards: the earliest head first (ties by shard, so every
    // gateway feeding the same SKU agrees).
    waiting.sort_by_key(|l| (l.head_joined_ms, l.shard));
    let states = survey(store, sku, layout).await?;
    // Donors: open stock on a shard without a line. A shard with waiters keeps its units for
    // its own line (give_back offers them there first).
    let mut donors: Vec<(u16, i64)> = lines
        .iter()
        .filter(|l| l.waiting == 0 && states[usize::from(l.shard)].stock > 0)
        .map(|l| (l.shard, states[usize::from(l.shard)].stock))
        .collect();
    let mut moved = 0;
    for line in waiting {
        let mut want = line.waiting;
        for (donor, stock) in donors.iter_mut().filter(|(_, s)| *s > 0) {
            if want == 0 {
                break;
            }
            let n = want.min(*stock);
            // need = cap = n: the donor gives less if it sold some meanwhile.
            let got = transfer::transfer(store, sku, layout, *donor, line.shard, n, n).await?;
            *stock -= n;
            want -= got;
            moved += got;
        }
    }
    Ok(moved)
}

async fn read_line(store: &Store, name: &str, shard: u16) -> Result<Line, StoreError> {
    let keys = store.keys(name);
    let mut con = store.hot();
    let (waiting, head): (i64, Vec<String>) = store
        .bounded(async {
            Ok(redis::pipe()
                .cmd("ZCARD")
                .arg(keys.waitlist())
                .cmd("ZRANGE")
                .arg(keys.waitlist())
                .arg(0)
                .arg(0)
                .query_async(&mut con)
                .await?)
        })
        .await?;
    let mut head_joined_ms = i64::MAX;
    if let Some(id) = head.first() {
        let raw: Option<String> = store
            .bounded(async {
                Ok(redis::cmd("HGET")
                    .arg(keys.waitlist_entries())
                    .arg(id)
                    .query_async(&mut con)
                    .await?)
            })
            .await?;
        if let Some(e) = raw.as_deref().and_then(Entry::parse) {
            head_joined_ms = e.joined_ms;
        }
    }
    Ok(Line {
        shard,
        waiting,
        head_joined_ms,
    })
}
