//! Single nodes: starting one, talking to one, reading what one sees of the cluster.

use super::*;

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
pub(super) async fn connect(port: u16) -> redis::RedisResult<MultiplexedConnection> {
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
pub(super) async fn info(port: u16, section: &str) -> redis::RedisResult<HashMap<String, String>> {
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
pub(super) fn slot_map(view: &[NodeLine]) -> BTreeMap<(u16, u16), u16> {
    view.iter()
        .filter(|n| n.is_master())
        .flat_map(|n| n.slots.iter().map(move |&r| (r, n.port)))
        .collect()
}

pub(super) fn covers_every_slot(map: &BTreeMap<(u16, u16), u16>) -> bool {
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
pub(super) async fn poll_until<F, Fut>(limit: Duration, what: &str, mut cond: F)
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
pub(super) fn distinct_free_ports(n: usize) -> Vec<u16> {
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
pub(super) fn spawn_node(
    host: &str,
    port: u16,
    bus: u16,
    dir: &std::path::Path,
) -> std::process::Child {
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
    pub(super) async fn wait_up(&mut self) {
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

/// `CLUSTER INFO` of one node (`cluster_state`, `cluster_slots_ok`, ...), the error as text.
pub(super) async fn info_cluster(port: u16) -> Result<HashMap<String, String>, String> {
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
