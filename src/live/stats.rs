//! This gateway's claim answers per SKU: counts by outcome, when the SKU last had a claim, and
//! the decision latencies of the last [`WINDOW_SECS`] seconds (HdrHistogram, one per second),
//! fed by the claim handler and read by the live streams.
//!
//! The claim handler's cost: two relaxed atomic adds and one uncontended lock of the SKU's
//! latency window (`benches/claim_path.rs`, group `live_stats`, measures it against the
//! atomic bucket counters this replaced).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dashmap::DashMap;
use hdrhistogram::Histogram;
use parking_lot::Mutex;

use crate::metrics::CLAIM_OUTCOMES;
use crate::sku::SkuId;

/// Seconds of decisions the p99 is taken over: one second holds too few claims off-peak.
pub const WINDOW_SECS: u64 = 10;
/// Latencies are recorded in microseconds, 1 µs to 60 s, to 2 significant digits (a p99 of
/// 1.234 ms reads 1.2 ms); slower answers count as 60 s.
const LOWEST_US: u64 = 1;
const HIGHEST_US: u64 = 60_000_000;
const SIGFIG: u8 = 2;

/// Per-SKU claim counters. Bounded by the catalog: only a declared SKU reaches a decision.
pub struct ClaimStats {
    /// The zero of the seconds the windows and `last_active` count in.
    epoch: Instant,
    skus: DashMap<String, Arc<SkuCounters>>,
}

impl Default for ClaimStats {
    fn default() -> Self {
        ClaimStats {
            epoch: Instant::now(),
            skus: DashMap::new(),
        }
    }
}

/// Counters of one SKU. The outcome counts are relaxed atomics (a frame tolerates a claim
/// counted a second late).
struct SkuCounters {
    /// Indexed like [`CLAIM_OUTCOMES`]; an outcome outside it is not counted.
    outcomes: Vec<AtomicU64>,
    /// The second (since the epoch) of the SKU's last answered claim, plus one (0: never).
    last_active: AtomicU64,
    latency: Mutex<Window>,
}

/// One histogram per second of the last [`WINDOW_SECS`], reused in a ring.
struct Window {
    slots: Vec<(u64, Histogram<u32>)>,
}

/// Totals of one SKU at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counts {
    pub outcomes: Vec<u64>,
    /// Seconds since the SKU's last answered claim on this gateway.
    pub idle_secs: u64,
}

impl ClaimStats {
    /// Counts one answered claim of `sku` with its `outcome` label (as in
    /// `dropgate_claims_total`) and how long its decision took.
    pub fn record(&self, sku: &SkuId, outcome: &str, took: Duration) {
        let counters = match self.skus.get(sku.as_str()) {
            Some(c) => c.clone(),
            None => self
                .skus
                .entry(sku.as_str().to_owned())
                .or_insert_with(|| Arc::new(SkuCounters::new()))
                .clone(),
        };
        if let Some(i) = CLAIM_OUTCOMES.iter().position(|o| *o == outcome) {
            counters.outcomes[i].fetch_add(1, Ordering::Relaxed);
        }
        let second = self.epoch.elapsed().as_secs();
        counters.last_active.store(second + 1, Ordering::Relaxed);
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        counters.latency.lock().record(second, micros);
    }

    /// Every SKU's totals.
    pub fn snapshot(&self) -> HashMap<String, Counts> {
        let now = self.epoch.elapsed().as_secs();
        self.skus
            .iter()
            .map(|e| {
                let last = e.last_active.load(Ordering::Relaxed);
                (
                    e.key().clone(),
                    Counts {
                        outcomes: e
                            .outcomes
                            .iter()
                            .map(|a| a.load(Ordering::Relaxed))
                            .collect(),
                        idle_secs: now.saturating_sub(last.saturating_sub(1)),
                    },
                )
            })
            .collect()
    }

    /// The 99th percentile of the SKU's decisions in the last [`WINDOW_SECS`] seconds, in
    /// seconds; `None` without any.
    pub fn p99(&self, sku: &SkuId) -> Option<f64> {
        let counters = self.skus.get(sku.as_str())?.clone();
        let now = self.epoch.elapsed().as_secs();
        let merged = counters.latency.lock().merged(now)?;
        Some(merged.value_at_quantile(0.99) as f64 / 1e6)
    }
}

impl SkuCounters {
    fn new() -> Self {
        SkuCounters {
            outcomes: (0..CLAIM_OUTCOMES.len())
                .map(|_| AtomicU64::new(0))
                .collect(),
            last_active: AtomicU64::new(0),
            latency: Mutex::new(Window { slots: Vec::new() }),
        }
    }
}

fn histogram() -> Histogram<u32> {
    Histogram::new_with_bounds(LOWEST_US, HIGHEST_US, SIGFIG)
        .expect("bounds are constants that hdrhistogram accepts")
}

impl Window {
    fn record(&mut self, second: u64, micros: u64) {
        if self.slots.is_empty() {
            // Allocated at a SKU's first claim, never again.
            self.slots = (0..WINDOW_SECS).map(|_| (u64::MAX, histogram())).collect();
        }
        let slot = &mut self.slots[(second % WINDOW_SECS) as usize];
        if slot.0 != second {
            slot.1.reset();
            slot.0 = second;
        }
        slot.1
            .saturating_record(micros.clamp(LOWEST_US, HIGHEST_US));
    }

    /// The seconds of the window ending at `now`, merged; `None` when they hold no claim.
    fn merged(&self, now: u64) -> Option<Histogram<u32>> {
        let mut out = histogram();
        for (second, h) in &self.slots {
            if *second != u64::MAX && *second + WINDOW_SECS > now {
                out.add(h).ok()?;
            }
        }
        (!out.is_empty()).then_some(out)
    }
}

impl Counts {
    /// What happened between `before` and these totals (a missing side counts as zeros).
    pub fn since(&self, before: &Counts) -> Counts {
        Counts {
            outcomes: (0..CLAIM_OUTCOMES.len())
                .map(|i| {
                    let now = self.outcomes.get(i).copied().unwrap_or(0);
                    now.saturating_sub(before.outcomes.get(i).copied().unwrap_or(0))
                })
                .collect(),
            idle_secs: self.idle_secs,
        }
    }

    /// All claims counted here.
    pub fn sum(&self) -> u64 {
        self.outcomes.iter().sum()
    }

    /// These counts by outcome (every outcome present).
    pub fn totals(&self) -> BTreeMap<&'static str, u64> {
        CLAIM_OUTCOMES
            .iter()
            .enumerate()
            .map(|(i, o)| (*o, self.outcomes.get(i).copied().unwrap_or(0)))
            .collect()
    }

    /// These counts as claims per second over `seconds`, by outcome (every outcome present).
    pub fn rates(&self, seconds: f64) -> BTreeMap<&'static str, f64> {
        CLAIM_OUTCOMES
            .iter()
            .enumerate()
            .map(|(i, o)| {
                let n = self.outcomes.get(i).copied().unwrap_or(0) as f64;
                (*o, (n / seconds * 10.0).round() / 10.0)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_p99_is_that_of_the_last_ten_seconds_of_decisions() {
        let mut w = Window { slots: Vec::new() };
        // 990 fast claims and 10 slow ones (5 ms) in second 3.
        for _ in 0..990 {
            w.record(3, 200);
        }
        for _ in 0..10 {
            w.record(3, 5_000);
        }
        let p99 = w.merged(5).unwrap().value_at_quantile(0.99);
        assert!((195..=205).contains(&p99), "{p99}");
        w.record(4, 5_000);
        let p99 = w.merged(5).unwrap().value_at_quantile(0.99);
        assert!((4_950..=5_050).contains(&p99), "{p99}");
        // Ten seconds later second 3 left the window; second 14 reuses its slot.
        assert!(w.merged(13).is_some());
        assert!(w.merged(14).is_none());
        w.record(14, 1_000);
        let only = w.merged(14).unwrap();
        assert_eq!(only.len(), 1);
    }

    #[test]
    fn a_sku_is_idle_from_its_last_claim() {
        let stats = ClaimStats::default();
        let (a, b) = (SkuId::parse("a").unwrap(), SkuId::parse("b").unwrap());
        stats.record(a, "won", Duration::from_micros(300));
        let snap = stats.snapshot();
        assert_eq!(snap["a"].idle_secs, 0);
        assert_eq!(snap["a"].totals()["won"], 1);
        assert!(stats.p99(a).is_some_and(|s| s > 0.000_29 && s < 0.000_31));
        assert_eq!(stats.p99(b), None);
    }
}
