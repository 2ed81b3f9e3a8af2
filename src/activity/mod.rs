//! Which SKUs have background work, so that the work scales with them and not with the catalog.
//!
//! The writer reads a SKU's journal, and the expiry worker expires its holds, only while the SKU
//! is in the active set ([`crate::keys::active_skus`], `<prefix>:active`): a sorted set of SKUs
//! scored by the unix ms of their last mark. An idle SKU costs nothing, however large the
//! catalog. Three rules keep every SKU that has work in the set:
//!
//! - **Marked with its work.** Every script call that can append to a SKU's journal or give it
//!   holds (claims, confirm and cancel, waitlist join and leave, compensations, restocks,
//!   restores), or leave a sharded SKU's shard with a transfer to finish or units pooled for
//!   its lines (transfers, the lines' feed), goes with a mark, `ZADD <prefix>:active <now_ms> <sku>`, sent at most once a
//!   [`MARK_EVERY`] per SKU per gateway ([`RecentMarks`]: a map lookup while the last one is
//!   fresh). The mark goes together with the call ([`with_mark`]), not before it, because the
//!   order does not matter: a SKU leaves the set only through `lua/retire_sku.lua`, which keeps
//!   it when its score changed after it was found empty, and a mark that lands after a removal
//!   adds it back. So a claim pays no extra round trip, and a stalled Redis no extra timeout.
//!   The expiry worker's own calls go unmarked: it only expires holds of SKUs in the set, and
//!   holds keep a SKU there.
//! - **Retired only when empty and long unmarked.** [`Upkeep`] removes a SKU whose last mark is
//!   older than [`HORIZON`] (far above the mark period and any clock skew between gateways)
//!   and with no work left ([`has_work`]), with a compare-and-remove on the
//!   score it read (the emptiness check reads the SKU's slot, the removal the set's: no single
//!   step can do both on a cluster).
//! - **Found again when the set is lost.** The set is an index, not the truth: a Redis that lost
//!   the key (a deleted key, a failover to a replica that missed the last marks) would hide
//!   work. [`Upkeep`] walks the catalog a page per round and adds back every SKU with work
//!   ([`has_work`]). A sentinel member ([`SENTINEL`], scored +inf,
//!   never retired) tells a lost set from an empty one: when it is missing, one gateway walks
//!   the whole catalog at once (fast pages) instead of at the slow pace. A mark that got no
//!   answer is retried by the next round. Meanwhile a gateway's own writer and expiry worker
//!   also serve the SKUs it marked within the horizon ([`RecentMarks::recent`]), whatever the
//!   set holds: a lost mark waits for the walk only if its gateway died too.

use std::time::Instant;

use crate::clock::now_ms;
use crate::error::StoreError;
use crate::keys::active_skus;
use crate::store::Store;

// How often a gateway marks a SKU, and how long an unmarked SKU stays: the store keeps the
// marks (src/store/recent.rs).
pub use crate::store::recent::{RecentMarks, HORIZON, MARK_EVERY};

mod upkeep;

pub use upkeep::{Upkeep, WALK_FAST_PAGE, WALK_PAGE};

/// The member that is never retired: its absence means the set was lost (see module docs). Not
/// a valid SKU id (`^[A-Za-z0-9._-]{1,64}$`), so no SKU can take its place.
pub const SENTINEL: &str = "*";
/// Members read per `ZRANGE` of the set.
const MEMBERS_PAGE: isize = 1000;

/// Marks the Redis SKU `name` (a SKU, or one shard of one) active unless this gateway did so
/// less than [`MARK_EVERY`] ago. Never fails: a mark that got no answer is remembered and
/// retried by [`Upkeep`] (meanwhile the catalog walk is the backstop).
pub async fn mark(store: &Store, name: &str) {
    let recent = store.recent_marks();
    if recent.fresh(name) {
        return;
    }
    let sent = Instant::now();
    match zadd(store, name).await {
        Ok(()) => {
            recent.marked(name, sent);
        }
        Err(e) => {
            tracing::debug!(sku = name, error = %e, "could not mark the SKU active; retrying next round");
            recent.failed(name);
        }
    }
}

/// Runs `call`, a script call that can journal for the Redis SKU `name` or give it holds,
/// together with its [`mark`] (see the module docs for why together is as safe as before).
pub async fn with_mark<T>(
    store: &Store,
    name: &str,
    call: impl std::future::Future<Output = T>,
) -> T {
    let ((), out) = tokio::join!(mark(store, name), call);
    out
}

async fn zadd(store: &Store, name: &str) -> Result<(), StoreError> {
    let key = active_skus(store.prefix());
    let mut con = store.hot();
    store
        .bounded(async {
            Ok(redis::cmd("ZADD")
                .arg(&key)
                .arg(now_ms())
                .arg(name)
                .query_async::<i64>(&mut con)
                .await
                .map(|_| ())?)
        })
        .await
}

/// Every SKU of the active set, read a bounded page per call.
///
/// # Errors
/// Redis unreachable or timed out.
pub async fn members(store: &Store) -> Result<Vec<String>, StoreError> {
    let key = active_skus(store.prefix());
    let mut out = Vec::new();
    let mut start: isize = 0;
    loop {
        let mut con = store.hot();
        let page: Vec<String> = store
            .bounded(async {
                Ok(redis::cmd("ZRANGE")
                    .arg(&key)
                    .arg(start)
                    .arg(start + MEMBERS_PAGE - 1)
                    .query_async(&mut con)
                    .await?)
            })
            .await?;
        let full = page.len() as isize == MEMBERS_PAGE;
        out.extend(page.into_iter().filter(|s| s != SENTINEL));
        if !full {
            return Ok(out);
        }
        start += MEMBERS_PAGE;
    }
}

/// Whether the Redis SKU `name` (a SKU, or one shard of one) has work left for the background:
/// entries in its journal (winners and changes not yet written), holds in its expiry set, a
/// waitlist, transfers it began to a sibling shard and has not finished, or units kept in its
/// waitlist pool (the last two only on a shard of a sharded SKU, src/shards/: the recovery task
/// finishes and feeds them). Empty
/// sorted sets and hashes do not exist in Redis, so `EXISTS` counts them; the journal stream
/// outlives its entries (the writer's group lives on it) and `XLEN` counts what
/// `ack_journal.lua` has not trimmed: it trims every written entry, so a stream of written
/// entries only is empty. One pipeline of the SKU's own keys: one slot.
///
/// # Errors
/// Redis unreachable or timed out.
pub async fn has_work(store: &Store, name: &str) -> Result<bool, StoreError> {
    let keys = store.keys(name);
    let mut con = store.hot();
    let (entries, sets, pool): (i64, i64, Option<i64>) = store
        .bounded(async {
            Ok(redis::pipe()
                .cmd("XLEN")
                .arg(keys.journal())
                .cmd("EXISTS")
                .arg(keys.expiry())
                .arg(keys.waitlist())
                .arg(keys.transfers())
                .cmd("HGET")
                .arg(keys.state())
                .arg("wl_pool")
                .query_async(&mut con)
                .await?)
        })
        .await?;
    Ok(entries > 0 || sets > 0 || pool.unwrap_or(0) > 0)
}
