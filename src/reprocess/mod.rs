//! The reprocessing loop: retries claims PostgreSQL refused, and compensates them after the
//! last attempt.
//!
//! Exactly once, even with several gateways: a row is taken with a lease (owner token, expiry)
//! by a compare-and-set on its status; every later update names the owner, so a reprocessor
//! whose lease ran out changes nothing; and the Redis side of a compensation is guarded by a
//! per-claim marker set in the same script, so even a stale owner cannot give units back twice.
//!
//! A compensation is recorded before it is given: the claim's `issuances` row is written
//! with status `compensated` first (see `rows.rs`), so a writer that still holds the claim's
//! journal entry can never record it as live afterwards. Only a refusal of the row itself
//! (SQLSTATE class 22, 23, or a trigger's P0001) spends an attempt; a lock timeout, a
//! deadlock or a lost connection puts the row back as it was.

use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::config::REPROCESS_BACKOFF_CAP;
use crate::error::{DbError, StoreError, TaskError};
use crate::keys::SkuKeys;
use crate::metrics as m;
use crate::scripts::lifecycle::{fence_parked, give_back_parked, GiveBack, Parked};
use crate::sku::SkuId;
use crate::status::ClaimStatus;
use crate::store::Store;

mod rows;

use rows::{Decision, Written};

const TICK: Duration = Duration::from_millis(100);
/// A lease outlives any one attempt by far; after it, another reprocessor may take the row.
const LEASE_SECS: f64 = 30.0;
const BATCH: i64 = 64;
const MARKER_TTL_SECS: u64 = crate::keys::COMPENSATION_MARKER_TTL_SECS;

#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct PendingRow {
    claim_id: Uuid,
    sku: String,
    user_id: String,
    quantity: i32,
    idempotency_key: Option<String>,
    remaining_after: Option<i64>,
    created_at: chrono::DateTime<chrono::Utc>,
    attempts: i32,
    /// The state sequence the claim produced (kept with its row; see [`crate::freshness`]).
    seq: Option<i64>,
    expires_at: Option<chrono::DateTime<chrono::Utc>>,
    /// A waitlist offer (its creation event is `waitlist.offered`).
    offer: bool,
    /// A seated claim's seat ids (`None` on a SKU sold by count): written with the row, freed
    /// with its units.
    seats: Option<Vec<String>>,
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
                        p.remaining_after, p.created_at, p.attempts, p.seq, p.expires_at,
                        p.offer, p.seats",
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

    async fn work(&self, row: &PendingRow) -> Result<(), TaskError> {
        let attempt = row.attempts + 1;
        if !self.fence(row).await? {
            // Given back by an earlier owner whose PostgreSQL update did not land.
            return self
                .finish_compensation(row, row.attempts, None, None)
                .await;
        }
        let reason = match rows::write(&self.db, row, self.owner).await {
            Ok(Written::Live) => {
                tracing::info!(claim_id = %row.claim_id, attempt, "parked claim written");
                return Ok(());
            }
            Ok(Written::LeaseLost) => return Ok(()),
            // An earlier owner decided and could not give the units back yet: finish that.
            Ok(Written::Compensating) => return self.give_back(row, row.attempts, None).await,
            // A lock held by an operator, a timeout, a lost connection: nothing about this
            // claim, so it spends no attempt (a long lock must not compensate winners).
            Err(e) if !e.refuses_row() => return self.postpone(row, &e).await,
            Err(e) => e.to_string(),
        };
        if attempt as u32 >= self.max_attempts {
            return self.compensate(row, attempt, &reason).await;
        }
        rows::reschedule(
            &self.db,
            row,
            self.owner,
            attempt,
            &reason,
            self.delay(attempt),
        )
        .await?;
        Ok(())
    }

    /// After the last attempt: the decision is recorded in PostgreSQL first (so no writer can
    /// record the claim as live after it), then the units go back, then the row is closed.
    async fn compensate(
        &self,
        row: &PendingRow,
        attempt: i32,
        reason: &str,
    ) -> Result<(), TaskError> {
        match rows::decide_compensation(&self.db, row, self.owner, attempt, reason).await? {
            Decision::Compensate => {}
            Decision::CompensateUnrecorded(e) => {
                tracing::warn!(claim_id = %row.claim_id, error = %e, "issuances refused the compensated row too; persistence_pending alone records the compensation");
            }
            Decision::AlreadyLive => {
                tracing::info!(claim_id = %row.claim_id, "parked claim was written meanwhile; nothing to compensate");
                return Ok(());
            }
            Decision::LeaseLost => return Ok(()),
        }
        self.give_back(row, attempt, Some(reason)).await
    }

    /// Gives the claim's units back in Redis (once, and only as the owner that fenced it
    /// last), then closes the parked row with `attempts` spent (and `reason`, when new).
    async fn give_back(
        &self,
        row: &PendingRow,
        attempts: i32,
        reason: Option<&str>,
    ) -> Result<(), TaskError> {
        // The hold's status when its units went back, as Redis had it.
        let ended = match self.give(row).await? {
            GiveBack::Given { confirmed } => {
                m::compensated(i64::from(row.quantity));
                tracing::warn!(claim_id = %row.claim_id, sku = %row.sku, units = row.quantity,
                    attempts, "claim compensated after its last attempt");
                confirmed.then_some(ClaimStatus::Confirmed)
            }
            // A hold that had already ended: its units came back then.
            GiveBack::HoldEnded(status) => Some(status),
            GiveBack::Already => None,
            GiveBack::Superseded => return Ok(()),
        };
        self.finish_compensation(row, attempts, reason, ended).await
    }

    async fn finish_compensation(
        &self,
        row: &PendingRow,
        attempts: i32,
        reason: Option<&str>,
        ended: Option<ClaimStatus>,
    ) -> Result<(), TaskError> {
        let live =
            rows::mark_compensated(&self.db, row, self.owner, attempts, reason, ended).await?;
        if let Some(status) = live {
            // Only a compensation given back before decisions were recorded first can get
            // here; the view shows the mismatch and an operator settles the claim.
            tracing::error!(claim_id = %row.claim_id, sku = %row.sku, status = %status,
                "claim is recorded as live and was also compensated; an operator must settle it");
        }
        Ok(())
    }

    /// The wait after the `attempt`-th attempt: the backoff, doubled per attempt, capped.
    fn delay(&self, attempt: i32) -> Duration {
        crate::pace::nth_retry(
            self.backoff,
            REPROCESS_BACKOFF_CAP,
            u32::try_from(attempt).unwrap_or(1),
        )
    }

    /// Puts the row back without spending an attempt, after a failure that was not about it.
    async fn postpone(&self, row: &PendingRow, e: &DbError) -> Result<(), TaskError> {
        if e.is_retryable() {
            tracing::warn!(claim_id = %row.claim_id, error = %e, "parked claim not written this time; retrying without spending an attempt");
        } else {
            tracing::error!(claim_id = %row.claim_id, error = %e, "parked claim cannot be written until an operator fixes the database; retrying without spending an attempt");
        }
        let delay = self.delay(row.attempts.max(1));
        rows::reschedule(
            &self.db,
            row,
            self.owner,
            row.attempts,
            &e.to_string(),
            delay,
        )
        .await?;
        Ok(())
    }

    /// Fences the claim for this process's token (compensate.lua, "fence") on the buyer's
    /// shard. Returns `false` when it is compensated already.
    async fn fence(&self, row: &PendingRow) -> Result<bool, StoreError> {
        let (name, keys) = self.home(row).await?;
        let floor = self.store.floor(&name);
        let mut con = self.store.hot();
        let call = self.store.bounded(fence_parked(
            &mut con,
            &keys,
            parked(row, &[]),
            &self.owner,
            MARKER_TTL_SECS,
            floor,
        ));
        crate::activity::with_mark(&self.store, &name, call).await
    }

    /// Gives the claim's units back (compensate.lua, "give") on the buyer's shard, as the
    /// owner that fenced it last.
    async fn give(&self, row: &PendingRow) -> Result<GiveBack, StoreError> {
        let (name, keys) = self.home(row).await?;
        let bits = self.seat_bits(row).await?;
        let floor = self.store.floor(&name);
        let mut con = self.store.hot();
        // A compensation gives units back, maybe as an offer to the waitlist's head: a journal
        // entry and a hold on a SKU that may have left the active set long ago.
        let call = self.store.bounded(give_back_parked(
            &mut con,
            &keys,
            parked(row, &bits),
            &self.owner,
            MARKER_TTL_SECS,
            floor,
        ));
        // The mark names the shard the units go back to, whose journal and holds they are.
        crate::activity::with_mark(&self.store, &name, call).await
    }

    /// A seated claim's seats as bits of its SKU's map (the plan read from the catalog row:
    /// a compensation is rare), empty for a claim without seats.
    async fn seat_bits(&self, row: &PendingRow) -> Result<Vec<u32>, StoreError> {
        let Some(seats) = row.seats.as_ref().filter(|s| !s.is_empty()) else {
            return Ok(Vec::new());
        };
        let unavailable = |e: String| StoreError::Unavailable(format!("seat plan: {e}"));
        let plan: Option<String> = sqlx::query_scalar("SELECT seats FROM skus WHERE sku = $1")
            .bind(&row.sku)
            .fetch_one(&self.db)
            .await
            .map_err(|e| unavailable(e.to_string()))?;
        let plan = plan
            .as_deref()
            .map(serde_json::from_str::<serde_json::Value>)
            .transpose()
            .map_err(|e| unavailable(e.to_string()))?
            .map(|v| crate::seating::SeatPlan::parse(&v))
            .transpose()
            .map_err(|e| unavailable(e.to_string()))?
            .ok_or_else(|| unavailable("a claim with seats on a SKU without a plan".into()))?;
        seats
            .iter()
            .map(|s| plan.bit_of(s).map_err(|e| unavailable(e.to_string())))
            .collect()
    }

    /// The Redis name of the claim's shard and its keys: its units and its buyer's count are
    /// in the buyer's shard (src/shards/).
    async fn home(&self, row: &PendingRow) -> Result<(String, SkuKeys), StoreError> {
        // A parked row names a declared SKU.
        let sku = SkuId::trusted(&row.sku);
        let layout = crate::shards::layout(&self.db, sku)
            .await
            .map_err(|e| StoreError::Unavailable(format!("catalog: {e}")))?;
        let name = layout.name_for_user(sku, &row.user_id);
        let keys = self.store.keys(&name);
        Ok((name, keys))
    }
}

/// A parked row as compensate.lua takes it.
fn parked<'a>(row: &'a PendingRow, seat_bits: &'a [u32]) -> Parked<'a> {
    Parked {
        claim_id: row.claim_id,
        user: &row.user_id,
        quantity: row.quantity,
        idempotency_key: row.idempotency_key.as_deref(),
        seat_bits,
    }
}
