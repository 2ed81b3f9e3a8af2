//! Redis connections.
//!
//! The claim hot path shares one multiplexed [`ConnectionManager`]: every request pipelines
//! onto one socket and the manager reconnects by itself after Redis comes back (measured
//! against a bb8 pool in `benches/claim_path.rs`; see README). The bb8 pool gives dedicated
//! connections to background work (the journal reader), which must not queue behind or in
//! front of claims.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bb8_redis::RedisConnectionManager;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::activity::RecentMarks;
use crate::error::StoreError;
use crate::keys::SkuKeys;

pub type RedisPool = bb8::Pool<RedisConnectionManager>;

/// Both kinds of Redis connection, the key prefix, and the call timeout.
#[derive(Clone)]
pub struct Store {
    /// Prefix of every key this gateway touches (DROPGATE_KEY_PREFIX).
    prefix: String,
    /// Multiplexed connection of the hot path; cloning it is cheap and shares the socket.
    hot: ConnectionManager,
    /// Dedicated connections for background readers.
    pool: RedisPool,
    /// Upper bound of any one call; past it the outcome is unknown and must be read back.
    timeout: Duration,
    /// This gateway's marks of active SKUs, shared by every clone, so each script caller marks
    /// its SKU without another handle (see [`crate::activity`]).
    recent_marks: Arc<RecentMarks>,
}

impl Store {
    /// Connects both kinds of connection and loads the scripts.
    ///
    /// # Errors
    /// The first connection or script-load failure.
    pub async fn connect(url: &str, prefix: &str, timeout: Duration) -> Result<Store, StoreError> {
        let client = redis::Client::open(url)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            // Reconnect quickly and keep trying: while Redis is away claims answer 503 fast
            // from the timeout below, and the first claim after it returns finds a socket.
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
        let store = Store {
            prefix: prefix.to_string(),
            hot,
            pool,
            timeout,
            recent_marks: Arc::default(),
        };
        let mut con = store.hot();
        store.bounded(crate::scripts::load_all(&mut con)).await?;
        Ok(store)
    }

    pub fn keys(&self, sku: &str) -> SkuKeys {
        SkuKeys::new(&self.prefix, sku)
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// A handle on the shared multiplexed connection.
    pub fn hot(&self) -> ConnectionManager {
        self.hot.clone()
    }

    pub fn pool(&self) -> &RedisPool {
        &self.pool
    }

    pub fn recent_marks(&self) -> &RecentMarks {
        &self.recent_marks
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
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

    /// Redis's `maxmemory-policy`, or `None` when CONFIG is not allowed (a managed Redis).
    /// Anything but `noeviction` may evict journal entries, per-user counts or fences: a
    /// gateway refuses to start on it and `/readyz` reports it.
    ///
    /// # Errors
    /// The failure to reach Redis.
    pub async fn eviction_policy(&self) -> Result<Option<String>, StoreError> {
        let mut con = self.hot();
        let reply: Result<Vec<String>, StoreError> = self
            .bounded(async {
                Ok(redis::cmd("CONFIG")
                    .arg("GET")
                    .arg("maxmemory-policy")
                    .query_async(&mut con)
                    .await?)
            })
            .await;
        match reply {
            Ok(kv) => Ok(kv.into_iter().nth(1)),
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
                .query_async::<String>(&mut con)
                .await
                .map(|_| ())
                .map_err(StoreError::from)
        })
        .await
    }
}
