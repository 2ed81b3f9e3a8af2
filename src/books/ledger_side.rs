//! The ledger's side of a reading ([`super`]): one PostgreSQL snapshot, and what of the
//! unacknowledged journal entries that snapshot already holds.

use std::collections::HashMap;

use sqlx::PgPool;
use uuid::Uuid;

use crate::error::DbError;
use crate::ledger::{ledger_sums, LedgerSums};
use crate::writer::Batch;

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
}

pub(super) async fn ledger_side(
    db: &PgPool,
    sku: &str,
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
    tx.commit().await?;
    Ok(LedgerSide {
        total,
        restocks,
        sums,
        claims: found,
        waits,
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
