//! A real Redis Cluster of the test's own: masters and replicas as child processes on free
//! ports, created with `redis-cli --cluster create`, and the faults a cluster has that a single
//! Redis has not: a master SIGKILLed (its replica is promoted) and a slot migrated, with its
//! keys, to another master while traffic runs (and held half-migrated as long as a test likes).
//!
//! Every wait polls a condition with a bound; nothing sleeps to synchronise.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, FromRedisValue};

use crate::services::scratch_dir;

mod faults;
mod nodes;
mod probe;
mod slots;
mod start;
mod tests;

pub use nodes::node_cmd;
use nodes::*;
pub use probe::{sku_key, skus_on_every_master, ClusterProbe};

/// Number of hash slots of every Redis Cluster.
pub const SLOTS: u16 = 16384;

/// Bound of one admin call to one node: loopback answers in microseconds, a killed node refuses
/// at once, so anything longer is a node that hangs.
const NODE_CALL: Duration = Duration::from_secs(2);

/// Bound of a cluster reaching a state (formed, agreed, failed over).
const CLUSTER_WAIT: Duration = Duration::from_secs(60);

/// Keys moved per `MIGRATE` when a slot moves in one go.
const MIGRATE_CHUNK: usize = 100;

/// Where every node listens, and what it announces, unless given an address of its own.
const LOOPBACK: &str = "127.0.0.1";

/// One redis-server of the cluster.
struct Node {
    /// Address the node announces to clients and to the other nodes (and binds, besides
    /// loopback): `127.0.0.1`, or an address of its own that a test can cut off alone.
    host: String,
    /// Client port; the cluster bus has its own (`--cluster-port`), both picked free, since
    /// the default bus port (port + 10000) may be taken or past 65535.
    port: u16,
    bus: u16,
    /// Its own directory: `nodes.conf`, the log.
    dir: PathBuf,
    /// `None` once killed.
    child: Option<std::process::Child>,
}

/// A cluster of `masters` masters, each with `replicas_per_master` replicas.
pub struct PrivateCluster {
    nodes: Vec<Node>,
    /// Replicas of each master as the cluster was created or last re-read, by master port:
    /// the candidates of [`PrivateCluster::wait_promoted`].
    replicas_of: HashMap<u16, Vec<u16>>,
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut c) = node.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
            let _ = std::fs::remove_dir_all(&node.dir);
        }
    }
}
