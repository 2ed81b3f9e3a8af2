//! The sold-out cache's watcher: the subscription to `<prefix>:units-back`, the heartbeat that
//! tells a silent subscription from a quiet one, and the re-reads of the SKUs in use.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

use super::SoldOut;
use crate::error::StoreError;
use crate::keys::{split_shard, units_back_channel, SkuKeys};
use crate::layout::Layout;
use crate::metrics as m;
use crate::sku::SkuId;
use crate::store::Store;

/// Every gateway publishes a heartbeat on its units-back channel this often; a subscription
/// that delivered none for [`SILENT_AFTER`] (a connection gone quiet without a reset) is
/// dropped with every entry and made again. (A PING on the subscribed connection would do, but
/// its reply is not told apart from messages by the client.)
const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);
const SILENT_AFTER: Duration = Duration::from_secs(3);
/// The heartbeat's payload; any other payload is a state key.
const HEARTBEAT: &str = "heartbeat";
/// Wait before subscribing again after the subscription failed.
const RESUBSCRIBE_AFTER: Duration = Duration::from_millis(200);

/// Keeps the subscription to `<prefix>:units-back` and re-reads the SKUs in use.
pub struct Watcher {
    pub store: Store,
    pub redis_url: String,
    pub cache: Arc<SoldOut>,
}

impl Watcher {
    /// Subscribes (again after every loss) until `shutdown`; logs its exit.
    pub async fn run(self, shutdown: CancellationToken) {
        let channel = units_back_channel(self.store.prefix());
        // Set after a failure to subscribe is logged, so a Redis that stays away (already
        // /readyz's news) is logged once, not every RESUBSCRIBE_AFTER.
        let mut quiet = false;
        loop {
            let mut up = false;
            let ended = tokio::select! {
                _ = shutdown.cancelled() => break,
                ended = self.subscribed(&channel, &shutdown, &mut up) => ended,
            };
            self.cache.set_live(false);
            match ended {
                Ok(()) => break,
                Err(e) => {
                    if up || !quiet {
                        tracing::warn!(error = %e, "sold-out subscription lost; claims ask Redis until it is back");
                    }
                    quiet = !up;
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(RESUBSCRIBE_AFTER) => {}
            }
        }
        self.cache.set_live(false);
        tracing::info!("sold-out watcher stopped");
    }

    /// One subscription, until it fails (`Err`) or `shutdown` (`Ok`).
    async fn subscribed(
        &self,
        channel: &str,
        shutdown: &CancellationToken,
        up: &mut bool,
    ) -> Result<(), StoreError> {
        let mut pubsub = self.open_pubsub().await?;
        self.bounded(pubsub.subscribe(channel)).await?;
        let (_sink, mut messages) = pubsub.split();
        // Live only once SUBSCRIBE is confirmed: from here no notification can be missed.
        self.cache.set_live(true);
        *up = true;
        tracing::debug!(channel, "sold-out subscription up");
        let every = (self.cache.trust / 4).max(Duration::from_millis(1));
        let mut recheck = tokio::time::interval(every);
        recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut heartbeat = tokio::time::interval(HEARTBEAT_EVERY);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut heard = Instant::now();
        let head = format!("{}:{{", self.store.prefix());
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                msg = messages.next() => {
                    let Some(msg) = msg else {
                        return Err(StoreError::Unavailable("subscription closed".into()));
                    };
                    let key: String = msg.get_payload().unwrap_or_default();
                    match SkuKeys::sku_of_state(&head, &key) {
                        // A shard's units are its SKU's: the SKU is forgotten.
                        // Trusted: a state key of our own store names a checked SKU.
                        Some(name) => self.cache.forget(SkuId::trusted(split_shard(name).0)),
                        None if key == HEARTBEAT => heard = Instant::now(),
                        // Not a state key of ours: forget everything rather than guess.
                        None => self.cache.set_live(true),
                    }
                }
                _ = recheck.tick() => self.recheck().await,
                _ = heartbeat.tick() => {
                    if heard.elapsed() > SILENT_AFTER {
                        return Err(StoreError::Unavailable("no heartbeat on the subscription".into()));
                    }
                    let mut con = self.store.hot();
                    let publish = redis::cmd("PUBLISH").arg(channel).arg(HEARTBEAT).to_owned();
                    // A failed publish is the hot connection's trouble, seen by the claims.
                    let _ = self.bounded(publish.query_async::<i64>(&mut con)).await;
                }
            }
        }
    }

    /// A pub/sub connection to the first node of `redis_url` that answers. On a cluster any
    /// node will do: a script's PUBLISH is broadcast to every node over the cluster bus.
    async fn open_pubsub(&self) -> Result<redis::aio::PubSub, StoreError> {
        let mut last = StoreError::Unavailable("no Redis URL".into());
        for url in self.redis_url.split(',').map(str::trim) {
            let client = redis::Client::open(url)?;
            match self.bounded(client.get_async_pubsub()).await {
                Ok(p) => return Ok(p),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// A Redis call under the store's timeout.
    async fn bounded<T>(
        &self,
        call: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        self.store
            .bounded(async { call.await.map_err(StoreError::from) })
            .await
    }

    /// Re-reads the stock of every entry due, in one round trip (a sharded SKU's shards in
    /// one more, all together).
    async fn recheck(&self) {
        let (due, sharded): (Vec<_>, Vec<_>) = self
            .cache
            .due()
            .into_iter()
            .partition(|(_, l)| !l.is_sharded());
        let due: Vec<String> = due.into_iter().map(|(sku, _)| sku).collect();
        let ticket = self.cache.ticket();
        for (sku, layout) in &sharded {
            // One reading of every shard at one instant (two that agree): a single pass can
            // see a shard before a transfer landed there and its donor after it left.
            // The cache's keys are copies of checked ids (`SoldOut::learn`).
            let sku = SkuId::trusted(sku);
            match crate::shards::view::all_dry(&self.store, sku, *layout).await {
                Ok(true) => self.cache.learn(sku, *layout, ticket),
                Ok(false) => self.cache.forget(sku),
                Err(e) => {
                    tracing::debug!(sku = sku.as_str(), error = %e, "sold-out re-check failed")
                }
            }
        }
        m::sold_out_rechecks(sharded.len());
        if due.is_empty() {
            return;
        }
        let read: Result<Vec<Option<i64>>, _> = if self.store.is_cluster() {
            // A pipeline cannot span slots: one read per SKU, all in flight together.
            let reads = due.iter().map(|sku| {
                let mut con = self.store.hot();
                let cmd = redis::cmd("HGET")
                    .arg(self.store.keys(sku).state())
                    .arg("stock")
                    .to_owned();
                async move { cmd.query_async::<Option<i64>>(&mut con).await }
            });
            self.bounded(async { futures_util::future::try_join_all(reads).await })
                .await
        } else {
            let mut pipe = redis::pipe();
            for sku in &due {
                pipe.cmd("HGET")
                    .arg(self.store.keys(sku).state())
                    .arg("stock");
            }
            let mut con = self.store.hot();
            self.bounded(pipe.query_async(&mut con)).await
        };
        m::sold_out_rechecks(due.len());
        match read {
            Ok(stocks) => {
                for (sku, stock) in due.iter().zip(stocks) {
                    let sku = SkuId::trusted(sku);
                    match stock {
                        Some(0) => self.cache.learn(sku, Layout::SINGLE, ticket),
                        _ => self.cache.forget(sku),
                    }
                }
            }
            // Entries age out by themselves within TRUST: the claims then ask Redis.
            Err(e) => tracing::debug!(error = %e, "sold-out re-check failed"),
        }
    }
}
