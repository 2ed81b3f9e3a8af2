//! The outbox's PostgreSQL side: recording events inside the ledger's transactions, and the
//! relay's lease, mark and trim.
//!
//! (`claim.won` of the journal writer is recorded by the writer's own insert statement, see
//! `writer/postgres.rs`; this module records the events of the reprocessor.)

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::events::{EventKind, OutboxRow};
use crate::error::DbError;
use crate::status::ClaimStatus;

/// An event to record in the caller's transaction.
#[derive(Debug)]
pub struct NewEvent<'a> {
    pub kind: EventKind,
    /// Its place in the claim's life: 1 for the creation, then one more per change.
    pub seq: i32,
    pub claim_id: Uuid,
    pub sku: &'a str,
    pub user: &'a str,
    pub quantity: i32,
    /// The claim's status after the event.
    pub status: ClaimStatus,
    /// When the transition happened; `None`: now (the transaction's time).
    pub occurred_at: Option<DateTime<Utc>>,
}

/// Records `event` in the caller's transaction. An event the claim already has (the same place
/// in its life) is left as it is: the transition that produced it committed before.
///
/// # Errors
/// The database's error; the caller's transaction then does not commit, and with it neither
/// does the ledger change.
pub async fn record(tx: &mut PgConnection, event: &NewEvent<'_>) -> Result<(), DbError> {
    sqlx::query(
        "INSERT INTO outbox (claim_id, seq, event, sku, user_id, quantity, status, occurred_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, COALESCE($8, now()))
         ON CONFLICT (claim_id, seq) DO NOTHING",
    )
    .bind(event.claim_id)
    .bind(event.seq)
    .bind(event.kind.as_str())
    .bind(event.sku)
    .bind(event.user)
    .bind(event.quantity)
    .bind(event.status)
    .bind(event.occurred_at)
    .execute(tx)
    .await?;
    Ok(())
}

/// Takes up to `limit` unsent events for `owner` until `lease` from now, oldest first: those
/// nobody holds, those whose lease ran out, and this owner's own (a batch it failed to finish).
/// An event whose claim has an earlier event still unsent is left for a later round, so a
/// claim's events reach JetStream in their order even with several relays. (`= ANY(ARRAY(…))`
/// rather than `IN (…)`: the planner then fetches the taken rows by primary key, where a
/// semi-join would scan the whole table, sent rows of the retention period included.)
///
/// # Errors
/// The database's error; nothing was taken.
///
/// Only rows above `after` are looked at: a relay working through a backlog passes the id
/// below its last batch, so it does not walk again over the index entries of rows it has sent
/// (dead until vacuum); `0` looks at everything.
pub async fn lease(
    db: &PgPool,
    owner: Uuid,
    lease: Duration,
    limit: i64,
    after: i64,
) -> Result<Vec<OutboxRow>, DbError> {
    let mut rows: Vec<OutboxRow> = sqlx::query_as(
        "UPDATE outbox o
            SET lease_owner = $1, lease_until = now() + make_interval(secs => $2)
          WHERE o.id = ANY(ARRAY(
                SELECT c.id FROM outbox c
                 WHERE c.sent_at IS NULL AND c.id > $4
                   AND (c.lease_until IS NULL OR c.lease_until < now() OR c.lease_owner = $1)
                   AND NOT EXISTS (SELECT 1 FROM outbox e
                                    WHERE e.claim_id = c.claim_id AND e.seq < c.seq
                                      AND e.sent_at IS NULL)
                 ORDER BY c.id
                 LIMIT $3
                 FOR UPDATE SKIP LOCKED))
          RETURNING o.id, o.claim_id, o.seq, o.event, o.sku, o.user_id, o.quantity, o.status,
                    o.occurred_at, o.created_at",
    )
    .bind(owner)
    .bind(lease.as_secs_f64())
    .bind(limit)
    .bind(after)
    .fetch_all(db)
    .await?;
    // RETURNING follows no order; publishing does.
    rows.sort_by_key(|r| r.id);
    Ok(rows)
}

/// Marks acknowledged events sent, only those `owner` still holds: a relay whose lease ran
/// out and was taken over changes nothing (the new owner publishes again, and JetStream drops
/// the copy by its `Nats-Msg-Id`). Returns how many were marked.
///
/// # Errors
/// The database's error; nothing was marked, and the caller keeps the ids to mark again.
pub async fn mark_sent(db: &PgPool, owner: Uuid, ids: &[i64]) -> Result<u64, DbError> {
    Ok(sqlx::query(
        "UPDATE outbox SET sent_at = now()
          WHERE id = ANY($1) AND lease_owner = $2 AND sent_at IS NULL",
    )
    .bind(ids)
    .bind(owner)
    .execute(db)
    .await?
    .rows_affected())
}

/// Gives back events `owner` could not publish, so any relay may take them at once.
///
/// # Errors
/// The database's error; the leases then run out by themselves.
pub async fn release(db: &PgPool, owner: Uuid, ids: &[i64]) -> Result<(), DbError> {
    sqlx::query(
        "UPDATE outbox SET lease_owner = NULL, lease_until = NULL
          WHERE id = ANY($1) AND lease_owner = $2 AND sent_at IS NULL",
    )
    .bind(ids)
    .bind(owner)
    .execute(db)
    .await?;
    Ok(())
}

/// Events not yet acknowledged by JetStream, and the age in seconds of the oldest.
///
/// # Errors
/// The database's error.
pub async fn backlog(db: &PgPool) -> Result<(i64, Option<f64>), DbError> {
    Ok(sqlx::query_as(
        "SELECT count(*), EXTRACT(EPOCH FROM clock_timestamp() - min(created_at))::float8
           FROM outbox WHERE sent_at IS NULL",
    )
    .fetch_one(db)
    .await?)
}

/// Deletes events sent more than `retention` ago, in chunks of `chunk` (short transactions;
/// several gateways trimming at once skip each other's rows). Returns how many went.
///
/// # Errors
/// The database's error; the rest goes at the next trim.
pub async fn trim(db: &PgPool, retention: Duration, chunk: i64) -> Result<u64, DbError> {
    let mut total = 0;
    loop {
        let n = sqlx::query(
            "DELETE FROM outbox WHERE id IN (
                 SELECT id FROM outbox
                  WHERE sent_at < now() - make_interval(secs => $1)
                  LIMIT $2 FOR UPDATE SKIP LOCKED)",
        )
        .bind(retention.as_secs_f64())
        .bind(chunk)
        .execute(db)
        .await?
        .rows_affected();
        total += n;
        if n < chunk as u64 {
            return Ok(total);
        }
    }
}
