//! Operator actions on a SKU (declare, restock; restore is in [`crate::restore`]).
//!
//! Each action keeps PostgreSQL (the catalog and the ledger) and Redis (the stock) in step,
//! under the SKU's lock ([`SkuLock`], held across the Redis step), so two operator actions on
//! one SKU never interleave. Where an answer from Redis is lost, the action reads it back
//! (never sends it twice) and moves PostgreSQL only on a definite answer; while it cannot
//! know, it leaves the stores in the order that can only undersell.

use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::{PgPool, Postgres};
use uuid::Uuid;

use crate::catalog::{self, Catalog};
use crate::error::{DbError, StoreError};
use crate::ledger::{view, SkuView};
use crate::scripts::{self, Declared, RestockMode, Restocked};
use crate::store::Store;

/// An operator request refused for a business reason (409/404), not a fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    UnknownSku,
    /// Declared again with another total.
    SkuExists,
    /// The delta would take the remaining stock below 0.
    InsufficientStock,
    /// Restore asked while Redis still holds the SKU's state, or a new catalog row whose id
    /// Redis already holds a state for (never adopt stock nobody declared here).
    StatePresent,
}

#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    #[error("refused: {0:?}")]
    Refused(Refusal),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Db(#[from] DbError),
}

impl From<sqlx::Error> for InventoryError {
    fn from(e: sqlx::Error) -> Self {
        InventoryError::Db(DbError::from(e))
    }
}

/// The result of a declare: whether the SKU is new (201) or already existed (200).
pub struct Declaration {
    pub created: bool,
    pub view: SkuView,
}

/// How long an operator action keeps reading back a Redis step whose answer was lost before it
/// answers 503 `outcome_unknown` and leaves the rest to a background task.
const SETTLE_LIMIT: Duration = Duration::from_secs(5);
const SETTLE_PAUSE: Duration = Duration::from_millis(100);

/// A SKU's operator lock: a PostgreSQL session advisory lock held on a connection of its own
/// across the Redis step, so declare, restock and restore of one SKU never interleave (on any
/// gateway). The connection is closed, not pooled, when the guard drops: the lock can never
/// outlive the action, even on an error path, and a gateway that dies releases it too.
pub struct SkuLock {
    _con: PoolConnection<Postgres>,
}

impl SkuLock {
    /// # Errors
    /// The database error.
    pub async fn acquire(db: &PgPool, sku: &str) -> Result<SkuLock, DbError> {
        let mut con = db.acquire().await?;
        con.close_on_drop();
        sqlx::query("SELECT pg_advisory_lock(hashtext('dropgate.sku.' || $1))")
            .bind(sku)
            .execute(&mut *con)
            .await?;
        Ok(SkuLock { _con: con })
    }
}

/// Declares a SKU, seeding its stock in Redis only if absent.
///
/// The stock is seeded only while the catalog has never seen Redis hold it, the ledger holds
/// no claim for the SKU and no state sequence was ever recorded: after that, a missing state
/// means Redis lost it, and only restore (from the ledger) may bring it back.
///
/// # Errors
/// [`Refusal::SkuExists`] for another total, [`Refusal::StatePresent`] for a new row whose id
/// Redis holds a state for; infrastructure errors otherwise.
pub async fn declare(
    store: &Store,
    catalog: &Catalog,
    sku: &str,
    total: i64,
    per_user_limit: i32,
    hold_seconds: i32,
) -> Result<Declaration, InventoryError> {
    let db = catalog.db();
    let _lock = SkuLock::acquire(db, sku).await?;
    let inserted = sqlx::query(
        "INSERT INTO skus (sku, total, per_user_limit, hold_seconds) VALUES ($1, $2, $3, $4)
         ON CONFLICT (sku) DO NOTHING",
    )
    .bind(sku)
    .bind(total)
    .bind(per_user_limit)
    .bind(hold_seconds)
    .execute(db)
    .await?
    .rows_affected()
        == 1;
    let row = catalog::fetch(db, sku)
        .await?
        .ok_or(InventoryError::Refused(Refusal::UnknownSku))?;
    if !inserted {
        if row.total != total {
            return Err(InventoryError::Refused(Refusal::SkuExists));
        }
        sqlx::query(
            "UPDATE skus SET per_user_limit = $2, hold_seconds = $3, updated_at = now()
             WHERE sku = $1",
        )
        .bind(sku)
        .bind(per_user_limit)
        .bind(hold_seconds)
        .execute(db)
        .await?;
    }
    let seed = !row.seeded && row.redis_seq == 0 && !ledger_has_claims(db, sku).await?;
    let keys = store.keys(sku);
    let mut con = store.hot();
    // A lost answer is safe to send again: the seed is stamped with the row's declare id, so
    // a second send finds its own seed and changes nothing.
    let declared = store
        .bounded(scripts::declare_sku(
            &mut con,
            &keys,
            seed,
            total,
            per_user_limit,
            &row.declare_id,
        ))
        .await?;
    match declared {
        Declared::Seeded | Declared::AlreadyPresent => {
            if !row.seeded {
                sqlx::query("UPDATE skus SET seeded = true WHERE sku = $1")
                    .bind(sku)
                    .execute(db)
                    .await?;
            }
        }
        Declared::Foreign => {
            if inserted {
                sqlx::query("DELETE FROM skus WHERE sku = $1 AND declare_id = $2 AND NOT seeded")
                    .bind(sku)
                    .bind(row.declare_id)
                    .execute(db)
                    .await?;
            }
            catalog.load(sku).await?;
            tracing::warn!(
                sku,
                "declare refused: redis holds a state this catalog did not seed"
            );
            return Err(InventoryError::Refused(Refusal::StatePresent));
        }
        Declared::Lost => {}
    }
    catalog.load(sku).await?;
    Ok(Declaration {
        created: inserted,
        view: view(store, catalog, sku).await?,
    })
}

async fn ledger_has_claims(db: &PgPool, sku: &str) -> Result<bool, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM issuances WHERE sku = $1)
             OR EXISTS (SELECT 1 FROM persistence_pending WHERE sku = $1)",
    )
    .bind(sku)
    .fetch_one(db)
    .await?)
}

/// Adds `delta` to the total and to the remaining stock.
///
/// The two stores move in the order that can only undersell if the gateway dies in between:
/// a positive delta grows the catalog total first, then the stock; a negative one shrinks the
/// stock first (where the "not below 0" check lives), then the total. The Redis step carries
/// an operation id, so it moves the stock at most once; a lost answer is read back, and the
/// total moves back (or on) only on a definite answer. While the answer stays unknown the
/// request answers 503 and a background task finishes the job when Redis answers.
///
/// # Errors
/// [`Refusal::UnknownSku`], [`Refusal::InsufficientStock`], or infrastructure errors
/// ([`StoreError::Timeout`] when the Redis step's outcome is not known yet).
pub async fn restock(
    store: &Store,
    catalog: &Catalog,
    sku: &str,
    delta: i64,
) -> Result<SkuView, InventoryError> {
    let db = catalog.db();
    let _lock = SkuLock::acquire(db, sku).await?;
    let total: Option<i64> = sqlx::query_scalar("SELECT total FROM skus WHERE sku = $1")
        .bind(sku)
        .fetch_optional(db)
        .await?;
    let total = total.ok_or(InventoryError::Refused(Refusal::UnknownSku))?;
    if total + delta < 0 {
        return Err(InventoryError::Refused(Refusal::InsufficientStock));
    }
    let op = Uuid::now_v7();
    if delta >= 0 {
        add_total(db, sku, delta, 0).await?;
    }
    let outcome = apply_restock(store, sku, &op, delta).await;
    let finished = finish_restock(db, sku, delta, &outcome).await;
    match outcome {
        Err(e) if e.is_uncertain() => {
            tracing::warn!(
                sku,
                delta,
                %op,
                "restock outcome unknown; settling it in the background"
            );
            tokio::spawn(settle_restock(
                store.clone(),
                db.clone(),
                sku.to_string(),
                op,
                delta,
            ));
            return Err(StoreError::Timeout.into());
        }
        Err(e) => return Err(e.into()),
        Ok(Restocked::Refused) => return Err(InventoryError::Refused(Refusal::InsufficientStock)),
        Ok(Restocked::NotApplied) => {
            return Err(
                StoreError::Unavailable("restock answer lost; it was not applied".into()).into(),
            )
        }
        Ok(Restocked::Applied { .. }) => finished?,
    }
    catalog.load(sku).await?;
    view(store, catalog, sku).await
}

/// Moves PostgreSQL after a definite Redis answer: the state sequence the restock produced
/// is recorded; a positive delta that was not applied is taken off the total again; a
/// negative one that was applied comes off the total now.
async fn finish_restock(
    db: &PgPool,
    sku: &str,
    delta: i64,
    outcome: &Result<Restocked, StoreError>,
) -> Result<(), DbError> {
    let result = match outcome {
        Ok(Restocked::Applied { seq, .. }) => {
            add_total(db, sku, if delta < 0 { delta } else { 0 }, *seq).await
        }
        Ok(Restocked::Refused | Restocked::NotApplied)
        | Err(StoreError::SkuLost | StoreError::Stale)
            if delta > 0 =>
        {
            add_total(db, sku, -delta, 0).await
        }
        _ => Ok(()),
    };
    if let Err(e) = &result {
        // Only ever an undersell: the total is larger than the units the stores hold.
        tracing::error!(sku, delta, error = %e, "restock half done (total larger than stock); run reconcile");
    }
    result
}

/// Applies a restock operation; when its answer is lost, reads it back (fencing it when it
/// has not happened) for up to [`SETTLE_LIMIT`].
async fn apply_restock(
    store: &Store,
    sku: &str,
    op: &Uuid,
    delta: i64,
) -> Result<Restocked, StoreError> {
    let keys = store.keys(sku);
    let mut con = store.hot();
    match store
        .bounded(scripts::restock(
            &mut con,
            &keys,
            op,
            delta,
            RestockMode::Apply,
        ))
        .await
    {
        Err(e) if e.is_uncertain() => read_back_restock(store, sku, op, delta, SETTLE_LIMIT).await,
        other => other,
    }
}

async fn read_back_restock(
    store: &Store,
    sku: &str,
    op: &Uuid,
    delta: i64,
    limit: Duration,
) -> Result<Restocked, StoreError> {
    let keys = store.keys(sku);
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let mut con = store.hot();
        match store
            .bounded(scripts::restock(
                &mut con,
                &keys,
                op,
                delta,
                RestockMode::Resolve,
            ))
            .await
        {
            Err(e) if e.is_uncertain() || matches!(e, StoreError::Unavailable(_)) => {
                if tokio::time::Instant::now() > deadline {
                    return Err(StoreError::Timeout);
                }
                tokio::time::sleep(SETTLE_PAUSE).await;
            }
            other => return other,
        }
    }
}

/// Finishes a restock whose outcome stayed unknown, once Redis answers.
async fn settle_restock(store: Store, db: PgPool, sku: String, op: Uuid, delta: i64) {
    let outcome = read_back_restock(&store, &sku, &op, delta, Duration::from_secs(24 * 3600)).await;
    tracing::info!(sku, %op, ?outcome, "restock outcome settled");
    let _lock = SkuLock::acquire(&db, &sku).await;
    let _ = finish_restock(&db, &sku, delta, &outcome).await;
}

/// Adds `delta` to the total and raises the SKU's high-water mark to `seq`.
async fn add_total(db: &PgPool, sku: &str, delta: i64, seq: i64) -> Result<(), DbError> {
    sqlx::query(
        "UPDATE skus SET total = total + $2, redis_seq = GREATEST(redis_seq, $3),
                updated_at = now()
          WHERE sku = $1",
    )
    .bind(sku)
    .bind(delta)
    .bind(seq)
    .execute(db)
    .await?;
    Ok(())
}
