//! What the writer carries from the journal to PostgreSQL: winners, and entries it cannot
//! read. One journal entry holds the winners of one claim.lua call: each becomes a [`Winner`]
//! that keeps the entry's id (acknowledged once, with all their units).

use uuid::Uuid;

use crate::status::{ClaimStatus, EntryStatus};

/// One winner as the journal holds it.
#[derive(Debug, Clone)]
pub struct Winner {
    /// Stream entry id, acknowledged after the commit (shared by the winners of one call).
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
    /// A hold's expiry (unix ms); `None` for a claim final at once.
    pub expires_ms: Option<i64>,
    /// A waitlist offer (its claim id is the entry id): recorded as `waitlist.offered`.
    pub offer: bool,
    /// A seated SKU's claim: its seat ids, comma-joined (claim_seats.lua's `z`).
    pub seats: Option<String>,
}

/// A hold's status change (confirmed, cancelled, expired), as the journal holds it.
#[derive(Debug, Clone)]
pub struct Change {
    /// The journal entry that carries it: its place after its win (see `order.rs`).
    pub entry_id: String,
    pub claim_id: Uuid,
    pub status: ClaimStatus,
    pub quantity: i32,
    pub ms: i64,
    pub seq: i64,
}

/// A waitlist entry's change (waiting, offered, claimed, expired, left).
#[derive(Debug, Clone)]
pub struct WaitChange {
    /// The journal entry that carries it (an offer's ending shares its hold change's entry).
    pub journal_entry: String,
    pub entry_id: Uuid,
    pub user: String,
    pub status: EntryStatus,
    /// Join order in the SKU's line.
    pub order: i64,
    pub ms: i64,
    pub seq: i64,
    /// The units the entry waits for (seats, on a seated SKU; 1 elsewhere).
    pub quantity: u32,
}

/// A journal entry that carries lifecycle records (and no winner): acknowledged with `units`
/// (negative: units a cancel or expiry gave back, which leave `inflight`'s negative balance
/// once the change is written).
#[derive(Debug, Clone)]
pub struct Other {
    pub entry_id: String,
    pub units: i32,
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
    /// Hold status changes, in journal order.
    pub changes: Vec<Change>,
    /// Waitlist changes, in journal order.
    pub waits: Vec<WaitChange>,
    /// Entries without a winner that carried changes.
    pub others: Vec<Other>,
}

impl Batch {
    /// Winners, unreadable entries and other entries: what the batch settles.
    pub fn len(&self) -> usize {
        self.winners.len() + self.unreadable.len() + self.others.len()
    }

    /// Journal entries the batch settles (a call's winners share one).
    pub fn entries(&self) -> usize {
        let winners: std::collections::HashSet<&str> =
            self.winners.iter().map(|w| w.entry_id.as_str()).collect();
        winners.len() + self.unreadable.len() + self.others.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn extend(&mut self, other: Batch) {
        self.winners.extend(other.winners);
        self.unreadable.extend(other.unreadable);
        self.changes.extend(other.changes);
        self.waits.extend(other.waits);
        self.others.extend(other.others);
    }

    /// The journal entries the batch holds, of every kind.
    pub fn entry_ids(&self) -> std::collections::HashSet<&str> {
        (self.winners.iter().map(|w| w.entry_id.as_str()))
            .chain(self.unreadable.iter().map(|u| u.entry_id.as_str()))
            .chain(self.others.iter().map(|o| o.entry_id.as_str()))
            .collect()
    }

    /// Takes the entries `ids` (entries without a winner: those of hold changes that wait for
    /// their wins) out of the batch, with everything they carry.
    pub fn split_off(&mut self, ids: &std::collections::HashSet<String>) -> Batch {
        let mut kept = Batch::default();
        if ids.is_empty() {
            return kept;
        }
        (self.others, kept.others) = std::mem::take(&mut self.others)
            .into_iter()
            .partition(|o| !ids.contains(&o.entry_id));
        (self.changes, kept.changes) = std::mem::take(&mut self.changes)
            .into_iter()
            .partition(|c| !ids.contains(&c.entry_id));
        (self.waits, kept.waits) = std::mem::take(&mut self.waits)
            .into_iter()
            .partition(|w| !ids.contains(&w.journal_entry));
        kept
    }

    /// The same entry may come from two reads of one pass; settle it once.
    pub fn dedup(&mut self) {
        self.winners
            .sort_by(|a, b| (&a.entry_id, a.claim_id).cmp(&(&b.entry_id, b.claim_id)));
        self.winners
            .dedup_by(|a, b| a.entry_id == b.entry_id && a.claim_id == b.claim_id);
        self.unreadable.sort_by(|a, b| a.entry_id.cmp(&b.entry_id));
        self.unreadable.dedup_by(|a, b| a.entry_id == b.entry_id);
        self.others.sort_by(|a, b| a.entry_id.cmp(&b.entry_id));
        self.others.dedup_by(|a, b| a.entry_id == b.entry_id);
        // Changes are applied with guards (a hold leaves `held` once, an entry only moves
        // forward), so a change read twice is harmless; order by sequence keeps journal order.
        self.changes.sort_by_key(|c| c.seq);
        self.changes
            .dedup_by(|a, b| a.seq == b.seq && a.claim_id == b.claim_id);
        self.waits.sort_by_key(|w| w.seq);
        self.waits
            .dedup_by(|a, b| a.seq == b.seq && a.entry_id == b.entry_id);
    }
}
