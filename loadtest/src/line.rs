//! What the visitors of `queue_drop` saw (its scenario writes it, its checks read it), and the
//! admission time its SKU is declared with: apart from the scenario, so the scenarios' `Drop`
//! (which carries a `Line`) and the scenario do not import each other.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

/// How long an admission is valid: far longer than a visitor takes to claim.
pub const ADMISSION_TTL_SECS: i64 = 120;

/// What the visitors saw, for the checks.
#[derive(Debug, Default)]
pub struct Line {
    /// Visitor index → ticket id.
    pub(crate) tickets: Mutex<HashMap<usize, String>>,
    /// Ticket → the `admission_expires_at` values its admitted readings carried.
    pub(crate) admissions: Mutex<HashMap<String, HashSet<String>>>,
    /// `"<request> <outcome>"` → count.
    pub(crate) answers: Mutex<BTreeMap<String, u64>>,
    /// Tickets that read `prequeue` (joined before the opening).
    pub prequeue: AtomicU64,
    /// Claims sent with a token the queue did not mint, and how many were not refused 403.
    pub cheats: AtomicU64,
    pub cheats_let_in: AtomicU64,
}

impl Line {
    pub(crate) fn count(&self, request: &str, outcome: &str) {
        let mut a = self.answers.lock().unwrap_or_else(|e| e.into_inner());
        *a.entry(format!("{request} {outcome}")).or_default() += 1;
    }
}

/// For the checks: tickets by visitor, admissions by ticket, answers.
impl Line {
    pub fn tickets(&self) -> HashMap<usize, String> {
        self.tickets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn admissions(&self) -> HashMap<String, HashSet<String>> {
        self.admissions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn answers(&self) -> BTreeMap<String, u64> {
        self.answers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}
