//! The ledger's marks this gateway knows (see [`crate::freshness`]), held by the [`super::Store`]
//! so that each script caller sends its SKU's floor without another handle.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;

use dashmap::DashMap;

use crate::scripts::Floor;

/// One Redis name's mark, as this gateway knows it.
#[derive(Default)]
struct Mark {
    seq: AtomicI64,
    inc: AtomicI64,
    /// Set once a script call of this gateway took its floor: the refresher then keeps the
    /// mark current every round (a SKU only loaded from the catalog is compared once).
    used: AtomicBool,
    /// The state's sequence at its last rotation by this gateway (-1: none yet).
    rotated_at: AtomicI64,
}

/// The highest state sequence and incarnation this gateway knows PostgreSQL recorded, per
/// Redis name: every SKU of the catalog (loaded at start and as new SKUs appear, before any
/// script call of this gateway moves them: [`crate::freshness::load_new`]), shards included.
#[derive(Default)]
pub struct Marks {
    map: DashMap<String, Arc<Mark>>,
    /// The highest catalog `tag` loaded so far (tags only grow: new SKUs are those above).
    loaded_tag: AtomicI64,
    /// Names loaded from the catalog whose Redis state the refresher has not compared yet.
    unchecked: parking_lot::Mutex<Vec<String>>,
    /// Every name loaded from the catalog, and where the refresher's walk over them is: each
    /// round re-reads the floors of [`WALK`] of them, so a name this gateway has not moved yet
    /// has a floor at most a walk old when it first does.
    loaded: parking_lot::Mutex<(Vec<String>, usize)>,
}

/// Names whose floors each refresher round re-reads besides the ones this gateway moves: a
/// catalog of up to this many SKUs is re-read every second, a larger one in turns.
const WALK: usize = 2_000;

impl Marks {
    fn mark(&self, name: &str) -> Arc<Mark> {
        if let Some(m) = self.map.get(name) {
            return m.clone();
        }
        self.map
            .entry(name.to_string())
            .or_insert_with(|| {
                Arc::new(Mark {
                    rotated_at: AtomicI64::new(-1),
                    ..Mark::default()
                })
            })
            .clone()
    }

    /// The mark of the Redis name `name` (0 when unknown: nothing to compare against yet).
    pub fn floor(&self, name: &str) -> i64 {
        self.map
            .get(name)
            .map_or(0, |m| m.seq.load(Ordering::Relaxed))
    }

    /// The floor of the Redis name `name` for a script call that may change its state; the
    /// name is then kept current every round.
    pub fn fence(&self, name: &str) -> Floor {
        let m = self.mark(name);
        m.used.store(true, Ordering::Relaxed);
        Floor {
            seq: m.seq.load(Ordering::Relaxed),
            inc: m.inc.load(Ordering::Relaxed),
        }
    }

    /// The floor of `name` as known, without making it a name kept current.
    pub fn fence_peek(&self, name: &str) -> Floor {
        self.map.get(name).map_or(Floor::default(), |m| Floor {
            seq: m.seq.load(Ordering::Relaxed),
            inc: m.inc.load(Ordering::Relaxed),
        })
    }

    /// Raises the mark of `name` to `mark` (marks only grow).
    pub fn observe(&self, name: &str, mark: i64) {
        let m = self.mark(name);
        m.used.store(true, Ordering::Relaxed);
        m.seq.fetch_max(mark, Ordering::Relaxed);
    }

    /// Raises the recorded incarnation of `name` to `inc`.
    pub fn observe_inc(&self, name: &str, inc: i64) {
        self.mark(name).inc.fetch_max(inc, Ordering::Relaxed);
    }

    /// Learns a name's mark from the catalog without making it one this gateway keeps current.
    pub fn learn(&self, name: &str, seq: i64, inc: i64) {
        let m = self.mark(name);
        m.seq.fetch_max(seq, Ordering::Relaxed);
        m.inc.fetch_max(inc, Ordering::Relaxed);
    }

    /// The names a script call of this gateway took a floor for: kept current every round.
    pub fn active(&self) -> Vec<String> {
        self.map
            .iter()
            .filter(|e| e.value().used.load(Ordering::Relaxed))
            .map(|e| e.key().clone())
            .collect()
    }

    /// The next [`WALK`] loaded names not in use here (in turns over the whole catalog).
    pub fn walk(&self) -> Vec<String> {
        let mut loaded = self.loaded.lock();
        let (names, at) = &mut *loaded;
        if names.is_empty() {
            return Vec::new();
        }
        let mut out = Vec::with_capacity(WALK.min(names.len()));
        for _ in 0..WALK.min(names.len()) {
            *at %= names.len();
            let name = &names[*at];
            *at += 1;
            if !self
                .map
                .get(name)
                .is_some_and(|m| m.used.load(Ordering::Relaxed))
            {
                out.push(name.clone());
            }
        }
        out
    }

    /// The highest catalog `tag` loaded so far.
    pub fn loaded_tag(&self) -> i64 {
        self.loaded_tag.load(Ordering::Relaxed)
    }

    /// Notes `names`, just loaded from the catalog up to the tag `tag`: each one's state is
    /// to be compared once, and each is walked in turn.
    pub fn loaded(&self, names: Vec<String>, tag: i64) {
        self.loaded.lock().0.extend(names.iter().cloned());
        self.unchecked.lock().extend(names);
        self.loaded_tag.fetch_max(tag, Ordering::Relaxed);
    }

    /// The names loaded whose state was not compared yet (taken: give back what was not
    /// compared with [`Marks::unchecked_again`]).
    pub fn take_unchecked(&self) -> Vec<String> {
        std::mem::take(&mut *self.unchecked.lock())
    }

    /// Names to compare again next round.
    pub fn unchecked_again(&self, names: impl IntoIterator<Item = String>) {
        self.unchecked.lock().extend(names);
    }

    /// The state's moves (`seq + qseq`) at this gateway's last rotation of `name` (-1: none yet).
    pub fn rotated_at(&self, name: &str) -> i64 {
        self.mark(name).rotated_at.load(Ordering::Relaxed)
    }

    /// Notes that this gateway rotated `name` at the state's moves `moves`.
    pub fn set_rotated_at(&self, name: &str, moves: i64) {
        self.mark(name).rotated_at.store(moves, Ordering::Relaxed);
    }
}
