//! The sold-out fast path: once Redis said a SKU has no stock, claims on it are refused from
//! memory, with no Redis call, until units may have come back.
//!
//! In a drop almost every attempt comes after the stock is gone; each one used to cost a
//! `claim.lua` call. Now the first `sold_out` with a remaining stock of 0 teaches [`SoldOut`],
//! and later claims without an `Idempotency-Key` are answered 409 `sold_out` at once (a keyed
//! claim may be a replay of a win, so it always asks Redis).
//!
//! # How units coming back reach every gateway
//!
//! Every script that can raise a SKU's stock (`restock.lua` when it applies, `compensate.lua`
//! when it gives back, `restore_sku.lua`, `declare_sku.lua` when it seeds; the hold and waitlist
//! scripts when they return units) publishes, in the same atomic step, the SKU's state key on
//! the channel `<prefix>:units-back` ([`crate::keys::units_back_channel`]). The one line, with
//! the state key as `KEYS[1]`:
//!
//! ```lua
//! redis.call('PUBLISH', (string.gsub(KEYS[1], '{[^{]*$', 'units-back')), KEYS[1])
//! ```
//!
//! [`Watcher`] (`watcher.rs`) holds the subscription and forgets the SKU when the message
//! comes.
//!
//! # The staleness bound (why a lost message cannot refuse forever)
//!
//! A cached sold-out is trusted only while the subscription is up **and** for at most
//! [`TRUST`] (100 ms) after a read of the SKU's stock that found 0 began: the read is the
//! claim's own `claim.lua` call, or the watcher's re-check (`HGET state stock`, one per SKU in
//! use per half [`TRUST`], never one per request; a SKU nobody asked about since the last
//! re-check is dropped instead). So even a notification that never came (a script that forgot
//! the line, a message lost with its connection) leaves a SKU refusing for at most 100 ms, and
//! the subscription only makes a restock visible sooner than that. Losing the subscription
//! forgets every SKU. A stale answer can only ever refuse: a sale always goes to Redis.
//!
//! A notification that overtakes the answer it invalidates (the restock ran after the
//! `claim.lua` that saw 0, and its message arrived before that answer) must not be undone by
//! the late answer: every reader takes a [`Ticket`] before its call, and learning is refused
//! when any notification arrived since.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::RwLock;

use crate::layout::Layout;
use crate::sku::SkuId;

mod watcher;

pub use watcher::Watcher;

/// How long after the read that found 0 a sold-out answer from memory is still given, by
/// default (`DROPGATE_SOLD_OUT_TRUST_MS`; 0 turns the fast path off). An entry in use is
/// re-read once it is half that old, and the watcher looks for such entries every quarter.
pub const TRUST: Duration = Duration::from_millis(100);

/// SKUs Redis last said have no stock; shared by every request of a gateway.
pub struct SoldOut {
    inner: RwLock<Inner>,
    /// See [`TRUST`].
    trust: Duration,
}

#[derive(Default)]
struct Inner {
    /// SKU -> when the read that found stock 0 began, and whether a claim was refused from
    /// memory since the last re-check (an unused entry is dropped, not re-read).
    skus: HashMap<String, Entry>,
    /// Bumped by every notification and every change of the subscription: a read that began
    /// before a bump may not teach anything (see [`Ticket`]).
    notices: u64,
    /// Whether the subscription is up; while it is not, nothing is cached.
    live: bool,
}

struct Entry {
    since: Instant,
    used: AtomicBool,
    /// The SKU's shards: a sharded SKU is re-read on every shard ([`crate::shards`]).
    layout: Layout,
}

/// Taken before a read of a SKU's stock; what the read finds is learned only if no
/// notification arrived in between.
#[derive(Debug, Clone, Copy)]
pub struct Ticket {
    notices: u64,
    at: Instant,
}

impl SoldOut {
    pub fn new(trust: Duration) -> Self {
        SoldOut {
            inner: RwLock::default(),
            trust,
        }
    }

    /// Whether a claim on `sku` may be refused from memory now.
    pub fn refuses(&self, sku: &SkuId) -> bool {
        let inner = self.inner.read();
        if !inner.live || self.trust.is_zero() {
            return false;
        }
        match inner.skus.get(sku.as_str()) {
            Some(e) if e.since.elapsed() <= self.trust => {
                // Load first: a store on every refusal would bounce the cache line.
                if !e.used.load(Ordering::Relaxed) {
                    e.used.store(true, Ordering::Relaxed);
                }
                true
            }
            _ => false,
        }
    }

    pub fn ticket(&self) -> Ticket {
        Ticket {
            notices: self.inner.read().notices,
            at: Instant::now(),
        }
    }

    /// A read that began at `ticket` found `sku`'s stock at 0 (on every one of its shards,
    /// laid out as `layout`, with no transfer between them in flight).
    pub fn learn(&self, sku: &SkuId, layout: Layout, ticket: Ticket) {
        let mut inner = self.inner.write();
        if !inner.live || inner.notices != ticket.notices {
            return;
        }
        let entry = Entry {
            since: ticket.at,
            used: AtomicBool::new(true),
            layout,
        };
        match inner.skus.get_mut(sku.as_str()) {
            Some(e) if e.since >= ticket.at => {}
            Some(e) => *e = entry,
            None => {
                inner.skus.insert(sku.as_str().to_owned(), entry);
            }
        }
    }

    /// Units may be back on `sku` (a notification, or a re-check that found stock).
    fn forget(&self, sku: &SkuId) {
        let mut inner = self.inner.write();
        inner.notices += 1;
        inner.skus.remove(sku.as_str());
    }

    /// The subscription is up (`true`) or gone (`false`); either way every entry goes.
    fn set_live(&self, live: bool) {
        let mut inner = self.inner.write();
        inner.notices += 1;
        inner.live = live;
        inner.skus.clear();
    }

    /// Entries at least half [`TRUST`] old that were used since their last re-check; unused
    /// ones are dropped here.
    fn due(&self) -> Vec<(String, Layout)> {
        let recheck_after = self.trust / 2;
        let mut inner = self.inner.write();
        let mut due = Vec::new();
        inner.skus.retain(|sku, e| {
            if e.since.elapsed() < recheck_after {
                return true;
            }
            let used = e.used.swap(false, Ordering::Relaxed);
            if used {
                due.push((sku.clone(), e.layout));
            }
            used
        });
        due
    }

    /// SKUs cached now (tests and the watcher's log).
    pub fn len(&self) -> usize {
        self.inner.read().skus.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> &SkuId {
        SkuId::parse(s).expect("a valid SKU id")
    }

    fn live() -> SoldOut {
        let s = SoldOut::new(TRUST);
        s.set_live(true);
        s
    }

    #[test]
    fn nothing_is_refused_while_the_subscription_is_down() {
        let s = SoldOut::new(TRUST);
        s.learn(id("a"), Layout::SINGLE, s.ticket());
        assert!(!s.refuses(id("a")));
    }

    #[test]
    fn a_learned_sold_out_is_refused_until_a_notification() {
        let s = live();
        s.learn(id("a"), Layout::SINGLE, s.ticket());
        assert!(s.refuses(id("a")));
        assert!(!s.refuses(id("b")));
        s.forget(id("a"));
        assert!(!s.refuses(id("a")));
    }

    #[test]
    fn a_notification_that_overtook_the_answer_wins() {
        let s = live();
        let t = s.ticket();
        s.forget(id("a"));
        s.learn(id("a"), Layout::SINGLE, t);
        assert!(!s.refuses(id("a")));
    }

    #[test]
    fn an_entry_older_than_the_bound_is_not_trusted() {
        let s = live();
        let mut t = s.ticket();
        t.at -= TRUST + Duration::from_millis(1);
        s.learn(id("a"), Layout::SINGLE, t);
        assert!(!s.refuses(id("a")));
    }

    #[test]
    fn losing_the_subscription_forgets_everything() {
        let s = live();
        s.learn(id("a"), Layout::SINGLE, s.ticket());
        s.set_live(false);
        s.set_live(true);
        assert!(!s.refuses(id("a")));
    }

    /// The line every script that can raise a SKU's stock carries (see the module docs).
    const UNITS_BACK: &str =
        "redis.call('PUBLISH', (string.gsub(KEYS[1], '{[^{]*$', 'units-back')), KEYS[1])";
    /// Scripts that write `stock` but can only lower it, or only read it.
    const LOWER_ONLY: &[&str] = &[
        "claim.lua",
        "claim_seats.lua",
        "join_waitlist.lua",
        "transfer_out.lua",
        "line_lease.lua",
        "offer_pool.lua",
        "read_books.lua",
        "admit_queue.lua",
    ];

    #[test]
    fn every_script_that_writes_stock_tells_the_gateways() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/lua");
        // Units come back through lib/lifecycle.lua's give_back in the scripts that include it.
        let lib = std::fs::read_to_string(format!("{dir}/lib/lifecycle.lua")).unwrap();
        assert!(
            lib.contains(UNITS_BACK),
            "give_back must carry the units-back line"
        );
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                continue;
            }
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            let text = std::fs::read_to_string(&path).unwrap();
            let through_lib = text.contains("give_back(") || text.contains("end_hold(");
            if !text.contains("'stock'") || through_lib || LOWER_ONLY.contains(&name.as_str()) {
                continue;
            }
            assert!(
                text.contains(UNITS_BACK),
                "{name} writes stock: add the units-back line (src/soldout/), or list it in LOWER_ONLY"
            );
        }
    }

    #[test]
    fn unused_entries_are_dropped_not_reread() {
        let s = live();
        let mut t = s.ticket();
        t.at -= TRUST / 2;
        s.learn(id("used"), Layout::SINGLE, t);
        s.learn(id("idle"), Layout::SINGLE, t);
        // First round: both were used since learning (learning counts as a use).
        let mut due = s.due();
        due.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            due,
            [
                ("idle".to_string(), Layout::SINGLE),
                ("used".to_string(), Layout::SINGLE)
            ]
        );
        assert!(s.refuses(id("used")));
        assert_eq!(s.due(), [("used".to_string(), Layout::SINGLE)]);
        assert_eq!(s.len(), 1);
    }
}
