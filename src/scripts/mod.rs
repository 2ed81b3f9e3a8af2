//! The Lua scripts, loaded once at start, and the typed wrappers that call them.
//!
//! Callers never see KEYS/ARGV order: each wrapper takes the SKU's [`crate::keys::SkuKeys`]
//! and typed arguments and returns a typed answer. `Script::invoke_async` sends EVALSHA and
//! reloads the script on NOSCRIPT, so a Redis that restarted empty keeps working. The wrappers,
//! by whom they serve:
//!
//! - [`claim`]: a call's claims (`claim.lua`), and reading back a call that got no answer
//!   (`resolve_claim.lua`);
//! - [`lifecycle`]: holds, the expiry, the waitlist, parked claims' compensation
//!   (`decide_hold.lua`, `expire_holds.lua`, `join_waitlist.lua`, `leave_waitlist.lua`,
//!   `compensate.lua`);
//! - [`shards`]: transfers between shards, the lines' lease, the pools' feed, the feed's lock
//!   (`transfer_out.lua`, `transfer_in.lua`, `finish_transfer.lua`, `line_lease.lua`,
//!   `offer_pool.lua`, `release_pool.lua`, `unlock.lua`);
//! - [`operator`]: declare, restock, close and rebuild a SKU (`declare_sku.lua`, `restock.lua`,
//!   `close_sku.lua`, `restore_sku.lua`);
//! - [`fresh`]: mark a state stale, advance its incarnation (`mark_stale.lua`, `rotate.lua`);
//! - [`journal`]: acknowledge written entries, read the entries before one, forget gone
//!   writers (`ack_journal.lua`, `pending_before.lua`, `reap_consumers.lua`);
//! - [`books`]: the SKU view's Redis side (`read_books.lua`);
//! - [`activity`]: retire an idle SKU from the active set (`retire_sku.lua`);
//! - [`seats`]: a seated SKU's claim of exact seats or best available (`claim_seats.lua`);
//! - the waiting room's, in `crate::queue::calls` (`queue_config.lua`, `join_queue.lua`,
//!   `read_ticket.lua`, `admit_queue.lua`).

use std::sync::LazyLock;

use redis::aio::ConnectionLike;
use redis::Script;

use crate::error::StoreError;

pub mod activity;
pub mod books;
pub mod claim;
pub mod fresh;
pub mod journal;
pub mod lifecycle;
pub mod operator;
pub mod seats;
pub mod shards;

// The names every caller of a decision uses, as the registry's (and the tests') paths.
pub use claim::{
    claim, claim_at, claim_invocation, claim_invocation_at, parse_claim_reply, read_back,
    resolve_claims, ClaimInput, Decision, ReadBack,
};
pub use fresh::mark_stale;
pub use operator::{
    close_sku, declare_shard, declare_sku, restock, restock_at, Declared, RestockMode, Restocked,
    Terms,
};

/// The script registry; the SHA1 of each is computed once.
pub struct Scripts {
    pub claim: Script,
    pub resolve_claim: Script,
    pub declare_sku: Script,
    pub restock: Script,
    pub ack_journal: Script,
    pub compensate: Script,
    pub restore_sku: Script,
    pub mark_stale: Script,
    pub close_sku: Script,
    pub decide_hold: Script,
    pub expire_holds: Script,
    pub join_waitlist: Script,
    pub leave_waitlist: Script,
    /// A sharded SKU's transfers between shards (src/shards/transfer.rs): take, apply, forget.
    pub transfer_out: Script,
    pub transfer_in: Script,
    pub finish_transfer: Script,
    /// A sharded SKU's lines (src/shards/line.rs): the lease a join sets on every shard, and
    /// the feed's offers from a shard's pool and its release once nobody waits.
    pub line_lease: Script,
    pub offer_pool: Script,
    pub release_pool: Script,
    /// Releases a lock held under a token (the feed's: src/shards/feed.rs).
    pub unlock: Script,
    /// The journal's unacknowledged entries before one entry (src/writer/order.rs).
    pub pending_before: Script,
    /// Advances a fresh state's incarnation (src/freshness.rs).
    pub rotate: Script,
    /// The Redis side of the SKU view, in one read (src/books.rs).
    pub read_books: Script,
    /// The waiting room (src/queue/; wrappers in src/queue/calls.rs): its settings, a join,
    /// a ticket's reading, a round of admissions.
    pub queue_config: Script,
    pub join_queue: Script,
    pub read_ticket: Script,
    pub admit_queue: Script,
    /// A seated SKU's claim of exact seats or best available (src/scripts/seats.rs).
    pub claim_seats: Script,
    pub seat_rows: Script,
}

/// A script that ends holds or gives units back, with `lua/lib/fresh.lua`,
/// `lua/lib/seats.lua` (a waitlist offer on a seated SKU searches the best seats) and
/// `lua/lib/lifecycle.lua` (functions only) prepended: one atomic script, its shared parts
/// written once.
macro_rules! lifecycle_script {
    ($file:literal) => {
        Script::new(concat!(
            include_str!("../../lua/lib/fresh.lua"),
            include_str!("../../lua/lib/seats.lua"),
            include_str!("../../lua/lib/lifecycle.lua"),
            include_str!(concat!("../../lua/", $file))
        ))
    };
}

/// A script that changes a SKU's state, with `lua/lib/fresh.lua` (the check against the
/// ledger's mark, functions only) prepended.
macro_rules! fresh_script {
    ($file:literal) => {
        Script::new(concat!(
            include_str!("../../lua/lib/fresh.lua"),
            include_str!(concat!("../../lua/", $file))
        ))
    };
}

/// A waiting-room script, with `lua/lib/fresh.lua` and `lua/lib/queue.lua` (functions only)
/// prepended: the line lives beside the state, so an older state's line never moves.
macro_rules! queue_script {
    ($file:literal) => {
        Script::new(concat!(
            include_str!("../../lua/lib/fresh.lua"),
            include_str!("../../lua/lib/queue.lua"),
            include_str!(concat!("../../lua/", $file))
        ))
    };
}

pub static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    claim: fresh_script!("claim.lua"),
    resolve_claim: Script::new(include_str!("../../lua/resolve_claim.lua")),
    declare_sku: Script::new(include_str!("../../lua/declare_sku.lua")),
    restock: lifecycle_script!("restock.lua"),
    ack_journal: Script::new(include_str!("../../lua/ack_journal.lua")),
    compensate: lifecycle_script!("compensate.lua"),
    restore_sku: Script::new(include_str!("../../lua/restore_sku.lua")),
    mark_stale: Script::new(include_str!("../../lua/mark_stale.lua")),
    close_sku: Script::new(include_str!("../../lua/close_sku.lua")),
    decide_hold: lifecycle_script!("decide_hold.lua"),
    expire_holds: lifecycle_script!("expire_holds.lua"),
    join_waitlist: lifecycle_script!("join_waitlist.lua"),
    leave_waitlist: lifecycle_script!("leave_waitlist.lua"),
    transfer_out: fresh_script!("transfer_out.lua"),
    // Step 2 gives its units back through `give_back`, so that the recipient shard's line is
    // offered them before open stock is.
    transfer_in: lifecycle_script!("transfer_in.lua"),
    finish_transfer: Script::new(include_str!("../../lua/finish_transfer.lua")),
    line_lease: fresh_script!("line_lease.lua"),
    offer_pool: lifecycle_script!("offer_pool.lua"),
    release_pool: lifecycle_script!("release_pool.lua"),
    unlock: Script::new(include_str!("../../lua/unlock.lua")),
    pending_before: Script::new(include_str!("../../lua/pending_before.lua")),
    rotate: fresh_script!("rotate.lua"),
    read_books: Script::new(include_str!("../../lua/read_books.lua")),
    queue_config: Script::new(include_str!("../../lua/queue_config.lua")),
    join_queue: queue_script!("join_queue.lua"),
    read_ticket: queue_script!("read_ticket.lua"),
    admit_queue: queue_script!("admit_queue.lua"),
    claim_seats: Script::new(concat!(
        include_str!("../../lua/lib/fresh.lua"),
        include_str!("../../lua/lib/seats.lua"),
        include_str!("../../lua/claim_seats.lua")
    )),
    seat_rows: Script::new(include_str!("../../lua/seat_rows.lua")),
});

/// Loads every script into Redis (SCRIPT LOAD), so the first claim does not pay for it.
///
/// # Errors
/// The Redis error of the first script that failed to load.
pub async fn load_all<C: ConnectionLike>(con: &mut C) -> Result<(), StoreError> {
    let s = &*SCRIPTS;
    for script in [
        &s.claim,
        &s.resolve_claim,
        &s.declare_sku,
        &s.restock,
        &s.ack_journal,
        &s.compensate,
        &s.restore_sku,
        &s.mark_stale,
        &s.close_sku,
        &s.decide_hold,
        &s.expire_holds,
        &s.join_waitlist,
        &s.leave_waitlist,
        &s.transfer_out,
        &s.transfer_in,
        &s.finish_transfer,
        &s.line_lease,
        &s.offer_pool,
        &s.release_pool,
        &s.unlock,
        &s.pending_before,
        &s.rotate,
        &s.read_books,
        &s.queue_config,
        &s.join_queue,
        &s.read_ticket,
        &s.admit_queue,
        &s.claim_seats,
        &s.seat_rows,
    ] {
        script.prepare_invoke().load_async(con).await?;
    }
    Ok(())
}

/// What a state must not be older than (`lua/lib/fresh.lua`): the ledger's high-water mark of
/// its sequence and the latest incarnation PostgreSQL recorded for it, as this gateway knows
/// them. Sent as `"seq:inc"`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Floor {
    pub seq: i64,
    pub inc: i64,
}

impl Floor {
    /// A floor of a sequence alone (incarnation 0: nothing recorded).
    pub fn seq(seq: i64) -> Floor {
        Floor { seq, inc: 0 }
    }

    /// Whether a state with this `seq` and `inc` is older than the floor: `behind_floor` of
    /// `lua/lib/fresh.lua`, for a reader that is not a script (a field absent reads 0).
    pub fn is_above(&self, seq: Option<i64>, inc: Option<i64>) -> bool {
        inc.unwrap_or(0) < self.inc || seq.unwrap_or(0) < self.seq
    }
}

impl redis::ToRedisArgs for Floor {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        out.write_arg(format!("{}:{}", self.seq, self.inc).as_bytes());
    }
}
