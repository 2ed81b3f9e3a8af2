//! Writing the lifecycle's journal records: a hold's status change (confirmed, cancelled,
//! expired) and a waitlist entry's change, each with its event in the same statement.
//!
//! Both are guarded so that a record delivered twice, or read out of order, changes nothing:
//! a claim leaves `held` once, and an entry only moves forward (waiting, then offered, then
//! claimed, expired or left). A hold's change is applied only once its win is in a table or
//! never will be (`order.rs`).

use sqlx::PgPool;
use uuid::Uuid;

use crate::error::DbError;
use crate::journal::{Batch, Change, WaitChange};
use crate::sku::SkuId;
use crate::status::EntryStatus;

/// A change of a parked claim (in `persistence_pending`, not yet written) is kept there with
/// its time, so the reprocessor writes the claim with it and tells its events in order
/// (`reprocess/rows.rs`), and the ledger does not count a cancelled hold's units as pending.
/// A parked row already written or compensated is left alone: the claim's row in `issuances`
/// then takes the change (a hold written `held`), or the compensation told it.
const APPLY_CHANGES: &str = "WITH t AS (
    SELECT * FROM UNNEST($1::uuid[], $2::text[], $3::int8[]) AS t(c, st, ms)),
  upd AS (
    UPDATE issuances i SET status = t.st, updated_at = to_timestamp(t.ms::double precision / 1000)
      FROM t WHERE i.claim_id = t.c AND i.status = 'held'
    RETURNING i.claim_id, i.sku, i.user_id, i.quantity, i.status, i.updated_at),
  parked AS (
    UPDATE persistence_pending p
       SET claim_status = t.st, claim_status_at = to_timestamp(t.ms::double precision / 1000),
           updated_at = now()
      FROM t WHERE p.claim_id = t.c AND p.claim_status = 'held'
               AND p.status IN ('pending', 'reprocessing')
    RETURNING p.claim_id),
  ev AS (
    INSERT INTO outbox (claim_id, seq, event, sku, user_id, quantity, status, occurred_at)
    SELECT claim_id, 2, 'claim.' || status, sku, user_id, quantity, status, updated_at FROM upd
    ON CONFLICT (claim_id, seq) DO NOTHING)
  SELECT claim_id FROM upd
  UNION SELECT i.claim_id FROM issuances i JOIN t ON i.claim_id = t.c AND i.status = t.st";

/// Takes the parked rows of the changes' claims, in claim order, before anything is read: the
/// reprocessor writes a parked claim under the same lock, so each change lands either in the
/// parked row before the claim is written (and is written with it) or in `issuances` after.
const LOCK_PARKED: &str = "SELECT claim_id FROM persistence_pending
     WHERE claim_id = ANY($1) ORDER BY claim_id FOR UPDATE";

/// `$from < $to` along the entry steps (waiting, offered, then one end), in SQL.
macro_rules! advances {
    ($from:literal, $to:literal) => {
        concat!(
            "((CASE ",
            $from,
            " WHEN 'waiting' THEN 0 WHEN 'offered' THEN 1 ELSE 2 END)",
            " < (CASE ",
            $to,
            " WHEN 'waiting' THEN 0 WHEN 'offered' THEN 1 ELSE 2 END))"
        )
    };
}

/// Entries only move forward; an offer's claim id is its entry id. Two writers may write one
/// entry's records out of order (a join read by a gateway that was killed or stalled, its leave
/// by another): an entry whose end is written first gets no claim unless that end is an offer's
/// (`claimed`), and an offer's record that comes after the end still names its claim. An entry
/// never offered names no claim, or a client would hold the id of a claim that never existed.
const APPLY_WAITS: &str = concat!(
    "INSERT INTO waitlist AS w
      (entry_id, sku, user_id, position, status, claim_id, created_at, updated_at, quantity)
    SELECT e, $1, u, o, st, CASE WHEN st IN ('offered', 'claimed') THEN e END,
           to_timestamp(ms::double precision / 1000), to_timestamp(ms::double precision / 1000),
           q
      FROM UNNEST($2::uuid[], $3::text[], $4::int8[], $5::text[], $6::int8[], $7::int4[])
        AS t(e, u, o, st, ms, q)
    ON CONFLICT (entry_id) DO UPDATE
       SET status = CASE WHEN ",
    advances!("w.status", "EXCLUDED.status"),
    " THEN EXCLUDED.status ELSE w.status END,
           claim_id = COALESCE(w.claim_id, EXCLUDED.claim_id),
           updated_at = CASE WHEN ",
    advances!("w.status", "EXCLUDED.status"),
    " THEN EXCLUDED.updated_at ELSE w.updated_at END
     WHERE ",
    advances!("w.status", "EXCLUDED.status"),
    " OR (w.claim_id IS NULL AND EXCLUDED.claim_id IS NOT NULL)"
);

/// Applies hold status changes; returns the claims whose final status `issuances` now holds
/// (their Redis hold records may go).
///
/// # Errors
/// The database error (nothing is acknowledged; the changes are applied again later).
pub async fn apply_changes(db: &PgPool, changes: &[Change]) -> Result<Vec<Uuid>, DbError> {
    if changes.is_empty() {
        return Ok(Vec::new());
    }
    let claims: Vec<Uuid> = changes.iter().map(|c| c.claim_id).collect();
    let mut tx = db.begin().await?;
    sqlx::query(LOCK_PARKED)
        .bind(&claims)
        .execute(&mut *tx)
        .await?;
    let forget = sqlx::query_scalar(APPLY_CHANGES)
        .bind(&claims)
        .bind(
            changes
                .iter()
                .map(|c| c.status.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(changes.iter().map(|c| c.ms).collect::<Vec<_>>())
        .fetch_all(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(forget)
}

/// Applies waitlist changes (the same entry may change twice in one batch: one statement per
/// status step, in order). Returns the entries that ended (claimed, expired, left).
///
/// # Errors
/// The database error.
pub async fn apply_waits(
    db: &PgPool,
    sku: &SkuId,
    waits: &[WaitChange],
) -> Result<Vec<Uuid>, DbError> {
    for rank in 0..3 {
        let step: Vec<&WaitChange> = waits.iter().filter(|w| w.status.rank() == rank).collect();
        if step.is_empty() {
            continue;
        }
        sqlx::query(APPLY_WAITS)
            .bind(sku)
            .bind(step.iter().map(|w| w.entry_id).collect::<Vec<_>>())
            .bind(step.iter().map(|w| w.user.as_str()).collect::<Vec<_>>())
            .bind(step.iter().map(|w| w.order).collect::<Vec<_>>())
            .bind(step.iter().map(|w| w.status.as_str()).collect::<Vec<_>>())
            .bind(step.iter().map(|w| w.ms).collect::<Vec<_>>())
            .bind(
                step.iter()
                    .map(|w| i32::try_from(w.quantity).unwrap_or(i32::MAX))
                    .collect::<Vec<_>>(),
            )
            .execute(db)
            .await?;
    }
    Ok(waits
        .iter()
        .filter(|w| !w.status.is_live())
        .map(|w| w.entry_id)
        .collect())
}

/// Offers made, taken and lapsed in this batch (an offer lapses when its entry ends together
/// with its hold: expired, or declined by leaving).
pub fn count_offers(batch: &Batch) {
    use crate::metrics::offers as count;
    let with = |s: EntryStatus| batch.waits.iter().filter(|w| w.status == s).count();
    count("made", with(EntryStatus::Offered));
    count("taken", with(EntryStatus::Claimed));
    let lapsed = (batch.waits.iter())
        .filter(|w| matches!(w.status, EntryStatus::Expired | EntryStatus::Left))
        .filter(|w| batch.changes.iter().any(|c| c.claim_id == w.entry_id))
        .count();
    count("lapsed", lapsed);
}
