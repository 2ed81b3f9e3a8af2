//! Reads of a drop's state on a cluster that bypass the gateway, and SKUs placed on every master.

use super::*;

/// Reads of a drop's Redis state on a cluster, bypassing the gateway, through a cluster
/// connection: it follows the SKU's slot wherever it moves. The cluster counterpart of the
/// Redis half of `helpers::Probe`.
#[derive(Clone)]
pub struct ClusterProbe {
    pub redis: ClusterConnection,
    pub prefix: String,
}

impl ClusterProbe {
    pub async fn new(cluster: &PrivateCluster, prefix: &str) -> Self {
        ClusterProbe {
            redis: cluster.connection().await,
            prefix: prefix.to_string(),
        }
    }

    /// One read through the cluster connection, retried for a bounded time: during a failover
    /// or a half-done migration a call may fail (CLUSTERDOWN, TRYAGAIN) before it succeeds.
    async fn read<T: FromRedisValue>(&self, cmd: &redis::Cmd) -> T {
        let deadline = Instant::now() + CLUSTER_WAIT;
        loop {
            let mut con = self.redis.clone();
            match cmd.query_async(&mut con).await {
                Ok(v) => return v,
                Err(e) => assert!(
                    Instant::now() < deadline,
                    "{:?} on the cluster: {e}",
                    String::from_utf8_lossy(&cmd.get_packed_command())
                ),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Remaining stock of `sku` in Redis (`None`: the state hash is absent).
    pub async fn stock(&self, sku: &str) -> Option<i64> {
        self.read(redis::cmd("HGET").arg(self.key(sku, "state")).arg("stock"))
            .await
    }

    /// Units `user` holds of `sku` according to Redis.
    pub async fn held(&self, sku: &str, user: &str) -> i64 {
        self.read::<Option<i64>>(redis::cmd("HGET").arg(self.key(sku, "users")).arg(user))
            .await
            .unwrap_or(0)
    }

    /// Every user's count of `sku` (`HGETALL` of the users hash).
    pub async fn counts(&self, sku: &str) -> HashMap<String, i64> {
        self.read(redis::cmd("HGETALL").arg(self.key(sku, "users")))
            .await
    }

    /// A key of `sku` under this probe's prefix, e.g. `key("drop", "state")`.
    pub fn key(&self, sku: &str, suffix: &str) -> String {
        format!("{}:{{{sku}}}:{suffix}", self.prefix)
    }
}

/// The key whose slot a SKU's keys live in (every key of the SKU carries the `{sku}` tag).
pub fn sku_key(sku: &str) -> String {
    format!("{{{sku}}}")
}

/// SKU names `<stem>-<n>` such that every master of `cluster` serves at least `per_master` of
/// them, in the order found; a drop over them touches every master.
pub async fn skus_on_every_master(
    cluster: &PrivateCluster,
    stem: &str,
    per_master: usize,
) -> Vec<String> {
    let masters = cluster.masters().await;
    let mut on: HashMap<u16, usize> = HashMap::new();
    let mut picked = Vec::new();
    for n in 0..10_000 {
        if masters
            .iter()
            .all(|m| on.get(m).copied().unwrap_or(0) >= per_master)
        {
            break;
        }
        let sku = format!("{stem}-{n}");
        let m = cluster.master_of(&sku_key(&sku)).await;
        let c = on.entry(m).or_default();
        if *c < per_master {
            *c += 1;
            picked.push(sku);
        }
    }
    assert!(
        masters
            .iter()
            .all(|m| on.get(m).copied().unwrap_or(0) >= per_master),
        "SKU names covering every master: {on:?}"
    );
    picked
}
