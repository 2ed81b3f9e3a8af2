//! A slot migrated, with its keys, to another master, in one go or held half-way.

use super::*;

impl PrivateCluster {
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
