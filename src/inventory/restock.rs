//! Restock: an operator's delta on a SKU's total and stock, written down before its Redis step
//! and settled by reading back when its answer is lost (never sent twice), now or by the
//! [`RestockSweeper`].

use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::SkuLock;
use crate::catalog::{self, Catalog};
use crate::error::{DbError, InventoryError, Refusal, StoreError};
// Answered while this action holds the SKU's operator lock: the view must not wait for it.
use crate::ledger::{view_under_lock as view, SkuView};
use crate::scripts::{self, RestockMode, Restocked};
use crate::sku::SkuId;
use crate::store::Store;

/// How long an operator action keeps reading back a Redis step whose answer was lost before it
/// answers 503 `outcome_unknown` and leaves the rest to a background task.
const SETTLE_LIMIT: Duration = Duration::from_secs(5);
const SETTLE_PAUSE: Duration = Duration::from_millis(100);

/// Adds `delta` to the total and to the remaining stock.
///
/// The operation is written to `restock_ops` before its Redis step and finished after it, so
/// one whose answer was lost, or whose gateway died, is settled later by reading Redis back
/// (never by sending it again): by the next restock or restore of the SKU, or by the periodic
/// sweep ([`RestockSweeper`]). The stores move in the order that can only undersell in
/// between: a positive delta grows the total first, then the stock; a negative one shrinks the
/// stock first (where the "not below 0" check lives), then the total.
///
/// # Errors
/// [`Refusal::UnknownSku`], [`Refusal::InsufficientStock`], or infrastructure errors
/// ([`StoreError::Timeout`] when the Redis step's outcome is not known yet: it is settled
/// later, and the answer is 503 `outcome_unknown`).
pub async fn restock(
    store: &Store,
    catalog: &Catalog,
    sku: &SkuId,
    delta: i64,
) -> Result<SkuView, InventoryError> {
    let db = catalog.db();
    let mut lock = SkuLock::acquire(db, sku).await?;
    settle_restocks(store, db, sku, &mut lock, Duration::ZERO).await?;
    let row = catalog::fetch(db, sku)
        .await?
        .ok_or(InventoryError::Refused(Refusal::UnknownSku))?;
    let (total, floor, layout) = (row.total, row.redis_seq, row.layout);
    // A negative delta is one step on shard 0 (src/shards/): first bring it the units the
    // other shards hold, so a SKU is restocked down as far as its whole stock allows.
    if delta < 0 && layout.is_sharded() && total + delta >= 0 && below_zero(store, sku, delta).await
    {
        crate::shards::borrow::gather(store, sku, layout, 0, -delta).await?;
    }
    if total + delta < 0 || (delta < 0 && below_zero(store, sku, delta).await) {
        return Err(InventoryError::Refused(Refusal::InsufficientStock));
    }
    let epoch = lock.epoch().await?;
    let op = Uuid::now_v7();
    let mut tx = db.begin().await?;
    sqlx::query("INSERT INTO restock_ops (op_id, sku, delta) VALUES ($1, $2, $3)")
        .bind(op)
        .bind(sku)
        .bind(delta)
        .execute(&mut *tx)
        .await?;
    if delta > 0 {
        add_total(&mut tx, sku, delta, 0).await?;
    }
    tx.commit().await?;
    let outcome = apply_restock(store, sku, &op, delta, epoch, floor).await;
    if matches!(&outcome, Err(e) if e.is_uncertain()) {
        tracing::warn!(sku = sku.as_str(), delta, %op, "restock outcome unknown; it is settled by reading back later");
        return Err(StoreError::Timeout.into());
    }
    finish_restock(db, sku, &op, delta, &outcome).await?;
    match outcome {
        Ok(Restocked::Applied { .. }) => {}
        Ok(Restocked::Refused) => return Err(InventoryError::Refused(Refusal::InsufficientStock)),
        Ok(Restocked::NotApplied | Restocked::Superseded) => {
            return Err(StoreError::Unavailable("restock not applied; retry".into()).into())
        }
        // A positive delta stays in the total: the restore that brings the state back seeds
        // the stock from it.
        Err(StoreError::SkuLost | StoreError::Stale) if delta > 0 => {}
        Err(e) => return Err(e.into()),
    }
    catalog.load(sku).await?;
    view(store, catalog, sku).await
}

/// Whether the stock Redis holds now would go below zero: checked before anything is written,
/// so the common refusal moves nothing (schemathesis found it recording an operation and
/// taking an epoch; tests/api/findings.rs). The script checks again, since claims and
/// compensations move the stock meanwhile; a refusal only it sees is recorded `not_applied`.
/// A Redis that does not answer here tells nothing: the restock goes on, and its own step
/// meets the same Redis (answering `outcome_unknown` as before if that step is sent).
async fn below_zero(store: &Store, sku: &SkuId, delta: i64) -> bool {
    let keys = store.keys(sku.as_str());
    let mut con = store.hot();
    let stock: Option<i64> = store
        .bounded(async {
            Ok(redis::cmd("HGET")
                .arg(keys.state())
                .arg("stock")
                .query_async(&mut con)
                .await?)
        })
        .await
        .unwrap_or(None);
    stock.is_some_and(|s| s + delta < 0)
}

/// Moves PostgreSQL after a definite Redis answer, once per operation (the first finisher
/// wins): the state sequence an applied restock produced is recorded; a positive delta that
/// was not applied comes off the total again; a negative one that was applied comes off now.
async fn finish_restock(
    db: &PgPool,
    sku: &SkuId,
    op: &Uuid,
    delta: i64,
    outcome: &Result<Restocked, StoreError>,
) -> Result<(), DbError> {
    let (applied, seq) = match outcome {
        Ok(Restocked::Applied { seq, .. }) => (true, *seq),
        // A missing or stale state is rebuilt from the total by restore: a positive delta
        // already in the total counts as applied; a negative one never reached the stock.
        Err(StoreError::SkuLost | StoreError::Stale) => (delta > 0, 0),
        Ok(_) => (false, 0),
        Err(_) => return Ok(()),
    };
    let mut tx = db.begin().await?;
    let first = sqlx::query(
        "UPDATE restock_ops SET status = $2, updated_at = now()
          WHERE op_id = $1 AND status = 'pending'",
    )
    .bind(op)
    .bind(if applied { "applied" } else { "not_applied" })
    .execute(&mut *tx)
    .await?
    .rows_affected()
        == 1;
    if first {
        let change = match (applied, delta > 0) {
            (true, false) => delta,
            (false, true) => -delta,
            _ => 0,
        };
        add_total(&mut tx, sku, change, seq).await?;
    }
    tx.commit().await?;
    Ok(())
}

/// Applies a restock operation; when its answer is lost, reads it back (fencing it when it
/// has not happened) for up to [`SETTLE_LIMIT`].
async fn apply_restock(
    store: &Store,
    sku: &SkuId,
    op: &Uuid,
    delta: i64,
    epoch: i64,
    floor: i64,
) -> Result<Restocked, StoreError> {
    match restock_call(store, sku, op, delta, RestockMode::Apply, epoch, floor).await {
        Ok(r) if replicated(store, sku).await => Ok(r),
        // Not held by the replicas yet (a failover would take it away), or it may have run
        // without an answer: read back.
        Ok(_) => read_back_restock(store, sku, op, delta, epoch).await,
        Err(e) if store.may_have_run(&e) => read_back_restock(store, sku, op, delta, epoch).await,
        other => other,
    }
}

/// Whether the replicas hold what this gateway wrote on the SKU's node (always, without
/// replicas): an outcome, or a read-back's fence, holds only then.
async fn replicated(store: &Store, sku: &SkuId) -> bool {
    matches!(store.replicated(&store.keys(sku.as_str())).await, Ok(true))
}

async fn read_back_restock(
    store: &Store,
    sku: &SkuId,
    op: &Uuid,
    delta: i64,
    epoch: i64,
) -> Result<Restocked, StoreError> {
    let deadline = tokio::time::Instant::now() + SETTLE_LIMIT;
    loop {
        match restock_call(store, sku, op, delta, RestockMode::Resolve, epoch, 0).await {
            Ok(r) if replicated(store, sku).await => return Ok(r),
            Ok(_) => {}
            Err(e) if e.is_uncertain() || matches!(e, StoreError::Unavailable(_)) => {}
            other => return other,
        }
        if tokio::time::Instant::now() > deadline {
            return Err(StoreError::Timeout);
        }
        tokio::time::sleep(SETTLE_PAUSE).await;
    }
}

async fn restock_call(
    store: &Store,
    sku: &SkuId,
    op: &Uuid,
    delta: i64,
    mode: RestockMode,
    epoch: i64,
    floor: i64,
) -> Result<Restocked, StoreError> {
    let keys = store.keys(sku.as_str());
    let mut con = store.hot();
    // Units added go to the waitlist's head as offers first: journal entries and holds.
    // The catalog row's mark, or a later one this gateway knows, with the incarnation.
    let mut fence = store.floor(sku.as_str());
    fence.seq = fence.seq.max(floor);
    let call = store.bounded(scripts::restock_at(
        &mut con, &keys, op, delta, mode, epoch, fence,
    ));
    crate::activity::with_mark(store, sku.as_str(), call).await
}

/// Settles the SKU's restocks still pending (older than `min_age`) under the caller's lock:
/// each is read back in Redis (fenced when it never ran) and finished in PostgreSQL.
///
/// # Errors
/// [`StoreError::Timeout`] when one stays unknown (Redis does not answer): the caller must not
/// read the total meanwhile.
pub async fn settle_restocks(
    store: &Store,
    db: &PgPool,
    sku: &SkuId,
    lock: &mut SkuLock,
    min_age: Duration,
) -> Result<(), InventoryError> {
    let pending: Vec<(Uuid, i64)> = sqlx::query_as(
        "SELECT op_id, delta FROM restock_ops
          WHERE sku = $1 AND status = 'pending'
            AND created_at < now() - make_interval(secs => $2)
          ORDER BY created_at",
    )
    .bind(sku)
    .bind(min_age.as_secs_f64())
    .fetch_all(db)
    .await?;
    for (op, delta) in pending {
        let epoch = lock.epoch().await?;
        let outcome = read_back_restock(store, sku, &op, delta, epoch).await;
        if matches!(&outcome, Err(e) if e.is_uncertain()) {
            return Err(StoreError::Timeout.into());
        }
        tracing::info!(sku = sku.as_str(), %op, delta, ?outcome, "a pending restock settled by reading back");
        finish_restock(db, sku, &op, delta, &outcome).await?;
    }
    Ok(())
}

/// Restocks left pending (an answer lost, a gateway that died) longer than this are settled by
/// the periodic sweep.
const STUCK_AFTER: Duration = Duration::from_secs(5);

/// Settles restocks left pending on any SKU, each under the SKU's lock; run periodically.
///
/// # Errors
/// The database error listing them; a SKU that cannot be settled now is left for next time.
pub async fn settle_stuck_restocks(store: &Store, db: &PgPool) -> Result<(), DbError> {
    let skus: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT sku FROM restock_ops
          WHERE status = 'pending' AND created_at < now() - make_interval(secs => $1)",
    )
    .bind(STUCK_AFTER.as_secs_f64())
    .fetch_all(db)
    .await?;
    for sku in skus {
        // An operator action on the SKU settles them itself; never queue behind it.
        let id = SkuId::trusted(&sku);
        let Some(mut lock) = SkuLock::try_acquire(db, id).await? else {
            continue;
        };
        if let Err(e) = settle_restocks(store, db, id, &mut lock, STUCK_AFTER).await {
            tracing::warn!(sku, error = %e, "pending restocks still unknown; retrying later");
        }
    }
    Ok(())
}

/// How often a gateway looks for restocks left pending ([`settle_stuck_restocks`]).
const SWEEP: Duration = Duration::from_secs(1);

/// Finishes the restocks whose answer was lost, or whose gateway died, every [`SWEEP`]: every
/// gateway runs one (each SKU's are settled under its lock, so two sweepers never race).
pub struct RestockSweeper {
    pub store: Store,
    pub db: PgPool,
}

impl RestockSweeper {
    pub async fn run(self, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(SWEEP) => {}
                _ = shutdown.cancelled() => break,
            }
            if let Err(e) = settle_stuck_restocks(&self.store, &self.db).await {
                tracing::debug!(error = %e, "settling pending restocks failed; retrying");
            }
        }
        tracing::info!("restock sweeper stopped");
    }
}

/// Adds `delta` to the total and raises the SKU's high-water mark to `seq`.
async fn add_total(
    db: &mut sqlx::PgConnection,
    sku: &SkuId,
    delta: i64,
    seq: i64,
) -> Result<(), DbError> {
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
