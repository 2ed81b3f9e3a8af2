//! The admission worker: a task of every gateway that admits the head of each queued SKU's
//! line at the SKU's `admit_per_second`. One gateway at a time per SKU: the round's script
//! (`lua/admit_queue.lua`) checks and renews the SKU's lease on Redis's clock in the same
//! atomic step that admits, so a holder that lost its lease (killed, paused, cut off) admits
//! nothing more, and the next holder takes the next fence and the line where it stands. No
//! ticket is admitted twice (I4): admission moves it from the line to the admitted set.
//!
//! The schedule lives in Redis too (the last round's time and the credit it left), so a rate
//! changed by PUT takes effect at the next round of whichever gateway admits, and the
//! admissions' own timestamps (the admitted set's scores) show the rate achieved.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use metrics::{counter, gauge};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use super::calls::{self, Round};
use super::RedisSettings;
use crate::metrics::{QUEUE_ADMITTED as ADMITTED, QUEUE_LAG as LAG, QUEUE_WAITING as WAITING};
use crate::repeats::{self, Repeats};
use crate::sku::SkuId;
use crate::store::Store;

/// Between the lease holder's rounds: the resolution of the schedule.
pub const TICK: Duration = Duration::from_millis(50);
/// How long a holder's lease lasts without a round: how soon another gateway takes over from
/// one that died.
pub const LEASE: Duration = Duration::from_secs(2);
/// Between a follower's tries at the lease (each one round trip that admits nothing).
const FOLLOW: Duration = Duration::from_millis(500);
/// How often the list of queued SKUs (and their settings) is read from the catalog; each
/// read also writes the settings to Redis, which re-arms a queue after a restore.
const REFRESH: Duration = Duration::from_secs(2);
/// Most tickets one round admits (a round's script stays short).
const MOST_PER_ROUND: u32 = 2000;

/// A queued SKU's catalog columns: sku, rate, ttl, pre-queue start, overbook, version.
type QueuedRow = (
    String,
    i32,
    Option<i32>,
    Option<chrono::DateTime<chrono::Utc>>,
    Option<i32>,
    i64,
);

pub struct Admitter {
    pub store: Store,
    pub db: PgPool,
    /// This process's lease owner token: a restarted gateway is a new owner.
    pub owner: uuid::Uuid,
}

#[derive(Default)]
struct Seat {
    leading: bool,
    next: Option<Instant>,
    /// Redis's time of this gateway's last round as the holder.
    last_ms: i64,
    /// The line and the time between the last two rounds, while leading (for the gauges).
    waiting: i64,
    lag_ms: i64,
}

impl Admitter {
    pub async fn run(self, shutdown: CancellationToken) {
        let owner = self.owner.to_string();
        let mut queued: HashMap<String, RedisSettings> = HashMap::new();
        let mut seats: HashMap<String, Seat> = HashMap::new();
        let mut refreshed: Option<Instant> = None;
        let faults = Repeats::default();
        loop {
            if refreshed.is_none_or(|t| t.elapsed() >= REFRESH) {
                refreshed = Some(Instant::now());
                match self.reload().await {
                    Ok(q) => queued = q,
                    Err(e) => {
                        tracing::debug!(error = %e, "queue admission: catalog not read; keeping the last list")
                    }
                }
                self.configure(&queued).await;
                seats.retain(|sku, _| queued.contains_key(sku));
            }
            let now = Instant::now();
            for sku in queued.keys() {
                let seat = seats.entry(sku.clone()).or_default();
                if seat.next.is_some_and(|t| t > now) {
                    continue;
                }
                let keys = self.store.keys(sku);
                let mut con = self.store.hot();
                let round = self
                    .store
                    .bounded(calls::admit(
                        &mut con,
                        &keys,
                        &owner,
                        LEASE.as_millis() as u64,
                        MOST_PER_ROUND,
                        false,
                        self.store.floor(sku),
                        self.store.line_floor(sku),
                    ))
                    .await;
                match round {
                    Ok(r) => {
                        if let Some(end) = faults.clear(sku) {
                            repeats::ended(
                                sku,
                                end,
                                "queue admission: the SKU's queue answers again",
                            );
                        }
                        self.seated(SkuId::trusted(sku), seat, &r);
                    }
                    Err(e) => {
                        seat.waiting = 0;
                        if let Some(o) = faults.occurred(sku, &e.to_string()) {
                            tracing::warn!(sku, error = %e, repeated = o.repeated, for_secs = o.for_secs,
                                "queue admission: no round (the line waits; joins and reads fail closed)");
                        }
                        seat.leading = false;
                        seat.next = Some(now + FOLLOW);
                    }
                }
            }
            let led = seats.values().filter(|s| s.leading);
            gauge!(WAITING).set(led.clone().map(|s| s.waiting).sum::<i64>() as f64);
            gauge!(LAG).set(led.map(|s| s.lag_ms).max().unwrap_or(0) as f64 / 1000.0);
            tokio::select! {
                _ = tokio::time::sleep(TICK) => {}
                _ = shutdown.cancelled() => break,
            }
        }
        // Hand the leases over at once rather than after they lapse.
        for (sku, seat) in &seats {
            if seat.leading {
                let mut con = self.store.hot();
                let keys = self.store.keys(sku);
                let _ = self
                    .store
                    .bounded(calls::admit(
                        &mut con,
                        &keys,
                        &owner,
                        0,
                        0,
                        true,
                        self.store.floor(sku),
                        self.store.line_floor(sku),
                    ))
                    .await;
            }
        }
        tracing::info!(owner = %self.owner, "queue admission stopped");
    }

    fn seated(&self, sku: &SkuId, seat: &mut Seat, r: &Round) {
        let was = seat.leading;
        seat.leading = r.code != "follower";
        if seat.leading && !was {
            tracing::info!(
                sku = sku.as_str(),
                fence = r.fence,
                "queue admission: this gateway admits now"
            );
        }
        if seat.leading {
            seat.waiting = r.waiting;
            if r.admitted > 0 {
                counter!(ADMITTED).increment(r.admitted as u64);
            }
            seat.lag_ms = if was && seat.last_ms > 0 {
                (r.now_ms - seat.last_ms).max(0)
            } else {
                0
            };
            seat.last_ms = r.now_ms;
            seat.next = None;
        } else {
            seat.last_ms = 0;
            seat.waiting = 0;
            seat.lag_ms = 0;
            seat.next = Some(Instant::now() + FOLLOW);
        }
    }

    async fn reload(&self) -> Result<HashMap<String, RedisSettings>, sqlx::Error> {
        let rows: Vec<QueuedRow> = sqlx::query_as(
            "SELECT sku, queue_admit_per_second, queue_admission_ttl_seconds,
                        queue_prequeue_from, queue_overbook_milli, queue_version
                   FROM skus WHERE queue_admit_per_second IS NOT NULL",
        )
        .fetch_all(&self.db)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(sku, rate, ttl, from, overbook, version)| {
                let q = RedisSettings {
                    rate,
                    ttl_seconds: ttl.unwrap_or(super::DEFAULT_ADMISSION_TTL as i32),
                    prequeue_ms: from.map_or(0, |t| t.timestamp_millis()),
                    overbook_milli: overbook.unwrap_or(super::DEFAULT_OVERBOOK_MILLI),
                    version,
                };
                (sku, q)
            })
            .collect())
    }

    /// Writes every queued SKU's settings to Redis (a rate changed on another gateway, a
    /// queue whose keys a restore did not bring back).
    async fn configure(&self, queued: &HashMap<String, RedisSettings>) {
        for (sku, q) in queued {
            let mut con = self.store.hot();
            let keys = self.store.keys(sku);
            let _ = self
                .store
                .bounded(calls::configure(&mut con, &keys, q))
                .await;
        }
    }
}
