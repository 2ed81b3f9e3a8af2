//! Redis key names. Every key of a SKU carries the SKU's hash tag, `{<sku>}`, so all of a
//! SKU's keys live in one Cluster slot and one script may touch them together.
//!
//! What is named here is a *Redis SKU*: a catalog SKU of one shard, or one shard of a sharded
//! SKU ([`crate::shards`]). Shard 0 is the SKU's own name; shard i >= 1 is `<sku>#<i>`, or
//! `<sku>#<i>.<s>` when it carries a placement salt s != 0 ([`shard_name`],
//! [`crate::shards::placement`]), so its keys carry the tag `{<sku>#<i>}` (`{<sku>#<i>.<s>}`)
//! and live in a slot of their own. SKU ids match `^[A-Za-z0-9._-]{1,64}$`, so `#` never
//! occurs in one and [`split_shard`] always finds the catalog SKU back. Everything below works
//! on Redis names; only the writer (the rows' `sku` column), the accounting and the HTTP layer
//! turn them back into SKUs ([`ShardName::sku`], a [`SkuId`]).

use crate::sku::SkuId;

/// How long a compensation marker lives: longer than any reprocessor's lease and retry
/// schedule (the reprocessor sets it; a restore that finds a compensation decided sets it
/// again: src/restore/claims.rs).
pub const COMPENSATION_MARKER_TTL_SECS: u64 = 30 * 24 * 3600;

/// The Redis name of shard `shard` of `sku` with placement salt `salt`: the SKU itself for
/// shard 0, `<sku>#<shard>` for salt 0 (the name every shard had before salts, so existing
/// SKUs keep their keys), `<sku>#<shard>.<salt>` otherwise. Only a catalog row's
/// [`crate::layout::Layout`] knows a shard's salt: build names through it.
pub fn shard_name(sku: &SkuId, shard: u16, salt: u16) -> String {
    match (shard, salt) {
        (0, _) => sku.to_string(),
        (_, 0) => format!("{sku}#{shard}"),
        _ => format!("{sku}#{shard}.{salt}"),
    }
}

/// The field of one user's Idempotency-Key in [`SkuKeys::idempotency`]: the first 16 bytes of
/// SHA-256 over the length-prefixed user id and the key, so `("a:b", "c")` and `("a", "b:c")`
/// never share a field, a key of up to 255 characters costs 16 bytes, and a collision between
/// two buyers' keys needs 2^64 tries, not a guess.
pub fn idempotency_field(user: &str, key: &str) -> [u8; 16] {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(user.len().to_string());
    h.update(b":");
    h.update(user);
    h.update(b":");
    h.update(key);
    let d = h.finalize();
    let mut out = [0u8; 16];
    out.copy_from_slice(&d[..16]);
    out
}

/// The catalog SKU and the shard of a Redis name (the inverse of [`shard_name`], whatever the
/// salt). A name whose part after `#` is not a shard number (with or without a salt) is taken
/// as a SKU of its own.
pub fn split_shard(name: &str) -> (&str, u16) {
    let Some((sku, tail)) = name.rsplit_once('#') else {
        return (name, 0);
    };
    let shard = match tail.split_once('.') {
        Some((shard, salt)) if salt.parse::<u16>().is_ok() => shard,
        Some(_) => return (name, 0),
        None => tail,
    };
    match shard.parse() {
        Ok(shard) => (sku, shard),
        Err(_) => (name, 0),
    }
}

/// A Redis SKU's name, parsed once into what it names: the catalog SKU and the shard (see
/// [`shard_name`], [`split_shard`]). Work that reads a shard's keys and writes its catalog
/// SKU's rows (the writer, its freshness check) carries one of these, not a name to split again.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ShardName {
    name: String,
    /// The catalog SKU is `name[..sku_len]`.
    sku_len: usize,
    shard: u16,
}

impl ShardName {
    pub fn parse(name: &str) -> ShardName {
        let (sku, shard) = split_shard(name);
        ShardName {
            name: name.to_string(),
            sku_len: sku.len(),
            shard,
        }
    }

    /// The Redis name itself (whose keys hold the shard's state and journal).
    pub fn as_str(&self) -> &str {
        &self.name
    }

    /// The catalog SKU (the rows' `sku` column). Trusted: the name came from our own store,
    /// where only a checked SKU's shards are named.
    pub fn sku(&self) -> &SkuId {
        SkuId::trusted(&self.name[..self.sku_len])
    }

    /// The shard's number (0: the SKU itself).
    pub fn shard(&self) -> u16 {
        self.shard
    }
}

impl std::ops::Deref for ShardName {
    type Target = str;

    fn deref(&self) -> &str {
        &self.name
    }
}

impl std::fmt::Display for ShardName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

/// The consumer group of every SKU's journal (its writers): each entry is owned by one writer
/// at a time, and an entry leaves the journal once acknowledged in this group.
pub const JOURNAL_GROUP: &str = "writers";

/// Width of a call-records bucket.
const CLAIM_BUCKET_MS: u64 = 10 * 60 * 1000;

/// The call-records bucket of a claim or call id: the 10-minute slot of its UUIDv7 timestamp.
pub fn bucket_of(claim_id: &uuid::Uuid) -> u64 {
    let ms = claim_id.get_timestamp().map_or(0, |t| {
        let (secs, nanos) = t.to_unix();
        secs * 1000 + u64::from(nanos / 1_000_000)
    });
    ms / CLAIM_BUCKET_MS
}

/// The channel on which scripts that can raise a SKU's stock publish its state key (see
/// [`crate::soldout`]). Not a key: Redis Cluster broadcasts it to every node.
pub fn units_back_channel(prefix: &str) -> String {
    format!("{prefix}:units-back")
}

/// The SKUs with background work: a sorted set, member = SKU, score = unix ms of the last mark
/// (see [`crate::activity`]). One key with no SKU's hash tag: only plain single-key commands and
/// `retire_sku.lua` (this key alone) touch it, never a SKU's script, so it may live on any node.
pub fn active_skus(prefix: &str) -> String {
    format!("{prefix}:active")
}

/// The key names of one SKU under one gateway prefix.
#[derive(Debug, Clone)]
pub struct SkuKeys {
    /// `<prefix>:{<sku>}:`, the common head of every key of this SKU.
    head: String,
}

impl SkuKeys {
    /// The keys of the Redis SKU `name`: a catalog SKU's own name, or a shard's.
    pub fn new(prefix: &str, name: &str) -> Self {
        SkuKeys {
            head: format!("{prefix}:{{{name}}}:"),
        }
    }

    /// Hash of `stock`, `limit` and `inflight`; its absence means Redis lost the SKU.
    pub fn state(&self) -> String {
        format!("{}state", self.head)
    }

    /// The newest operator epoch that moved the SKU while its state was absent (a restock on a
    /// lost state: lua/restock.lua): a restore under an older epoch, which read an older total,
    /// must not rebuild the state (lua/restore_sku.lua).
    pub fn op_fence(&self) -> String {
        format!("{}op_fence", self.head)
    }

    /// The SKU of a state key `<prefix>:{<sku>}:state`, given `head` = `<prefix>:{`.
    pub fn sku_of_state<'a>(head: &str, key: &'a str) -> Option<&'a str> {
        key.strip_prefix(head)?.strip_suffix("}:state")
    }

    /// A seated SKU's seat map: one bit per seat, 1 = sold or held (docs/seats.md).
    pub fn seats(&self) -> String {
        format!("{}seats", self.head)
    }

    /// Hash of user id to units held.
    pub fn users(&self) -> String {
        format!("{}users", self.head)
    }

    /// Per-user counts staged by one restore, moved over `users` in one step (one key per
    /// restore, so two restores never stage into each other's counts).
    pub fn users_restore(&self, restore_id: &uuid::Uuid) -> String {
        format!("{}users:restore:{}", self.head, restore_id.simple())
    }

    /// Stream of winners not yet acknowledged by a writer.
    pub fn journal(&self) -> String {
        format!("{}journal", self.head)
    }

    /// The hash holding the record of the call that decided `claim_id` (or of the call
    /// `claim_id` itself; field = the call id, see [`crate::ids::call_of`]), read back when a
    /// call's outcome is uncertain. Records are grouped by the 10-minute bucket of the UUIDv7's
    /// timestamp (a call's claims share its timestamp): one field per call is far cheaper in
    /// Redis than one key with its own expiry, and the bucket's key expires as a whole.
    pub fn claim(&self, claim_id: &uuid::Uuid) -> String {
        self.claims_bucket(bucket_of(claim_id))
    }

    /// The call-records hash of one bucket (see [`bucket_of`]).
    pub fn claims_bucket(&self, bucket: u64) -> String {
        format!("{}claims:{}", self.head, bucket)
    }

    /// The SKU's idempotency records: one hash, field [`idempotency_field`] of (user, key) ->
    /// the record (`claim.lua`). Only winners are recorded, so the hash holds at most one
    /// field per unit sold; it lives as long as the SKU's per-user counts (API.md: "kept at
    /// least 24 hours"), which is why no field needs an expiry of its own. A key with its own
    /// expiry cost 339 bytes of Redis per keyed winner, a field of this hash 136
    /// (docs/performance.md, "Redis bytes per claimant").
    pub fn idempotency(&self) -> String {
        format!("{}idem", self.head)
    }

    /// Marker of one restock operation, so that it moves the stock at most once.
    pub fn restock_op(&self, op_id: &uuid::Uuid) -> String {
        format!("{}restock:{}", self.head, op_id.simple())
    }

    /// Holds: claim id to hold record (`lua/lib/lifecycle.lua`), kept until the writer has
    /// written the hold's final status.
    pub fn holds(&self) -> String {
        format!("{}holds", self.head)
    }

    /// Sorted set of the holds still `held`, by expires_ms: what the expiry worker reads.
    pub fn expiry(&self) -> String {
        format!("{}expiry", self.head)
    }

    /// Which gateway's expiry worker serves this SKU now (spares duplicate work only).
    pub fn expiry_lease(&self) -> String {
        format!("{}expiry:lease", self.head)
    }

    /// The waitlist's line: sorted set of waiting entry ids by join order.
    pub fn waitlist(&self) -> String {
        format!("{}wl", self.head)
    }

    /// Waitlist entries: entry id to entry record.
    pub fn waitlist_entries(&self) -> String {
        format!("{}wl:entries", self.head)
    }

    /// Waitlist members: user id to that user's current entry id.
    pub fn waitlist_users(&self) -> String {
        format!("{}wl:users", self.head)
    }

    /// The nine lifecycle keys, in the order every lifecycle script takes them as
    /// `KEYS[1..9]` (see `lua/lib/lifecycle.lua`). The seat map is one of them (unused by a
    /// SKU without seats) because ending a hold or offering a unit frees or takes seats.
    pub fn lifecycle(&self) -> [String; 9] {
        [
            self.state(),
            self.users(),
            self.journal(),
            self.holds(),
            self.expiry(),
            self.waitlist(),
            self.waitlist_entries(),
            self.waitlist_users(),
            self.seats(),
        ]
    }

    /// A donor shard's transfers not yet finished: transfer id to
    /// `units|recipient shard|generation|created_ms` (see `lua/transfer_out.lua`).
    pub fn transfers(&self) -> String {
        format!("{}xfer:out", self.head)
    }

    /// A recipient shard's record that the transfer `id` was applied here (so it adds its
    /// units once), kept for [`crate::scripts::shards::TRANSFER_RECORD_TTL_SECS`].
    pub fn transfer_in(&self, id: &uuid::Uuid) -> String {
        format!("{}xfer:in:{}", self.head, id.simple())
    }

    /// The lock of a sharded SKU's waitlist feed (on shard 0; holds the feeder's token), so
    /// one feed at a time, across gateways, decides which line's head comes next
    /// (`crate::shards::feed`).
    pub fn feed_lock(&self) -> String {
        format!("{}feed", self.head)
    }

    /// Marker that a claim's units were given back, so compensation happens once; it lives
    /// [`COMPENSATION_MARKER_TTL_SECS`].
    pub fn compensation(&self, claim_id: &uuid::Uuid) -> String {
        format!("{}comp:{}", self.head, claim_id.simple())
    }

    /// The waiting room's keys in the order its scripts take them as `KEYS[1..11]` (see
    /// `lua/lib/queue.lua`): its hash, the line, the admitted set, then the SKU's state,
    /// waitlist, expiry set and per-user counts, the admissions' fixed expiries, the
    /// admissions not known to be used, each ticket's visitor, and the line's log.
    pub fn queue(&self) -> [String; 11] {
        [
            format!("{}q", self.head),
            format!("{}q:line", self.head),
            format!("{}q:admitted", self.head),
            self.state(),
            self.waitlist(),
            self.expiry(),
            self.users(),
            format!("{}q:exp", self.head),
            format!("{}q:live", self.head),
            format!("{}q:who", self.head),
            format!("{}q:log", self.head),
        ]
    }

    /// One visitor's join counter in the waiting room (its ticket, hex): the join rate is per
    /// visitor, never per address.
    pub fn queue_joins(&self, ticket: &uuid::Uuid) -> String {
        format!("{}q:j:{}", self.head, ticket.simple())
    }
}

#[cfg(test)]
mod tests;
