//! Knowing when Redis came back with older data (a restart from an older snapshot, an AOF
//! tail lost with its host, a failover to a lagging replica). See docs/freshness.md.
//!
//! Every script that changes a SKU's state bumps the state's sequence (`seq`); every winner's
//! journal entry carries the sequence it produced; the writer commits the highest one it wrote
//! to `skus.redis_seq` (the high-water mark). A state whose sequence is behind the mark has
//! forgotten sales PostgreSQL holds, so it must never sell again: it is marked stale in Redis
//! (every gateway then fails closed on it) until `restore` rewrites it from the ledger.
//!
//! A sequence alone stops telling once an older state's own moves carry it past the mark, so
//! the state also carries an incarnation (`inc`, a Redis-clock time): stamped by restore and
//! advanced every second by the refresher of a gateway that found the state fresh and moving
//! (`lua/rotate.lua`), then recorded in `skus.redis_inc` once the replicas hold it. A copy
//! taken before that rotation carries an older incarnation whatever its sequence becomes.
//!
//! The checks: every script that changes a state (`lua/lib/fresh.lua`, prepended) compares it
//! with the floor its caller sends, the mark and incarnation this gateway knows ([`Marks`]:
//! every catalog SKU's, loaded at start before anything is served, new SKUs as they appear,
//! its own writer's commits and a refresh every second of the SKUs it moves); the writer looks
//! for a sequence PostgreSQL already holds for another claim (a state that went back and sold
//! again before any script saw the mark); and the refresher compares every catalog SKU's state
//! once at start (or when the SKU appears) and the SKUs this gateway moves every second.

use std::time::Duration;

use sqlx::PgPool;

use crate::error::DbError;
use crate::keys::ShardName;
use crate::metrics as m;
use crate::scripts;
use crate::store::marks::Marks;
use crate::store::Store;

mod refresh;
pub mod shard_marks;

pub use refresh::{load_new, Refresher};

/// How often active SKUs' marks are re-read from PostgreSQL and compared with Redis.
const REFRESH: Duration = Duration::from_secs(1);

/// Checks a written batch of winners of the Redis SKU `name` for sequences PostgreSQL already
/// held for other claims, and raises the SKU's mark to the batch's highest (`lifecycle_seq`:
/// the highest sequence of the batch's hold and waitlist records, which name no new claim).
/// Returns the new mark.
///
/// # Errors
/// The database error (the batch is written; the caller retries the check with the next one).
pub async fn record_batch(
    db: &PgPool,
    store: &Store,
    marks: &Marks,
    name: &ShardName,
    written: &[(i64, uuid::Uuid)],
    lifecycle_seq: Option<i64>,
) -> Result<i64, DbError> {
    // A shard of a sharded SKU keeps its mark apart (its sequences are its own,
    // src/layout.rs), and its rows carry the catalog SKU.
    let (sku, catalog_sku, shard) = (name.as_str(), name.sku(), name.shard());
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
        let mark = crate::freshness::shard_marks::raise(db, sku, top).await?;
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

/// Marks the state of the Redis SKU `name` (a SKU, or one shard of one) stale (every gateway
/// fails closed on it until a restore).
pub async fn close_stale(store: &Store, name: &str, why: &str) {
    let keys = store.keys(name);
    let mut con = store.hot();
    match store
        .bounded(scripts::mark_stale(&mut con, &keys, why))
        .await
    {
        Ok(true) => {
            m::stale_state();
            tracing::error!(
                sku = name,
                why,
                "redis holds an older state than the ledger: the SKU is closed until restore"
            );
        }
        Ok(false) => {}
        Err(e) => tracing::warn!(sku = name, error = %e, "could not mark a stale state; retrying"),
    }
}
