//! Why the relay waits: the oldest transaction of the PostgreSQL server holding the cursor's
//! bound back (issue 37.5).
//!
//! The relay publishes a creation event only once every transaction with a smaller id has
//! ended (`pg_snapshot_xmin`, [`super::cursor`]). That bound is the server's: a transaction
//! left open with an id, in any database of the same server (a `psql` session that ran one
//! write and went to lunch), holds every new `claim.won` back until it ends. Nothing else
//! looks wrong meanwhile (NATS is fine, claims are fast), so the relay names the culprit:
//! the oldest transaction holding an id, from `pg_stat_activity`, whenever the first event
//! past the cursor waits for it. (Seeing other databases' sessions, and their `state`, needs
//! a superuser or the `pg_read_all_stats` role; without it `state` reads null.)

use serde::Serialize;
use sqlx::PgPool;

use crate::error::DbError;

/// A transaction the relay waits for.
#[derive(Debug, Clone, Serialize, sqlx::FromRow, PartialEq)]
pub struct HeldBack {
    /// Its database (any of the server's, not only the gateway's).
    pub database: Option<String>,
    /// The backend's process id: `SELECT pg_terminate_backend(pid)` ends it.
    pub pid: i32,
    /// `idle in transaction`, `active`...
    pub state: Option<String>,
    /// Seconds since the transaction began.
    pub age_seconds: f64,
}

/// The oldest transaction holding an id, when the first creation event past the cursor waits
/// for it (its `won_xid` is not below the server's oldest running id); `None` when the relay
/// waits for nothing.
///
/// # Errors
/// The database's error.
pub async fn find(db: &PgPool) -> Result<Option<HeldBack>, DbError> {
    let row = sqlx::query_as::<_, HeldBack>(
        "WITH first AS (
             SELECT i.won_xid
               FROM issuances i, outbox_cursor c
              WHERE c.id = 1 AND i.won_xid IS NOT NULL
                AND (i.won_xid, i.claim_id) > (c.won_xid, c.claim_id)
              ORDER BY i.won_xid, i.claim_id
              LIMIT 1)
         SELECT a.datname::text AS database, a.pid, a.state,
                EXTRACT(EPOCH FROM clock_timestamp() - a.xact_start)::float8 AS age_seconds
           FROM pg_stat_activity a
          WHERE a.backend_xid IS NOT NULL
            AND a.xact_start IS NOT NULL
            AND EXISTS (SELECT 1 FROM first
                         WHERE first.won_xid >= pg_snapshot_xmin(pg_current_snapshot()))
          ORDER BY age(a.backend_xid) DESC
          LIMIT 1",
    )
    .fetch_optional(db)
    .await?;
    Ok(row)
}
