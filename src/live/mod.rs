//! The live drop page's data (`GET /admin/live/stream`): per SKU, once a second, the SKU view
//! ([`crate::ledger::view`]: stock, holds, the waitlist, whether the ledger balances), this
//! gateway's claims per second by outcome and p99 decision latency (HdrHistogram over the
//! last 10 s), and the journal lag (the age of the oldest winner not yet written). SKUs come
//! most active first. The page draws its charts from the frames it received.
//!
//! Prometheus's counters carry no SKU label (bounded cardinality for every scraper), so the
//! per-SKU claim counts live here, in process: [`ClaimStats`] is fed by the claim handler, and
//! each stream's [`Watch`] turns its totals into rates. The page shows what this gateway
//! answered; with several gateways, open the page of each (or use the Grafana dashboard).

mod hall;
mod stats;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde::Serialize;

use crate::catalog::Catalog;
use crate::ledger::{self, SkuView};
use crate::sku::SkuId;
use crate::store::Store;
pub use hall::{Hall, HallRow, HallSection};
pub use stats::{ClaimStats, Counts};

/// SKUs shown at most: the SKUs this gateway answered claims for first, then the catalog in
/// id order. Each costs one SKU view and one XRANGE per second per open page.
pub const MAX_SKUS: usize = 32;

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
    /// Seconds since this gateway answered the SKU's last claim; `None` when it never did.
    pub idle_seconds: Option<u64>,
    /// The 99th percentile of this gateway's decisions of the SKU in the last 10 seconds.
    pub p99_claim_latency_seconds: Option<f64>,
    pub journal_lag_seconds: Option<f64>,
    /// A seated SKU's hall ([`hall`]), when it changed since this stream's previous frame;
    /// `None` otherwise (the page keeps drawing the last one).
    pub hall: Option<Hall>,
}

/// What a frame reads: this gateway's claim counts, the catalog and Redis.
pub struct Sources<'a> {
    pub live: &'a Live,
    pub store: &'a Store,
    pub catalog: &'a Catalog,
    /// The seat-map copies the seat route serves (a hall is drawn from the same copy).
    pub seat_maps: &'a crate::seatmaps::SeatMaps,
}

/// One open stream's memory: the counts of the previous frame, for rates.
#[derive(Default)]
pub struct Watch {
    /// Each SKU's totals at the previous frame, and when that frame was taken.
    last: HashMap<String, Counts>,
    last_at: Option<std::time::Instant>,
    /// The tag of each seated SKU's hall last sent.
    halls: HashMap<String, String>,
}

impl Watch {
    /// The next frame: reads this gateway's claim counts, the catalog, and each shown SKU's
    /// view and journal head. SKUs come most active first (see [`order`]).
    pub async fn frame(&mut self, state: &Sources<'_>) -> Frame {
        let now = std::time::Instant::now();
        let elapsed = self
            .last_at
            .map_or(1.0, |t| now.duration_since(t).as_secs_f64().max(0.001));
        let counts = state.live.stats.snapshot();
        let deltas: HashMap<&String, Counts> = counts
            .iter()
            .map(|(sku, current)| {
                // The first frame has no baseline: it shows no rate rather than a lifetime's.
                let before = match self.last_at {
                    Some(_) => self.last.get(sku).cloned().unwrap_or_default(),
                    None => current.clone(),
                };
                (sku, current.since(&before))
            })
            .collect();
        let skus = active_skus(state, &counts, &deltas).await;
        let mut out = Vec::with_capacity(skus.len());
        for sku in skus {
            // Ids this gateway counted (checked by the claim route) or the catalog's.
            let id = SkuId::trusted(&sku);
            let current = counts.get(&sku).cloned().unwrap_or_default();
            let delta = deltas.get(&sku).cloned().unwrap_or_default();
            let view = ledger::view(state.store, state.catalog, id).await.ok();
            let hall = match state.catalog.get(id).await {
                Ok(Some(entry)) => {
                    let last = self.halls.get(&sku).map(String::as_str);
                    hall::changed(state.store, state.seat_maps, &entry, last).await
                }
                _ => None,
            };
            if let Some(h) = &hall {
                self.halls.insert(sku.clone(), h.tag.clone());
            }
            out.push(SkuFrame {
                hall,
                claims_per_second: delta.rates(elapsed),
                claims_total: current.totals(),
                idle_seconds: counts.get(&sku).map(|c| c.idle_secs),
                p99_claim_latency_seconds: state.live.stats.p99(id),
                journal_lag_seconds: journal_lag(state, id).await,
                view,
                sku,
            });
        }
        self.last = counts;
        self.last_at = Some(now);
        Frame {
            time: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            skus: out,
        }
    }
}

/// The SKUs to show, [`MAX_SKUS`] at most: those this gateway answered claims for, most active
/// first ([`order`]), then the catalog's first ones in id order.
async fn active_skus(
    state: &Sources<'_>,
    counts: &HashMap<String, Counts>,
    deltas: &HashMap<&String, Counts>,
) -> Vec<String> {
    let mut skus: Vec<&String> = counts.keys().collect();
    skus.sort_by(|a, b| order(a, b, counts, deltas));
    let mut skus: Vec<String> = skus.into_iter().take(MAX_SKUS).cloned().collect();
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
    }
    skus
}

/// Most active first: claims in the last second, then the most recent claim, then claims
/// since the gateway started, then the id (a stable order for SKUs alike).
fn order(
    a: &String,
    b: &String,
    counts: &HashMap<String, Counts>,
    deltas: &HashMap<&String, Counts>,
) -> std::cmp::Ordering {
    let key = |s: &String| {
        let d = deltas.get(s).map_or(0, Counts::sum);
        let c = &counts[s];
        (
            std::cmp::Reverse(d),
            c.idle_secs,
            std::cmp::Reverse(c.sum()),
        )
    };
    key(a).cmp(&key(b)).then_with(|| a.cmp(b))
}

/// The age of the oldest journal entry of any of the SKU's shards (each shard has a journal
/// of its own, src/shards/): a journal holds only winners not yet written (it is trimmed below
/// the oldest unacknowledged entry), and an entry id starts with the millisecond Redis added
/// it. 0 when none waits; `None` when Redis does not answer for some shard.
async fn journal_lag(state: &Sources<'_>, sku: &SkuId) -> Option<f64> {
    let layout = match state.catalog.get(sku).await {
        Ok(Some(entry)) => entry.layout,
        _ => crate::layout::Layout::SINGLE,
    };
    let mut lag: f64 = 0.0;
    for name in layout.names(sku) {
        lag = lag.max(shard_journal_lag(state, &name).await?);
    }
    Some(lag)
}

async fn shard_journal_lag(state: &Sources<'_>, name: &str) -> Option<f64> {
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
    Some(((crate::clock::now_ms() - added_ms).max(0)) as f64 / 1000.0)
}
