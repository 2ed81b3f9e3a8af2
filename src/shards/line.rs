//! The waitlist of a sharded SKU: one FIFO line, on shard 0 (the SKU's own keys), whatever
//! shard a joiner's claims route to.
//!
//! Every waitlist script (join, leave, and the offers `give_back` makes) runs on shard 0, so
//! the line and its offers are decided atomically there as on a SKU of one shard. What no
//! single-slot script can see is the other shards, and two steps here bridge that:
//!
//! - [`before_join`]: "the stock is 0" means every shard dry and nothing in transit. The
//!   gateway finishes the transfers it finds pending, then checks shards i >= 1 (not
//!   atomically with the join); `join_waitlist.lua` then checks shard 0's stock atomically.
//!   It also reads the units the joiner holds on its own shard, which the join's per-user
//!   limit check adds to shard 0's count.
//! - [`feed`]: units that come back on shard i >= 1 (a hold cancelled or expired there, a
//!   compensation) go to shard i's open stock, where no line is. While shard 0's line has
//!   waiting entries, the recovery task (every second, [`super::recovery`]) and a buyer's
//!   cancel on shard i move every unit of open stock of shards i >= 1 to shard 0 by a normal
//!   fenced transfer; `transfer_in.lua` gives them back through `give_back`, so the line is
//!   offered them before open stock gets any. Until then (about a second at most) a buyer
//!   routed to shard i may take such a unit: see README "Sharding a hot SKU" for why that
//!   window is accepted.

use super::transfer;
use super::view::survey;
use crate::error::StoreError;
use crate::keys::shard_name;
use crate::store::Store;

/// What the gateway found on the other shards before a join on a sharded SKU, passed to
/// `join_waitlist.lua` on shard 0 (which still answers an existing entry first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BeforeJoin {
    /// Some shard i >= 1 holds stock, or a transfer between shards is still in flight.
    pub in_stock: bool,
    /// The units the joiner holds on its own shard (0 when that is shard 0: the script counts
    /// those itself).
    pub held_elsewhere: i64,
}

/// Checks the shards i >= 1 of `sku` before `user` joins its line on shard 0.
///
/// # Errors
/// [`StoreError::SkuLost`] / [`StoreError::Stale`] when any shard fails closed (the SKU cannot
/// be said sold out), or a Redis error.
pub async fn before_join(
    store: &Store,
    sku: &str,
    shards: i32,
    user: &str,
) -> Result<BeforeJoin, StoreError> {
    let mut states = survey(store, sku, shards).await?;
    if states.iter().any(|s| !s.pending.is_empty()) {
        // Units in transit land on some shard (on shard 0 they are offered to the line):
        // finish them, as a refill would, then look again.
        for p in states.iter().flat_map(|s| &s.pending) {
            transfer::complete(store, sku, p).await?;
        }
        states = survey(store, sku, shards).await?;
    }
    // Pending once more: another gateway began a transfer meanwhile. Its units are on their
    // way to a shard, so the SKU is not sold out; the buyer's claim borrows them.
    let in_stock = states
        .iter()
        .enumerate()
        .any(|(i, s)| !s.pending.is_empty() || (i > 0 && s.stock > 0));
    let home = super::shard_of_user(user, shards);
    if home == 0 {
        return Ok(BeforeJoin {
            in_stock,
            held_elsewhere: 0,
        });
    }
    let keys = store.keys(&shard_name(sku, home));
    let mut con = store.hot();
    let held: Option<i64> = store
        .bounded(async {
            Ok(redis::cmd("HGET")
                .arg(keys.users())
                .arg(user)
                .query_async(&mut con)
                .await?)
        })
        .await?;
    Ok(BeforeJoin {
        in_stock,
        held_elsewhere: held.unwrap_or(0),
    })
}

/// While shard 0's line has waiting entries, moves every unit of open stock of the shards
/// i >= 1 of `sku` to shard 0, where `transfer_in.lua` offers it to the line first. Returns
/// the units moved. Costs one `ZCARD` while nobody waits.
///
/// # Errors
/// [`StoreError::SkuLost`] / [`StoreError::Stale`] when a shard fails closed, or a Redis error
/// (a transfer left half done is finished by the recovery task).
pub async fn feed(store: &Store, sku: &str, shards: i32) -> Result<i64, StoreError> {
    if shards <= 1 {
        return Ok(0);
    }
    let line = store.keys(sku).waitlist();
    let mut con = store.hot();
    let waiting: i64 = store
        .bounded(async { Ok(redis::cmd("ZCARD").arg(&line).query_async(&mut con).await?) })
        .await?;
    if waiting == 0 {
        return Ok(0);
    }
    let states = survey(store, sku, shards).await?;
    let mut moved = 0;
    for (i, s) in states.iter().enumerate().skip(1) {
        if s.stock > 0 {
            // All of it (need = cap = what was read; the donor gives less if it sold some
            // meanwhile): the line takes what it waits for, the rest is open stock on shard 0.
            moved += transfer::transfer(store, sku, i as u16, 0, s.stock, s.stock).await?;
        }
    }
    Ok(moved)
}
