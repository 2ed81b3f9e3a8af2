//! A SKU's layout: how many shards it has and the placement salt of each, as its catalog row
//! holds them (`skus.shards`, `skus.shard_salts`). Every Redis name of a shard is built from a
//! layout, so every gateway names a shard alike: from the stored row, never from what it
//! sees of the cluster (the salts were chosen once, at the first declare:
//! [`crate::shards::placement`]).

use sqlx::postgres::PgRow;
use sqlx::Row;
use xxhash_rust::xxh3::xxh3_64;

use crate::keys::shard_name;
use crate::sku::SkuId;

/// Most shards a SKU may have.
pub const MAX_SHARDS: i32 = 16;
/// Bits of a shard's own sequence space: 2^36 state changes per shard, and the highest
/// sequence (16 << 36, about 1.1e12) stays far below 10^14, past which Lua would print a
/// number in exponent form.
const SEQ_SHIFT: u32 = 36;

/// The shard a buyer's claims go to: xxh3 of the user id, modulo the shard count. xxh3's
/// output is specified, so every gateway of every version and platform routes a user alike.
pub fn shard_of_user(user: &str, shards: i32) -> u16 {
    if shards <= 1 {
        return 0;
    }
    (xxh3_64(user.as_bytes()) % shards as u64) as u16
}

/// The first state sequence of shard `shard`.
pub fn seq_base(shard: u16) -> i64 {
    i64::from(shard) << SEQ_SHIFT
}

/// A declared total split over the shards: evenly, the remainder to the lowest shards.
pub fn split_total(total: i64, shards: i32) -> Vec<i64> {
    let n = i64::from(shards.max(1));
    (0..n)
        .map(|i| total / n + i64::from(i < total % n))
        .collect()
}

/// Shards a layout can name.
const MAX: usize = MAX_SHARDS as usize;

/// How many shards a SKU has and the salt of each (see [`crate::keys::shard_name`]). Small and
/// `Copy`: it rides along with the SKU id wherever a shard is named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Shards, 1..=16.
    count: u8,
    /// The placement salt of each shard; shard 0's, and those past `count`, are 0.
    salts: [u16; MAX],
}

impl Layout {
    /// A SKU of one shard: its own name, as every SKU was before sharding.
    pub const SINGLE: Layout = Layout {
        count: 1,
        salts: [0; MAX],
    };

    /// `count` shards with no salt (the names `sku`, `sku#1`, ...): every sharded SKU on a
    /// single Redis, and those declared before placement.
    pub fn unsalted(count: i32) -> Layout {
        Layout::salted(count, &[])
    }

    /// `count` shards (clamped to 1..=16), shard i carrying `salts[i]` (0 where `salts` is
    /// shorter). Shard 0 never carries one: it is the SKU itself.
    pub fn salted(count: i32, salts: &[u16]) -> Layout {
        let count = count.clamp(1, MAX_SHARDS) as u8;
        let mut layout = Layout {
            count,
            salts: [0; MAX],
        };
        for (i, s) in salts.iter().enumerate().take(usize::from(count)).skip(1) {
            layout.salts[i] = *s;
        }
        layout
    }

    /// As a catalog row stores it: an empty (or short) `shard_salts` means salt 0 for the
    /// shards it does not reach. The table's check keeps each salt in `0..=65535`.
    pub fn stored(shards: i32, salts: &[i32]) -> Layout {
        let salts: Vec<u16> = salts
            .iter()
            .map(|s| u16::try_from(*s).unwrap_or(0))
            .collect();
        Layout::salted(shards, &salts)
    }

    /// The `shard_salts` column for this layout: empty when no shard carries a salt.
    pub fn stored_salts(&self) -> Vec<i32> {
        if self.salts.iter().all(|s| *s == 0) {
            return Vec::new();
        }
        self.salts[..usize::from(self.count)]
            .iter()
            .map(|s| i32::from(*s))
            .collect()
    }

    /// The number of shards (1 for a SKU that is not sharded).
    pub fn count(&self) -> i32 {
        i32::from(self.count)
    }

    /// Whether the SKU has more than one shard.
    pub fn is_sharded(&self) -> bool {
        self.count > 1
    }

    /// The placement salt of shard `shard` (0 for a shard past the count).
    pub fn salt(&self, shard: u16) -> u16 {
        self.salts.get(usize::from(shard)).copied().unwrap_or(0)
    }

    /// The Redis name of shard `shard` of `sku`.
    pub fn name(&self, sku: &SkuId, shard: u16) -> String {
        shard_name(sku, shard, self.salt(shard))
    }

    /// The Redis names of every shard of `sku`, shard 0 first.
    pub fn names(&self, sku: &SkuId) -> Vec<String> {
        (0..u16::from(self.count))
            .map(|i| self.name(sku, i))
            .collect()
    }

    /// The shard that serves `user` ([`shard_of_user`]).
    pub fn shard_of_user(&self, user: &str) -> u16 {
        shard_of_user(user, self.count())
    }

    /// The Redis name of the shard that serves `user` on `sku`.
    pub fn name_for_user(&self, sku: &SkuId, user: &str) -> String {
        self.name(sku, self.shard_of_user(user))
    }
}

/// Read from the columns `shards` and `shard_salts` of a row of `skus`.
impl<'r> sqlx::FromRow<'r, PgRow> for Layout {
    fn from_row(row: &'r PgRow) -> Result<Self, sqlx::Error> {
        let shards: i32 = row.try_get("shards")?;
        let salts: Vec<i32> = row.try_get("shard_salts")?;
        Ok(Layout::stored(shards, &salts))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s() -> &'static SkuId {
        SkuId::parse("s").expect("a valid SKU id")
    }

    #[test]
    fn a_layout_without_salts_keeps_the_names_shards_always_had() {
        assert_eq!(Layout::SINGLE.names(s()), vec!["s"]);
        assert_eq!(Layout::unsalted(3).names(s()), vec!["s", "s#1", "s#2"]);
        assert_eq!(Layout::stored(3, &[]), Layout::unsalted(3));
        assert_eq!(Layout::stored(3, &[0, 0, 0]), Layout::unsalted(3));
        assert!(Layout::unsalted(3).stored_salts().is_empty());
        assert!(!Layout::SINGLE.is_sharded());
    }

    #[test]
    fn salts_name_their_shards_and_are_stored_as_read_back() {
        let l = Layout::salted(4, &[9, 0, 17, 3]);
        // Shard 0 is the SKU itself: a salt given for it is dropped.
        assert_eq!(l.names(s()), vec!["s", "s#1", "s#2.17", "s#3.3"]);
        assert_eq!(l.stored_salts(), vec![0, 0, 17, 3]);
        assert_eq!(Layout::stored(4, &l.stored_salts()), l);
        // A short column means salt 0 for the rest; salts past the count are ignored.
        assert_eq!(
            Layout::stored(3, &[0, 5]).names(s()),
            vec!["s", "s#1.5", "s#2"]
        );
        assert_eq!(Layout::salted(2, &[0, 1, 2]).names(s()), vec!["s", "s#1.1"]);
        let user = "u-1";
        assert_eq!(
            l.name_for_user(s(), user),
            l.name(s(), l.shard_of_user(user))
        );
    }

    #[test]
    fn a_total_is_split_evenly_with_the_remainder_to_the_lowest_shards() {
        assert_eq!(split_total(10, 3), vec![4, 3, 3]);
        assert_eq!(split_total(2, 3), vec![1, 1, 0]);
        assert_eq!(split_total(7, 1), vec![7]);
        assert_eq!(split_total(0, 4), vec![0, 0, 0, 0]);
    }

    #[test]
    fn routing_is_stable_and_spreads_users_over_every_shard() {
        assert_eq!(shard_of_user("u-1", 1), 0);
        let first: Vec<u16> = (0..8)
            .map(|i| shard_of_user(&format!("u-{i}"), 3))
            .collect();
        let again: Vec<u16> = (0..8)
            .map(|i| shard_of_user(&format!("u-{i}"), 3))
            .collect();
        assert_eq!(first, again);
        // Pinned: xxh3 is specified, so these never change across versions and platforms; a
        // change here would move every buyer's count to another shard mid-drop.
        assert_eq!(xxh3_64(b"u-1"), 0xea72_db3c_4998_47f0);
        assert_eq!(first, vec![1, 2, 2, 1, 1, 1, 2, 0]);
        let mut seen = [0usize; 3];
        for i in 0..3000 {
            seen[usize::from(shard_of_user(&format!("user-{i}"), 3))] += 1;
        }
        assert!(seen.iter().all(|&n| (800..1200).contains(&n)), "{seen:?}");
    }

    #[test]
    fn shard_sequences_never_meet() {
        assert_eq!(seq_base(0), 0);
        assert!(seq_base(15) + (1 << SEQ_SHIFT) < 100_000_000_000_000);
    }
}
