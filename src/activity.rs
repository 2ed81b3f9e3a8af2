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

use std::collections::HashSet;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use dashmap::DashMap;
use futures_util::{stream, StreamExt};
use redis::Script;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::claims::now_ms;
use crate::error::{DbError, StoreError};
use crate::keys::active_skus;
use crate::store::Store;

/// A gateway marks a SKU again once its last mark is this old (and the SKU is used again).
pub const MARK_EVERY: Duration = Duration::from_secs(1);
/// A SKU unmarked this long, with nothing in its journal, expiry set or waitlist, leaves the
/// set. Far above [`MARK_EVERY`] and the clock skew between gateways (scores are their clocks).
pub const HORIZON: Duration = Duration::from_secs(60);
/// The member that is never retired: its absence means the set was lost (see module docs). Not
/// a valid SKU id (`^[A-Za-z0-9._-]{1,64}$`), so no SKU can take its place.
pub const SENTINEL: &str = "*";
/// Members read per `ZRANGE` of the set.
const MEMBERS_PAGE: isize = 1000;
/// One round of [`Upkeep`]: failed marks retried, the sentinel checked, a catalog page walked,
/// retirement candidates checked.
const ROUND: Duration = Duration::from_secs(1);
/// Catalog SKUs checked per round at the slow pace: two Redis commands each, so 80 commands a
/// second whatever the catalog's size; a catalog of 100,000 SKUs is walked in about 42 minutes.
pub const WALK_PAGE: i64 = 40;
/// Catalog SKUs checked per round while walking after the set was lost.
pub const WALK_FAST_PAGE: i64 = 2000;
/// Retirement candidates checked per round.
const RETIRE_BATCH: isize = 64;
/// SKUs checked at once by a walk or a retirement round (each check is one pipelined call).
const CHECKS_IN_FLIGHT: usize = 16;

/// Kept beside its only caller, like `reap_consumers.lua`: never preloaded, `invoke_async`
/// loads it on first use.
static RETIRE_SKU: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/retire_sku.lua")));

/// This gateway's last successful mark per SKU, so a fresh SKU costs a map lookup; and the SKUs
/// whose mark got no answer, retried by [`Upkeep`]. Bounded by the SKUs this gateway used
/// within the [`HORIZON`] (see [`RecentMarks::recent`]). Held by the [`Store`], so every caller
/// of a script reaches it without another handle.
#[derive(Default)]
pub struct RecentMarks {
    /// When the last acknowledged mark of each SKU was sent.
    last: DashMap<String, Instant>,
    /// SKUs whose last mark failed: their calls may have journaled unmarked.
    failed: parking_lot::Mutex<HashSet<String>>,
}

impl RecentMarks {
    fn fresh(&self, sku: &str) -> bool {
        self.last.get(sku).is_some_and(|t| t.elapsed() < MARK_EVERY)
    }

    /// The SKUs this gateway marked (or failed to mark) within the [`HORIZON`]: its own writer
    /// and expiry worker serve them whether or not the set still holds them (a mark a failover
    /// lost, a mark that got no answer), so only a gateway's death leaves their work to the
    /// set, and only the set's loss as well leaves it to the catalog walk. Older entries are
    /// dropped here, which keeps the map as small as this gateway's recent work.
    pub fn recent(&self) -> Vec<String> {
        self.last.retain(|_, t| t.elapsed() < HORIZON);
        let mut out: Vec<String> = self.last.iter().map(|e| e.key().clone()).collect();
        out.extend(self.failed.lock().iter().cloned());
        out
    }
}

/// Marks `sku` active unless this gateway did so less than [`MARK_EVERY`] ago. Never fails: a
/// mark that got no answer is remembered and retried by [`Upkeep`] (meanwhile the catalog walk
/// is the backstop).
pub async fn mark(store: &Store, sku: &str) {
    let recent = store.recent_marks();
    if recent.fresh(sku) {
        return;
    }
    let sent = Instant::now();
    match zadd(store, sku).await {
        Ok(()) => {
            recent.last.insert(sku.to_string(), sent);
        }
        Err(e) => {
            tracing::debug!(sku, error = %e, "could not mark the SKU active; retrying next round");
            recent.failed.lock().insert(sku.to_string());
        }
    }
}

/// Runs `call`, a script call that can journal for `sku` or give it holds, together with the
/// SKU's [`mark`] (see the module docs for why together is as safe as before).
pub async fn with_mark<T>(
    store: &Store,
    sku: &str,
    call: impl std::future::Future<Output = T>,
) -> T {
    let ((), out) = tokio::join!(mark(store, sku), call);
    out
}

async fn zadd(store: &Store, sku: &str) -> Result<(), StoreError> {
    let key = active_skus(store.prefix());
    let mut con = store.hot();
    store
        .bounded(async {
            Ok(redis::cmd("ZADD")
                .arg(&key)
                .arg(now_ms())
                .arg(sku)
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

/// Whether the SKU has work left for the background: entries in its journal (winners and
/// changes not yet written), holds in its expiry set, a waitlist, transfers it began to a
/// sibling shard and has not finished, or units kept in its waitlist pool (the last two only on
/// a shard of a sharded SKU, src/shards/: the recovery task finishes and feeds them). Empty
/// sorted sets and hashes do not exist in Redis, so `EXISTS` counts them; the journal stream
/// outlives its entries (the writer's group lives on it) and `XLEN` counts what
/// `ack_journal.lua` has not trimmed: it trims every written entry, so a stream of written
/// entries only is empty. One pipeline of the SKU's own keys: one slot.
///
/// # Errors
/// Redis unreachable or timed out.
pub async fn has_work(store: &Store, sku: &str) -> Result<bool, StoreError> {
    let keys = store.keys(sku);
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

/// The active set's upkeep: retries failed marks, retires SKUs with nothing left, and walks
/// the catalog to find work the set lost. Every gateway runs one; a duplicate removal or
/// re-add is harmless.
pub struct Upkeep {
    store: Store,
    /// The ledger's pool: one catalog page per round.
    db: PgPool,
    /// A SKU unmarked this long with nothing left leaves the set ([`HORIZON`]; shorter in tests).
    horizon: Duration,
    /// The last SKU id of the previous walk page ("" = from the first).
    after: String,
    /// Walking the whole catalog at [`WALK_FAST_PAGE`] per round, after the set was lost.
    fast: bool,
}

impl Upkeep {
    pub fn new(store: Store, db: PgPool, horizon: Duration) -> Self {
        Upkeep {
            store,
            db,
            horizon,
            after: String::new(),
            fast: false,
        }
    }

    pub async fn run(mut self, shutdown: CancellationToken) {
        loop {
            if let Err(e) = self.round().await {
                tracing::debug!(error = %e, "active-set upkeep round failed; retrying");
            }
            tokio::select! {
                _ = tokio::time::sleep(ROUND) => {}
                _ = shutdown.cancelled() => break,
            }
        }
        tracing::info!("active-set upkeep stopped");
    }

    /// One round: failed marks retried, the sentinel checked, one catalog page walked, one
    /// batch of retirement candidates checked.
    ///
    /// # Errors
    /// The first Redis or PostgreSQL failure; the rest of the round waits for the next one.
    pub async fn round(&mut self) -> Result<(), UpkeepError> {
        let failed: Vec<String> = self.store.recent_marks().failed.lock().drain().collect();
        for sku in failed {
            // Not `mark`: the map may call this SKU fresh, yet its last call went unmarked.
            if let Err(e) = zadd(&self.store, &sku).await {
                self.store.recent_marks().failed.lock().insert(sku);
                return Err(e.into());
            }
        }
        if self.sentinel_was_missing().await? {
            tracing::warn!("the active-SKU set was missing (lost by Redis, or never created): walking the whole catalog for unwritten winners and holds");
            self.fast = true;
            self.after.clear();
        }
        self.walk_page().await?;
        self.retire().await?;
        Ok(())
    }

    /// Adds the sentinel when absent; true when it was (the set was lost, or this is its start).
    async fn sentinel_was_missing(&self) -> Result<bool, StoreError> {
        let key = active_skus(self.store.prefix());
        let mut con = self.store.hot();
        let added: i64 = self
            .store
            .bounded(async {
                Ok(redis::cmd("ZADD")
                    .arg(&key)
                    .arg("NX")
                    .arg("+inf")
                    .arg(SENTINEL)
                    .query_async(&mut con)
                    .await?)
            })
            .await?;
        Ok(added == 1)
    }

    /// Checks the next page of the catalog and adds back every SKU with work. Returns how many
    /// were added.
    ///
    /// # Errors
    /// The catalog read or a Redis check failed; the page is walked again next round.
    pub async fn walk_page(&mut self) -> Result<usize, UpkeepError> {
        let page_len = if self.fast { WALK_FAST_PAGE } else { WALK_PAGE };
        let rows: Vec<(String, i32, Vec<i32>)> = sqlx::query_as(
            "SELECT sku, shards, shard_salts FROM skus WHERE sku > $1 ORDER BY sku LIMIT $2",
        )
        .bind(&self.after)
        .bind(page_len)
        .fetch_all(&self.db)
        .await
        .map_err(DbError::from)?;
        let page: Vec<String> = rows.iter().map(|(sku, _, _)| sku.clone()).collect();
        // Every shard of a sharded SKU is a Redis SKU of its own, with its own work.
        let names: Vec<String> = rows
            .iter()
            .flat_map(|(sku, shards, salts)| {
                crate::shards::Layout::stored(*shards, salts).names(sku)
            })
            .collect();
        let store = &self.store;
        let checks: Vec<(String, Result<bool, StoreError>)> = stream::iter(names)
            .map(|sku| async move {
                let work = has_work(store, &sku).await;
                (sku, work)
            })
            .buffer_unordered(CHECKS_IN_FLIGHT)
            .collect()
            .await;
        let mut added = 0;
        for (sku, work) in checks {
            if work? {
                // GT: a SKU marked later than now by a gateway with a clock ahead keeps that.
                let key = active_skus(store.prefix());
                let mut con = store.hot();
                let new: i64 = store
                    .bounded(async {
                        Ok(redis::cmd("ZADD")
                            .arg(&key)
                            .arg("GT")
                            .arg(now_ms())
                            .arg(&sku)
                            .query_async(&mut con)
                            .await?)
                    })
                    .await?;
                if new == 1 {
                    added += 1;
                    tracing::warn!(sku, "found a SKU with unwritten entries or holds outside the active set (the set lost it); added it back");
                }
            }
        }
        self.after = match page.last() {
            Some(last) if page.len() as i64 == page_len => last.clone(),
            _ => {
                if self.fast {
                    tracing::info!("walked the whole catalog after the active-SKU set was lost");
                }
                self.fast = false;
                String::new()
            }
        };
        Ok(added)
    }

    /// Removes the SKUs unmarked for the horizon with nothing left; those that still have work
    /// are marked again, so they go to the back of the line and do not hide the others. Returns
    /// how many were removed.
    ///
    /// # Errors
    /// A Redis failure; the candidates are checked again next round.
    pub async fn retire(&self) -> Result<usize, UpkeepError> {
        let key = active_skus(self.store.prefix());
        let cutoff = now_ms() - self.horizon.as_millis() as i64;
        let mut con = self.store.hot();
        let candidates: Vec<(String, String)> = self
            .store
            .bounded(async {
                Ok(redis::cmd("ZRANGE")
                    .arg(&key)
                    .arg("-inf")
                    .arg(format!("({cutoff}"))
                    .arg("BYSCORE")
                    .arg("LIMIT")
                    .arg(0)
                    .arg(RETIRE_BATCH)
                    .arg("WITHSCORES")
                    .query_async(&mut con)
                    .await?)
            })
            .await?;
        let store = &self.store;
        let checks: Vec<(String, String, Result<bool, StoreError>)> = stream::iter(candidates)
            .map(|(sku, score)| async move {
                let work = has_work(store, &sku).await;
                (sku, score, work)
            })
            .buffer_unordered(CHECKS_IN_FLIGHT)
            .collect()
            .await;
        let mut removed = 0;
        for (sku, score, work) in checks {
            let mut con = store.hot();
            if work? {
                // XX: only while it is a member (never re-adds one another gateway retired);
                // GT: never lowers a newer mark.
                store
                    .bounded(async {
                        Ok(redis::cmd("ZADD")
                            .arg(&key)
                            .arg("XX")
                            .arg("GT")
                            .arg(now_ms())
                            .arg(&sku)
                            .query_async::<i64>(&mut con)
                            .await
                            .map(|_| ())?)
                    })
                    .await?;
                continue;
            }
            let mut inv = RETIRE_SKU.prepare_invoke();
            inv.key(&key).arg(&sku).arg(&score);
            let gone: i64 = store
                .bounded(async { Ok(inv.invoke_async(&mut con).await?) })
                .await?;
            if gone == 1 {
                removed += 1;
                tracing::debug!(sku, "SKU idle with nothing left: out of the active set");
            }
        }
        Ok(removed)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum UpkeepError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Db(#[from] DbError),
}
