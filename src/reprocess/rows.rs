//! The reprocessor's PostgreSQL side: each change to a parked row is one transaction that
//! commits only while this process still holds the row's lease.
//!
//! A compensation is decided here before Redis gives anything back: the claim's `issuances`
//! row is written with status `compensated`, in the transaction that records the last
//! attempt. From its commit on, a writer that read the claim's journal entry long ago and
//! writes it only now finds the row taken (`ON CONFLICT (claim_id) DO NOTHING`), so a
//! compensated claim is never recorded as live; and a writer that got there first is seen
//! here, and the claim is resolved instead of compensated.
//!
//! A parked claim has announced nothing yet: the transaction that writes it (or closes it as
//! compensated) records its life so far, in order: its creation with the status it won with
//! (`held` for a hold, an offer's as `waitlist.offered`), the change its hold went through
//! while parked (the writer keeps it in the parked row, under the row's lock), and its
//! compensation.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::PendingRow;
use crate::error::DbError;
use crate::outbox::{self, EventKind, NewEvent};
use crate::status::ClaimStatus;

/// Records the claim's event at `seq` in the caller's transaction (see [`crate::outbox`]);
/// `occurred_at` `None` is the transaction's time.
async fn event(
    tx: &mut PgConnection,
    row: &PendingRow,
    kind: EventKind,
    seq: i32,
    status: ClaimStatus,
    occurred_at: Option<DateTime<Utc>>,
) -> Result<(), DbError> {
    outbox::record(
        tx,
        &NewEvent {
            kind,
            seq,
            claim_id: row.claim_id,
            sku: &row.sku,
            user: &row.user_id,
            quantity: row.quantity,
            status,
            occurred_at,
        },
    )
    .await
}

/// A hold's change while parked: its status (confirmed, cancelled, expired) and, when the
/// writer recorded it, when it happened.
type ParkedChange = (ClaimStatus, Option<DateTime<Utc>>);

/// Records the parked claim's creation and the change of its hold while parked, if any.
/// Returns the sequence of the claim's next event.
async fn life_so_far(
    tx: &mut PgConnection,
    row: &PendingRow,
    change: Option<ParkedChange>,
) -> Result<i32, DbError> {
    let (kind, won_as) = match (row.offer, row.expires_at.is_some()) {
        (true, _) => (EventKind::Offered, ClaimStatus::Held),
        (false, true) => (EventKind::Won, ClaimStatus::Held),
        (false, false) => (EventKind::Won, ClaimStatus::Issued),
    };
    event(tx, row, kind, 1, won_as, Some(row.created_at)).await?;
    let Some((status, at)) = change else {
        return Ok(2);
    };
    let Some(kind) = EventKind::of_change(status) else {
        return Ok(2);
    };
    event(tx, row, kind, 2, status, at).await?;
    Ok(3)
}

/// The parked row's lifecycle as it is now, under the row's lock (the writer applies a hold's
/// change under the same lock); `None` when the lease is no longer this owner's.
async fn lock_owned(
    tx: &mut PgConnection,
    row: &PendingRow,
    owner: Uuid,
) -> Result<Option<ParkedChange>, DbError> {
    Ok(sqlx::query_as(
        "SELECT claim_status, claim_status_at FROM persistence_pending
          WHERE claim_id = $1 AND lease_owner = $2 AND status = 'reprocessing' FOR UPDATE",
    )
    .bind(row.claim_id)
    .bind(owner)
    .fetch_optional(tx)
    .await?)
}

/// What writing a parked claim to `issuances` found.
#[derive(Debug, PartialEq, Eq)]
pub enum Written {
    /// The claim is in `issuances` as a live claim (now, or by a writer earlier); the parked
    /// row is resolved.
    Live,
    /// An earlier owner decided to compensate the claim: only the giving back is left.
    Compensating,
    /// The lease ran out: the new owner decides; nothing changed.
    LeaseLost,
}

/// What recording the decision to compensate found.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Recorded (or recorded before): the units may be given back.
    Compensate,
    /// `issuances` refused even the compensated row (the same refusal keeps a late writer's
    /// live row out; the writer also skips every claim parked in `persistence_pending`).
    CompensateUnrecorded(String),
    /// The claim was written as a live claim meanwhile: nothing must be given back.
    AlreadyLive,
    LeaseLost,
}

const INSERT: &str = "INSERT INTO issuances
       (claim_id, sku, user_id, quantity, idempotency_key, remaining_after, created_at, status,
        seq, expires_at, offer, seats)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) ON CONFLICT (claim_id) DO NOTHING";

/// Writes the row as `status` (a hold keeps its expiry). Its `won_xid` stays NULL: a parked
/// claim's events, its creation included, are `outbox` rows of this transaction, which the
/// relay's cursor over the writer's rows ([`crate::outbox::cursor`]) must not publish again.
async fn insert(
    tx: &mut PgConnection,
    row: &PendingRow,
    status: ClaimStatus,
) -> Result<u64, DbError> {
    Ok(sqlx::query(INSERT)
        .bind(row.claim_id)
        .bind(&row.sku)
        .bind(&row.user_id)
        .bind(row.quantity)
        .bind(&row.idempotency_key)
        .bind(row.remaining_after)
        .bind(row.created_at)
        .bind(status)
        .bind(row.seq)
        .bind(row.expires_at)
        .bind(row.offer)
        .bind(&row.seats)
        .execute(tx)
        .await?
        .rows_affected())
}

/// The status of the claim's `issuances` row, if it has one.
async fn status(tx: &mut PgConnection, claim_id: Uuid) -> Result<Option<ClaimStatus>, DbError> {
    Ok(
        sqlx::query_scalar("SELECT status FROM issuances WHERE claim_id = $1")
            .bind(claim_id)
            .fetch_optional(tx)
            .await?,
    )
}

/// Sets the leased row's fields; `false` when the lease is no longer this owner's.
async fn update_owned(
    tx: &mut PgConnection,
    row: &PendingRow,
    owner: Uuid,
    status: &str,
    attempts: i32,
    reason: Option<&str>,
) -> Result<bool, DbError> {
    let n = sqlx::query(
        "UPDATE persistence_pending
            SET status = $3, attempts = $4, failure_reason = COALESCE($5, failure_reason),
                lease_owner = CASE WHEN $3 = 'reprocessing' THEN lease_owner END,
                lease_until = CASE WHEN $3 = 'reprocessing' THEN lease_until END,
                updated_at = now()
          WHERE claim_id = $1 AND lease_owner = $2 AND status = 'reprocessing'",
    )
    .bind(row.claim_id)
    .bind(owner)
    .bind(status)
    .bind(attempts)
    .bind(reason)
    .execute(tx)
    .await?
    .rows_affected();
    Ok(n == 1)
}

/// Writes the claim to `issuances` with its lifecycle status (a hold's change while parked
/// included) and its events, and resolves the parked row, in one transaction.
///
/// # Errors
/// The database's error, e.g. its refusal of the row (nothing changed).
pub async fn write(db: &PgPool, row: &PendingRow, owner: Uuid) -> Result<Written, DbError> {
    let mut tx = db.begin().await?;
    let Some((claim_status, at)) = lock_owned(&mut tx, row, owner).await? else {
        return Ok(Written::LeaseLost);
    };
    if insert(&mut tx, row, claim_status).await? == 1 {
        life_so_far(&mut tx, row, Some((claim_status, at))).await?;
    } else if status(&mut tx, row.claim_id).await? == Some(ClaimStatus::Compensated) {
        return Ok(Written::Compensating);
    }
    if !update_owned(&mut tx, row, owner, "resolved", row.attempts + 1, None).await? {
        return Ok(Written::LeaseLost);
    }
    tx.commit().await?;
    Ok(Written::Live)
}

/// Records the last attempt and the decision to compensate: the claim's `issuances` row with
/// status `compensated`, in one transaction. When a live row is there already, the claim is
/// resolved instead.
///
/// # Errors
/// The database error (nothing changed), except a refusal of the compensated row itself.
pub async fn decide_compensation(
    db: &PgPool,
    row: &PendingRow,
    owner: Uuid,
    attempt: i32,
    reason: &str,
) -> Result<Decision, DbError> {
    let mut tx = db.begin().await?;
    if !update_owned(&mut tx, row, owner, "reprocessing", attempt, Some(reason)).await? {
        return Ok(Decision::LeaseLost);
    }
    sqlx::query("SAVEPOINT tombstone").execute(&mut *tx).await?;
    let decision = match insert(&mut tx, row, ClaimStatus::Compensated).await {
        Ok(1) => Decision::Compensate,
        Ok(_) => match status(&mut tx, row.claim_id).await? {
            Some(ClaimStatus::Compensated) | None => Decision::Compensate,
            Some(_) => {
                update_owned(&mut tx, row, owner, "resolved", attempt, None).await?;
                Decision::AlreadyLive
            }
        },
        Err(e) if e.refuses_row() => {
            sqlx::query("ROLLBACK TO SAVEPOINT tombstone")
                .execute(&mut *tx)
                .await?;
            Decision::CompensateUnrecorded(e.to_string())
        }
        Err(e) => return Err(e),
    };
    tx.commit().await?;
    Ok(decision)
}

/// Marks the parked row compensated (the units are back in Redis), writing the compensated
/// `issuances` row too when it is not there yet (a compensation given back before this code
/// recorded decisions first). Returns the status of a live `issuances` row found instead:
/// the claim is then both recorded and given back, which the caller reports.
///
/// The same transaction records `claim.compensated` (this update succeeds once per claim),
/// preceded by the claim's life so far unless a live row shows the ledger recorded (and
/// announced) it: the order system heard of the claim from its 201, and hears of both ends.
/// `ended` is the status Redis had the hold in when the units went back (compensate.lua), so
/// a change whose journal entry has not reached the parked row yet is told all the same.
///
/// # Errors
/// The database error; the lease then runs out and the next owner finishes.
pub async fn mark_compensated(
    db: &PgPool,
    row: &PendingRow,
    owner: Uuid,
    attempts: i32,
    reason: Option<&str>,
    ended: Option<ClaimStatus>,
) -> Result<Option<ClaimStatus>, DbError> {
    let mut tx = db.begin().await?;
    let Some((claim_status, at)) = lock_owned(&mut tx, row, owner).await? else {
        return Ok(None);
    };
    let change: Option<ParkedChange> = match ended {
        Some(s) if s != claim_status => Some((s, None)),
        _ => Some((claim_status, at)),
    };
    if !update_owned(&mut tx, row, owner, "compensated", attempts, reason).await? {
        return Ok(None);
    }
    if let Some((s, _)) = change.filter(|c| EventKind::of_change(c.0).is_some()) {
        sqlx::query("UPDATE persistence_pending SET claim_status = $2 WHERE claim_id = $1")
            .bind(row.claim_id)
            .bind(s)
            .execute(&mut *tx)
            .await?;
    }
    if row.offer {
        // An offer's entry ends with its hold. Redis's give-back ends it there and journals
        // the end, but a restore that counted the units back itself (Redis had lost the
        // give-back) leaves no give-back to do it: the ledger's row would stay `offered`.
        sqlx::query(
            "UPDATE waitlist SET status = 'expired', updated_at = now()
              WHERE entry_id = $1 AND status = 'offered'",
        )
        .bind(row.claim_id)
        .execute(&mut *tx)
        .await?;
    }
    sqlx::query("SAVEPOINT tombstone").execute(&mut *tx).await?;
    let live = match insert(&mut tx, row, ClaimStatus::Compensated).await {
        Ok(1) => None,
        Ok(_) => status(&mut tx, row.claim_id)
            .await?
            .filter(|s| *s != ClaimStatus::Compensated),
        // Refused even as compensated: the persistence_pending row stands in (see Decision).
        Err(e) if e.refuses_row() => {
            sqlx::query("ROLLBACK TO SAVEPOINT tombstone")
                .execute(&mut *tx)
                .await?;
            None
        }
        Err(e) => return Err(e),
    };
    let seq = match live {
        None => life_so_far(&mut tx, row, change).await?,
        // Announced by the writer already: the compensation follows what it told. Its
        // creation event has no `outbox` row when the writer wrote it (read from `issuances`
        // by the relay's cursor, `won_xid` set): it is seq 1 all the same.
        Some(_) => {
            sqlx::query_scalar(
                "SELECT GREATEST(
                        (SELECT COALESCE(max(seq), 0) FROM outbox WHERE claim_id = $1),
                        (SELECT count(*)::int4 FROM issuances
                          WHERE claim_id = $1 AND won_xid IS NOT NULL)) + 1",
            )
            .bind(row.claim_id)
            .fetch_one(&mut *tx)
            .await?
        }
    };
    let comp = EventKind::Compensated;
    event(&mut tx, row, comp, seq, ClaimStatus::Compensated, None).await?;
    tx.commit().await?;
    Ok(live)
}

/// Puts the leased row back to `pending` until `delay` from now, with `attempts` spent and
/// the reason noted.
///
/// # Errors
/// The database error; the lease then runs out and the row comes back by itself.
pub async fn reschedule(
    db: &PgPool,
    row: &PendingRow,
    owner: Uuid,
    attempts: i32,
    reason: &str,
    delay: std::time::Duration,
) -> Result<(), DbError> {
    sqlx::query(
        "UPDATE persistence_pending
            SET status = 'pending', attempts = $3, failure_reason = $4, lease_owner = NULL,
                lease_until = NULL, updated_at = now(),
                next_attempt_at = now() + make_interval(secs => $5)
          WHERE claim_id = $1 AND lease_owner = $2 AND status = 'reprocessing'",
    )
    .bind(row.claim_id)
    .bind(owner)
    .bind(attempts)
    .bind(reason)
    .bind(delay.as_secs_f64())
    .execute(db)
    .await?;
    Ok(())
}
