//! Knowing when Redis came back with older data (a restart from an older snapshot, an AOF
//! tail lost with its host, a failover to a lagging replica).
//!
//! Every script that changes a SKU's state bumps the state's sequence (`seq`); every winner's
//! journal entry carries the sequence it produced; the writer commits the highest one it wrote
//! to `skus.redis_seq` (the high-water mark). A state whose sequence is behind the mark has
//! forgotten sales PostgreSQL holds, so it must never sell again: it is marked stale in Redis
//! (every gateway then fails closed on it) until `restore` rewrites it from the ledger.
//!
//! Three checks, each cheap: the claim script compares the state's sequence with the mark this
//! gateway knows (the catalog's row on first use, its own writer's commits, and a refresh every
//! second); the writer looks for a sequence PostgreSQL already holds for another claim (a state
//! that went back and sold again before any claim saw the mark); and the refresher compares
//! each active SKU's state with the mark every second, claims or not.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::error::{DbError, StoreError};
use crate::metrics as m;
use crate::scripts;
use crate::store::Store;

/// How often active SKUs' marks are re-read from PostgreSQL and compared with Redis.
const REFRESH: Duration = Duration::from_secs(1);

/// The highest state sequence this gateway knows PostgreSQL recorded, per SKU it has used.
#[derive(Default)]
pub struct Marks {
    map: DashMap<String, Arc<AtomicI64>>,
}

impl Marks {
    /// The mark of `sku` (0 when unknown: nothing to compare against yet).
    pub fn floor(&self, sku: &str) -> i64 {
        self.map.get(sku).map_or(0, |m| m.load(Ordering::Relaxed))
    }

    /// Raises the mark of `sku` to `mark` (marks only grow, except through [`Marks::reset`]).
    pub fn observe(&self, sku: &str, mark: i64) {
        if let Some(m) = self.map.get(sku) {
            m.fetch_max(mark, Ordering::Relaxed);
            return;
        }
        self.map
            .entry(sku.to_string())
            .or_default()
            .fetch_max(mark, Ordering::Relaxed);
    }

    fn active(&self) -> Vec<String> {
        self.map.iter().map(|e| e.key().clone()).collect()
    }
}

/// Checks a written batch of winners of `sku` for sequences PostgreSQL already held for other
/// claims, and raises the SKU's mark to the batch's highest (`lifecycle_seq`: the highest
/// sequence of the batch's hold and waitlist records, which name no new claim). Returns the
/// new mark.
///
/// # Errors
/// The database error (the batch is written; the caller retries the check with the next one).
pub async fn record_batch(
    db: &PgPool,
    store: &Store,
    marks: &Marks,
    sku: &str,
    written: &[(i64, uuid::Uuid)],
    lifecycle_seq: Option<i64>,
) -> Result<i64, DbError> {
    // `sku` is a Redis name: a shard of a sharded SKU keeps its mark apart (its sequences
    // are its own, src/shards/mod.rs), and its rows carry the catalog SKU.
    let (catalog_sku, shard) = crate::keys::split_shard(sku);
    let (seqs, ids): (Vec<i64>, Vec<uuid::Uuid>) = written.iter().copied().unzip();
    let (clashes, mark): (i64, i64) = if shard == 0 {
        sqlx::query_as(
            "WITH batch AS (SELECT * FROM UNNEST($2::int8[], $3::uuid[]) AS t(seq, claim_id)),
                  mark AS (UPDATE skus SET redis_seq = GREATEST(redis_seq, (SELECT max(seq) FROM batch),
                                                                $4::int8)
                            WHERE sku = $1 RETURNING redis_seq)
             SELECT (SELECT count(*) FROM issuances i JOIN batch b
                       ON i.sku = $1 AND i.seq = b.seq AND i.claim_id <> b.claim_id),
                    COALESCE((SELECT redis_seq FROM mark), 0)",
        )
        .bind(catalog_sku)
        .bind(&seqs)
        .bind(&ids)
        .bind(lifecycle_seq)
        .fetch_one(db)
        .await?
    } else {
        let top = seqs.iter().copied().chain(lifecycle_seq).max().unwrap_or(0);
        let mark = crate::shards::marks::raise(db, sku, top).await?;
        let clashes: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM issuances i
               JOIN UNNEST($2::int8[], $3::uuid[]) AS b(seq, claim_id)
                 ON i.sku = $1 AND i.seq = b.seq AND i.claim_id <> b.claim_id",
        )
        .bind(catalog_sku)
        .bind(&seqs)
        .bind(&ids)
        .fetch_one(db)
        .await?;
        (clashes, mark)
    };
    marks.observe(sku, mark);
    if clashes > 0 {
        close_stale(store, sku, "a state sequence was used twice").await;
    }
    Ok(mark)
}

/// Marks the SKU's Redis state stale (every gateway fails closed on it until a restore).
pub async fn close_stale(store: &Store, sku: &str, why: &str) {
    let keys = store.keys(sku);
    let mut con = store.hot();
    match store
        .bounded(scripts::mark_stale(&mut con, &keys, why))
        .await
    {
        Ok(true) => {
            m::stale_state();
            tracing::error!(
                sku,
                why,
                "redis holds an older state than the ledger: the SKU is closed until restore"
            );
        }
        Ok(false) => {}
        Err(e) => tracing::warn!(sku, error = %e, "could not mark a stale state; retrying"),
    }
}

/// Re-reads the marks of the SKUs this gateway has used, and compares each with its Redis
/// state, every second.
pub struct Refresher {
    pub store: Store,
    pub db: PgPool,
    pub marks: Arc<Marks>,
}

impl Refresher {
    pub async fn run(self, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(REFRESH) => {}
                _ = shutdown.cancelled() => break,
            }
            if let Err(e) = self.round().await {
                tracing::debug!(error = %e, "freshness round failed; retrying");
            }
            // Restocks whose answer was lost, or whose gateway died, are finished here.
            if let Err(e) = crate::inventory::settle_stuck_restocks(&self.store, &self.db).await {
                tracing::debug!(error = %e, "settling pending restocks failed; retrying");
            }
        }
        tracing::info!("freshness refresher stopped");
    }

    async fn round(&self) -> Result<(), RoundError> {
        let skus = self.marks.active();
        if skus.is_empty() {
            return Ok(());
        }
        // Shards of sharded SKUs among them keep their marks apart (src/shards/marks.rs).
        let rows = crate::shards::marks::read(&self.db, &skus).await?;
        for (sku, mark) in rows {
            self.marks.observe(&sku, mark);
            let keys = self.store.keys(&sku);
            let mut con = self.store.hot();
            let (seq, stale): (Option<i64>, Option<String>) = self
                .store
                .bounded(async {
                    Ok(redis::cmd("HMGET")
                        .arg(keys.state())
                        .arg("seq")
                        .arg("stale")
                        .query_async(&mut con)
                        .await?)
                })
                .await?;
            if let (Some(seq), None) = (seq, stale) {
                if seq < mark {
                    close_stale(&self.store, &sku, "state sequence behind the ledger").await;
                }
            }
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
enum RoundError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    Store(#[from] StoreError),
}
