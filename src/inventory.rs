//! Operator actions on a SKU (declare, restock, restore) and its accounting view.
//!
//! Each action keeps PostgreSQL (the catalog and the ledger) and Redis (the stock) in step:
//! PostgreSQL holds the row lock while Redis applies its atomic part, and commits only after
//! Redis accepted.

use redis::AsyncCommands;

use crate::catalog::{self, Catalog, Sku};
use crate::config::RECORD_TTL_SECS;
use crate::error::{DbError, StoreError};
use crate::ledger::{view, SkuView};
use crate::scripts::{self, ClaimRecord, Declared, Restocked, SCRIPTS};
use crate::store::Store;

/// An operator request refused for a business reason (409/404), not a fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    UnknownSku,
    /// Declared again with another total.
    SkuExists,
    /// The delta would take the remaining stock below 0.
    InsufficientStock,
    /// Restore asked while Redis still holds the SKU's state.
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

/// Declares a SKU, seeding its stock in Redis only if absent.
///
/// # Errors
/// [`Refusal::SkuExists`] for another total; infrastructure errors otherwise.
pub async fn declare(
    store: &Store,
    catalog: &Catalog,
    sku: &str,
    total: i64,
    per_user_limit: i32,
    hold_seconds: i32,
) -> Result<Declaration, InventoryError> {
    let db = catalog.db();
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
    let row = if inserted {
        None
    } else {
        let row = catalog::fetch(db, sku)
            .await?
            .ok_or(InventoryError::Refused(Refusal::UnknownSku))?;
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
        Some(row)
    };
    // Seed only while the catalog has never seen Redis confirm the stock: a declare after a
    // lost Redis must not re-sell what was sold (that is restore's job, from the ledger).
    let seed = row.as_ref().is_none_or(|r| !r.seeded);
    let keys = store.keys(sku);
    let mut con = store.hot();
    let declared = store
        .bounded(scripts::declare_sku(
            &mut con,
            &keys,
            seed,
            total,
            per_user_limit,
        ))
        .await?;
    if declared != Declared::Lost && seed {
        sqlx::query("UPDATE skus SET seeded = true WHERE sku = $1")
            .bind(sku)
            .execute(db)
            .await?;
    }
    catalog.load(sku).await?;
    Ok(Declaration {
        created: inserted,
        view: view(store, catalog, sku).await?,
    })
}

/// Adds `delta` to the total and to the remaining stock.
///
/// The two stores move in the order that can only undersell if the gateway dies in between:
/// a positive delta grows the catalog total first, then the stock; a negative one shrinks the
/// stock first (where the "not below 0" check lives), then the total. The Redis step carries
/// an operation id, so it moves the stock at most once and an uncertain answer is read back.
///
/// # Errors
/// [`Refusal::UnknownSku`], [`Refusal::InsufficientStock`], or infrastructure errors.
pub async fn restock(
    store: &Store,
    catalog: &Catalog,
    sku: &str,
    delta: i64,
) -> Result<SkuView, InventoryError> {
    let db = catalog.db();
    let keys = store.keys(sku);
    let mut con = store.hot();
    let op = uuid::Uuid::now_v7();
    let mut tx = db.begin().await?;
    let total: Option<i64> = sqlx::query_scalar("SELECT total FROM skus WHERE sku = $1 FOR UPDATE")
        .bind(sku)
        .fetch_optional(&mut *tx)
        .await?;
    let total = total.ok_or(InventoryError::Refused(Refusal::UnknownSku))?;
    if total + delta < 0 {
        return Err(InventoryError::Refused(Refusal::InsufficientStock));
    }
    if delta >= 0 {
        add_total(&mut tx, sku, delta).await?;
        tx.commit().await?;
        match scripts::restock(&mut con, &keys, &op, delta, store.timeout()).await {
            Ok(Restocked::Applied(_)) => {}
            outcome => {
                // Redis did not (and now cannot) take the units: take them off the total again.
                let undo = add_total(&mut *db.acquire().await?, sku, -delta).await;
                if undo.is_err() || !matches!(outcome, Ok(Restocked::NotApplied)) {
                    tracing::error!(
                        sku,
                        delta,
                        "restock half done: total grown, stock unknown; run reconcile"
                    );
                }
                return Err(outcome.err().unwrap_or(StoreError::Timeout).into());
            }
        }
    } else {
        match scripts::restock(&mut con, &keys, &op, delta, store.timeout()).await? {
            Restocked::Applied(_) => {}
            Restocked::Refused => return Err(InventoryError::Refused(Refusal::InsufficientStock)),
            Restocked::NotApplied => return Err(StoreError::Timeout.into()),
        }
        let committed = async {
            add_total(&mut tx, sku, delta).await?;
            tx.commit().await
        }
        .await;
        if let Err(e) = committed {
            // The stock shrank and the total did not: give the stock back (a new operation).
            let back = uuid::Uuid::now_v7();
            if scripts::restock(&mut con, &keys, &back, -delta, store.timeout())
                .await
                .is_err()
            {
                tracing::error!(
                    sku,
                    delta,
                    "restock could not be undone in Redis; run reconcile"
                );
            }
            return Err(e.into());
        }
    }
    catalog.load(sku).await?;
    view(store, catalog, sku).await
}

async fn add_total(db: &mut sqlx::PgConnection, sku: &str, delta: i64) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE skus SET total = total + $2, updated_at = now() WHERE sku = $1")
        .bind(sku)
        .bind(delta)
        .execute(db)
        .await
        .map(|_| ())
}

/// Rebuilds the SKU's Redis state from the ledger.
///
/// # Errors
/// [`Refusal::StatePresent`] when Redis holds the SKU and `force` is off, or infrastructure
/// errors.
pub async fn restore(
    store: &Store,
    catalog: &Catalog,
    sku: &str,
    force: bool,
) -> Result<SkuView, InventoryError> {
    let db = catalog.db();
    let mut tx = db.begin().await?;
    // One restore per SKU at a time, across gateways.
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('dropgate.restore.' || $1))")
        .bind(sku)
        .execute(&mut *tx)
        .await?;
    let row: Sku = sqlx::query_as(
        "SELECT sku, total, per_user_limit, hold_seconds, seeded FROM skus WHERE sku = $1",
    )
    .bind(sku)
    .fetch_optional(&mut *tx)
    .await?
    .ok_or(InventoryError::Refused(Refusal::UnknownSku))?;
    let keys = store.keys(sku);
    let mut con = store.hot();
    let present: bool = store
        .bounded(async { Ok(con.exists::<_, bool>(keys.state()).await?) })
        .await?;
    if present && !force {
        return Err(InventoryError::Refused(Refusal::StatePresent));
    }
    if present {
        // Close the SKU first (claims fail closed), so the ledger stops moving under us.
        store
            .bounded(async { Ok(con.del::<_, ()>(keys.state()).await?) })
            .await?;
    }
    // Winners decided before the close must be in the ledger before it is read, or their units
    // would be counted nowhere (and sold again).
    wait_for_empty_journal(store, &keys).await?;
    let live = live_claims(&mut tx, sku).await?;
    // Idempotency records first: the state hash appears last, so no claim is decided before a
    // retry of a live claim would replay.
    let mut pipe = redis::pipe();
    let mut held: std::collections::BTreeMap<&str, i64> = Default::default();
    let mut units = 0i64;
    let mut records = 0usize;
    for c in &live {
        units += c.quantity;
        *held.entry(c.user_id.as_str()).or_default() += c.quantity;
        if let Some(k) = &c.idempotency_key {
            let record = ClaimRecord::render(
                &c.claim_id,
                c.quantity,
                c.created_at.timestamp_millis(),
                c.remaining_after.unwrap_or(0),
                &c.user_id,
                k,
            );
            pipe.set_ex(keys.idempotency(&c.user_id, k), record, RECORD_TTL_SECS)
                .ignore();
            records += 1;
        }
    }
    if records > 0 {
        store
            .bounded(async { Ok(pipe.query_async::<()>(&mut con).await?) })
            .await?;
    }
    let mut inv = SCRIPTS.restore_sku.prepare_invoke();
    inv.key(keys.state())
        .key(keys.users())
        .key(keys.journal())
        .arg(row.total - units)
        .arg(row.per_user_limit);
    for (user, n) in &held {
        inv.arg(*user).arg(*n);
    }
    let applied: i64 = store
        .bounded(async { Ok(inv.invoke_async(&mut con).await?) })
        .await?;
    if applied != 1 {
        return Err(InventoryError::Refused(Refusal::StatePresent));
    }
    sqlx::query("UPDATE skus SET seeded = true WHERE sku = $1")
        .bind(sku)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    tracing::info!(
        sku,
        units,
        users = held.len(),
        force,
        "restored the SKU's Redis state from the ledger"
    );
    view(store, catalog, sku).await
}

/// How long a restore waits for the writer to empty the SKU's journal.
const JOURNAL_DRAIN_LIMIT: std::time::Duration = std::time::Duration::from_secs(15);

async fn wait_for_empty_journal(
    store: &Store,
    keys: &crate::keys::SkuKeys,
) -> Result<(), StoreError> {
    let deadline = tokio::time::Instant::now() + JOURNAL_DRAIN_LIMIT;
    loop {
        let mut con = store.hot();
        let len: i64 = store
            .bounded(async { Ok(con.xlen(keys.journal()).await?) })
            .await?;
        if len == 0 {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            tracing::warn!(
                journal = len,
                "restore gave up waiting for the writer; the SKU stays closed"
            );
            return Err(StoreError::Unavailable(format!(
                "{len} winners not yet written"
            )));
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[derive(sqlx::FromRow)]
struct LiveClaim {
    claim_id: uuid::Uuid,
    user_id: String,
    quantity: i64,
    idempotency_key: Option<String>,
    remaining_after: Option<i64>,
    created_at: chrono::DateTime<chrono::Utc>,
}

/// Claims that hold units: written and live, or refused and not yet compensated.
async fn live_claims(
    tx: &mut sqlx::PgConnection,
    sku: &str,
) -> Result<Vec<LiveClaim>, sqlx::Error> {
    sqlx::query_as(
        "SELECT claim_id, user_id, quantity::bigint AS quantity, idempotency_key, remaining_after, created_at
           FROM issuances WHERE sku = $1 AND status IN ('issued', 'held', 'confirmed')
         UNION ALL
         SELECT claim_id, user_id, quantity::bigint, idempotency_key, remaining_after, created_at
           FROM persistence_pending WHERE sku = $1 AND status IN ('pending', 'reprocessing')",
    )
    .bind(sku)
    .fetch_all(tx)
    .await
}
