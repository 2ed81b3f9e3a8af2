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
///
/// A lock is no fence: a holder whose connection was cut has lost it without knowing. So each
/// holder also takes the SKU's next operator epoch before its first Redis step, and every
/// Redis step of the action carries it: a state a newer action has touched refuses an older
/// one. The epoch is taken then, not with the lock, so an action refused before it touches
/// Redis (a restock below zero, a restore while the state is present) leaves the catalog row
/// as it was (schemathesis found refusals moving it; tests/api/findings.rs).
pub struct SkuLock {
    /// The session holding the advisory lock; the epoch is taken on it too.
    con: PoolConnection<Postgres>,
    sku: String,
    /// This action's operator epoch once taken (0 when the SKU has no catalog row yet).
    epoch: Option<i64>,
}

impl SkuLock {
    /// # Errors
    /// The database error.
    pub async fn acquire(db: &PgPool, sku: &str) -> Result<SkuLock, DbError> {
        Self::take(db, sku, true)
            .await?
            .ok_or_else(|| DbError::from(sqlx::Error::RowNotFound))
    }

    /// The lock if it is free now (`None` when another action holds it): for background work
    /// that must not queue behind an operator.
    ///
    /// # Errors
    /// The database error.
    pub async fn try_acquire(db: &PgPool, sku: &str) -> Result<Option<SkuLock>, DbError> {
        Self::take(db, sku, false).await
    }

    async fn take(db: &PgPool, sku: &str, wait: bool) -> Result<Option<SkuLock>, DbError> {
        let mut con = db.acquire().await?;
        con.close_on_drop();
        let sql = if wait {
            "SELECT true FROM pg_advisory_lock(hashtext('dropgate.sku.' || $1))"
        } else {
            "SELECT pg_try_advisory_lock(hashtext('dropgate.sku.' || $1))"
        };
        let taken: bool = sqlx::query_scalar(sql)
            .bind(sku)
            .fetch_one(&mut *con)
            .await?;
        if !taken {
            return Ok(None);
        }
        Ok(Some(SkuLock {
            con,
            sku: sku.to_string(),
            epoch: None,
        }))
    }

    /// This action's operator epoch: the SKU's next one, taken on the first call.
    ///
    /// # Errors
    /// The database error.
    pub async fn epoch(&mut self) -> Result<i64, DbError> {
        if let Some(e) = self.epoch {
            return Ok(e);
        }
        let taken: Option<i64> = sqlx::query_scalar(
            "UPDATE skus SET op_epoch = op_epoch + 1 WHERE sku = $1 RETURNING op_epoch",
        )
        .bind(&self.sku)
        .fetch_optional(&mut *self.con)
        .await?;
        let e = taken.unwrap_or(0);
        self.epoch = Some(e);
        Ok(e)
    }
}

/// What a declare sets besides the total (and may change on an existing SKU).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkuTerms {
    pub per_user_limit: i32,
    pub hold_seconds: i32,
    /// 0: offers are held `hold_seconds` (see [`scripts::Terms::of`]).
    pub offer_seconds: i32,
    pub opens_at: Option<chrono::DateTime<chrono::Utc>>,
    pub closes_at: Option<chrono::DateTime<chrono::Utc>>,
    /// Redis shards (1..=16, see [`crate::shards`]); fixed at the first declare: another count
    /// later is refused like another total.
    pub shards: i32,
    /// The waiting room's settings; `None` leaves a SKU's queue as it is (a queue, once
    /// declared, stays: its visitors hold tickets).
    pub queue: Option<QueueTerms>,
}

/// The `queue` of a declare (validated by the HTTP layer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueTerms {
    pub admit_per_second: i32,
    pub admission_ttl_seconds: i32,
    pub prequeue_from: Option<chrono::DateTime<chrono::Utc>>,
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
    terms: &SkuTerms,
) -> Result<Declaration, InventoryError> {
    let db = catalog.db();
    let _lock = SkuLock::acquire(db, sku).await?;
    // The shards' placement is chosen only for a SKU the catalog does not hold yet, and
    // written by the INSERT that creates its row: a re-declare, or a second gateway declaring
    // the same SKU with another view of the cluster, reads the first row's salts back below.
    let layout = if catalog::fetch(db, sku).await?.is_none() {
        crate::shards::placement::for_new_sku(store, sku, terms.shards).await
    } else {
        crate::shards::Layout::unsalted(terms.shards)
    };
    let inserted = sqlx::query(
        "INSERT INTO skus (sku, total, per_user_limit, hold_seconds, offer_seconds, opens_at,
                           closes_at, shards, shard_salts)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
         ON CONFLICT (sku) DO NOTHING",
    )
    .bind(sku)
    .bind(total)
    .bind(terms.per_user_limit)
    .bind(terms.hold_seconds)
    .bind(terms.offer_seconds)
    .bind(terms.opens_at)
    .bind(terms.closes_at)
    .bind(terms.shards)
    .bind(layout.stored_salts())
    .execute(db)
    .await?
    .rows_affected()
        == 1;
    let row = catalog::fetch(db, sku)
        .await?
        .ok_or(InventoryError::Refused(Refusal::UnknownSku))?;
    if !inserted {
        if row.total != total || row.layout.count() != terms.shards {
            return Err(InventoryError::Refused(Refusal::SkuExists));
        }
        sqlx::query(
            "UPDATE skus SET per_user_limit = $2, hold_seconds = $3, offer_seconds = $4,
                    opens_at = $5, closes_at = $6, updated_at = now()
             WHERE sku = $1",
        )
        .bind(sku)
        .bind(terms.per_user_limit)
        .bind(terms.hold_seconds)
        .bind(terms.offer_seconds)
        .bind(terms.opens_at)
        .bind(terms.closes_at)
        .execute(db)
        .await?;
    }
    if let Some(q) = &terms.queue {
        // The seed is chosen once, by the first declare with a queue, and never replaced: its
        // commitment is public from then on (docs/waiting-room.md).
        sqlx::query(
            "UPDATE skus SET queue_admit_per_second = $2, queue_admission_ttl_seconds = $3,
                    queue_prequeue_from = $4, queue_seed = COALESCE(queue_seed, $5)
             WHERE sku = $1",
        )
        .bind(sku)
        .bind(q.admit_per_second)
        .bind(q.admission_ttl_seconds)
        .bind(q.prequeue_from)
        .bind(crate::queue::order::new_seed())
        .execute(db)
        .await?;
    }
    let row = catalog::fetch(db, sku)
        .await?
        .ok_or(InventoryError::Refused(Refusal::UnknownSku))?;
    let seed = !row.seeded && row.redis_seq == 0 && !ledger_has_claims(db, sku).await?;
    let mut con = store.hot();
    // Each shard is seeded (or updated) as a SKU of its own: the total split evenly, the
    // remainder to the lowest shards, each shard's sequence in its own range. One shard found
    // holding a state stamped by another declare refuses the whole declare.
    let mut declared = Declared::Seeded;
    let parts = crate::shards::split_total(total, row.layout.count());
    for (i, part) in parts.into_iter().enumerate() {
        let shard = i as u16;
        let keys = store.keys(&row.layout.name(sku, shard));
        // A lost answer is safe to send again: the seed is stamped with the row's declare id,
        // so a second send finds its own seed and changes nothing.
        let one = store
            .bounded(scripts::declare_shard(
                &mut con,
                &keys,
                seed,
                part,
                &scripts::Terms::of(&row),
                &row.declare_id,
                crate::shards::seq_base(shard),
            ))
            .await?;
        declared = match (declared, one) {
            (Declared::Foreign, _) | (_, Declared::Foreign) => Declared::Foreign,
            (Declared::Lost, _) | (_, Declared::Lost) => Declared::Lost,
            (Declared::AlreadyPresent, _) | (_, Declared::AlreadyPresent) => {
                Declared::AlreadyPresent
            }
            _ => Declared::Seeded,
        };
    }
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
    if let Some(q) = &row.queue.0 {
        let keys = store.keys(sku);
        store
            .bounded(crate::queue::calls::configure(
                &mut con,
                &keys,
                q.admit_per_second,
                q.admission_ttl_seconds,
                q.prequeue_from.map_or(0, |t| t.timestamp_millis()),
            ))
            .await?;
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
/// The operation is written to `restock_ops` before its Redis step and finished after it, so
/// one whose answer was lost, or whose gateway died, is settled later by reading Redis back
/// (never by sending it again): by the next restock or restore of the SKU, or by the periodic
/// sweep ([`settle_stuck_restocks`]). The stores move in the order that can only undersell in
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
    sku: &str,
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
        tracing::warn!(sku, delta, %op, "restock outcome unknown; it is settled by reading back later");
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
async fn below_zero(store: &Store, sku: &str, delta: i64) -> bool {
    let keys = store.keys(sku);
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
    sku: &str,
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
    sku: &str,
    op: &Uuid,
    delta: i64,
    epoch: i64,
    floor: i64,
) -> Result<Restocked, StoreError> {
    match restock_call(store, sku, op, delta, RestockMode::Apply, epoch, floor).await {
        Err(e) if e.is_uncertain() => read_back_restock(store, sku, op, delta, epoch).await,
        other => other,
    }
}

async fn read_back_restock(
    store: &Store,
    sku: &str,
    op: &Uuid,
    delta: i64,
    epoch: i64,
) -> Result<Restocked, StoreError> {
    let deadline = tokio::time::Instant::now() + SETTLE_LIMIT;
    loop {
        match restock_call(store, sku, op, delta, RestockMode::Resolve, epoch, 0).await {
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

async fn restock_call(
    store: &Store,
    sku: &str,
    op: &Uuid,
    delta: i64,
    mode: RestockMode,
    epoch: i64,
    floor: i64,
) -> Result<Restocked, StoreError> {
    let keys = store.keys(sku);
    let mut con = store.hot();
    // Units added go to the waitlist's head as offers first: journal entries and holds.
    // The catalog row's mark, or a later one this gateway knows, with the incarnation.
    let mut fence = store.floor(sku);
    fence.seq = fence.seq.max(floor);
    let call = store.bounded(scripts::restock_at(
        &mut con, &keys, op, delta, mode, epoch, fence,
    ));
    crate::activity::with_mark(store, sku, call).await
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
    sku: &str,
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
        tracing::info!(sku, %op, delta, ?outcome, "a pending restock settled by reading back");
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
        let Some(mut lock) = SkuLock::try_acquire(db, &sku).await? else {
            continue;
        };
        if let Err(e) = settle_restocks(store, db, &sku, &mut lock, STUCK_AFTER).await {
            tracing::warn!(sku, error = %e, "pending restocks still unknown; retrying later");
        }
    }
    Ok(())
}

/// Adds `delta` to the total and raises the SKU's high-water mark to `seq`.
async fn add_total(
    db: &mut sqlx::PgConnection,
    sku: &str,
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
