//! This gateway's claim answers per SKU: counts by outcome and a decision-latency histogram,
//! fed by the claim handler and read by the live streams.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;

use crate::metrics::{CLAIM_OUTCOMES, LATENCY_BUCKETS};

/// Per-SKU claim counters. Bounded by the catalog: only a declared SKU reaches a decision.
#[derive(Default)]
pub struct ClaimStats {
    skus: DashMap<String, Arc<SkuCounters>>,
}

/// Counters of one SKU, updated with relaxed atomics (a frame tolerates a claim counted a
/// second late).
struct SkuCounters {
    /// Indexed like [`CLAIM_OUTCOMES`]; an outcome outside it is not counted.
    outcomes: Vec<AtomicU64>,
    /// Indexed like [`LATENCY_BUCKETS`], plus one bucket over the largest bound.
    latency: Vec<AtomicU64>,
}

/// Totals of one SKU at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counts {
    pub outcomes: Vec<u64>,
    pub latency: Vec<u64>,
}

impl ClaimStats {
    /// Counts one answered claim of `sku` with its `outcome` label (as in
    /// `dropgate_claims_total`) and how long its decision took.
    pub fn record(&self, sku: &str, outcome: &str, took: Duration) {
        let counters = match self.skus.get(sku) {
            Some(c) => c.clone(),
            None => self
                .skus
                .entry(sku.to_string())
                .or_insert_with(|| Arc::new(SkuCounters::new()))
                .clone(),
        };
        if let Some(i) = CLAIM_OUTCOMES.iter().position(|o| *o == outcome) {
            counters.outcomes[i].fetch_add(1, Ordering::Relaxed);
        }
        let secs = took.as_secs_f64();
        let bucket = LATENCY_BUCKETS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(LATENCY_BUCKETS.len());
        counters.latency[bucket].fetch_add(1, Ordering::Relaxed);
    }

    /// Every SKU's totals.
    pub fn snapshot(&self) -> HashMap<String, Counts> {
        self.skus
            .iter()
            .map(|e| {
                let load =
                    |v: &Vec<AtomicU64>| v.iter().map(|a| a.load(Ordering::Relaxed)).collect();
                (
                    e.key().clone(),
                    Counts {
                        outcomes: load(&e.outcomes),
                        latency: load(&e.latency),
                    },
                )
            })
            .collect()
    }
}

impl SkuCounters {
    fn new() -> Self {
        let zeros = |n: usize| (0..n).map(|_| AtomicU64::new(0)).collect();
        SkuCounters {
            outcomes: zeros(CLAIM_OUTCOMES.len()),
            latency: zeros(LATENCY_BUCKETS.len() + 1),
        }
    }
}

impl Counts {
    /// What happened between `before` and these totals (a missing side counts as zeros).
    pub fn since(&self, before: &Counts) -> Counts {
        let diff = |a: &[u64], b: &[u64], n: usize| {
            (0..n)
                .map(|i| {
                    let now = a.get(i).copied().unwrap_or(0);
                    now.saturating_sub(b.get(i).copied().unwrap_or(0))
                })
                .collect()
        };
        Counts {
            outcomes: diff(&self.outcomes, &before.outcomes, CLAIM_OUTCOMES.len()),
            latency: diff(&self.latency, &before.latency, LATENCY_BUCKETS.len() + 1),
        }
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
