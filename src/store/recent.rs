//! This gateway's marks of active SKUs (see [`crate::activity`]), held by the
//! [`super::Store`] so that each script caller marks its SKU without another handle.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use dashmap::DashMap;

/// A gateway marks a SKU again once its last mark is this old (and the SKU is used again).
pub const MARK_EVERY: Duration = Duration::from_secs(1);
/// A SKU unmarked this long, with nothing in its journal, expiry set or waitlist, leaves the
/// set. Far above [`MARK_EVERY`] and the clock skew between gateways (scores are their clocks).
pub const HORIZON: Duration = Duration::from_secs(60);

/// This gateway's last successful mark per SKU, so a fresh SKU costs a map lookup; and the SKUs
/// whose mark got no answer, retried by [`crate::activity::Upkeep`]. Bounded by the SKUs this
/// gateway used within the [`HORIZON`] (see [`RecentMarks::recent`]). Held by the
/// [`super::Store`], so every caller of a script reaches it without another handle.
#[derive(Default)]
pub struct RecentMarks {
    /// When the last acknowledged mark of each SKU was sent.
    last: DashMap<String, Instant>,
    /// SKUs whose last mark failed: their calls may have journaled unmarked.
    failed: parking_lot::Mutex<HashSet<String>>,
}

impl RecentMarks {
    /// Whether this gateway marked the Redis SKU `name` (a SKU, or one shard of one) less than
    /// [`MARK_EVERY`] ago.
    pub fn fresh(&self, name: &str) -> bool {
        self.last
            .get(name)
            .is_some_and(|t| t.elapsed() < MARK_EVERY)
    }

    /// The SKUs this gateway marked (or failed to mark) within the [`HORIZON`]: its own writer
    /// and expiry worker serve them whether or not the set still holds them (a mark a failover
    /// lost, a mark that got no answer), so only a gateway's death leaves their work to the
    /// set, and only the set's loss as well leaves it to the catalog walk. Older entries are
    /// dropped here, which keeps the map as small as this gateway's recent work.
    pub fn recent(&self) -> Vec<String> {
        self.last.retain(|_, t| t.elapsed() < HORIZON);
        let mut out: Vec<String> = self.last.iter().map(|e| e.key().clone()).collect();
        out.extend(self.failed.lock().iter().cloned());
        out
    }

    /// Notes an acknowledged mark of `name`, sent at `sent`.
    pub fn marked(&self, name: &str, sent: Instant) {
        self.last.insert(name.to_string(), sent);
    }

    /// Notes a mark of `name` that got no answer: its calls may have journaled unmarked.
    pub fn failed(&self, name: &str) {
        self.failed.lock().insert(name.to_string());
    }

    /// The SKUs whose mark got no answer (taken: a retry that fails notes them again).
    pub fn take_failed(&self) -> Vec<String> {
        self.failed.lock().drain().collect()
    }
}
