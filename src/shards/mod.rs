//! One hot SKU spread over several Redis shards, so its claims are decided by more than one
//! Redis core (on a Cluster, by more than one master).
//!
//! A SKU declared with `shards: n` (1..=16) is, inside Redis, n *Redis SKUs*: shard 0 keeps the
//! SKU's own name and keys, shard i >= 1 is named `<sku>#<i>`, or `<sku>#<i>.<salt>`
//! ([`crate::keys::shard_name`]), and so has its own hash tag and slot. On a Cluster the salts
//! put the shards on different masters ([`placement`]); they are chosen at the first declare
//! and kept in the catalog row, and every name is built from that row's [`Layout`]. Each shard is a whole SKU to the Redis-side machinery
//! (state, per-user counts, journal, call records, idempotency records, activity marks, the
//! writer, freshness): none of it knows shards exist. What does:
//!
//! - routing ([`shard_of_user`]): a buyer always goes to one shard, chosen by a stable hash of
//!   the user id, so the per-user count lives in one shard and the per-user limit holds with
//!   no cross-slot call; the claim lanes then coalesce per shard;
//! - borrowing ([`borrow`]): a shard that answers sold out takes units from a sibling through a
//!   two-step transfer ([`transfer`]), and the claim is decided once more; `sold_out` is
//!   answered only when every shard is dry and no transfer is in flight;
//! - the recovery task ([`recovery`]): finishes transfers a gateway began and did not finish,
//!   and feeds the waitlists;
//! - the waitlist ([`line`]): one line per shard, joined by the buyers routed there (so an
//!   offer counts where the buyer's other claims do), ordered by tickets from shard 0 so the
//!   SKU keeps one join order; a join first leases every shard and checks that the other
//!   shards are dry; units given back under the lease wait in the shard's pool, and the feed
//!   offers them across the lines in ticket order;
//! - the writer names a row's SKU from the shard's name (`keys::ShardName::sku`), the SKU view
//!   sums the shards ([`view`]), restock moves shard 0, restore rebuilds every shard.
//!
//! Each shard's state sequence starts at `shard << 36` ([`seq_base`]): the sequences of two
//! shards never meet, so the ledger's per-SKU checks on `issuances.seq` stay as they are, and
//! each shard's high-water mark is kept apart (`skus.redis_seq` for shard 0,
//! `sku_shard_marks` for the others).

pub mod borrow;
pub mod feed;
pub mod line;
pub mod placement;
pub mod recovery;
pub mod transfer;
pub mod view;

// The layout and the routing are the core's (src/layout.rs): named here too, as the shards'
// face.
pub use crate::layout::{seq_base, shard_of_user, split_total, Layout, MAX_SHARDS};

use crate::sku::SkuId;

/// The layout of `sku` in the catalog: its shard count and placement salts (one shard for a
/// SKU it does not hold).
///
/// # Errors
/// The database error.
pub async fn layout(db: &sqlx::PgPool, sku: &SkuId) -> Result<Layout, crate::error::DbError> {
    let row: Option<Layout> = sqlx::query_as("SELECT shards, shard_salts FROM skus WHERE sku = $1")
        .bind(sku)
        .fetch_optional(db)
        .await?;
    Ok(row.unwrap_or(Layout::SINGLE))
}
