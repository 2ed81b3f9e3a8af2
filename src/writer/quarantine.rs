//! The quarantine: journal entries that no table would take (PostgreSQL refused the winner in
//! `issuances` and in `persistence_pending`, or the entry cannot be read at all). One such
//! entry must not stop its SKU's writer, and must not vanish either: it is kept, bytes and
//! error, where an operator sees it (the `quarantine` table, an ERROR log line, the
//! `dropgate_quarantined_total` counter), and its entry is then acknowledged like any other.
//! An entry carries the winners of one call: each winner no table takes is a row of its own
//! (the entry's id and bytes, its claim); an entry that cannot be read at all is one row.
//!
//! Its units left Redis stock when the claim won, so the SKU view counts them as
//! `quarantined` until an operator resolves the row (records or compensates the claim, then
//! sets `resolved_at`).

use sqlx::PgPool;
use uuid::Uuid;

use crate::error::DbError;
use crate::journal::{Unreadable, Winner};
use crate::metrics as m;
use crate::sku::SkuId;

/// One entry for the quarantine.
#[derive(Debug, Clone)]
pub struct Quarantined {
    pub entry_id: String,
    pub claim_id: Option<Uuid>,
    /// The buyer, made storable (a NUL byte, which text refuses, becomes U+FFFD); `None`
    /// when the entry could not be read.
    pub user_id: Option<String>,
    pub quantity: Option<i32>,
    pub raw: Vec<u8>,
    pub error: String,
}

impl Quarantined {
    pub fn winner(w: &Winner, raw: Vec<u8>, error: String) -> Self {
        Quarantined {
            entry_id: w.entry_id.clone(),
            claim_id: Some(w.claim_id),
            user_id: Some(storable(&w.user)),
            quantity: Some(w.quantity),
            raw,
            error,
        }
    }

    pub fn unreadable(u: &Unreadable) -> Self {
        Quarantined {
            entry_id: u.entry_id.clone(),
            claim_id: u.claim_id,
            user_id: None,
            quantity: u.units,
            raw: u.raw.clone(),
            error: "the journal entry holds no winner this gateway can read".into(),
        }
    }
}

fn storable(s: &str) -> String {
    s.replace('\0', "\u{FFFD}")
}

/// Stores the entries; an entry stored before (a second writer, a retried pass) is left as
/// it is and counted once.
///
/// # Errors
/// The database error: the caller keeps the batch and acknowledges nothing.
pub async fn record(db: &PgPool, sku: &SkuId, entries: &[Quarantined]) -> Result<(), DbError> {
    for q in entries {
        let inserted = sqlx::query(
            "INSERT INTO quarantine (sku, entry_id, claim_id, user_id, quantity, raw_entry, error)
             VALUES ($1, $2, $3, $4, $5, $6, $7)
             ON CONFLICT (sku, entry_id, claim_id) DO NOTHING",
        )
        .bind(sku)
        .bind(&q.entry_id)
        .bind(q.claim_id)
        .bind(&q.user_id)
        .bind(q.quantity)
        .bind(&q.raw)
        .bind(storable(&q.error))
        .execute(db)
        .await?
        .rows_affected();
        if inserted == 1 {
            m::quarantined();
            tracing::error!(
                sku = sku.as_str(),
                entry_id = %q.entry_id,
                claim_id = ?q.claim_id,
                units = ?q.quantity,
                error = %q.error,
                "journal entry quarantined: no table takes it; an operator must resolve it (table quarantine)"
            );
        }
    }
    Ok(())
}
