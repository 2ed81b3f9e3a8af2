//! The live page's cost on the claim path: `ClaimStats::record`, called by the claim handler
//! once per answered claim, against the per-SKU atomic bucket counters it replaced (copied
//! below as `atomic_buckets`), side by side in one run.
//!
//! ```text
//! cargo bench --bench live_stats
//! ```
//!
//! Groups: `live_stats/{hdr_window, atomic_buckets}` (one thread), and
//! `live_stats_2_threads/{hdr_window, atomic_buckets}` (two threads recording the same hot
//! SKU at once, as the gateway's two worker threads do during a drop; throughput in claims).

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use dashmap::DashMap;

use dropgate::live::ClaimStats;
use dropgate::metrics::{CLAIM_OUTCOMES, LATENCY_BUCKETS};
use dropgate::sku::SkuId;

/// One SKU's counts by outcome and by latency bucket.
type Counters = std::sync::Arc<(Vec<AtomicU64>, Vec<AtomicU64>)>;

/// The recorder before HdrHistogram: an atomic count per outcome and per latency bucket.
#[derive(Default)]
struct AtomicBuckets {
    skus: DashMap<String, Counters>,
}

impl AtomicBuckets {
    fn record(&self, sku: &str, outcome: &str, took: Duration) {
        let counters = match self.skus.get(sku) {
            Some(c) => c.clone(),
            None => self
                .skus
                .entry(sku.to_string())
                .or_insert_with(|| {
                    let zeros = |n: usize| (0..n).map(|_| AtomicU64::new(0)).collect();
                    std::sync::Arc::new((
                        zeros(CLAIM_OUTCOMES.len()),
                        zeros(LATENCY_BUCKETS.len() + 1),
                    ))
                })
                .clone(),
        };
        if let Some(i) = CLAIM_OUTCOMES.iter().position(|o| *o == outcome) {
            counters.0[i].fetch_add(1, Ordering::Relaxed);
        }
        let secs = took.as_secs_f64();
        let bucket = LATENCY_BUCKETS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(LATENCY_BUCKETS.len());
        counters.1[bucket].fetch_add(1, Ordering::Relaxed);
    }
}

const TOOK: Duration = Duration::from_micros(640);

fn one_thread(c: &mut Criterion) {
    let sku = SkuId::parse("drop-1").unwrap();
    let hdr = ClaimStats::default();
    let atomic = AtomicBuckets::default();
    let mut group = c.benchmark_group("live_stats");
    group
        .throughput(Throughput::Elements(1))
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    group.bench_function("hdr_window", |b| {
        b.iter(|| hdr.record(black_box(sku), black_box("won"), black_box(TOOK)));
    });
    group.bench_function("atomic_buckets", |b| {
        b.iter(|| atomic.record(black_box("drop-1"), black_box("won"), black_box(TOOK)));
    });
    group.finish();
}

fn two_threads(c: &mut Criterion) {
    let sku = SkuId::parse("drop-1").unwrap();
    let hdr = ClaimStats::default();
    let atomic = AtomicBuckets::default();
    // Each iteration: both threads record 1,000 claims of the same SKU at once.
    const PER_ITER: usize = 1_000;
    let mut group = c.benchmark_group("live_stats_2_threads");
    group
        .throughput(Throughput::Elements(2 * PER_ITER as u64))
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    group.bench_function("hdr_window", |b| {
        b.iter(|| {
            std::thread::scope(|s| {
                for _ in 0..2 {
                    s.spawn(|| {
                        for _ in 0..PER_ITER {
                            hdr.record(black_box(sku), "won", TOOK);
                        }
                    });
                }
            });
        });
    });
    group.bench_function("atomic_buckets", |b| {
        b.iter(|| {
            std::thread::scope(|s| {
                for _ in 0..2 {
                    s.spawn(|| {
                        for _ in 0..PER_ITER {
                            atomic.record(black_box("drop-1"), "won", TOOK);
                        }
                    });
                }
            });
        });
    });
    group.finish();
}

criterion_group!(benches, one_thread, two_threads);
criterion_main!(benches);
