//! A master killed (its replica promoted) and a node restarted as itself.

use super::*;

impl PrivateCluster {
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
}
