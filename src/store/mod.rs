//! Redis connections, on a single Redis or a Redis Cluster.
//!
//! On a single Redis the claim hot path shares one multiplexed [`ConnectionManager`]: every
//! request pipelines onto one socket and the manager reconnects by itself after Redis comes
//! back (measured against a bb8 pool in `benches/claim_path.rs`; see docs/performance.md).
//! The bb8 pool gives dedicated connections to background work (the journal reader), which
//! must not queue behind or in front of claims.
//!
//! On a cluster (`REDIS_URL` lists several nodes) both roles are played by the redis crate's
//! cluster connection, which multiplexes one socket per node, follows `MOVED` and `ASK`,
//! retries `TRYAGAIN` and refreshes its slot map after a failover; background readers get a
//! second one, so they still never queue with claims. Every script keeps its keys in the SKU's
//! slot (`{sku}`), so no call spans two nodes. Scripts are loaded on every master at start
//! (`SCRIPT LOAD` goes to all primaries) and reloaded on `NOSCRIPT` (a promoted replica, a
//! node added later) by `Script::invoke_async`.
//!
//! The cluster connection may resend a command after a connection error: every script is
//! idempotent per id (claim ids are fenced by their record, restocks by their marker, ...), and
//! a resent claim comes back `fenced`, which the claim path settles by reading (src/claims/call.rs).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bb8_redis::RedisConnectionManager;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo, Slot};
use redis::{Cmd, Value};

use crate::error::StoreError;
use crate::keys::SkuKeys;
use crate::scripts::Floor;

mod conn;
pub mod marks;
pub mod recent;
pub mod replicas;

use conn::{carries_entries, collect_policies, Background};
pub use conn::{RedisConn, RedisPool};
use marks::Marks;
use recent::RecentMarks;
use replicas::{to_master, Replicas};

/// Both kinds of Redis connection, the key prefix, and the call timeout.
#[derive(Clone)]
pub struct Store {
    /// Prefix of every key this gateway touches (DROPGATE_KEY_PREFIX).
    prefix: String,
    /// Multiplexed connection of the hot path.
    hot: RedisConn,
    /// Dedicated connections for background readers.
    background: Background,
    /// Upper bound of any one call; past it the outcome is unknown and must be read back.
    timeout: Duration,
    /// Replicas that must acknowledge a decision before it is answered as won (`WAIT`): at
    /// most the configured number, fewer where a master has fewer that could be promoted.
    replicas: Arc<Replicas>,
    /// How long to wait for them.
    wait_timeout: Duration,
    /// The node URLs as configured (one on a single Redis).
    urls: Vec<String>,
    /// This gateway's marks of active SKUs, shared by every clone, so each script caller marks
    /// its SKU without another handle (see [`crate::activity`]).
    recent_marks: Arc<RecentMarks>,
    /// The ledger's marks this gateway knows, shared by every clone, so each script caller
    /// sends its SKU's floor without another handle (see [`crate::freshness`]).
    marks: Arc<Marks>,
    /// The highest line sequence PostgreSQL recorded of each queued SKU, as this gateway knows
    /// it (see [`crate::queue::tickets`]): a waiting room's line behind it is an older copy.
    line_marks: Arc<dashmap::DashMap<String, i64>>,
    /// Wakes the ticket recorder at once: a join waits for its ticket's record.
    line_wake: Arc<tokio::sync::Notify>,
}

impl Store {
    /// Connects both kinds of connection and loads the scripts. `url` is one URL, or several
    /// comma-separated: the seed nodes of a cluster.
    ///
    /// # Errors
    /// The first connection or script-load failure.
    pub async fn connect(url: &str, prefix: &str, timeout: Duration) -> Result<Store, StoreError> {
        let urls: Vec<String> = url.split(',').map(|u| u.trim().to_string()).collect();
        let (hot, background) = if urls.len() > 1 {
            let client = ClusterClient::builder(urls.clone())
                .connection_timeout(timeout)
                .response_timeout(timeout)
                // Redirections, TRYAGAIN during a slot migration and reconnects after a
                // failover are retried inside the call; the store's timeout bounds them all.
                .retries(6)
                .min_retry_wait(10)
                .max_retry_wait(200)
                .build()?;
            let connect = || async {
                tokio::time::timeout(timeout * 8, client.get_async_connection())
                    .await
                    .map_err(|_| StoreError::Timeout)?
                    .map_err(StoreError::from)
            };
            let hot = connect().await?;
            let background = connect().await?;
            (RedisConn::Cluster(hot), Background::Cluster(background))
        } else {
            let client = redis::Client::open(url)?;
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(timeout))
                .set_response_timeout(Some(timeout))
                // Reconnect quickly and keep trying: while Redis is away claims answer 503
                // fast from the timeout below, and the first claim after it returns finds a
                // socket.
                .set_number_of_retries(2)
                .set_min_delay(Duration::from_millis(20))
                .set_max_delay(Duration::from_millis(500));
            let hot = tokio::time::timeout(
                timeout * 8,
                ConnectionManager::new_with_config(client, config),
            )
            .await
            .map_err(|_| StoreError::Timeout)??;
            let pool = bb8::Pool::builder()
                .max_size(8)
                .connection_timeout(timeout * 4)
                // Keep bb8's PING on checkout: a multiplexed connection cannot report itself
                // broken, so without it a Redis restart would leave dead sockets in the pool
                // and the writer failing forever (tests/api/faults.rs caught exactly that).
                .test_on_check_out(true)
                .build_unchecked(RedisConnectionManager::new(url)?);
            (RedisConn::Single(hot), Background::Pool(pool))
        };
        let store = Store {
            prefix: prefix.to_string(),
            hot,
            background,
            timeout,
            replicas: Arc::new(Replicas::new(0)),
            wait_timeout: Duration::from_millis(200),
            urls,
            recent_marks: Arc::default(),
            marks: Arc::default(),
            line_marks: Arc::default(),
            line_wake: Arc::default(),
        };
        let mut con = store.hot();
        // Startup is not the hot path: loading every script (on every master) gets the same
        // generous bound as the first connection, so a loaded machine does not fail a start.
        tokio::time::timeout(timeout * 8, crate::scripts::load_all(&mut con))
            .await
            .map_err(|_| StoreError::Timeout)??;
        Ok(store)
    }

    /// Wins are answered only once `replicas` replicas acknowledged them, waiting at most
    /// `timeout` (see [`Store::replicated`]).
    #[must_use]
    pub fn with_wait(mut self, replicas: usize, timeout: Duration) -> Store {
        self.replicas = Arc::new(Replicas::new(replicas));
        self.wait_timeout = timeout;
        self
    }

    /// The keys of the Redis SKU `name`: a SKU's own name, or one shard's.
    pub fn keys(&self, name: &str) -> SkuKeys {
        SkuKeys::new(&self.prefix, name)
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Whether this store talks to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.hot, RedisConn::Cluster(_))
    }
    /// Whether a call that failed with `e` may have run (read it back): on a cluster even a
    /// refused one, as the connection retries inside a call and an earlier try may have run.
    pub fn may_have_run(&self, e: &StoreError) -> bool {
        e.is_uncertain() || (self.is_cluster() && matches!(e, StoreError::Unavailable(_)))
    }

    /// The configured node URLs (the first one alone on a single Redis).
    pub fn urls(&self) -> &[String] {
        &self.urls
    }

    /// A handle on the shared multiplexed connection.
    pub fn hot(&self) -> RedisConn {
        self.hot.clone()
    }

    pub fn recent_marks(&self) -> &RecentMarks {
        &self.recent_marks
    }

    /// The ledger's marks this gateway knows (see [`crate::freshness`]).
    pub fn marks(&self) -> &Arc<Marks> {
        &self.marks
    }

    /// The floor of a script call that may change the state of the Redis SKU `name`: a state
    /// older than it fails closed (`lua/lib/fresh.lua`).
    pub fn floor(&self, name: &str) -> Floor {
        self.marks.fence(name)
    }

    /// The line floor of a waiting-room script call on `sku` (`lua/lib/queue.lua`): a line
    /// whose sequence is behind it fails closed.
    pub fn line_floor(&self, sku: &str) -> i64 {
        self.line_marks.get(sku).map_or(0, |m| *m)
    }

    /// The ticket recorder's wake-up ([`crate::queue::tickets`]).
    pub fn line_wake(&self) -> &tokio::sync::Notify {
        &self.line_wake
    }

    /// Raises the line floor of `sku` to `mark` (floors only grow).
    pub fn raise_line_floor(&self, sku: &str, mark: i64) {
        let mut m = self.line_marks.entry(sku.to_string()).or_insert(0);
        if *m < mark {
            *m = mark;
        }
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Runs `cmd` on a background connection (never queued with claims).
    ///
    /// # Errors
    /// No pool connection within the pool's timeout, or the call's own error.
    pub async fn background_query(&self, cmd: &Cmd) -> Result<Value, StoreError> {
        match &self.background {
            Background::Pool(pool) => {
                let mut con = pool
                    .get()
                    .await
                    .map_err(|e| StoreError::Unavailable(e.to_string()))?;
                self.bounded(async { Ok(cmd.query_async(&mut *con).await?) })
                    .await
            }
            Background::Cluster(c) => {
                let mut con = c.clone();
                self.bounded(async { Ok(cmd.query_async(&mut con).await?) })
                    .await
            }
        }
    }

    /// Runs a journal read (`cmd`, on `keys`' slot) on a background connection and, when
    /// replicas are required, `WAIT`s on the same socket after it. `XREADGROUP` and
    /// `XAUTOCLAIM` are writes (they move entries into the reader's pending list), so once the
    /// replicas acknowledged them they hold every entry the read returned. The writer writes
    /// only such entries to PostgreSQL: after a failover the promoted replica's state is never
    /// behind the ledger, so it can go on selling at once.
    ///
    /// # Errors
    /// As [`Store::background_query`]; [`StoreError::Unavailable`] when the replicas did not
    /// acknowledge in time (the entries stay pending for this reader, to be read again).
    pub async fn background_read_replicated(
        &self,
        cmd: &Cmd,
        keys: &SkuKeys,
    ) -> Result<Value, StoreError> {
        // No key string built and no future awaited on a deployment that waits for nothing.
        if self.replicas.configured == 0 {
            return self.background_query(cmd).await;
        }
        let required = self
            .replicas
            .required(&self.hot, &keys.state(), self.timeout)
            .await;
        if required == 0 {
            return self.background_query(cmd).await;
        }
        let mut wait = redis::cmd("WAIT");
        wait.arg(required).arg(self.wait_timeout.as_millis() as u64);
        let (value, acked): (Value, i64) = match &self.background {
            Background::Pool(pool) => {
                let mut con = pool
                    .get()
                    .await
                    .map_err(|e| StoreError::Unavailable(e.to_string()))?;
                self.bounded(async {
                    let v: Value = cmd.query_async(&mut *con).await?;
                    let n: i64 = wait.query_async(&mut *con).await?;
                    Ok((v, n))
                })
                .await?
            }
            Background::Cluster(c) => {
                let mut con = c.clone();
                let routing = to_master(Slot::for_key(keys.state()));
                self.bounded(async {
                    let v: Value = cmd.query_async(&mut con).await?;
                    let n = con.route_command(wait, routing).await?;
                    Ok((
                        v,
                        redis::from_redis_value(n).map_err(redis::RedisError::from)?,
                    ))
                })
                .await?
            }
        };
        if acked < required as i64 && carries_entries(&value) {
            crate::metrics::wait_short();
            return Err(StoreError::Unavailable(
                "journal entries read but not yet on the replicas".into(),
            ));
        }
        Ok(value)
    }

    /// Runs a Redis call under the store's timeout.
    ///
    /// # Errors
    /// [`StoreError::Timeout`] past the timeout (the call's effect is then unknown), or the
    /// call's own error.
    pub async fn bounded<T, F>(&self, call: F) -> Result<T, StoreError>
    where
        F: Future<Output = Result<T, StoreError>>,
    {
        tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| StoreError::Timeout)?
    }

    /// Whether the writes this gateway made so far on the node of `keys`' slot reached the
    /// configured number of replicas (`WAIT`, routed to that slot's master, on the same
    /// multiplexed socket that carried the writes). Always true when no replica is required.
    ///
    /// Redis replicates asynchronously: a master that dies before its replica has a decision
    /// takes the decision with it when the replica is promoted. A win is therefore answered
    /// only after this returns true; otherwise its outcome is unknown to the buyer (503
    /// `outcome_unknown`) until read back.
    ///
    /// # Errors
    /// The failure to reach the node.
    pub async fn replicated(&self, keys: &SkuKeys) -> Result<bool, StoreError> {
        // The claim path calls this after every call that won: on a single Redis (nothing to
        // wait for) it must cost nothing, not a key string per call.
        if self.replicas.configured == 0 {
            return Ok(true);
        }
        let required = self
            .replicas
            .required(&self.hot, &keys.state(), self.timeout)
            .await;
        if required == 0 {
            return Ok(true);
        }
        let mut cmd = redis::cmd("WAIT");
        cmd.arg(required).arg(self.wait_timeout.as_millis() as u64);
        let acked: i64 = match &self.hot {
            RedisConn::Single(c) => {
                let mut con = c.clone();
                self.bounded(async { Ok(cmd.query_async(&mut con).await?) })
                    .await?
            }
            RedisConn::Cluster(c) => {
                let mut con = c.clone();
                let routing = to_master(Slot::for_key(keys.state()));
                let v = self
                    .bounded(async { Ok(con.route_command(cmd, routing).await?) })
                    .await?;
                redis::from_redis_value(v).map_err(redis::RedisError::from)?
            }
        };
        Ok(acked >= required as i64)
    }

    /// Redis's `maxmemory-policy` (on a cluster: the first master's that is not `noeviction`,
    /// else `noeviction`), or `None` when CONFIG is not allowed (a managed Redis). Anything but
    /// `noeviction` may evict journal entries, per-user counts or fences: a gateway refuses
    /// to start on it and `/readyz` reports it.
    ///
    /// # Errors
    /// The failure to reach Redis.
    pub async fn eviction_policy(&self) -> Result<Option<String>, StoreError> {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("GET").arg("maxmemory-policy");
        let reply: Result<Value, StoreError> = match &self.hot {
            RedisConn::Single(c) => {
                let mut con = c.clone();
                self.bounded(async { Ok(cmd.query_async(&mut con).await?) })
                    .await
            }
            RedisConn::Cluster(c) => {
                let mut con = c.clone();
                let routing = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                self.bounded(async { Ok(con.route_command(cmd, routing).await?) })
                    .await
            }
        };
        match reply {
            Ok(v) => {
                let mut policies = Vec::new();
                collect_policies(v, &mut policies);
                Ok(policies
                    .iter()
                    .find(|p| p.as_str() != "noeviction")
                    .or(policies.first())
                    .cloned())
            }
            Err(StoreError::Redis(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// PING on the hot connection, for /readyz.
    ///
    /// # Errors
    /// The failure to reach Redis.
    pub async fn ping(&self) -> Result<(), StoreError> {
        let mut con = self.hot();
        self.bounded(async move {
            redis::cmd("PING")
                .query_async::<Value>(&mut con)
                .await
                .map(|_| ())
                .map_err(StoreError::from)
        })
        .await
    }
}
