//! The outbox's PostgreSQL side: recording events inside the ledger's transactions, and the
//! relay's lead, mark and trim.
//!
//! (`claim.won` of the journal writer has no row here: it is read from `issuances` by
//! [`super::cursor`]; this module records the events of the reprocessor, and the writer's
//! statement for a hold's change records its own, see `writer/lifecycle.rs`.)

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

/// Takes or renews the lead of the relays for `owner` until `lease` from now: `true` when
/// `owner` leads, the lead being free, expired, or its own already. One UPDATE per batch is
/// all a relay's ownership costs (rows are no longer leased one by one).
///
/// # Errors
/// The database's error; the caller then publishes nothing this round.
pub async fn lead(db: &PgPool, owner: Uuid, lease: Duration) -> Result<bool, DbError> {
    Ok(sqlx::query(
        "UPDATE outbox_leader SET owner = $1, lease_until = now() + make_interval(secs => $2)
          WHERE id = 1 AND (owner = $1 OR owner IS NULL OR lease_until < now())",
    )
    .bind(owner)
    .bind(lease.as_secs_f64())
    .execute(db)
    .await?
    .rows_affected()
        == 1)
}

/// Gives up the lead `owner` holds (a gateway shutting down), so another relay takes it at
/// once instead of after the lease.
///
/// # Errors
/// The database's error; the lease then runs out by itself.
pub async fn resign(db: &PgPool, owner: Uuid) -> Result<(), DbError> {
    sqlx::query(
        "UPDATE outbox_leader SET owner = NULL, lease_until = NULL WHERE id = 1 AND owner = $1",
    )
    .bind(owner)
    .execute(db)
    .await?;
    Ok(())
}

/// Up to `limit` unsent events, oldest first, for the leader to publish. An event whose claim
/// has an earlier event still unsent is left for a later round, so a claim's events reach
/// JetStream in their order. (`= ANY(ARRAY(…))` rather than `IN (…)`: the planner then
/// fetches the rows by primary key, where a semi-join would scan the whole table, sent rows
/// of the retention period included. `seq = 1 OR`: a claim's first event has nothing before
/// it, and without the row locks of `FOR UPDATE` the planner would otherwise check every
/// unsent row with a hash anti-join on each batch, where this walks the unsent index in order
/// and stops at the batch: 4.5× the PostgreSQL CPU per winner, measured.)
///
/// A claim the journal writer wrote has its creation event in `issuances`, not here
/// ([`super::cursor`]): its later events wait until the cursor has passed it (its `won_xid` is
/// NULL for every other claim).
///
/// Only rows above `after` are looked at: a relay working through a backlog passes the id
/// below its last batch, so it does not walk again over the index entries of rows it has sent
/// (dead until vacuum); `0` looks at everything.
///
/// # Errors
/// The database's error; nothing was taken.
pub async fn take(db: &PgPool, limit: i64, after: i64) -> Result<Vec<OutboxRow>, DbError> {
    Ok(sqlx::query_as(
        "WITH k AS MATERIALIZED (SELECT won_xid, claim_id FROM outbox_cursor WHERE id = 1)
         SELECT o.id, o.claim_id, o.seq, o.event, o.sku, o.user_id, o.quantity, o.status,
                o.occurred_at, o.created_at,
                -- A seated claim's seats: its ledger row's (or its parked row's, for a
                -- compensation PostgreSQL refused to record), one lookup by key per event.
                COALESCE((SELECT i.seats FROM issuances i WHERE i.claim_id = o.claim_id),
                         (SELECT p.seats FROM persistence_pending p
                           WHERE p.claim_id = o.claim_id)) AS seats
           FROM outbox o
          WHERE o.id = ANY(ARRAY(
                SELECT c.id FROM outbox c
                 WHERE c.sent_at IS NULL AND c.id > $2
                   AND (c.seq = 1
                        OR (NOT EXISTS (SELECT 1 FROM outbox e
                                         WHERE e.claim_id = c.claim_id AND e.seq < c.seq
                                           AND e.sent_at IS NULL)
                            AND NOT EXISTS (SELECT 1 FROM issuances i
                                             WHERE i.claim_id = c.claim_id
                                               AND i.won_xid IS NOT NULL
                                               AND (i.won_xid, i.claim_id)
                                                   > ((SELECT won_xid FROM k),
                                                      (SELECT claim_id FROM k)))))
                 ORDER BY c.id
                 LIMIT $1))
          ORDER BY o.id",
    )
    .bind(limit)
    .bind(after)
    .fetch_all(db)
    .await?)
}

/// Marks events sent once JetStream acknowledged them (whoever published them: a copy a late
/// leader sent is dropped by JetStream, and the event is on the stream either way). Returns
/// how many were marked now.
///
/// # Errors
/// The database's error; nothing was marked, and the caller keeps the ids to mark again.
pub async fn mark_sent(db: &PgPool, ids: &[i64]) -> Result<u64, DbError> {
    Ok(
        sqlx::query("UPDATE outbox SET sent_at = now() WHERE id = ANY($1) AND sent_at IS NULL")
            .bind(ids)
            .execute(db)
            .await?
            .rows_affected(),
    )
}

/// Events not yet acknowledged by JetStream, counted up to `cap` (oldest first, along the
/// unsent index: see [`super::cursor::backlog`] for why), and the age in seconds of the oldest.
///
/// # Errors
/// The database's error.
pub async fn backlog(db: &PgPool, cap: i64) -> Result<(i64, Option<f64>), DbError> {
    Ok(sqlx::query_as(
        "SELECT count(*), EXTRACT(EPOCH FROM clock_timestamp() - min(created_at))::float8
           FROM (SELECT created_at FROM outbox WHERE sent_at IS NULL ORDER BY id LIMIT $1) b",
    )
    .bind(cap)
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
