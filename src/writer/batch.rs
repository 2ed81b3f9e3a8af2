//! What the writer carries from the journal to PostgreSQL: winners, and entries it cannot
//! read.

use uuid::Uuid;

/// One winner as the journal holds it.
#[derive(Debug, Clone)]
pub struct Winner {
    /// Stream entry id, acknowledged after the commit.
    pub entry_id: String,
    pub claim_id: Uuid,
    pub sku: String,
    pub user: String,
    pub quantity: i32,
    pub idempotency_key: Option<String>,
    pub remaining_after: Option<i64>,
    pub created_ms: i64,
    /// The SKU state's sequence this winner produced (see [`crate::freshness`]).
    pub seq: i64,
}

/// A journal entry that holds no winner this code can read (garbled, or laid out by a newer
/// claim.lua than this gateway knows): it goes to the quarantine, never silently skipped.
#[derive(Debug, Clone)]
pub struct Unreadable {
    pub entry_id: String,
    /// The entry's fields as Redis holds them, `field=value` joined by newlines.
    pub raw: Vec<u8>,
    /// What could still be made out of the entry.
    pub claim_id: Option<Uuid>,
    pub units: Option<i32>,
}

/// What one pass read from a SKU's journal.
#[derive(Debug, Clone, Default)]
pub struct Batch {
    pub winners: Vec<Winner>,
    pub unreadable: Vec<Unreadable>,
}

impl Batch {
    pub fn len(&self) -> usize {
        self.winners.len() + self.unreadable.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(super) fn extend(&mut self, other: Batch) {
        self.winners.extend(other.winners);
        self.unreadable.extend(other.unreadable);
    }

    /// The same entry may come from two reads of one pass; settle it once.
    pub(super) fn dedup(&mut self) {
        self.winners.sort_by(|a, b| a.entry_id.cmp(&b.entry_id));
        self.winners.dedup_by(|a, b| a.entry_id == b.entry_id);
        self.unreadable.sort_by(|a, b| a.entry_id.cmp(&b.entry_id));
        self.unreadable.dedup_by(|a, b| a.entry_id == b.entry_id);
    }
}
