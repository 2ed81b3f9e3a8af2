//! The waitlists of a sharded SKU: one line per shard, one join order across them.
//!
//! A buyer joins the line of its own shard (the shard its claims route to,
//! [`super::shard_of_user`]), and its offer is made on that shard, so the offer is a held claim
//! counted in the same per-user count as every other claim of the buyer: one script sees all
//! of a buyer's units, and the per-user limit holds (I3) as on a SKU of one shard.
//!
//! What no single-slot script can see is the other shards; three things bridge that, so the
//! SKU keeps one first-come-first-served line as a SKU of one shard does:
//!
//! - **Tickets.** Every join takes a ticket from shard 0 (`line_lease.lua`) and is ordered by
//!   it in its shard's line, so the heads of two lines compare exactly ([`position`] is the
//!   entry's place in the SKU's whole line).
//! - **The lease.** Before a buyer checks that every shard is dry ([`before_join`]), it sets
//!   a line lease on every shard. While a shard's lease lasts, a unit given back there (a
//!   hold cancelled or expired, an offer declined, a compensation, a restock, a transfer)
//!   goes to the shard's pool, not to open stock and not to its own line's head
//!   (`give_back`, lua/lib/lifecycle.lua): nobody outside the lines can take it, and no
//!   line is served before an earlier ticket on another shard.
//! - **The feed** ([`super::feed`]: the recovery task every second, and a buyer's cancel at once)
//!   offers pooled units in ticket order across every line: it merges the lines' heads,
//!   moves pooled units to the shards whose heads come next (fenced transfers,
//!   [`Source::Pool`]) and offers them there (`offer_pool.lua`). It renews the lease while
//!   anybody waits, and takes into the pools any open stock it finds then (units that came
//!   back without a lease: after a restore rebuilt a shard, or a lease that lapsed while no
//!   gateway fed); once nobody waits and the lease has lapsed, it gives the pools back to
//!   open stock (`release_pool.lua`).
//!
//! The price: a unit given back while anybody waits is offered at the next feed (within a
//! second), not in the same script; one given back within [`LEASE`] after the last waiter
//! went reaches open stock up to that much later. A SKU of one shard never takes a lease
//! and works as before.

use std::time::Duration;

use super::transfer;
use super::view::survey;
use crate::error::StoreError;
use crate::layout::Layout;
use crate::scripts::{self, shards::LineLease};
use crate::sku::SkuId;
use crate::store::Store;

/// How long a line lease lasts after the join or feed that set it. Longer than a join takes
/// from its lease to its entry (three bounded calls), and than a few feed rounds, so a
/// gateway's missed round does not open the pools while somebody waits.
pub const LEASE: Duration = Duration::from_secs(3);

/// What [`before_join`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JoinCheck {
    /// Units remain elsewhere: another shard holds stock, or a transfer between shards is
    /// still in flight (passed to `join_waitlist.lua`, which still answers an existing entry
    /// first).
    pub in_stock_elsewhere: bool,
    /// The join's ticket: its order in the SKU's one line.
    pub ticket: i64,
}

/// Leases every shard of `sku` and takes a ticket, then checks the shards other than `home`
/// (the joiner's) before a join on `home`'s line (not atomically with the join; the lease
/// keeps units given back after this check out of open stock, and `join_waitlist.lua` checks
/// `home`'s stock atomically).
///
/// # Errors
/// [`StoreError::SkuLost`] / [`StoreError::Stale`] when any shard fails closed (the SKU cannot
/// be said sold out), or a Redis error.
pub async fn before_join(
    store: &Store,
    sku: &SkuId,
    layout: Layout,
    home: u16,
) -> Result<JoinCheck, StoreError> {
    let leased = lease_all(store, sku, layout, true).await?;
    let ticket = leased[0].ticket;
    let pending = leased.iter().any(|l| l.pending > 0);
    let in_stock_elsewhere = if pending {
        // Units in transit land on some shard (under the lease, in its pool): finish them,
        // as a refill would, then look again.
        for p in survey(store, sku, layout)
            .await?
            .iter()
            .flat_map(|s| &s.pending)
        {
            transfer::complete(store, sku, layout, p).await?;
        }
        // Pending once more: another gateway began a transfer meanwhile. Its units are on
        // their way to a shard, so the SKU is not sold out; the buyer's claim borrows them.
        survey(store, sku, layout)
            .await?
            .iter()
            .enumerate()
            .any(|(i, s)| !s.pending.is_empty() || (i != usize::from(home) && s.stock > 0))
    } else {
        leased
            .iter()
            .enumerate()
            .any(|(i, l)| i != usize::from(home) && l.stock > 0)
    };
    Ok(JoinCheck {
        in_stock_elsewhere,
        ticket,
    })
}

/// Sets the line lease on every shard of `sku` (all in flight together); with `ticket`, also
/// takes a join ticket from shard 0.
pub(super) async fn lease_all(
    store: &Store,
    sku: &SkuId,
    layout: Layout,
    ticket: bool,
) -> Result<Vec<LineLease>, StoreError> {
    let calls = (0..layout.count() as u16).map(|i| async move {
        let name = layout.name(sku, i);
        let keys = store.keys(&name);
        let floor = store.floor(&name);
        let mut con = store.hot();
        store
            .bounded(scripts::shards::line_lease(
                &mut con,
                &keys,
                LEASE.as_millis() as u64,
                ticket && i == 0,
                floor,
            ))
            .await
    });
    futures_util::future::try_join_all(calls).await
}

/// The place in the SKU's one line (1: next to be offered) of the waiting entry `entry_id` in
/// `home`'s line: the entries of every line with an earlier ticket, plus one. `None` when
/// the entry is not waiting there.
///
/// # Errors
/// A Redis error.
pub async fn position(
    store: &Store,
    sku: &SkuId,
    layout: Layout,
    home: u16,
    entry_id: &str,
) -> Result<Option<i64>, StoreError> {
    let keys = store.keys(&layout.name(sku, home));
    let mut con = store.hot();
    let ticket: Option<f64> = store
        .bounded(async {
            Ok(redis::cmd("ZSCORE")
                .arg(keys.waitlist())
                .arg(entry_id)
                .query_async(&mut con)
                .await?)
        })
        .await?;
    let Some(ticket) = ticket else {
        return Ok(None);
    };
    let counts = (0..layout.count() as u16).map(|i| async move {
        let line = store.keys(&layout.name(sku, i)).waitlist();
        let mut con = store.hot();
        store
            .bounded(async {
                Ok(redis::cmd("ZCOUNT")
                    .arg(line)
                    .arg("-inf")
                    .arg(format!("({ticket}"))
                    .query_async::<i64>(&mut con)
                    .await?)
            })
            .await
    });
    let ahead: i64 = futures_util::future::try_join_all(counts)
        .await?
        .into_iter()
        .sum();
    Ok(Some(ahead + 1))
}
