//! Writing winners to PostgreSQL: one UNNEST insert per batch, split on refusal so the good
//! rows land, refused rows parked in `persistence_pending` for the reprocessor.

use std::time::Duration;

use sqlx::PgPool;

use crate::error::DbError;
use crate::journal::Winner;
use crate::metrics as m;

/// A claim already in `issuances` is left as it is: written before, or compensated (the
/// reprocessor writes a compensated claim's row with that status before giving its units
/// back). A parked claim (any row in `persistence_pending`) is skipped by the `NOT EXISTS`:
/// the reprocessor alone writes it, with the changes it went through while parked, so a writer
/// that reads its entry again (an acknowledgement lost, a gateway that died) neither writes it
/// `held` after a cancel nor brings back a claim compensated without a row.
///
/// Each row is stamped with this transaction's id (`won_xid`): its `claim.won` (or
/// `waitlist.offered`, `offer` true: an offer is a held claim whose id is its entry's) is read
/// from `issuances` by the relay past its cursor ([`crate::outbox::cursor`]), so no `outbox` row
/// is written for it. Only rows this insert actually wrote are stamped, so a journal entry
/// delivered again produces no event, and an event exists exactly when its claim committed.
///
/// A hold is written `held` with its `expires_at` (the status its creation event tells).
const INSERT_ISSUANCES: &str = "INSERT INTO issuances
      (claim_id, sku, user_id, quantity, idempotency_key, remaining_after, created_at, seq,
       status, expires_at, offer, won_xid, seats)
    SELECT c, s, u, q, k, r, to_timestamp(ms::double precision / 1000), n,
           CASE WHEN ex IS NULL THEN 'issued' ELSE 'held' END,
           to_timestamp(ex::double precision / 1000), o, pg_current_xact_id(),
           string_to_array(z, ',')
      FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::int4[], $5::text[], $6::int8[], $7::int8[],
                  $8::int8[], $9::int8[], $10::bool[], $11::text[])
        AS t(c, s, u, q, k, r, ms, n, ex, o, z)
     WHERE NOT EXISTS (SELECT 1 FROM persistence_pending p WHERE p.claim_id = t.c)
    ON CONFLICT (claim_id) DO NOTHING";

/// A winner that neither `issuances` nor `persistence_pending` would take: the caller
/// quarantines it before acknowledging its entry.
#[derive(Debug)]
pub struct Unwritable {
    /// Its position in the batch given to [`write_batch`].
    pub index: usize,
    /// Both refusals, as the database worded them.
    pub error: String,
}

/// Inserts winners in one statement; when PostgreSQL refuses the batch, splits it so the good
/// rows land, and moves each refused row to `persistence_pending` with the database's reason.
/// Returns the rows `persistence_pending` refused too (a NUL byte in a text column, say).
///
/// # Errors
/// A transient database error (unreachable, a lock or statement timeout, a deadlock; see
/// [`DbError::is_retryable`]): nothing is acknowledged and the batch is tried again later. No
/// row is parked for a failure that is not about the row. The same when parking meets an
/// error that is not about the row (a missing table, a permission): the batch waits for an
/// operator rather than quarantine winners that are fine.
pub async fn write_batch(
    db: &PgPool,
    winners: &[Winner],
    first_retry: Duration,
) -> Result<Vec<Unwritable>, DbError> {
    let mut unwritable = Vec::new();
    let mut stack: Vec<(usize, usize)> = vec![(0, winners.len())];
    while let Some((start, end)) = stack.pop() {
        let chunk = &winners[start..end];
        if chunk.is_empty() {
            continue;
        }
        match insert(db, chunk).await {
            Ok(()) => {}
            Err(e) if e.is_retryable() => return Err(e),
            Err(e) if chunk.len() == 1 => {
                m::writer_refused(1);
                match park(db, &chunk[0], &e.to_string(), first_retry).await {
                    Ok(()) => {}
                    Err(p) if p.refuses_row() => unwritable.push(Unwritable {
                        index: start,
                        error: format!(
                            "issuances: {}; persistence_pending: {}",
                            with_code(&e),
                            with_code(&p)
                        ),
                    }),
                    Err(p) => return Err(p),
                }
            }
            Err(_) => {
                let mid = start + chunk.len() / 2;
                stack.push((mid, end));
                stack.push((start, mid));
            }
        }
    }
    Ok(unwritable)
}

fn with_code(e: &DbError) -> String {
    match e.sqlstate() {
        Some(code) => format!("{e} (SQLSTATE {code})"),
        None => e.to_string(),
    }
}

async fn insert(db: &PgPool, rows: &[Winner]) -> Result<(), DbError> {
    sqlx::query(INSERT_ISSUANCES)
        .bind(rows.iter().map(|w| w.claim_id).collect::<Vec<_>>())
        .bind(rows.iter().map(|w| w.sku.as_str()).collect::<Vec<_>>())
        .bind(rows.iter().map(|w| w.user.as_str()).collect::<Vec<_>>())
        .bind(rows.iter().map(|w| w.quantity).collect::<Vec<_>>())
        .bind(
            rows.iter()
                .map(|w| w.idempotency_key.as_deref())
                .collect::<Vec<_>>(),
        )
        .bind(rows.iter().map(|w| w.remaining_after).collect::<Vec<_>>())
        .bind(rows.iter().map(|w| w.created_ms).collect::<Vec<_>>())
        .bind(rows.iter().map(|w| w.seq).collect::<Vec<_>>())
        .bind(rows.iter().map(|w| w.expires_ms).collect::<Vec<_>>())
        .bind(rows.iter().map(|w| w.offer).collect::<Vec<_>>())
        .bind(rows.iter().map(|w| w.seats.as_deref()).collect::<Vec<_>>())
        .execute(db)
        .await?;
    Ok(())
}

/// Records a winner PostgreSQL refused, for the reprocessing loop.
async fn park(db: &PgPool, w: &Winner, reason: &str, first_retry: Duration) -> Result<(), DbError> {
    tracing::warn!(claim_id = %w.claim_id, sku = %w.sku, reason, "postgres refused a winner; parked in persistence_pending");
    sqlx::query(
        "INSERT INTO persistence_pending
           (claim_id, sku, user_id, quantity, idempotency_key, remaining_after, created_at,
            failure_reason, next_attempt_at, seq, claim_status, expires_at, offer, seats)
         VALUES ($1, $2, $3, $4, $5, $6, to_timestamp($7::double precision / 1000), $8,
                 now() + make_interval(secs => $9::double precision / 1000), $10,
                 CASE WHEN $11::int8 IS NULL THEN 'issued' ELSE 'held' END,
                 to_timestamp($11::double precision / 1000), $12, string_to_array($13, ','))
         ON CONFLICT (claim_id) DO NOTHING",
    )
    .bind(w.claim_id)
    .bind(&w.sku)
    .bind(&w.user)
    .bind(w.quantity)
    .bind(&w.idempotency_key)
    .bind(w.remaining_after)
    .bind(w.created_ms)
    .bind(reason)
    .bind(first_retry.as_millis() as f64)
    .bind(w.seq)
    .bind(w.expires_ms)
    .bind(w.offer)
    // A seated claim's seats: a restore keeps them taken while the row is parked
    // (src/restore/seats.rs), the reprocessor writes or frees exactly them.
    .bind(w.seats.as_deref())
    .execute(db)
    .await?;
    Ok(())
}
