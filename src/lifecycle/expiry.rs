//! The expiry worker: every gateway runs one; each SKU with holds is served by one worker at a
//! time (a short lease in Redis), in bounded batches, on Redis's clock.
//!
//! Correctness never rests on the lease: `expire_holds.lua` expires only holds still `held`
//! and past their time, atomically, so two workers (a lease that ran out under a slow one, a
//! gateway SIGKILLed mid-batch and its successor) never expire a hold twice, and a batch cut
//! short loses nothing (the holds stay in the expiry set).

use std::time::Duration;

use metrics::{counter, histogram};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::error::StoreError;
use crate::metrics::{EXPIRY_LAG, HOLDS};
use crate::repeats::{self, Repeats, BACKEND};
use crate::scripts;
use crate::store::Store;

/// How often each SKU's due holds are looked for: with the batch below, the bound on how late
/// a hold expires while Redis answers (the goal is p99 <= 1 s after `expires_at`).
pub const TICK: Duration = Duration::from_millis(100);
/// Holds expired by one call: bounds the script's time inside Redis.
pub const BATCH: usize = 500;
/// A worker's lease on a SKU: another gateway's worker takes over this long after the holder
/// stopped renewing (a SIGKILL).
const LEASE_MS: u64 = 1_500;
/// The SKUs to serve are re-read this often: also how long a SKU's first hold may wait to be
/// looked at after its SKU joined the active set (well under any hold's time).
const SKUS_EVERY: Duration = Duration::from_secs(1);

/// Expires due holds of the active SKUs ([`crate::activity`]) that have holds in Redis: a SKU
/// with holds stays in the active set until they end, so idle SKUs of the catalog cost
/// nothing here.
pub struct Expirer {
    pub store: Store,
    /// This worker's lease token.
    pub owner: Uuid,
}

impl Expirer {
    pub async fn run(self, shutdown: CancellationToken) {
        let mut skus: Vec<String> = Vec::new();
        let mut last_list: Option<tokio::time::Instant> = None;
        // At a 100 ms tick a fault would otherwise log ten lines a second (src/repeats.rs).
        let faults = Repeats::default();
        loop {
            if last_list.is_none_or(|t| t.elapsed() > SKUS_EVERY) {
                match self.skus().await {
                    Ok(list) => {
                        skus = list;
                        last_list = Some(tokio::time::Instant::now());
                        cleared(&faults, LIST, "expiry worker lists its SKUs again");
                    }
                    Err(e) => {
                        if let Some(o) = faults.occurred(LIST, &e.to_string()) {
                            tracing::warn!(error = %e, repeated = o.repeated, for_secs = o.for_secs,
                                "expiry worker could not list SKUs; serving the SKUs it listed last");
                        }
                    }
                }
            }
            // A fault of Redis itself fails every SKU alike: one line for all of them, over
            // after a tick without one. A SKU whose state is lost or stale has its own line.
            let mut backend_failed = false;
            for sku in &skus {
                match self.expire_due(sku).await {
                    Ok(_) => cleared(&faults, sku, "expiry passes of the SKU succeed again"),
                    Err(e) => {
                        let key = if e.is_about_sku() {
                            sku.as_str()
                        } else {
                            backend_failed = true;
                            BACKEND
                        };
                        if let Some(o) = faults.occurred(key, &e.to_string()) {
                            tracing::warn!(sku, error = %e, repeated = o.repeated, for_secs = o.for_secs,
                                "expiry pass failed; the holds stay due");
                        }
                    }
                }
            }
            if !backend_failed && !skus.is_empty() {
                cleared(&faults, BACKEND, "expiry passes succeed again");
            }
            tokio::select! {
                _ = tokio::time::sleep(TICK) => {}
                _ = shutdown.cancelled() => break,
            }
        }
        tracing::info!(owner = %self.owner, "expiry worker stopped");
    }

    /// The active Redis SKUs (shards included) that hold holds now, as Redis tells: a SKU
    /// whose expiry set exists. Never the catalog's terms: a hold keeps the `expires_at` it
    /// was given, so a SKU whose `hold_seconds` was set to 0 (or left out of a re-declare)
    /// while holds were live still has them to expire (API.md; an offer is a hold too).
    async fn skus(&self) -> Result<Vec<String>, StoreError> {
        let mut active = crate::activity::members(&self.store).await?;
        // And what this gateway marked itself, even if the set lost it.
        active.extend(self.store.recent_marks().recent());
        active.sort();
        active.dedup();
        with_holds(&self.store, active).await
    }

    /// Expires the due holds of the Redis SKU `name` (a SKU, or one shard of one), a batch per
    /// call, until none is due or another worker holds it. Returns how many this worker expired.
    ///
    /// # Errors
    /// The Redis error of a call (what it expired stays expired; the rest stays due).
    pub async fn expire_due(&self, name: &str) -> Result<usize, StoreError> {
        let keys = self.store.keys(name);
        let mut expired = 0;
        loop {
            let mut con = self.store.hot();
            let lags = self
                .store
                .bounded(scripts::lifecycle::expire_holds(
                    &mut con,
                    &keys,
                    &self.owner,
                    LEASE_MS,
                    BATCH,
                    self.store.floor(name),
                ))
                .await?;
            let n = lags.len();
            if n == 0 {
                return Ok(expired);
            }
            for lag in lags {
                histogram!(EXPIRY_LAG).record(lag as f64 / 1000.0);
            }
            counter!(HOLDS, "outcome" => "expired").increment(n as u64);
            expired += n;
            if n < BATCH {
                return Ok(expired);
            }
        }
    }
}

/// The key of the SKU list's faults in the worker's [`Repeats`].
const LIST: &str = "\0list";

/// Logs that the fault under `key` is over, if one was logged.
fn cleared(faults: &Repeats, key: &str, message: &str) {
    if let Some(end) = faults.clear(key) {
        repeats::ended(key, end, message);
    }
}

/// The names among `names` whose expiry set exists (empty sorted sets do not exist in Redis,
/// so `EXISTS` says whether any hold or offer is left to end). One pipeline on a single Redis;
/// on a Cluster one read per name (each its own slot), all in flight together.
///
/// # Errors
/// Redis unreachable or timed out.
pub async fn with_holds(store: &Store, names: Vec<String>) -> Result<Vec<String>, StoreError> {
    if names.is_empty() {
        return Ok(names);
    }
    let found: Vec<bool> = if store.is_cluster() {
        // A pipeline cannot span slots: one read per name, all in flight together.
        let reads = names.iter().map(|name| {
            let mut con = store.hot();
            let cmd = redis::cmd("EXISTS")
                .arg(store.keys(name).expiry())
                .to_owned();
            async move { cmd.query_async::<bool>(&mut con).await }
        });
        store
            .bounded(async { Ok(futures_util::future::try_join_all(reads).await?) })
            .await?
    } else {
        let mut pipe = redis::pipe();
        for name in &names {
            pipe.cmd("EXISTS").arg(store.keys(name).expiry());
        }
        let mut con = store.hot();
        store
            .bounded(async { Ok(pipe.query_async(&mut con).await?) })
            .await?
    };
    Ok(names
        .into_iter()
        .zip(found)
        .filter_map(|(name, held)| held.then_some(name))
        .collect())
}
