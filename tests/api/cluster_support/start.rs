//! A cluster formed and read: start, addresses, who serves which slot, ready.

use super::*;

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
    pub(super) async fn remember_replicas(&mut self) {
        let view = self.view().await;
        let port_of: HashMap<&str, u16> = view.iter().map(|n| (n.id.as_str(), n.port)).collect();
        self.replicas_of.clear();
        for n in &view {
            if let Some(m) = n.master.as_deref().and_then(|m| port_of.get(m)) {
                self.replicas_of.entry(*m).or_default().push(n.port);
            }
        }
    }
}
