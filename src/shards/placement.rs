//! Placement: on a Redis Cluster, the shards of a SKU put on different masters.
//!
//! Where a shard's keys live follows the CRC16 of its hash tag, its Redis name: left to
//! chance, 3 shards land on 3 masters of 3 only 2/9 of the time. So at the first declare of a
//! sharded SKU on a cluster ([`crate::inventory::declare`]) the gateway reads the slot map and
//! picks, for each shard i >= 1, a *salt*: the shard is named `<sku>#<i>.<salt>`
//! ([`crate::keys::shard_name`]), and the salt is the smallest one whose name hashes to a slot
//! of the master chosen for the shard ([`choose`]). The salts are stored in the SKU's catalog
//! row by the INSERT that creates it, and every gateway names the shards from that row
//! ([`crate::layout::Layout`]): a slot map read later, or by another gateway, never renames a shard.
//!
//! Shard 0 is the SKU itself and stays where `{sku}` hashes. Each next shard goes to the master
//! holding the fewest of this SKU's shards so far, so n shards on m masters spread evenly
//! (`ceil(n/m)` at most on one). A shard whose plain name (salt 0) already lands on such a
//! master keeps it; otherwise the first such master in the order after shard 0's master is
//! chosen. A single Redis, or a slot map that cannot be read, leaves every salt 0.
//!
//! Placement is made once: a slot moved later by an operator moves the shards in it, as it
//! moves any key.

use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::Value;

use crate::error::StoreError;
use crate::keys::shard_name;
use crate::layout::Layout;
use crate::sku::SkuId;
use crate::store::{RedisConn, Store};

/// Hash slots of a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// CRC16-XMODEM (polynomial 0x1021, initial value 0), the checksum Redis Cluster hashes keys
/// with.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The hash slot of `key`, as Redis computes it: the CRC16 of its hash tag (what lies between
/// the first `{` and the first `}` after it, when not empty), or of the whole key.
pub fn key_slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|b| *b == b'{').and_then(|open| {
        let rest = &bytes[open + 1..];
        let close = rest.iter().position(|b| *b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16(tagged.unwrap_or(bytes)) % SLOTS
}

/// Which master serves each slot, as one read of the cluster's slot map saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotMap {
    /// Per slot, the index of its master in `masters` (`None`: no master serves it).
    owners: Vec<Option<u16>>,
    /// The masters serving at least one slot, by their first slot: an order every gateway
    /// reading the same map agrees on.
    masters: Vec<String>,
}

impl SlotMap {
    /// The map of slot ranges `(first, last, master)` (inclusive; `master` names a node, e.g.
    /// its id). Ranges past the last slot are cut off.
    pub fn from_ranges(ranges: &[(u16, u16, String)]) -> SlotMap {
        let mut sorted: Vec<&(u16, u16, String)> = ranges.iter().collect();
        sorted.sort_by_key(|r| r.0);
        let mut masters: Vec<String> = Vec::new();
        let mut owners = vec![None; usize::from(SLOTS)];
        for (first, last, master) in sorted {
            let index = match masters.iter().position(|m| m == master) {
                Some(i) => i,
                None => {
                    masters.push(master.clone());
                    masters.len() - 1
                }
            };
            for slot in *first..=(*last).min(SLOTS - 1) {
                owners[usize::from(slot)] = Some(index as u16);
            }
        }
        SlotMap { owners, masters }
    }

    /// The masters, in the map's order.
    pub fn masters(&self) -> &[String] {
        &self.masters
    }

    /// The index of the master serving `slot`.
    pub fn owner(&self, slot: u16) -> Option<usize> {
        self.owners
            .get(usize::from(slot))
            .copied()
            .flatten()
            .map(usize::from)
    }
}

/// The layout of `count` shards of `sku` placed on the masters of `map` (see the module's
/// doc); `slot_of` gives the slot of a shard's Redis name (its keys' slot). Pure: the same
/// map gives the same salts.
pub fn choose(sku: &SkuId, count: i32, map: &SlotMap, slot_of: impl Fn(&str) -> u16) -> Layout {
    let plain = Layout::unsalted(count);
    let masters = map.masters().len();
    if masters < 2 || !plain.is_sharded() {
        return plain;
    }
    let mut load = vec![0usize; masters];
    let home = map.owner(slot_of(sku.as_str()));
    if let Some(h) = home {
        load[h] += 1;
    }
    // Ties go to the masters after shard 0's, in the map's order, wrapping around.
    let start = home.map_or(0, |h| h + 1);
    let order: Vec<usize> = (0..masters).map(|k| (start + k) % masters).collect();
    let mut salts = vec![0u16; plain.count() as usize];
    for shard in 1..plain.count() as u16 {
        let fewest = load.iter().copied().min().unwrap_or(0);
        let unsalted = map.owner(slot_of(&shard_name(sku, shard, 0)));
        let target = match unsalted {
            Some(m) if load[m] == fewest => m,
            _ => *order
                .iter()
                .find(|m| load[**m] == fewest)
                .expect("some master holds the fewest shards"),
        };
        // A master serving a single slot is found within 65,535 salts most of the time; one
        // that is not found leaves the shard where its plain name hashes.
        let salt = (unsalted != Some(target))
            .then(|| {
                (1..=u16::MAX)
                    .find(|s| map.owner(slot_of(&shard_name(sku, shard, *s))) == Some(target))
            })
            .flatten()
            .unwrap_or(0);
        salts[usize::from(shard)] = salt;
        let landed = if salt == 0 { unsalted } else { Some(target) };
        if let Some(m) = landed {
            load[m] += 1;
        }
    }
    Layout::salted(count, &salts)
}

/// The layout of a SKU declared now with `count` shards: placed on the masters when the store
/// is a cluster, every salt 0 otherwise or when the slot map cannot be read (the declare goes
/// on; its shards then land where their names hash).
pub async fn for_new_sku(store: &Store, sku: &SkuId, count: i32) -> Layout {
    let plain = Layout::unsalted(count);
    if !store.is_cluster() || !plain.is_sharded() {
        return plain;
    }
    match read_slot_map(store).await {
        Ok(map) => choose(sku, count, &map, |name| key_slot(&store.keys(name).state())),
        Err(e) => {
            tracing::warn!(sku = sku.as_str(), error = %e, "could not read the cluster's slot map; the shards are named without placement salts");
            plain
        }
    }
}

/// The cluster's slot map (`CLUSTER SLOTS`, asked of a master).
///
/// # Errors
/// [`StoreError::Protocol`] for a reply that is not a slot map, or the Redis error.
pub async fn read_slot_map(store: &Store) -> Result<SlotMap, StoreError> {
    let RedisConn::Cluster(mut con) = store.hot() else {
        return Err(StoreError::Protocol(
            "a single Redis has no slot map".into(),
        ));
    };
    let mut cmd = redis::cmd("CLUSTER");
    cmd.arg("SLOTS");
    let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::RandomPrimary);
    let reply = store
        .bounded(async { Ok(con.route_command(cmd, routing).await?) })
        .await?;
    parse_slots(&reply)
        .filter(|r| !r.is_empty())
        .map(|r| SlotMap::from_ranges(&r))
        .ok_or_else(|| StoreError::Protocol("CLUSTER SLOTS answered no slot ranges".into()))
}

/// The ranges of a `CLUSTER SLOTS` reply: `[[first, last, [host, port, id, ...], replicas...],
/// ...]`, each master named by its node id (by `host:port` where the reply has no id).
fn parse_slots(reply: &Value) -> Option<Vec<(u16, u16, String)>> {
    let Value::Array(ranges) = reply else {
        return None;
    };
    ranges
        .iter()
        .map(|range| {
            let Value::Array(parts) = range else {
                return None;
            };
            let first: u16 = redis::from_redis_value(parts.first()?.clone()).ok()?;
            let last: u16 = redis::from_redis_value(parts.get(1)?.clone()).ok()?;
            let Value::Array(master) = parts.get(2)? else {
                return None;
            };
            let text =
                |v: Option<&Value>| -> Option<String> { redis::from_redis_value(v?.clone()).ok() };
            let name = match text(master.get(2)) {
                Some(id) => id,
                None => format!("{}:{}", text(master.first())?, text(master.get(1))?),
            };
            Some((first, last, name))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// Three masters splitting the slots as `redis-cli --cluster create` does.
    fn three_masters() -> SlotMap {
        SlotMap::from_ranges(&[
            (0, 5460, "a".into()),
            (5461, 10922, "b".into()),
            (10923, 16383, "c".into()),
        ])
    }

    fn slot_of(name: &str) -> u16 {
        key_slot(&format!("dg:{{{name}}}:state"))
    }

    fn id(s: &str) -> &SkuId {
        SkuId::parse(s).unwrap()
    }

    fn masters_of(map: &SlotMap, sku: &str, layout: &Layout) -> Vec<usize> {
        layout
            .names(id(sku))
            .iter()
            .map(|n| map.owner(slot_of(n)).unwrap())
            .collect()
    }

    #[test]
    fn key_slots_are_the_ones_redis_computes() {
        // Pinned from Redis: CLUSTER KEYSLOT of each.
        assert_eq!(crc16(b"123456789"), 0x31c3);
        assert_eq!(key_slot("123456789"), 12739);
        assert_eq!(key_slot("somekey"), 11058);
        assert_eq!(key_slot("foo{hash_tag}"), 2515);
        assert_eq!(key_slot("foo"), key_slot("{foo}:bar"));
        // An empty tag does not count: the whole key is hashed.
        assert_eq!(key_slot("{}foo"), crc16(b"{}foo") % SLOTS);
        // And the redis crate, which routes every call, agrees.
        use redis::cluster_routing::Slot;
        for i in 0..2000 {
            let key = format!("dg:{{sku-{i}#1.{i}}}:state");
            assert_eq!(
                Slot::for_key(&key),
                Slot::new(key_slot(&key)).unwrap(),
                "{key}"
            );
        }
    }

    #[test]
    fn shards_whose_plain_names_share_a_master_are_salted_onto_the_others() {
        let map = three_masters();
        // A SKU whose plain names put two or more of its three shards on one master.
        let sku = (0..)
            .map(|n| format!("crowded-{n}"))
            .find(|s| {
                let masters: HashSet<usize> = masters_of(&map, s, &Layout::unsalted(3))
                    .into_iter()
                    .collect();
                masters.len() < 3
            })
            .unwrap();

        let layout = choose(id(&sku), 3, &map, slot_of);

        let placed = masters_of(&map, &sku, &layout);
        assert_eq!(placed.iter().collect::<HashSet<_>>().len(), 3, "{placed:?}");
        assert_eq!(layout.salt(0), 0, "shard 0 stays where the SKU hashes");
        assert_eq!(placed[0], map.owner(slot_of(&sku)).unwrap());
        assert!(layout.names(id(&sku))[1..].iter().any(|n| n.contains('.')));
        // Each salt is the smallest that reaches its master.
        for shard in 1..3u16 {
            let salt = layout.salt(shard);
            for smaller in 1..salt {
                let name = shard_name(id(&sku), shard, smaller);
                assert_ne!(map.owner(slot_of(&name)), Some(placed[usize::from(shard)]));
            }
        }
        // The same map gives the same salts.
        assert_eq!(choose(id(&sku), 3, &map, slot_of), layout);
    }

    #[test]
    fn shards_already_spread_keep_their_plain_names() {
        let map = three_masters();
        let sku = (0..)
            .map(|n| format!("spread-{n}"))
            .find(|s| {
                let masters: HashSet<usize> = masters_of(&map, s, &Layout::unsalted(3))
                    .into_iter()
                    .collect();
                masters.len() == 3
            })
            .unwrap();
        assert_eq!(choose(id(&sku), 3, &map, slot_of), Layout::unsalted(3));
    }

    #[test]
    fn more_shards_than_masters_spread_evenly() {
        let map = three_masters();
        for n in 0..50 {
            let sku = format!("many-{n}");
            for count in [2, 4, 6, 7, 16] {
                let layout = choose(id(&sku), count, &map, slot_of);
                let mut per_master = [0usize; 3];
                for m in masters_of(&map, &sku, &layout) {
                    per_master[m] += 1;
                }
                let (lo, hi) = (
                    per_master.iter().min().unwrap(),
                    per_master.iter().max().unwrap(),
                );
                assert!(hi - lo <= 1, "{sku} x{count}: {per_master:?}");
            }
        }
    }

    #[test]
    fn one_master_or_one_shard_needs_no_salt() {
        let one = SlotMap::from_ranges(&[(0, 16383, "a".into())]);
        assert_eq!(choose(id("s"), 3, &one, slot_of), Layout::unsalted(3));
        assert_eq!(
            choose(id("s"), 1, &three_masters(), slot_of),
            Layout::SINGLE
        );
    }

    #[test]
    fn a_master_of_few_slots_still_gets_its_share() {
        // Uneven ranges, listed out of order, one master serving two ranges, a slot unserved.
        let map = SlotMap::from_ranges(&[
            (100, 16383, "big".into()),
            (0, 9, "tiny".into()),
            (10, 49, "split".into()),
            (51, 99, "split".into()),
        ]);
        assert_eq!(map.masters(), ["tiny", "split", "big"]);
        assert_eq!(map.owner(50), None);
        let layout = choose(id("s"), 3, &map, slot_of);
        let placed: HashSet<usize> = masters_of(&map, "s", &layout).into_iter().collect();
        assert_eq!(placed.len(), 3);
    }

    #[test]
    fn a_cluster_slots_reply_is_read_as_ranges_of_masters() {
        let node = |host: &str, port: i64, id: &str| {
            Value::Array(vec![
                Value::BulkString(host.into()),
                Value::Int(port),
                Value::BulkString(id.into()),
            ])
        };
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(8191),
                node("10.0.0.1", 7000, "id-a"),
                node("10.0.0.4", 7003, "id-d"),
            ]),
            Value::Array(vec![
                Value::Int(8192),
                Value::Int(16383),
                Value::Array(vec![Value::BulkString("10.0.0.2".into()), Value::Int(7001)]),
            ]),
        ]);
        assert_eq!(
            parse_slots(&reply).unwrap(),
            vec![
                (0, 8191, "id-a".to_string()),
                (8192, 16383, "10.0.0.2:7001".to_string())
            ]
        );
        assert_eq!(parse_slots(&Value::Int(1)), None);
    }
}
