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

/// One line of `CLUSTER NODES`, as one node sees one node.
#[derive(Debug, Clone)]
pub struct NodeLine {
    pub id: String,
    pub port: u16,
    pub flags: Vec<String>,
    /// The master's id, for a replica.
    pub master: Option<String>,
    /// Slot ranges served (inclusive); the `[slot->-id]` / `[slot-<-id]` migration markers are
    /// left out.
    pub slots: Vec<(u16, u16)>,
}

impl NodeLine {
    pub fn is_master(&self) -> bool {
        self.flags.iter().any(|f| f == "master")
    }

    pub fn failed(&self) -> bool {
        self.flags.iter().any(|f| f == "fail" || f == "fail?")
    }

    pub fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(a, b)| a <= slot && slot <= b)
    }
}

/// Parses `CLUSTER NODES`.
pub fn parse_nodes(text: &str) -> Vec<NodeLine> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            // ip:port@cport[,hostname]
            let port = f[1]
                .split('@')
                .next()
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| p.parse().ok())
                .unwrap_or(0);
            let slots = f[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .map(|s| match s.split_once('-') {
                    Some((a, b)) => (a.parse().unwrap(), b.parse().unwrap()),
                    None => {
                        let n = s.parse().unwrap();
                        (n, n)
                    }
                })
                .collect();
            NodeLine {
                id: f[0].to_string(),
                port,
                flags: f[2].split(',').map(str::to_string).collect(),
                master: (f[3] != "-").then(|| f[3].to_string()),
                slots,
            }
        })
        .collect()
}

/// A connection to one node, bounded.
async fn connect(port: u16) -> redis::RedisResult<MultiplexedConnection> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(NODE_CALL))
        .set_response_timeout(Some(NODE_CALL));
    redis::Client::open(format!("redis://127.0.0.1:{port}"))?
        .get_multiplexed_async_connection_with_config(&config)
        .await
}

/// One command on one node (a fresh connection: nodes die under these tests).
pub async fn node_cmd<T: FromRedisValue>(port: u16, cmd: &redis::Cmd) -> redis::RedisResult<T> {
    let mut con = connect(port).await?;
    cmd.query_async(&mut con).await
}

/// `INFO <section>` of one node as field → value.
async fn info(port: u16, section: &str) -> redis::RedisResult<HashMap<String, String>> {
    let text: String = node_cmd(port, redis::cmd("INFO").arg(section)).await?;
    Ok(text
        .lines()
        .filter_map(|l| l.trim().split_once(':'))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect())
}

/// `CLUSTER NODES` as one node sees it.
pub async fn nodes_seen_by(port: u16) -> redis::RedisResult<Vec<NodeLine>> {
    let text: String = node_cmd(port, redis::cmd("CLUSTER").arg("NODES")).await?;
    Ok(parse_nodes(&text))
}

/// The slot map one node holds: slot range → port of the master serving it.
fn slot_map(view: &[NodeLine]) -> BTreeMap<(u16, u16), u16> {
    view.iter()
        .filter(|n| n.is_master())
        .flat_map(|n| n.slots.iter().map(move |&r| (r, n.port)))
        .collect()
}

fn covers_every_slot(map: &BTreeMap<(u16, u16), u16>) -> bool {
    let mut next = 0u32;
    for &(a, b) in map.keys() {
        if u32::from(a) != next {
            return false;
        }
        next = u32::from(b) + 1;
    }
    next == u32::from(SLOTS)
}

/// Polls `cond` (which says why it is not there yet) until it holds; panics after `limit`
/// with the last reason.
async fn poll_until<F, Fut>(limit: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let deadline = Instant::now() + limit;
    loop {
        match cond().await {
            Ok(()) => return,
            Err(why) => assert!(
                Instant::now() < deadline,
                "{what}: not reached within {limit:?}: {why}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `n` distinct free ports: all bound at once before any is released, so no two are equal
/// (a node's client port and another's bus port must differ).
fn distinct_free_ports(n: usize) -> Vec<u16> {
    let held: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    held.iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

/// Starts one cluster node; its `nodes.conf` in `dir` makes a restarted node rejoin as itself.
/// A node with a `host` of its own binds it besides loopback and announces it, so redirects and
/// `CLUSTER SLOTS` name an address reachable from another network namespace.
fn spawn_node(host: &str, port: u16, bus: u16, dir: &std::path::Path) -> std::process::Child {
    let mut cmd = std::process::Command::new("redis-server");
    cmd.args(["--port", &port.to_string()]);
    if host == LOOPBACK {
        cmd.args(["--bind", LOOPBACK]);
    } else {
        // Clients from other hosts have no password to give: protected mode would refuse them.
        cmd.args(["--bind", LOOPBACK, host])
            .args(["--cluster-announce-ip", host])
            .args(["--protected-mode", "no"]);
    }
    cmd.args([
        "--cluster-enabled",
        "yes",
        "--cluster-port",
        &bus.to_string(),
    ])
    .arg("--cluster-config-file")
    .arg(dir.join("nodes.conf"))
    // Failure detection in about a second; a replica may always take over (its link's
    // age does not disqualify it), and a cluster missing a slot serves no reads either,
    // as production runs it.
    .args(["--cluster-node-timeout", "1000"])
    .args(["--cluster-replica-validity-factor", "0"])
    .args(["--cluster-allow-reads-when-down", "no"])
    // A replica's first sync starts at once (Redis 7 waits 5 s for more replicas).
    .args([
        "--repl-diskless-sync",
        "yes",
        "--repl-diskless-sync-delay",
        "0",
    ])
    .args(["--save", "", "--appendonly", "no"])
    .arg("--dir")
    .arg(dir)
    .arg("--logfile")
    .arg(dir.join("redis.log"))
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .expect("redis-server is installed")
}

impl Node {
    /// Waits until the node answers PING; a node that exited (its port taken by someone else
    /// meanwhile) fails the test with its log.
    async fn wait_up(&mut self) {
        let deadline = Instant::now() + CLUSTER_WAIT;
        loop {
            if node_cmd::<String>(self.port, &redis::cmd("PING"))
                .await
                .is_ok()
            {
                return;
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                let log = std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
                panic!("redis-server on {} exited ({status}): {log}", self.port);
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on {} does not answer PING",
                self.port
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

// === impl PrivateCluster ===

impl PrivateCluster {
    /// Starts `masters * (1 + replicas_per_master)` nodes, creates the cluster, and waits until
    /// every node serves (`cluster_state:ok`), all agree on one slot map covering every slot,
    /// and every replica's link to its master is up.
    pub async fn start(masters: usize, replicas_per_master: usize) -> Self {
        Self::start_on(masters, replicas_per_master, &[]).await
    }

    /// As [`PrivateCluster::start`], node `i` on `hosts[i]` (an address of this host, bound
    /// besides loopback and announced); nodes past the end of `hosts` on loopback alone.
    pub async fn start_on(masters: usize, replicas_per_master: usize, hosts: &[String]) -> Self {
        assert!(
            masters >= 3,
            "redis-cli --cluster create wants 3 masters at least"
        );
        let count = masters * (1 + replicas_per_master);
        let mut ports = distinct_free_ports(2 * count).into_iter();
        let mut nodes = Vec::with_capacity(count);
        for i in 0..count {
            let (port, bus) = (ports.next().unwrap(), ports.next().unwrap());
            let dir = scratch_dir("cluster");
            let host = hosts.get(i).map_or(LOOPBACK, String::as_str).to_string();
            let child = spawn_node(&host, port, bus, &dir);
            nodes.push(Node {
                host,
                port,
                bus,
                dir,
                child: Some(child),
            });
        }
        let mut cluster = PrivateCluster {
            nodes,
            replicas_of: HashMap::new(),
        };
        for node in &mut cluster.nodes {
            node.wait_up().await;
        }
        let out = tokio::process::Command::new(crate::tools::require("redis-cli", "redis-tools"))
            .arg("--cluster")
            .arg("create")
            .args(
                cluster
                    .nodes
                    .iter()
                    .map(|n| format!("{}:{}", n.host, n.port)),
            )
            .args(["--cluster-replicas", &replicas_per_master.to_string()])
            .arg("--cluster-yes")
            .output()
            .await
            .expect("redis-cli is installed");
        assert!(
            out.status.success(),
            "redis-cli --cluster create: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        cluster.wait_ready().await;
        cluster.remember_replicas().await;
        let masters_seen = cluster.masters().await.len();
        assert_eq!(masters_seen, masters, "masters serving slots");
        cluster
    }

    /// Ports of the nodes still running.
    pub fn live_ports(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| n.child.is_some())
            .map(|n| n.port)
            .collect()
    }

    /// What `REDIS_URL` takes: every node's URL, comma-separated.
    pub fn urls(&self) -> String {
        self.url_list().join(",")
    }

    pub fn url_list(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("redis://{}:{}", n.host, n.port))
            .collect()
    }

    /// The address the node on `port` announces.
    pub fn host_of(&self, port: u16) -> &str {
        self.nodes
            .iter()
            .find(|n| n.port == port)
            .map(|n| n.host.as_str())
            .unwrap_or_else(|| panic!("no node on {port}"))
    }

    /// The cluster as the first live node that answers sees it.
    pub async fn view(&self) -> Vec<NodeLine> {
        for port in self.live_ports() {
            if let Ok(v) = nodes_seen_by(port).await {
                return v;
            }
        }
        panic!("no live cluster node answers CLUSTER NODES");
    }

    /// Ports of the masters serving at least one slot.
    pub async fn masters(&self) -> Vec<u16> {
        let mut m: Vec<u16> = self
            .view()
            .await
            .into_iter()
            .filter(|n| n.is_master() && !n.failed() && !n.slots.is_empty())
            .map(|n| n.port)
            .collect();
        m.sort_unstable();
        m
    }

    /// The hash slot of `key` (`CLUSTER KEYSLOT`, so hash tags count as Redis counts them).
    pub async fn slot_of(&self, key: &str) -> u16 {
        for port in self.live_ports() {
            if let Ok(s) = node_cmd(port, redis::cmd("CLUSTER").arg("KEYSLOT").arg(key)).await {
                return s;
            }
        }
        panic!("no live cluster node answers CLUSTER KEYSLOT");
    }

    /// Port of the master currently serving `key`'s slot.
    pub async fn master_of(&self, key: &str) -> u16 {
        let slot = self.slot_of(key).await;
        self.view()
            .await
            .into_iter()
            .find(|n| n.is_master() && !n.failed() && n.serves(slot))
            .unwrap_or_else(|| panic!("no master serves slot {slot}"))
            .port
    }

    /// A master other than the one serving `key`: a destination for its slot.
    pub async fn other_master(&self, key: &str) -> u16 {
        let owner = self.master_of(key).await;
        self.masters()
            .await
            .into_iter()
            .find(|&p| p != owner)
            .expect("a cluster has more than one master")
    }

    /// Node id of the node on `port`.
    pub async fn id_of(&self, port: u16) -> String {
        node_cmd(port, redis::cmd("CLUSTER").arg("MYID"))
            .await
            .unwrap_or_else(|e| panic!("CLUSTER MYID on {port}: {e}"))
    }

    /// Waits until every live node serves, agrees with every other on one slot map covering
    /// every slot and on every live node's role (none flagged failing), and every live
    /// replica's link to its master is up and synced.
    pub async fn wait_ready(&self) {
        let live = self.live_ports();
        poll_until(CLUSTER_WAIT, "the cluster is ready", || {
            let live = live.clone();
            async move {
                let mut first: Option<BTreeMap<(u16, u16), u16>> = None;
                // Each live node's role as it states it, then as every other node sees it.
                let mut roles: HashMap<u16, (bool, Option<String>)> = HashMap::new();
                let mut views = Vec::new();
                for &port in &live {
                    let state = info_cluster(port).await?;
                    if state.get("cluster_state").map(String::as_str) != Some("ok") {
                        return Err(format!("{port}: {state:?}"));
                    }
                    let view = nodes_seen_by(port).await.map_err(|e| e.to_string())?;
                    let map = slot_map(&view);
                    if !covers_every_slot(&map) {
                        return Err(format!("{port} sees slots uncovered: {map:?}"));
                    }
                    match &first {
                        None => first = Some(map),
                        Some(m) if *m != map => {
                            return Err(format!("{port} disagrees: {map:?} vs {m:?}"))
                        }
                        Some(_) => {}
                    }
                    let me = view
                        .iter()
                        .find(|n| n.flags.iter().any(|f| f == "myself"))
                        .ok_or("no myself line")?;
                    if !me.is_master() {
                        let repl = info(port, "replication").await.map_err(|e| e.to_string())?;
                        let up = repl.get("master_link_status").map(String::as_str) == Some("up")
                            && repl.get("master_sync_in_progress").map(String::as_str) == Some("0");
                        if !up {
                            return Err(format!("replica {port} not linked: {repl:?}"));
                        }
                    }
                    roles.insert(port, (me.is_master(), me.master.clone()));
                    views.push((port, view));
                }
                for (port, view) in &views {
                    for n in view.iter().filter(|n| live.contains(&n.port)) {
                        let seen = (n.is_master(), n.master.clone());
                        if n.failed() || roles.get(&n.port) != Some(&seen) {
                            return Err(format!("{port} sees {n:?} otherwise than it is"));
                        }
                    }
                }
                Ok(())
            }
        })
        .await;
    }

    /// Records which replicas each master has now.
    async fn remember_replicas(&mut self) {
        let view = self.view().await;
        let port_of: HashMap<&str, u16> = view.iter().map(|n| (n.id.as_str(), n.port)).collect();
        self.replicas_of.clear();
        for n in &view {
            if let Some(m) = n.master.as_deref().and_then(|m| port_of.get(m)) {
                self.replicas_of.entry(*m).or_default().push(n.port);
            }
        }
    }

    /// SIGKILLs the master serving `key`'s slot; returns its port.
    pub async fn kill_master_of(&mut self, key: &str) -> u16 {
        self.remember_replicas().await;
        let port = self.master_of(key).await;
        assert!(
            self.replicas_of.get(&port).is_some_and(|r| !r.is_empty()),
            "the master {port} has no replica to take over"
        );
        self.kill(port);
        port
    }

    /// SIGKILL of the node on `port`: no shutdown, no save.
    pub fn kill(&mut self, port: u16) {
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.port == port)
            .unwrap_or_else(|| panic!("no node on {port}"));
        if let Some(mut c) = node.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the killed node on `port` again, with its `nodes.conf` and no data: it rejoins
    /// the cluster and, its slots taken over meanwhile, becomes a replica of their new master.
    /// Waits until the cluster is ready again (every replica linked and synced).
    pub async fn restart(&mut self, port: u16) {
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.port == port)
            .unwrap_or_else(|| panic!("no node on {port}"));
        assert!(node.child.is_none(), "the node on {port} is running");
        node.child = Some(spawn_node(&node.host, node.port, node.bus, &node.dir));
        node.wait_up().await;
        self.wait_ready().await;
        self.remember_replicas().await;
    }

    /// Waits until a replica of the master killed for `key` serves `key`'s slot as master,
    /// every live node agrees, and the cluster is ok again; returns the new master's port.
    pub async fn wait_promoted(&self, key: &str) -> u16 {
        let slot = self.slot_of(key).await;
        let live = self.live_ports();
        let candidates: Vec<u16> = self
            .replicas_of
            .iter()
            .filter(|(m, _)| !live.contains(m))
            .flat_map(|(_, r)| r.iter().copied())
            .collect();
        assert!(!candidates.is_empty(), "no master was killed");
        let promoted = std::sync::Mutex::new(0u16);
        poll_until(CLUSTER_WAIT, "a replica took over the slot", || {
            let (live, candidates, promoted) = (live.clone(), candidates.clone(), &promoted);
            async move {
                let mut owner = None;
                for &port in &live {
                    let state = info_cluster(port).await?;
                    if state.get("cluster_state").map(String::as_str) != Some("ok") {
                        return Err(format!("{port}: cluster_state not ok"));
                    }
                    let view = nodes_seen_by(port).await.map_err(|e| e.to_string())?;
                    let o = view
                        .iter()
                        .find(|n| n.is_master() && !n.failed() && n.serves(slot))
                        .map(|n| n.port)
                        .ok_or(format!("{port} sees nobody serving slot {slot}"))?;
                    if owner.is_some_and(|p| p != o) {
                        return Err(format!("nodes disagree on slot {slot}'s master"));
                    }
                    owner = Some(o);
                }
                let o = owner.ok_or("no live node")?;
                if !candidates.contains(&o) {
                    return Err(format!(
                        "slot {slot} is served by {o}, not a replica of the dead master"
                    ));
                }
                let role = info(o, "replication").await.map_err(|e| e.to_string())?;
                if role.get("role").map(String::as_str) != Some("master") {
                    return Err(format!("{o} does not call itself master yet"));
                }
                *promoted.lock().unwrap() = o;
                Ok(())
            }
        })
        .await;
        let port = *promoted.lock().unwrap();
        port
    }

    /// Moves `key`'s whole slot, with every key in it, to the master on `to`.
    pub async fn migrate_slot_of(&self, key: &str, to: u16) {
        let mut m = self.begin_migration(key, to).await;
        while m.move_keys(MIGRATE_CHUNK).await > 0 {}
        m.finish().await;
    }

    /// Starts moving `key`'s slot to the master on `to`: the slot is marked IMPORTING there and
    /// MIGRATING on its owner, and no key has moved yet. The caller moves keys in chunks
    /// ([`SlotMigration::move_keys`]) and may run traffic between them, while the slot's keys
    /// are split between the two nodes, then [`SlotMigration::finish`]es.
    pub async fn begin_migration(&self, key: &str, to: u16) -> SlotMigration {
        let slot = self.slot_of(key).await;
        let from = self.master_of(key).await;
        assert_ne!(from, to, "slot {slot} is already on {to}");
        let (from_id, to_id) = (self.id_of(from).await, self.id_of(to).await);
        let setslot = |state: &str, id: &str| {
            let mut c = redis::cmd("CLUSTER");
            c.arg("SETSLOT").arg(slot).arg(state).arg(id);
            c
        };
        node_cmd::<()>(to, &setslot("IMPORTING", &from_id))
            .await
            .unwrap_or_else(|e| panic!("SETSLOT {slot} IMPORTING on {to}: {e}"));
        node_cmd::<()>(from, &setslot("MIGRATING", &to_id))
            .await
            .unwrap_or_else(|e| panic!("SETSLOT {slot} MIGRATING on {from}: {e}"));
        SlotMigration {
            slot,
            from,
            to,
            to_id,
            masters: self.masters().await,
            moved: 0,
            live: self.live_ports(),
        }
    }

    /// Keys in `slot` on the node on `port` (at most `count`).
    pub async fn keys_in_slot(port: u16, slot: u16, count: usize) -> Vec<String> {
        node_cmd(
            port,
            redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(slot)
                .arg(count),
        )
        .await
        .unwrap_or_else(|e| panic!("GETKEYSINSLOT {slot} on {port}: {e}"))
    }

    /// A cluster-aware connection (follows MOVED and ASK, refreshes its slot map).
    pub async fn connection(&self) -> ClusterConnection {
        cluster_connection(&self.url_list()).await
    }
}

/// `CLUSTER INFO` of one node (`cluster_state`, `cluster_slots_ok`, ...), the error as text.
async fn info_cluster(port: u16) -> Result<HashMap<String, String>, String> {
    let text: String = node_cmd(port, redis::cmd("CLUSTER").arg("INFO"))
        .await
        .map_err(|e| format!("{port}: {e}"))?;
    Ok(text
        .lines()
        .filter_map(|l| l.trim().split_once(':'))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect())
}

/// A cluster connection to the nodes at `urls`; it retries on MOVED/ASK/TRYAGAIN and after a
/// failover by itself.
pub async fn cluster_connection(urls: &[String]) -> ClusterConnection {
    redis::cluster::ClusterClient::builder(urls.to_vec())
        .connection_timeout(NODE_CALL)
        .response_timeout(NODE_CALL)
        .build()
        .expect("valid cluster URLs")
        .get_async_connection()
        .await
        .expect("the cluster accepts a connection")
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

/// A slot on its way from one master to another ([`PrivateCluster::begin_migration`]).
pub struct SlotMigration {
    pub slot: u16,
    pub from: u16,
    pub to: u16,
    to_id: String,
    /// Masters to tell the new owner once every key has moved.
    masters: Vec<u16>,
    /// Keys moved so far.
    pub moved: usize,
    /// Every live node, replicas included: all must see the new owner before the move is done.
    live: Vec<u16>,
}

impl SlotMigration {
    /// Moves up to `count` of the slot's keys still on the old owner (one `MIGRATE ... KEYS`);
    /// returns how many moved (0: none is left).
    pub async fn move_keys(&mut self, count: usize) -> usize {
        let keys = PrivateCluster::keys_in_slot(self.from, self.slot, count).await;
        if keys.is_empty() {
            return 0;
        }
        let mut migrate = redis::cmd("MIGRATE");
        migrate
            .arg("127.0.0.1")
            .arg(self.to)
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS")
            .arg(&keys);
        let reply: String = node_cmd(self.from, &migrate)
            .await
            .unwrap_or_else(|e| panic!("MIGRATE of slot {} to {}: {e}", self.slot, self.to));
        assert!(
            reply == "OK" || reply == "NOKEY",
            "MIGRATE answered {reply}"
        );
        self.moved += keys.len();
        keys.len()
    }

    /// Keys of the slot still on the old owner.
    pub async fn keys_left(&self) -> usize {
        let n: usize = node_cmd(
            self.from,
            redis::cmd("CLUSTER").arg("COUNTKEYSINSLOT").arg(self.slot),
        )
        .await
        .unwrap_or_else(|e| panic!("COUNTKEYSINSLOT on {}: {e}", self.from));
        n
    }

    /// Moves whatever keys are left, then gives the slot to the new owner (itself first, then
    /// the old owner, then every other master, as `redis-cli --cluster reshard` does), and
    /// waits until every live node, replicas included, sees the new owner.
    pub async fn finish(mut self) {
        while self.move_keys(MIGRATE_CHUNK).await > 0 {}
        let node = |c: &mut redis::Cmd| {
            c.arg("SETSLOT").arg(self.slot).arg("NODE").arg(&self.to_id);
        };
        let mut order = vec![self.to, self.from];
        order.extend(
            self.masters
                .iter()
                .filter(|&&p| p != self.to && p != self.from),
        );
        for port in order {
            let mut c = redis::cmd("CLUSTER");
            node(&mut c);
            node_cmd::<()>(port, &c)
                .await
                .unwrap_or_else(|e| panic!("SETSLOT {} NODE on {port}: {e}", self.slot));
        }
        let (slot, to) = (self.slot, self.to);
        let live = self.live.clone();
        poll_until(CLUSTER_WAIT, "every node sees the slot's new owner", || {
            let live = live.clone();
            async move {
                for &port in &live {
                    let view = nodes_seen_by(port).await.map_err(|e| e.to_string())?;
                    let owner = view.iter().find(|n| n.is_master() && n.serves(slot));
                    if owner.map(|n| n.port) != Some(to) {
                        return Err(format!("{port} sees slot {slot} on {owner:?}"));
                    }
                }
                Ok(())
            }
        })
        .await;
    }
}

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

// === the harness's own tests ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_cluster_serves_every_slot_and_moves_a_slot_with_its_keys() {
    let _heavy = crate::helpers::heavy().await;
    let cluster = PrivateCluster::start(3, 1).await;
    assert_eq!(cluster.urls().split(',').count(), 6);
    let mut con = cluster.connection().await;
    let probe = ClusterProbe::new(&cluster, "h").await;

    // A SKU's state on every master, written through the cluster connection.
    let skus = skus_on_every_master(&cluster, "harness", 2).await;
    for sku in &skus {
        redis::pipe()
            .hset(probe.key(sku, "state"), "stock", sku.len())
            .hset(probe.key(sku, "users"), "u-1", 1)
            .query_async::<()>(&mut con)
            .await
            .unwrap();
    }
    assert_eq!(cluster.masters().await.len(), 3);

    // A SKU's slot with many keys, moved half, then the rest, while it stays readable.
    let hot = &sku_key(&skus[0]);
    for i in 0..250 {
        redis::cmd("SET")
            .arg(format!("{hot}:{i}"))
            .arg(i)
            .query_async::<()>(&mut con)
            .await
            .unwrap();
    }
    let from = cluster.master_of(hot).await;
    let to = cluster.other_master(hot).await;
    let mut m = cluster.begin_migration(hot, to).await;
    let total = m.keys_left().await;
    assert_eq!(total, 252, "250 keys and the SKU's two");
    assert_eq!(m.move_keys(120).await, 120);
    assert_eq!(
        m.keys_left().await,
        132,
        "the slot is split between two nodes"
    );
    assert_eq!(probe.stock(&skus[0]).await, Some(skus[0].len() as i64));
    // Split: a key still on the old owner and one already moved are both read (ASK followed).
    let left = PrivateCluster::keys_in_slot(from, m.slot, 1).await;
    let moved = PrivateCluster::keys_in_slot(to, m.slot, 1).await;
    for k in left.iter().chain(&moved) {
        let v: Option<i64> = redis::cmd("GET")
            .arg(k)
            .query_async(&mut con)
            .await
            .unwrap();
        assert!(
            v.is_some(),
            "{k} is readable while its slot is half-migrated"
        );
    }
    m.finish().await;
    assert_eq!(cluster.master_of(hot).await, to);
    assert!(
        PrivateCluster::keys_in_slot(from, cluster.slot_of(hot).await, 10)
            .await
            .is_empty()
    );
    for i in 0..250 {
        let v: i64 = redis::cmd("GET")
            .arg(format!("{hot}:{i}"))
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(v, i);
    }
    // The one-call migration moves a slot back, and the earlier keys are all where they were.
    cluster.migrate_slot_of(hot, from).await;
    assert_eq!(cluster.master_of(hot).await, from);
    let n: usize = node_cmd(
        from,
        redis::cmd("CLUSTER")
            .arg("COUNTKEYSINSLOT")
            .arg(cluster.slot_of(hot).await),
    )
    .await
    .unwrap();
    assert_eq!(n, total);
    for sku in &skus {
        assert_eq!(probe.stock(sku).await, Some(sku.len() as i64));
        assert_eq!(probe.held(sku, "u-1").await, 1);
        assert_eq!(probe.counts(sku).await.len(), 1);
    }
    cluster.wait_ready().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_is_replaced_by_its_replica() {
    let _heavy = crate::helpers::heavy().await;
    let mut cluster = PrivateCluster::start(3, 1).await;
    let key = "{victim}:state";
    let master = cluster.master_of(key).await;
    // Written on the master and acknowledged by its replica before the kill.
    let mut direct = connect(master).await.unwrap();
    redis::cmd("SET")
        .arg(key)
        .arg("kept")
        .query_async::<()>(&mut direct)
        .await
        .unwrap();
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(5000)
        .query_async(&mut direct)
        .await
        .unwrap();
    assert_eq!(acked, 1, "the replica acknowledged the write");

    let killed = cluster.kill_master_of(key).await;
    assert_eq!(killed, master);
    let promoted = cluster.wait_promoted(key).await;
    assert_ne!(promoted, master);
    assert_eq!(cluster.master_of(key).await, promoted);

    let v: String = node_cmd(promoted, redis::cmd("GET").arg(key))
        .await
        .unwrap();
    assert_eq!(v, "kept");
    // And through a cluster connection opened on every URL, the dead one included.
    let mut con = cluster.connection().await;
    let v: String = redis::cmd("GET")
        .arg(key)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(v, "kept");

    // The dead node comes back as the new master's replica, with the key.
    cluster.restart(killed).await;
    let view = cluster.view().await;
    let back = view.iter().find(|n| n.port == killed).unwrap();
    assert!(!back.is_master(), "{back:?}");
    assert_eq!(
        back.master.as_deref(),
        Some(cluster.id_of(promoted).await.as_str())
    );
    let mut replica = connect(killed).await.unwrap();
    redis::cmd("READONLY")
        .query_async::<()>(&mut replica)
        .await
        .unwrap();
    let v: String = redis::cmd("GET")
        .arg(key)
        .query_async(&mut replica)
        .await
        .unwrap();
    assert_eq!(v, "kept");
}
