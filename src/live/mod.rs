//! The live drop page's data (`GET /admin/live/stream`): per SKU, once a second, the SKU view
//! ([`crate::ledger::view`]: stock and whether the ledger balances), this gateway's claims per
//! second by outcome and p99 decision latency, and the journal lag (the age of the oldest
//! winner not yet written).
//!
//! Prometheus's counters carry no SKU label (bounded cardinality for every scraper), so the
//! per-SKU claim counts live here, in process: [`ClaimStats`] is fed by the claim handler, and
//! each stream's [`Watch`] turns its totals into rates. The page shows what this gateway
//! answered; with several gateways, open the page of each (or use the Grafana dashboard).

mod stats;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use serde::Serialize;

use crate::app::AppState;
use crate::ledger::{self, SkuView};
use crate::metrics::LATENCY_BUCKETS;
pub use stats::{ClaimStats, Counts};

/// SKUs shown at most: the SKUs this gateway answered claims for first, then the catalog in
/// id order. Each costs one SKU view and one XRANGE per second per open page.
pub const MAX_SKUS: usize = 32;
/// Seconds of decisions the p99 is taken over: one second holds too few claims off-peak.
const LATENCY_WINDOW: usize = 10;

/// Live streams open at once on one gateway, at most: each costs a few queries per second.
pub const MAX_STREAMS: usize = 8;

/// The shared side of the live streams: the claim counts, and the bound on open streams.
pub struct Live {
    /// Fed by the claim handler, read by every open stream.
    pub stats: ClaimStats,
    /// One permit per open stream, held until the client goes away ([`MAX_STREAMS`]).
    pub streams: Arc<tokio::sync::Semaphore>,
}

impl Default for Live {
    fn default() -> Self {
        Live {
            stats: ClaimStats::default(),
            streams: Arc::new(tokio::sync::Semaphore::new(MAX_STREAMS)),
        }
    }
}

/// One second of a drop as this gateway sees it (schema `LiveFrame` of the OpenAPI document).
#[derive(Debug, Serialize)]
pub struct Frame {
    pub time: String,
    pub skus: Vec<SkuFrame>,
}

#[derive(Debug, Serialize)]
pub struct SkuFrame {
    pub sku: String,
    /// `None` when the ledger could not be read this second.
    pub view: Option<SkuView>,
    /// Claims this gateway answered in the last second, by outcome.
    pub claims_per_second: BTreeMap<&'static str, f64>,
    /// Claims this gateway answered since it started, by outcome.
    pub claims_total: BTreeMap<&'static str, u64>,
    pub p99_claim_latency_seconds: Option<f64>,
    pub journal_lag_seconds: Option<f64>,
}

/// One open stream's memory: the counts of the previous frame (for rates) and the latency
/// histograms of the last [`LATENCY_WINDOW`] seconds (for the p99).
#[derive(Default)]
pub struct Watch {
    /// Each SKU's totals at the previous frame, and when that frame was taken.
    last: HashMap<String, Counts>,
    last_at: Option<std::time::Instant>,
    /// Per second, the latency bucket increments of each SKU.
    window: VecDeque<HashMap<String, Vec<u64>>>,
}

impl Watch {
    /// The next frame: reads the catalog, each shown SKU's view and journal head, and this
    /// gateway's claim counts.
    pub async fn frame(&mut self, state: &AppState) -> Frame {
        let now = std::time::Instant::now();
        let elapsed = self
            .last_at
            .map_or(1.0, |t| now.duration_since(t).as_secs_f64().max(0.001));
        let counts = state.live.stats.snapshot();
        let skus = active_skus(state, &counts).await;
        let mut second = HashMap::new();
        let mut out = Vec::with_capacity(skus.len());
        for sku in skus {
            let current = counts.get(&sku).cloned().unwrap_or_default();
            // The first frame has no baseline: it shows no rate rather than a lifetime's.
            let before = match self.last_at {
                Some(_) => self.last.get(&sku).cloned().unwrap_or_default(),
                None => current.clone(),
            };
            let delta = current.since(&before);
            second.insert(sku.clone(), delta.latency.clone());
            let view = ledger::view(&state.store, &state.catalog, &sku).await.ok();
            out.push(SkuFrame {
                claims_per_second: delta.rates(elapsed),
                claims_total: current.totals(),
                p99_claim_latency_seconds: None,
                journal_lag_seconds: journal_lag(state, &sku).await,
                view,
                sku,
            });
        }
        self.window.push_back(second);
        if self.window.len() > LATENCY_WINDOW {
            self.window.pop_front();
        }
        for f in &mut out {
            f.p99_claim_latency_seconds = p99(self.window.iter().filter_map(|s| s.get(&f.sku)));
        }
        self.last = counts;
        self.last_at = Some(now);
        Frame {
            time: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            skus: out,
        }
    }
}

/// The SKUs this gateway answered claims for, then the catalog's first ones, [`MAX_SKUS`] in
/// all, in id order.
async fn active_skus(state: &AppState, counts: &HashMap<String, Counts>) -> Vec<String> {
    let mut skus: Vec<String> = counts.keys().cloned().collect();
    skus.sort();
    skus.truncate(MAX_SKUS);
    if skus.len() < MAX_SKUS {
        let catalog: Vec<String> = sqlx::query_scalar("SELECT sku FROM skus ORDER BY sku LIMIT $1")
            .bind(MAX_SKUS as i64)
            .fetch_all(state.catalog.db())
            .await
            .unwrap_or_default();
        for s in catalog {
            if skus.len() < MAX_SKUS && !skus.contains(&s) {
                skus.push(s);
            }
        }
        skus.sort();
    }
    skus
}

/// The age of the oldest journal entry of any of the SKU's shards (each shard has a journal
/// of its own, src/shards/): a journal holds only winners not yet written (it is trimmed below
/// the oldest unacknowledged entry), and an entry id starts with the millisecond Redis added
/// it. 0 when none waits; `None` when Redis does not answer for some shard.
async fn journal_lag(state: &AppState, sku: &str) -> Option<f64> {
    let layout = match state.catalog.get(sku).await {
        Ok(Some(entry)) => entry.layout,
        _ => crate::shards::Layout::SINGLE,
    };
    let mut lag: f64 = 0.0;
    for name in layout.names(sku) {
        lag = lag.max(shard_journal_lag(state, &name).await?);
    }
    Some(lag)
}

async fn shard_journal_lag(state: &AppState, name: &str) -> Option<f64> {
    let key = state.store.keys(name).journal();
    let mut con = state.store.hot();
    let head: Vec<(String, HashMap<String, redis::Value>)> = state
        .store
        .bounded(async {
            Ok(redis::cmd("XRANGE")
                .arg(&key)
                .arg("-")
                .arg("+")
                .arg("COUNT")
                .arg(1)
                .query_async(&mut con)
                .await?)
        })
        .await
        .ok()?;
    let Some((id, _)) = head.first() else {
        return Some(0.0);
    };
    let added_ms: i64 = id.split('-').next()?.parse().ok()?;
    Some(((crate::claims::now_ms() - added_ms).max(0)) as f64 / 1000.0)
}

/// The upper bound of the bucket holding the 99th percentile of the summed histograms; the
/// last bucket (over the largest bound) reports the largest bound. `None` without claims.
fn p99<'a>(seconds: impl Iterator<Item = &'a Vec<u64>>) -> Option<f64> {
    let mut sum = vec![0u64; LATENCY_BUCKETS.len() + 1];
    for s in seconds {
        for (t, v) in sum.iter_mut().zip(s) {
            *t += v;
        }
    }
    let total: u64 = sum.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = (total * 99).div_ceil(100);
    let mut seen = 0;
    for (i, n) in sum.iter().enumerate() {
        seen += n;
        if seen >= rank {
            return Some(LATENCY_BUCKETS[i.min(LATENCY_BUCKETS.len() - 1)]);
        }
    }
    LATENCY_BUCKETS.last().copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_p99_is_the_bucket_holding_the_99th_claim() {
        let mut h = vec![0u64; LATENCY_BUCKETS.len() + 1];
        h[0] = 99; // 99 claims under 100 µs
        h[5] = 1; // one under 5 ms
        assert_eq!(p99([&h].into_iter()), Some(LATENCY_BUCKETS[0]));
        h[5] = 2;
        assert_eq!(p99([&h].into_iter()), Some(LATENCY_BUCKETS[5]));
        assert_eq!(p99(std::iter::empty()), None);
    }
}
