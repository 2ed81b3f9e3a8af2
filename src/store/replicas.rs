//! How many replicas a decision must reach before it is answered (`WAIT`), per master.
//!
//! `DROPGATE_REDIS_WAIT_REPLICAS` is the most a decision waits for. It waits for fewer when its
//! master has fewer replicas that could ever be promoted: right after a failover the new master
//! has none until the dead node comes back as its replica, and a `WAIT 1` would then time out
//! on every call, answering every win `outcome_unknown` and stalling the writer while the
//! stock is spent (tests/api/cluster.rs caught exactly that). A replica the cluster marked
//! `fail` cannot be promoted, so a decision it lacks cannot be lost to a failover; the
//! requirement counts only the others. A replica that is merely slow or cut off for a moment
//! (not yet `fail`) still counts: its decisions wait, time out, and are answered
//! `outcome_unknown`, which is safe. On a single Redis (a requirement set by hand, replicas
//! behind Sentinel) the count is the replicas connected to it (`ROLE`).
//!
//! The count is read at most once a [`REFRESH`] per slot, so the calls in between cost nothing.

use std::time::{Duration, Instant};

use dashmap::DashMap;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr};
use redis::Value;

use super::RedisConn;
use crate::error::StoreError;

/// How long a master's replica count is trusted.
pub const REFRESH: Duration = Duration::from_secs(1);

/// The configured requirement and the counts read per slot.
pub struct Replicas {
    /// The most any decision waits for (0: never waits).
    pub configured: usize,
    /// Per slot of a SKU used here: the replicas its master can promote, and when that was read.
    counts: DashMap<Slot, (usize, Instant)>,
}

impl Replicas {
    pub fn new(configured: usize) -> Self {
        Replicas {
            configured,
            counts: DashMap::new(),
        }
    }

    /// The replicas a decision on `key`'s slot must reach: the configured number, or fewer
    /// when its master has fewer that could be promoted. A read that fails keeps the
    /// configured number (the decision then waits, and at worst is answered unknown).
    pub async fn required(&self, con: &RedisConn, key: &str, timeout: Duration) -> usize {
        if self.configured == 0 {
            return 0;
        }
        let slot = Slot::for_key(key);
        if let Some(c) = self.counts.get(&slot) {
            if c.1.elapsed() < REFRESH {
                return c.0.min(self.configured);
            }
        }
        let read = tokio::time::timeout(timeout, promotable(con.clone(), slot)).await;
        let n = match read {
            Ok(Ok(n)) => n,
            _ => self.configured,
        };
        self.counts.insert(slot, (n, Instant::now()));
        n.min(self.configured)
    }
}

fn route_of(slot: Slot) -> Route {
    Route::with_slot(slot, SlotAddr::Master)
}

/// The routing of a command to the master of `slot`.
pub fn to_master(slot: Slot) -> RoutingInfo {
    RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route_of(slot)))
}

/// The replicas of `slot`'s master that the cluster has not marked `fail` (on a single Redis:
/// the replicas connected to it).
async fn promotable(con: RedisConn, slot: Slot) -> Result<usize, StoreError> {
    match con {
        RedisConn::Single(mut c) => {
            let role: Value = redis::cmd("ROLE").query_async(&mut c).await?;
            // ["master", offset, [[ip, port, offset], ...]]
            Ok(match role {
                Value::Array(parts) => match parts.get(2) {
                    Some(Value::Array(replicas)) => replicas.len(),
                    _ => 0,
                },
                _ => 0,
            })
        }
        RedisConn::Cluster(mut c) => {
            let id: Value = c
                .route_command(
                    redis::cmd("CLUSTER").arg("MYID").to_owned(),
                    to_master(slot),
                )
                .await?;
            let id: String = redis::from_redis_value(id).map_err(redis::RedisError::from)?;
            let lines: Value = c
                .route_command(
                    redis::cmd("CLUSTER").arg("REPLICAS").arg(&id).to_owned(),
                    to_master(slot),
                )
                .await?;
            let lines: Vec<String> =
                redis::from_redis_value(lines).map_err(redis::RedisError::from)?;
            Ok(lines.iter().filter(|l| promotable_line(l)).count())
        }
    }
}

/// Whether a `CLUSTER REPLICAS` line (`<id> <addr> <flags> <master> ...`) names a replica that
/// could be promoted: not marked `fail` (a `fail?`, only suspected, still counts) and with an
/// address.
fn promotable_line(line: &str) -> bool {
    let Some(flags) = line.split_whitespace().nth(2) else {
        return false;
    };
    !flags
        .split(',')
        .any(|f| matches!(f, "fail" | "noaddr" | "handshake"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_replica_cannot_be_promoted_and_a_suspected_one_still_can() {
        let ok = "e7d1 127.0.0.1:7104@17104 slave 67ed 0 1426238317239 4 connected";
        let suspected = "e7d1 127.0.0.1:7104@17104 slave,fail? 67ed 0 1426238317239 4 connected";
        let failed = "e7d1 127.0.0.1:7104@17104 slave,fail 67ed 0 1426238317239 4 disconnected";
        assert!(promotable_line(ok));
        assert!(promotable_line(suspected));
        assert!(!promotable_line(failed));
        assert!(!promotable_line("garbage"));
    }
}
