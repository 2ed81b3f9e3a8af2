//! Repeated warnings, rate-limited: a background task that retries every 100 ms would write a
//! line per retry for as long as a fault lasts (100 identical lines in 10 s of a Redis outage),
//! and the one line an operator needs (when it started, what is wrong, when it ended) drowns.
//!
//! [`Repeats`] decides which occurrences of a fault are logged: the first one, the first one
//! after the fault changed (another error: a state change is news), then at most one every
//! `every`, carrying how many occurrences it stands for (`repeated`); and when the fault is
//! over, one line saying so (see [`Repeats::clear`]). The caller keeps its own message and
//! fields, so each site still says what is true in its own words.
//!
//! Keys are what a fault is about: a SKU for a fault of that SKU's state, or a fixed name for
//! a fault of the whole backend (a Redis outage fails every SKU alike, and one line says so).
//! Bounded by the catalog plus a few fixed names.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// How often a fault that goes on is logged again, by default.
pub const EVERY: Duration = Duration::from_secs(10);

/// The key of a fault that is not about one SKU.
pub const BACKEND: &str = "";

/// Which occurrences of repeated faults to log (see the module docs).
pub struct Repeats {
    every: Duration,
    faults: Mutex<HashMap<String, Fault>>,
}

struct Fault {
    /// What the fault is (the error's text): another text is a change, logged at once.
    what: String,
    since: Instant,
    logged_at: Instant,
    /// Occurrences since the last logged one.
    unlogged: u64,
}

/// Whether to log this occurrence, and what the line stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Occurrence {
    /// Occurrences since the previous line that were not logged (0 for the first line).
    pub repeated: u64,
    /// How long the fault has lasted.
    pub for_secs: u64,
}

/// A fault that ended, once logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended {
    /// Occurrences after the last line that were never logged.
    pub unlogged: u64,
    pub lasted_secs: u64,
}

impl Default for Repeats {
    fn default() -> Self {
        Repeats::new(EVERY)
    }
}

impl Repeats {
    pub fn new(every: Duration) -> Self {
        Repeats {
            every,
            faults: Mutex::new(HashMap::new()),
        }
    }

    /// One occurrence of the fault `what` about `key`: `Some` when it is to be logged now.
    pub fn occurred(&self, key: &str, what: &str) -> Option<Occurrence> {
        self.occurred_at(key, what, Instant::now())
    }

    fn occurred_at(&self, key: &str, what: &str, now: Instant) -> Option<Occurrence> {
        let mut faults = self.faults.lock();
        let Some(f) = faults.get_mut(key) else {
            faults.insert(
                key.to_string(),
                Fault {
                    what: what.to_string(),
                    since: now,
                    logged_at: now,
                    unlogged: 0,
                },
            );
            return Some(Occurrence {
                repeated: 0,
                for_secs: 0,
            });
        };
        let changed = f.what != what;
        if changed || now.duration_since(f.logged_at) >= self.every {
            let line = Occurrence {
                repeated: f.unlogged,
                for_secs: now.duration_since(f.since).as_secs(),
            };
            if changed {
                f.what = what.to_string();
            }
            f.logged_at = now;
            f.unlogged = 0;
            return Some(line);
        }
        f.unlogged += 1;
        None
    }

    /// The fault about `key` is over (the call succeeded): `Some` when one was logged, so
    /// that its end is logged too.
    pub fn clear(&self, key: &str) -> Option<Ended> {
        let f = self.faults.lock().remove(key)?;
        Some(Ended {
            unlogged: f.unlogged,
            lasted_secs: f.since.elapsed().as_secs(),
        })
    }

    /// Whether a fault about `key` is being counted.
    pub fn ongoing(&self, key: &str) -> bool {
        self.faults.lock().contains_key(key)
    }
}

/// Logs, at INFO, that the fault under `key` (a SKU, or [`BACKEND`]) is over: `message`
/// says what works again.
pub fn ended(key: &str, end: Ended, message: &str) {
    let sku = (!key.is_empty() && !key.starts_with('\0')).then_some(key);
    tracing::info!(
        sku,
        lasted_secs = end.lasted_secs,
        unlogged = end.unlogged,
        "{message}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fault_is_logged_first_then_once_per_interval_with_the_count() {
        let r = Repeats::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(
            r.occurred_at("", "refused", t0),
            Some(Occurrence {
                repeated: 0,
                for_secs: 0
            })
        );
        // 100 retries in the next 9.9 s: none logged.
        for i in 1..=99 {
            let at = t0 + Duration::from_millis(100 * i);
            assert_eq!(r.occurred_at("", "refused", at), None, "retry {i}");
        }
        let line = r.occurred_at("", "refused", t0 + Duration::from_secs(10));
        assert_eq!(
            line,
            Some(Occurrence {
                repeated: 99,
                for_secs: 10
            })
        );
        assert_eq!(
            r.occurred_at("", "refused", t0 + Duration::from_millis(10_100)),
            None
        );
        let ended = r.clear("").expect("it was logged");
        assert_eq!(ended.unlogged, 1);
        assert_eq!(r.clear(""), None, "an end is logged once");
    }

    #[test]
    fn another_fault_is_news_and_keys_are_apart() {
        let r = Repeats::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert!(r.occurred_at("", "refused", t0).is_some());
        assert!(r.occurred_at("", "refused", t0).is_none());
        let changed = r.occurred_at("", "timeout", t0).unwrap();
        assert_eq!(changed.repeated, 1);
        assert!(r.occurred_at("drop-1", "lost", t0).is_some());
        assert!(r.ongoing("drop-1") && r.ongoing(""));
        assert!(r.clear("drop-1").is_some());
        assert!(!r.ongoing("drop-1") && r.ongoing(""));
    }
}
