//! The ledger's side of a reading ([`super`]): one PostgreSQL snapshot, and what of the
//! unacknowledged journal entries that snapshot already holds.

use std::collections::HashMap;

use sqlx::PgPool;
use uuid::Uuid;

use crate::error::DbError;
use crate::journal::Batch;
use crate::sku::SkuId;

/// Ledger sums of one SKU, in units. Each claim counts in one sum at most:
/// - `recorded`: `issuances` rows of live claims (`issued`, `held`, `confirmed`); a
///   `compensated` row there only keeps a late writer from inserting the claim again.
/// - `pending`: `persistence_pending` rows not yet resolved.
/// - `compensated`: `persistence_pending` rows compensated (every compensation goes through
///   that table, so the `issuances` row of the same claim is not counted again).
/// - `quarantined`: open `quarantine` rows whose claim is in neither table above (an operator
///   who records it by hand is not counted twice, even before setting `resolved_at`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, sqlx::FromRow)]
pub struct LedgerSums {
    pub recorded: i64,
    pub pending: i64,
    pub compensated: i64,
    pub quarantined: i64,
    pub held: i64,
    pub confirmed: i64,
    pub waiting: i64,
    pub offered: i64,
}

/// Units by state in the ledger.
///
/// # Errors
/// The database error.
pub async fn ledger_sums<'e>(
    db: impl sqlx::PgExecutor<'e>,
    sku: &SkuId,
) -> Result<LedgerSums, DbError> {
    Ok(sqlx::query_as(
        "SELECT
           (SELECT COALESCE(SUM(quantity), 0)::bigint FROM issuances
             WHERE sku = $1 AND status IN ('issued', 'held', 'confirmed')) AS recorded,
           (SELECT COALESCE(SUM(quantity), 0)::bigint FROM persistence_pending
             WHERE sku = $1 AND status IN ('pending', 'reprocessing')
               AND claim_status NOT IN ('cancelled', 'expired')) AS pending,
           (SELECT COALESCE(SUM(quantity), 0)::bigint FROM persistence_pending
             WHERE sku = $1 AND status = 'compensated') AS compensated,
           (SELECT COALESCE(SUM(q.quantity), 0)::bigint FROM quarantine q
             WHERE q.sku = $1 AND q.resolved_at IS NULL
               AND NOT EXISTS (SELECT 1 FROM issuances i WHERE i.claim_id = q.claim_id)
               AND NOT EXISTS (SELECT 1 FROM persistence_pending p
                                WHERE p.claim_id = q.claim_id)) AS quarantined,
           (SELECT COALESCE(SUM(quantity), 0)::bigint FROM issuances
             WHERE sku = $1 AND status = 'held') AS held,
           (SELECT COALESCE(SUM(quantity), 0)::bigint FROM issuances
             WHERE sku = $1 AND status = 'confirmed') AS confirmed,
           (SELECT count(*) FROM waitlist WHERE sku = $1 AND status = 'waiting') AS waiting,
           (SELECT count(*) FROM waitlist WHERE sku = $1 AND status = 'offered') AS offered",
    )
    .bind(sku)
    .fetch_one(db)
    .await?)
}

/// PostgreSQL's side, one snapshot: the total, the restocks not finished, the sums, and what
/// the ledger holds of the claims and waitlist entries the unacknowledged entries carry.
pub(super) struct LedgerSide {
    pub(super) total: i64,
    pub(super) restocks: Vec<(Uuid, i64)>,
    pub(super) sums: LedgerSums,
    /// Statuses of each claim's rows (`issuances`, open `persistence_pending`, open
    /// `quarantine` as "quarantined").
    claims: HashMap<Uuid, Vec<String>>,
    waits: HashMap<Uuid, String>,
    /// Parked claims a reprocessor is working on that `pending` counts: (claim, buyer, units).
    /// One that has just been compensated in Redis (its units back in stock) is counted there
    /// until its row says so.
    pub(super) reprocessing: Vec<(Uuid, String, i64)>,
}

pub(super) async fn ledger_side(
    db: &PgPool,
    sku: &SkuId,
    claims: &[Uuid],
    waits: &[Uuid],
) -> Result<LedgerSide, DbError> {
    // Every query below reads the snapshot of the first: one instant of the ledger.
    let mut tx = db
        .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .await?;
    // The total with the restocks not finished, in one row.
    let (total, ops, deltas): (i64, Vec<Uuid>, Vec<i64>) = sqlx::query_as(
        "SELECT s.total,
                COALESCE(array_agg(r.op_id ORDER BY r.op_id) FILTER (WHERE r.op_id IS NOT NULL), '{}'),
                COALESCE(array_agg(r.delta ORDER BY r.op_id) FILTER (WHERE r.op_id IS NOT NULL), '{}')
           FROM skus s
           LEFT JOIN restock_ops r ON r.sku = s.sku AND r.status = 'pending'
          WHERE s.sku = $1
          GROUP BY s.total",
    )
    .bind(sku)
    .fetch_one(&mut *tx)
    .await?;
    let restocks: Vec<(Uuid, i64)> = ops.into_iter().zip(deltas).collect();
    let sums = ledger_sums(&mut *tx, sku).await?;
    let mut found: HashMap<Uuid, Vec<String>> = HashMap::new();
    if !claims.is_empty() {
        let rows: Vec<(Uuid, String)> = sqlx::query_as(
            "SELECT claim_id, status FROM issuances WHERE claim_id = ANY($1)
             UNION ALL
             SELECT claim_id,
                    CASE WHEN status = 'compensated' THEN 'compensated' ELSE claim_status END
               FROM persistence_pending WHERE claim_id = ANY($1) AND status <> 'resolved'
             UNION ALL
             SELECT claim_id, 'quarantined' FROM quarantine
              WHERE claim_id = ANY($1) AND resolved_at IS NULL",
        )
        .bind(claims)
        .fetch_all(&mut *tx)
        .await?;
        for (id, status) in rows {
            found.entry(id).or_default().push(status);
        }
    }
    let waits: HashMap<Uuid, String> = if waits.is_empty() {
        HashMap::new()
    } else {
        sqlx::query_as("SELECT entry_id, status FROM waitlist WHERE entry_id = ANY($1)")
            .bind(waits)
            .fetch_all(&mut *tx)
            .await?
            .into_iter()
            .collect()
    };
    let reprocessing = sqlx::query_as(
        "SELECT claim_id, user_id, quantity::bigint FROM persistence_pending
          WHERE sku = $1 AND status = 'reprocessing' AND claim_status NOT IN ('cancelled', 'expired')",
    )
    .bind(sku)
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(LedgerSide {
        total,
        restocks,
        sums,
        claims: found,
        waits,
        reprocessing,
    })
}

/// What one shard's unacknowledged entries leave unwritten at the snapshot.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Backlog {
    /// Units of those entries the ledger already holds (a give-back's negative): they are
    /// still in `inflight`, and come off it so that they count once.
    pub(super) written_units: i64,
    /// Entries with anything the ledger does not hold yet: a win, a hold's change, a
    /// waitlist change, or an entry nobody can read (it goes to the quarantine).
    pub(super) unwritten: i64,
}

pub(super) fn backlog(entries: &[Batch], more: bool, ledger: &LedgerSide) -> Backlog {
    let mut out = Backlog::default();
    for b in entries {
        let mut behind = !b.unreadable.is_empty();
        for w in &b.winners {
            if ledger.claims.contains_key(&w.claim_id) {
                out.written_units += i64::from(w.quantity);
            } else {
                behind = true;
            }
        }
        for c in &b.changes {
            // The claim's row has left `held`: the change (or one that ends it as well) is in.
            let done = ledger.claims.get(&c.claim_id).is_some_and(|ss| {
                ss.iter()
                    .any(|s| !matches!(s.as_str(), "held" | "issued" | "quarantined"))
            });
            if done {
                if matches!(c.status.as_str(), "cancelled" | "expired") {
                    out.written_units -= i64::from(c.quantity);
                }
            } else {
                behind = true;
            }
        }
        for w in &b.waits {
            let done = ledger
                .waits
                .get(&w.entry_id)
                .is_some_and(|s| wait_rank(s) >= wait_rank(w.status.as_str()));
            behind |= !done;
        }
        out.unwritten += i64::from(behind);
    }
    // Entries past what one reading returns: not looked into, so not known to be written.
    out.unwritten += i64::from(more);
    out
}

/// A waitlist entry's statuses only move forward (as the writer upserts them).
fn wait_rank(status: &str) -> u8 {
    match status {
        "waiting" => 0,
        "offered" => 1,
        _ => 2,
    }
}
