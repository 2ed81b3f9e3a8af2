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
//! [`Watcher`] holds the subscription and forgets the SKU when the message comes.
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
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use parking_lot::RwLock;
use tokio_util::sync::CancellationToken;

use crate::error::StoreError;
use crate::keys::{split_shard, units_back_channel, SkuKeys};
use crate::metrics as m;
use crate::shards::Layout;
use crate::store::Store;

/// How long after the read that found 0 a sold-out answer from memory is still given, by
/// default (`DROPGATE_SOLD_OUT_TRUST_MS`; 0 turns the fast path off). An entry in use is
/// re-read once it is half that old, and the watcher looks for such entries every quarter.
pub const TRUST: Duration = Duration::from_millis(100);
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
    pub fn refuses(&self, sku: &str) -> bool {
        let inner = self.inner.read();
        if !inner.live || self.trust.is_zero() {
            return false;
        }
        match inner.skus.get(sku) {
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
    pub fn learn(&self, sku: &str, layout: Layout, ticket: Ticket) {
        let mut inner = self.inner.write();
        if !inner.live || inner.notices != ticket.notices {
            return;
        }
        let entry = Entry {
            since: ticket.at,
            used: AtomicBool::new(true),
            layout,
        };
        match inner.skus.get_mut(sku) {
            Some(e) if e.since >= ticket.at => {}
            Some(e) => *e = entry,
            None => {
                inner.skus.insert(sku.to_string(), entry);
            }
        }
    }

    /// Units may be back on `sku` (a notification, or a re-check that found stock).
    fn forget(&self, sku: &str) {
        let mut inner = self.inner.write();
        inner.notices += 1;
        inner.skus.remove(sku);
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
                        Some(name) => self.cache.forget(split_shard(name).0),
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
            match crate::shards::view::all_dry(&self.store, sku, *layout).await {
                Ok(true) => self.cache.learn(sku, *layout, ticket),
                Ok(false) => self.cache.forget(sku),
                Err(e) => tracing::debug!(sku, error = %e, "sold-out re-check failed"),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn live() -> SoldOut {
        let s = SoldOut::new(TRUST);
        s.set_live(true);
        s
    }

    #[test]
    fn nothing_is_refused_while_the_subscription_is_down() {
        let s = SoldOut::new(TRUST);
        s.learn("a", Layout::SINGLE, s.ticket());
        assert!(!s.refuses("a"));
    }

    #[test]
    fn a_learned_sold_out_is_refused_until_a_notification() {
        let s = live();
        s.learn("a", Layout::SINGLE, s.ticket());
        assert!(s.refuses("a"));
        assert!(!s.refuses("b"));
        s.forget("a");
        assert!(!s.refuses("a"));
    }

    #[test]
    fn a_notification_that_overtook_the_answer_wins() {
        let s = live();
        let t = s.ticket();
        s.forget("a");
        s.learn("a", Layout::SINGLE, t);
        assert!(!s.refuses("a"));
    }

    #[test]
    fn an_entry_older_than_the_bound_is_not_trusted() {
        let s = live();
        let mut t = s.ticket();
        t.at -= TRUST + Duration::from_millis(1);
        s.learn("a", Layout::SINGLE, t);
        assert!(!s.refuses("a"));
    }

    #[test]
    fn losing_the_subscription_forgets_everything() {
        let s = live();
        s.learn("a", Layout::SINGLE, s.ticket());
        s.set_live(false);
        s.set_live(true);
        assert!(!s.refuses("a"));
    }

    /// The line every script that can raise a SKU's stock carries (see the module docs).
    const UNITS_BACK: &str =
        "redis.call('PUBLISH', (string.gsub(KEYS[1], '{[^{]*$', 'units-back')), KEYS[1])";
    /// Scripts that write `stock` but can only lower it, or only read it.
    const LOWER_ONLY: &[&str] = &[
        "claim.lua",
        "join_waitlist.lua",
        "transfer_out.lua",
        "line_lease.lua",
        "offer_pool.lua",
        "read_books.lua",
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
                "{name} writes stock: add the units-back line (src/soldout.rs), or list it in LOWER_ONLY"
            );
        }
    }

    #[test]
    fn unused_entries_are_dropped_not_reread() {
        let s = live();
        let mut t = s.ticket();
        t.at -= TRUST / 2;
        s.learn("used", Layout::SINGLE, t);
        s.learn("idle", Layout::SINGLE, t);
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
        assert!(s.refuses("used"));
        assert_eq!(s.due(), [("used".to_string(), Layout::SINGLE)]);
        assert_eq!(s.len(), 1);
    }
}
