//! What the clients saw, for the checker: every claim attempt with its answer, every reading
//! of a claim's status (lookups, confirms, cancels, their refusals) with when it was asked
//! and answered, the waitlist entries joined, and the requests that had to move nothing.

use std::collections::HashMap;
use std::time::Instant;

use uuid::Uuid;

#[derive(Debug, Clone)]
pub struct Attempt {
    pub sku: String,
    pub user: String,
    pub key: Option<String>,
    pub qty: i64,
    pub status: u16,
    pub code: String,
    pub claim_id: Option<Uuid>,
    pub replayed: bool,
}

/// One reading of a claim's status: what the answer says the claim was at some instant
/// between `asked` and `answered`.
#[derive(Debug, Clone)]
pub struct Reading {
    pub claim: Uuid,
    /// `GET`, `confirm`, `cancel`, `entry` (the offer's claim as its entry shows it).
    pub via: &'static str,
    pub status: String,
    pub asked: Instant,
    pub answered: Instant,
}

/// A claim a client won (201) or may have won (`outcome_unknown`), for the operations that
/// act on it later.
#[derive(Debug, Clone)]
pub struct Owned {
    pub claim: Uuid,
    pub sku: String,
    pub user: String,
    /// A 201 said so: the claim is the buyer's from that moment (never a 404).
    pub answered: bool,
}

#[derive(Debug, Clone)]
pub struct Joined {
    pub entry: Uuid,
    pub sku: String,
    pub user: String,
}

#[derive(Default)]
pub struct History {
    pub attempts: Vec<Attempt>,
    /// Keys used so far, per (sku, user), with their quantity, for retries.
    pub keys: HashMap<(String, String), Vec<(String, i64)>>,
    pub owned: Vec<Owned>,
    pub readings: Vec<Reading>,
    pub entries: Vec<Joined>,
    /// (sku, user, key) of claims refused before any decision (a token for another SKU):
    /// no row may carry them.
    pub refused: Vec<(String, String, String)>,
    /// Counts of every operation's answers, `op status code`, for the run's summary.
    pub answers: std::collections::BTreeMap<String, usize>,
    /// The waiting room's tickets and readings (`queue.rs`).
    pub queue: super::queue::Tickets,
    /// The seated SKU's keys per user with the body sent under each, for replays, and the
    /// seats each claim won as its first 201 told them (`seats.rs`).
    pub seat_keys: HashMap<String, Vec<(String, serde_json::Value)>>,
    pub seats_won: HashMap<Uuid, Vec<String>>,
}

impl History {
    pub fn count(&mut self, op: &str, status: u16, code: &str) {
        *self
            .answers
            .entry(format!("{op} {status} {code}"))
            .or_default() += 1;
    }

    pub fn read(&mut self, claim: Uuid, via: &'static str, status: &str, asked: Instant) {
        self.readings.push(Reading {
            claim,
            via,
            status: status.to_string(),
            asked,
            answered: Instant::now(),
        });
    }
}
