//! The active set's upkeep (see the module docs of [`super`]): failed marks retried, idle and
//! empty SKUs retired, and the catalog walked for work the set lost.

use std::time::Duration;

use futures_util::{stream, StreamExt};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use super::{has_work, zadd, SENTINEL};
use crate::clock::now_ms;
use crate::error::{DbError, StoreError, TaskError};
use crate::keys::active_skus;
use crate::sku::SkuId;
use crate::store::Store;

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
    pub async fn round(&mut self) -> Result<(), TaskError> {
        let failed = self.store.recent_marks().take_failed();
        for sku in failed {
            // Not `mark`: the map may call this SKU fresh, yet its last call went unmarked.
            if let Err(e) = zadd(&self.store, &sku).await {
                self.store.recent_marks().failed(&sku);
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
    pub async fn walk_page(&mut self) -> Result<usize, TaskError> {
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
                crate::layout::Layout::stored(*shards, salts).names(SkuId::trusted(sku))
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
    pub async fn retire(&self) -> Result<usize, TaskError> {
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
            let gone = store
                .bounded(crate::scripts::activity::retire_sku(
                    &mut con, &key, &sku, &score,
                ))
                .await?;
            if gone {
                removed += 1;
                tracing::debug!(sku, "SKU idle with nothing left: out of the active set");
            }
        }
        Ok(removed)
    }
}
