//! The reprocessing loop: retries claims PostgreSQL refused, and compensates them after the
//! last attempt.
//!
//! Exactly once, even with several gateways: a row is taken with a lease (owner token, expiry)
//! by a compare-and-set on its status; every later update names the owner, so a reprocessor
//! whose lease ran out changes nothing; and the Redis side of a compensation is guarded by a
//! per-claim marker set in the same script, so even a stale owner cannot give units back twice.

use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::config::REPROCESS_BACKOFF_CAP;
use crate::error::{DbError, StoreError};
use crate::metrics as m;
use crate::scripts::SCRIPTS;
use crate::store::Store;

const TICK: Duration = Duration::from_millis(100);
/// A lease outlives any one attempt by far; after it, another reprocessor may take the row.
const LEASE_SECS: f64 = 30.0;
const BATCH: i64 = 64;
/// The compensation marker outlives any lease and any retry schedule.
const MARKER_TTL_SECS: u64 = 30 * 24 * 3600;

#[derive(Debug, Clone, sqlx::FromRow)]
struct PendingRow {
    claim_id: Uuid,
    sku: String,
    user_id: String,
    quantity: i32,
    idempotency_key: Option<String>,
    remaining_after: Option<i64>,
    created_at: chrono::DateTime<chrono::Utc>,
    attempts: i32,
}

pub struct Reprocessor {
    store: Store,
    db: PgPool,
    /// Owner token of this process's leases.
    owner: Uuid,
    max_attempts: u32,
    backoff: Duration,
}

impl Reprocessor {
    pub fn new(store: Store, db: PgPool, max_attempts: u32, backoff: Duration) -> Self {
        Reprocessor {
            store,
            db,
            owner: Uuid::new_v4(),
            max_attempts,
            backoff,
        }
    }

    pub async fn run(self, shutdown: CancellationToken) {
        loop {
            match self.round().await {
                Ok(n) if n > 0 => continue,
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "reprocessing round failed; retrying"),
            }
            tokio::select! {
                _ = tokio::time::sleep(TICK) => {}
                _ = shutdown.cancelled() => break,
            }
        }
        // Leases this process holds expire by themselves; nothing is half-done in PostgreSQL.
        tracing::info!(owner = %self.owner, "reprocessor stopped");
    }

    /// Takes the due rows and works each once. Returns how many were taken.
    async fn round(&self) -> Result<usize, DbError> {
        let rows: Vec<PendingRow> = sqlx::query_as(
            "UPDATE persistence_pending p
                SET status = 'reprocessing', lease_owner = $1,
                    lease_until = now() + make_interval(secs => $2), updated_at = now()
              WHERE p.claim_id IN (
                    SELECT claim_id FROM persistence_pending
                     WHERE (status = 'pending' AND next_attempt_at <= now())
                        OR (status = 'reprocessing' AND lease_until < now())
                     ORDER BY next_attempt_at
                     LIMIT $3
                     FOR UPDATE SKIP LOCKED)
              RETURNING p.claim_id, p.sku, p.user_id, p.quantity, p.idempotency_key,
                        p.remaining_after, p.created_at, p.attempts",
        )
        .bind(self.owner)
        .bind(LEASE_SECS)
        .bind(BATCH)
        .fetch_all(&self.db)
        .await?;
        for row in &rows {
            if let Err(e) = self.work(row).await {
                tracing::warn!(claim_id = %row.claim_id, error = %e, "reprocessing a parked claim failed; its lease will expire");
            }
        }
        let open: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM persistence_pending WHERE status IN ('pending', 'reprocessing')",
        )
        .fetch_one(&self.db)
        .await?;
        m::pending_rows(open);
        Ok(rows.len())
    }

    async fn work(&self, row: &PendingRow) -> Result<(), ReprocessError> {
        let attempt = row.attempts + 1;
        if self.marker(row, "fence").await? == 0 {
            // Compensated by an earlier owner whose PostgreSQL update did not land.
            return self
                .mark_compensated(row, attempt, "compensated earlier")
                .await;
        }
        let reason = match self.write(row).await {
            Ok(()) => {
                tracing::info!(claim_id = %row.claim_id, attempt, "parked claim written");
                return Ok(());
            }
            // A lock held by an operator, a timeout, a lost connection: nothing about this
            // claim, so it spends no attempt (a long lock must not compensate winners).
            Err(e) if !e.refuses_row() => return self.postpone(row, &e).await,
            Err(e) => e.to_string(),
        };
        if attempt as u32 >= self.max_attempts {
            return match self.marker(row, "give").await? {
                1 => {
                    m::compensated(i64::from(row.quantity));
                    tracing::warn!(claim_id = %row.claim_id, sku = %row.sku, units = row.quantity,
                        attempt, "claim compensated after its last attempt");
                    self.mark_compensated(row, attempt, &reason).await
                }
                0 => self.mark_compensated(row, attempt, &reason).await,
                -2 => Ok(()),
                _ => Err(StoreError::SkuLost.into()),
            };
        }
        let delay = self.delay(attempt);
        sqlx::query(
            "UPDATE persistence_pending
                SET status = 'pending', attempts = $3, failure_reason = $4, lease_owner = NULL,
                    lease_until = NULL, updated_at = now(),
                    next_attempt_at = now() + make_interval(secs => $5)
              WHERE claim_id = $1 AND lease_owner = $2 AND status = 'reprocessing'",
        )
        .bind(row.claim_id)
        .bind(self.owner)
        .bind(attempt)
        .bind(&reason)
        .bind(delay.as_secs_f64())
        .execute(&self.db)
        .await
        .map_err(DbError::from)?;
        Ok(())
    }

    /// The wait after the `attempt`-th attempt: the backoff, doubled per attempt, capped.
    fn delay(&self, attempt: i32) -> Duration {
        self.backoff
            .saturating_mul(1u32 << (attempt - 1).clamp(0, 20))
            .min(REPROCESS_BACKOFF_CAP)
    }

    /// Puts the row back without spending an attempt, after a failure that was not about it,
    /// and notes why. When even this update fails, the lease runs out and the row comes back.
    async fn postpone(&self, row: &PendingRow, e: &DbError) -> Result<(), ReprocessError> {
        if e.is_retryable() {
            tracing::warn!(claim_id = %row.claim_id, error = %e, "parked claim not written this time; retrying without spending an attempt");
        } else {
            tracing::error!(claim_id = %row.claim_id, error = %e, "parked claim cannot be written until an operator fixes the database; retrying without spending an attempt");
        }
        sqlx::query(
            "UPDATE persistence_pending
                SET status = 'pending', failure_reason = $3, lease_owner = NULL,
                    lease_until = NULL, updated_at = now(),
                    next_attempt_at = now() + make_interval(secs => $4)
              WHERE claim_id = $1 AND lease_owner = $2 AND status = 'reprocessing'",
        )
        .bind(row.claim_id)
        .bind(self.owner)
        .bind(e.to_string())
        .bind(self.delay(row.attempts.max(1)).as_secs_f64())
        .execute(&self.db)
        .await
        .map_err(DbError::from)?;
        Ok(())
    }

    /// Writes the claim to `issuances` and resolves the parked row, in one transaction that
    /// commits only while this process still owns the lease.
    async fn write(&self, row: &PendingRow) -> Result<(), DbError> {
        let mut tx = self.db.begin().await?;
        sqlx::query(
            "INSERT INTO issuances
               (claim_id, sku, user_id, quantity, idempotency_key, remaining_after, created_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (claim_id) DO NOTHING",
        )
        .bind(row.claim_id)
        .bind(&row.sku)
        .bind(&row.user_id)
        .bind(row.quantity)
        .bind(&row.idempotency_key)
        .bind(row.remaining_after)
        .bind(row.created_at)
        .execute(&mut *tx)
        .await?;
        let owned = sqlx::query(
            "UPDATE persistence_pending
                SET status = 'resolved', attempts = attempts + 1, lease_owner = NULL,
                    lease_until = NULL, updated_at = now()
              WHERE claim_id = $1 AND lease_owner = $2 AND status = 'reprocessing'",
        )
        .bind(row.claim_id)
        .bind(self.owner)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if owned == 1 {
            tx.commit().await?;
        }
        // Lease lost: the new owner decides; rolling back leaves no trace of this attempt.
        Ok(())
    }

    /// Runs compensate.lua in `mode` ("fence" or "give") for this process's token.
    async fn marker(&self, row: &PendingRow, mode: &str) -> Result<i64, StoreError> {
        let keys = self.store.keys(&row.sku);
        let marker = keys.compensation(&row.claim_id);
        let idem = match &row.idempotency_key {
            Some(k) => keys.idempotency(&row.user_id, k),
            None => marker.clone(),
        };
        let mut inv = SCRIPTS.compensate.prepare_invoke();
        inv.key(keys.state())
            .key(keys.users())
            .key(&marker)
            .key(idem)
            .arg(mode)
            .arg(self.owner.to_string())
            .arg(&row.user_id)
            .arg(row.quantity)
            .arg(row.claim_id.to_string())
            .arg(MARKER_TTL_SECS);
        let mut con = self.store.hot();
        self.store
            .bounded(async { Ok(inv.invoke_async(&mut con).await?) })
            .await
    }

    async fn mark_compensated(
        &self,
        row: &PendingRow,
        attempt: i32,
        reason: &str,
    ) -> Result<(), ReprocessError> {
        sqlx::query(
            "UPDATE persistence_pending
                SET status = 'compensated', attempts = $3, failure_reason = $4,
                    lease_owner = NULL, lease_until = NULL, updated_at = now()
              WHERE claim_id = $1 AND lease_owner = $2 AND status = 'reprocessing'",
        )
        .bind(row.claim_id)
        .bind(self.owner)
        .bind(attempt)
        .bind(reason)
        .execute(&self.db)
        .await
        .map_err(DbError::from)?;
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
enum ReprocessError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    Store(#[from] StoreError),
}
