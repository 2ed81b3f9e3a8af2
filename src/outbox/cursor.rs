//! The creation events of the journal writer's claims (`claim.won`, `waitlist.offered`), read
//! from `issuances` past the relays' cursor instead of from an `outbox` row each
//! (`migrations/0017_outbox_cursor.sql`).
//!
//! The writer's insert stamps each row it writes with its transaction's id (`won_xid`, an
//! `xid8`). Transactions commit in any order, so a row with a smaller id can still appear
//! behind rows already seen; but none can below `pg_snapshot_xmin(pg_current_snapshot())`, the
//! smallest id still running: every transaction below it has ended. The relay publishes rows
//! in (`won_xid`, `claim_id`) order, and moves the cursor only over rows below that bound whose
//! events JetStream acknowledged, so the cursor never passes an event that was not published.
//! A row at or below the cursor is published; a claim's later events (`outbox` rows) wait for
//! that ([`super::store::take`]).

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

use super::events::{EventKind, OutboxRow};
use crate::error::DbError;
use crate::status::ClaimStatus;

/// A place in the cursor's order: a row's `won_xid` (as a number: sqlx has no `xid8`) and its
/// claim id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Position {
    pub xid: i64,
    pub claim_id: Uuid,
}

/// A creation event read from `issuances`.
#[derive(Debug)]
pub struct Won {
    pub at: Position,
    /// Every transaction below it has ended: no row can appear before this one any more, and
    /// the cursor may move over it once it is published. Rows that are not settled come after
    /// every settled one (the order is by `won_xid`).
    pub settled: bool,
    /// The event, as its `outbox` row would have been (`id` 0: it has none).
    pub event: OutboxRow,
}

#[derive(sqlx::FromRow)]
struct WonRow {
    xid: i64,
    claim_id: Uuid,
    sku: String,
    user_id: String,
    quantity: i32,
    offer: bool,
    held: bool,
    created_at: DateTime<Utc>,
    settled: bool,
    seats: Option<Vec<String>>,
}

impl From<WonRow> for Won {
    fn from(r: WonRow) -> Won {
        // The status it won with: a later change of the row (a hold's end) is an event of its
        // own; the writer writes a hold (an offer too) `held` with its expiry, else `issued`.
        let (kind, status) = match (r.offer, r.held) {
            (true, _) => (EventKind::Offered, ClaimStatus::Held),
            (false, true) => (EventKind::Won, ClaimStatus::Held),
            (false, false) => (EventKind::Won, ClaimStatus::Issued),
        };
        Won {
            at: Position {
                xid: r.xid,
                claim_id: r.claim_id,
            },
            settled: r.settled,
            event: OutboxRow {
                id: 0,
                claim_id: r.claim_id,
                seq: 1,
                event: kind.as_str().to_string(),
                sku: r.sku,
                user_id: r.user_id,
                quantity: r.quantity,
                status,
                occurred_at: r.created_at,
                created_at: r.created_at,
                seats: r.seats,
            },
        }
    }
}

/// Up to `limit` rows past the cursor, in its order, each saying whether it is settled. (The
/// cursor and the bound are read once, by init plans: the cursor's place is the index scan's
/// start, where a join would filter the whole index up to it, and the statement's snapshot is
/// not copied for every row.)
///
/// # Errors
/// The database's error; nothing was taken.
pub async fn take(db: &PgPool, limit: i64) -> Result<Vec<Won>, DbError> {
    let rows: Vec<WonRow> = sqlx::query_as(
        "WITH c AS MATERIALIZED (SELECT won_xid, claim_id,
                                        pg_snapshot_xmin(pg_current_snapshot()) AS xmin
                                   FROM outbox_cursor WHERE id = 1)
         SELECT i.won_xid::text::int8 AS xid, i.claim_id, i.sku, i.user_id, i.quantity, i.offer,
                i.expires_at IS NOT NULL AS held, i.created_at,
                i.won_xid < (SELECT xmin FROM c) AS settled, i.seats
           FROM issuances i
          WHERE i.won_xid IS NOT NULL
            AND (i.won_xid, i.claim_id) > ((SELECT won_xid FROM c), (SELECT claim_id FROM c))
          ORDER BY i.won_xid, i.claim_id
          LIMIT $1",
    )
    .bind(limit)
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(Won::from).collect())
}

/// Moves the cursor to `to`, whose event and every one before it JetStream acknowledged. Never
/// back: a relay that lost the lead and comes late leaves a cursor moved further alone.
///
/// # Errors
/// The database's error; the caller keeps `to` and moves the cursor later (meanwhile the rows
/// are published again, and JetStream drops the copies).
pub async fn advance(db: &PgPool, to: Position) -> Result<(), DbError> {
    sqlx::query(
        "UPDATE outbox_cursor SET won_xid = $1::text::xid8, claim_id = $2
          WHERE id = 1 AND (won_xid, claim_id) < ($1::text::xid8, $2)",
    )
    .bind(to.xid)
    .bind(to.claim_id)
    .execute(db)
    .await?;
    Ok(())
}

/// Creation events past the cursor (settled or not), counted up to `cap`, and the age in
/// seconds of the oldest (from its claim's decision: the row has no time of its own for its
/// insert).
///
/// The count walks the cursor's index from the cursor and stops at `cap`. Every gateway samples
/// each second, and the count it replaced read the whole table each time, healthy or not: the
/// planner cannot estimate a row comparison with the cursor's subselect, so it scanned
/// `issuances` rather than the index (35 ms a sample at 700k rows with 200 events waiting; the
/// ordered walk with a limit takes the index, 0.2 ms). While NATS is down the backlog is every
/// claim since, so the walk stops at `cap`. The age is the oldest of the rows counted:
/// writers take their transaction ids about in the order their claims were decided, but past
/// the cap a row decided earlier and written later (a dead gateway's entries, taken over by
/// another writer) is not seen until the backlog shrinks below it.
///
/// # Errors
/// The database's error.
pub async fn backlog(db: &PgPool, cap: i64) -> Result<(i64, Option<f64>), DbError> {
    Ok(sqlx::query_as(
        "WITH c AS MATERIALIZED (SELECT won_xid, claim_id FROM outbox_cursor WHERE id = 1),
              b AS (SELECT i.created_at FROM issuances i
                     WHERE i.won_xid IS NOT NULL
                       AND (i.won_xid, i.claim_id) > ((SELECT won_xid FROM c), (SELECT claim_id FROM c))
                     ORDER BY i.won_xid, i.claim_id
                     LIMIT $1)
         SELECT count(*), EXTRACT(EPOCH FROM clock_timestamp() - min(created_at))::float8 FROM b",
    )
    .bind(cap)
    .fetch_one(db)
    .await?)
}
