//! The Lua scripts, loaded once at start, and the typed wrappers that call them.
//!
//! Callers never see KEYS/ARGV order: each wrapper takes the SKU's [`SkuKeys`] and typed
//! arguments and returns a typed answer. `Script::invoke_async` sends EVALSHA and reloads the
//! script on NOSCRIPT, so a Redis that restarted empty keeps working.

use std::sync::LazyLock;

use redis::aio::ConnectionLike;
use redis::{Script, Value};
use uuid::Uuid;

use crate::config::{CLAIM_RECORD_TTL_SECS, RECORD_TTL_SECS};
use crate::error::StoreError;
use crate::freshness::Floor;
use crate::keys::SkuKeys;
use crate::record::ClaimRecord;

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
}

/// A script that ends holds or gives units back, with `lua/lib/fresh.lua` and
/// `lua/lib/lifecycle.lua` (functions only) prepended: one atomic script, its shared parts
/// written once.
macro_rules! lifecycle_script {
    ($file:literal) => {
        Script::new(concat!(
            include_str!("../lua/lib/fresh.lua"),
            include_str!("../lua/lib/lifecycle.lua"),
            include_str!(concat!("../lua/", $file))
        ))
    };
}

/// A script that changes a SKU's state, with `lua/lib/fresh.lua` (the check against the
/// ledger's mark, functions only) prepended.
macro_rules! fresh_script {
    ($file:literal) => {
        Script::new(concat!(
            include_str!("../lua/lib/fresh.lua"),
            include_str!(concat!("../lua/", $file))
        ))
    };
}

/// A waiting-room script, with `lua/lib/queue.lua` (functions only) prepended.
macro_rules! queue_script {
    ($file:literal) => {
        Script::new(concat!(
            include_str!("../lua/lib/queue.lua"),
            include_str!(concat!("../lua/", $file))
        ))
    };
}

pub static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    claim: fresh_script!("claim.lua"),
    resolve_claim: Script::new(include_str!("../lua/resolve_claim.lua")),
    declare_sku: Script::new(include_str!("../lua/declare_sku.lua")),
    restock: lifecycle_script!("restock.lua"),
    ack_journal: Script::new(include_str!("../lua/ack_journal.lua")),
    compensate: lifecycle_script!("compensate.lua"),
    restore_sku: Script::new(include_str!("../lua/restore_sku.lua")),
    mark_stale: Script::new(include_str!("../lua/mark_stale.lua")),
    close_sku: Script::new(include_str!("../lua/close_sku.lua")),
    decide_hold: lifecycle_script!("decide_hold.lua"),
    expire_holds: lifecycle_script!("expire_holds.lua"),
    join_waitlist: lifecycle_script!("join_waitlist.lua"),
    leave_waitlist: lifecycle_script!("leave_waitlist.lua"),
    transfer_out: fresh_script!("transfer_out.lua"),
    // Step 2 gives its units back through `give_back`, so that the recipient shard's line is
    // offered them before open stock is.
    transfer_in: lifecycle_script!("transfer_in.lua"),
    finish_transfer: Script::new(include_str!("../lua/finish_transfer.lua")),
    line_lease: fresh_script!("line_lease.lua"),
    offer_pool: lifecycle_script!("offer_pool.lua"),
    release_pool: lifecycle_script!("release_pool.lua"),
    unlock: Script::new(include_str!("../lua/unlock.lua")),
    pending_before: Script::new(include_str!("../lua/pending_before.lua")),
    rotate: fresh_script!("rotate.lua"),
    read_books: Script::new(include_str!("../lua/read_books.lua")),
    queue_config: Script::new(include_str!("../lua/queue_config.lua")),
    join_queue: queue_script!("join_queue.lua"),
    read_ticket: queue_script!("read_ticket.lua"),
    admit_queue: queue_script!("admit_queue.lua"),
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
    ] {
        script.prepare_invoke().load_async(con).await?;
    }
    Ok(())
}

/// One claim to decide. Its id is its call's (see [`crate::ids::claim_in`]): minted when the
/// call is formed, before it is sent.
#[derive(Debug, Clone)]
pub struct ClaimInput {
    pub user: String,
    pub quantity: u32,
    pub idempotency_key: Option<String>,
}

/// What Redis decided for one claim. Business outcomes are values, not errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Won {
        remaining: i64,
        /// When the hold expires (unix ms, Redis's clock); `None`: final at once.
        expires_ms: Option<i64>,
    },
    /// The same Idempotency-Key won earlier with the same request.
    Replay {
        claim_id: Uuid,
        quantity: u32,
        remaining: i64,
        created_ms: i64,
        expires_ms: Option<i64>,
    },
    /// The sale window has not opened yet.
    NotOpen,
    /// The sale window has closed.
    Closed,
    SoldOut {
        remaining: i64,
    },
    LimitReached {
        held: i64,
    },
    KeyReused,
    /// The call had a record already: a resolver fenced it after an earlier timeout (it
    /// decided nothing), or it is a resend of a call that ran (read its outcome back).
    Fenced,
    /// Never sent to Redis: the gateway shed it (its SKU's queue was full).
    Shed,
}

/// Decides `claims` (all on the SKU of `keys`) in order, in one script call: the call
/// `call_id` (see [`crate::ids::mint_call`]; claim i is [`crate::ids::claim_in`]`(call_id, i)`).
/// `floor` is the highest state sequence this gateway knows PostgreSQL recorded: a state
/// behind it is stale.
///
/// # Errors
/// [`StoreError::SkuLost`] when Redis holds no state for the SKU, [`StoreError::Stale`] when
/// the state is older than the ledger (nothing was written either way), or the Redis error of
/// the call.
pub async fn claim<C: ConnectionLike>(
    con: &mut C,
    keys: &SkuKeys,
    call_id: &Uuid,
    claims: &[ClaimInput],
    now_ms: i64,
    floor: i64,
) -> Result<Vec<Decision>, StoreError> {
    claim_at(con, keys, call_id, claims, now_ms, Floor::seq(floor)).await
}

/// As [`claim`], with the whole floor: the ledger's mark and incarnation as this gateway knows
/// them (a state older than either is stale: see `lua/lib/fresh.lua`).
///
/// # Errors
/// As [`claim`].
pub async fn claim_at<C: ConnectionLike>(
    con: &mut C,
    keys: &SkuKeys,
    call_id: &Uuid,
    claims: &[ClaimInput],
    now_ms: i64,
    floor: Floor,
) -> Result<Vec<Decision>, StoreError> {
    if claims.is_empty() {
        return Ok(Vec::new());
    }
    let reply: Value = claim_invocation_at(keys, call_id, claims, now_ms, floor)?
        .invoke_async(con)
        .await?;
    parse_claim_reply(reply, claims.len())
}

/// The `claim.lua` call `call_id` deciding `claims` (1 to [`crate::ids::CALL_CLAIMS`]), built
/// but not sent: its keys and arguments in the script's order, four per claim
/// (`benches/instructions.rs` counts what this costs).
///
/// # Errors
/// [`StoreError::Protocol`] when `claims` is empty or more than one call holds.
pub fn claim_invocation<'a>(
    keys: &SkuKeys,
    call_id: &Uuid,
    claims: &[ClaimInput],
    now_ms: i64,
    floor: i64,
) -> Result<redis::ScriptInvocation<'a>, StoreError> {
    claim_invocation_at(keys, call_id, claims, now_ms, Floor::seq(floor))
}

/// As [`claim_invocation`], with the whole floor (see [`claim_at`]).
///
/// # Errors
/// As [`claim_invocation`].
pub fn claim_invocation_at<'a>(
    keys: &SkuKeys,
    call_id: &Uuid,
    claims: &[ClaimInput],
    now_ms: i64,
    floor: Floor,
) -> Result<redis::ScriptInvocation<'a>, StoreError> {
    if claims.is_empty() || claims.len() > crate::ids::CALL_CLAIMS {
        return Err(StoreError::Protocol(format!(
            "a call decides 1 to {} claims, not {}",
            crate::ids::CALL_CLAIMS,
            claims.len()
        )));
    }
    let mut inv = SCRIPTS.claim.prepare_invoke();
    inv.key(keys.state())
        .key(keys.users())
        .key(keys.journal())
        .key(keys.claim(call_id))
        .key(keys.holds())
        .key(keys.expiry())
        .arg(now_ms)
        .arg(RECORD_TTL_SECS)
        .arg(CLAIM_RECORD_TTL_SECS)
        .arg(floor)
        .arg(call_id.to_string())
        .arg(claims.len());
    for (i, c) in claims.iter().enumerate() {
        if let Some(k) = &c.idempotency_key {
            inv.key(keys.idempotency(&c.user, k));
        }
        inv.arg(&c.user)
            .arg(c.quantity)
            .arg(c.idempotency_key.as_deref().unwrap_or(""))
            // The claim's piece of the call's journal entry and record, built here rather
            // than in Redis (claim.lua).
            .arg(format!("{i}|{}|{}|{}", c.quantity, c.user.len(), c.user));
    }
    Ok(inv)
}

/// Reads `claim.lua`'s reply for `n` claims.
///
/// # Errors
/// [`StoreError::SkuLost`] and [`StoreError::Stale`] as the script says;
/// [`StoreError::Protocol`] for a reply of another shape.
pub fn parse_claim_reply(reply: Value, n: usize) -> Result<Vec<Decision>, StoreError> {
    let items = match reply {
        Value::Array(items) => items,
        other => return Err(StoreError::Protocol(format!("claim: {other:?}"))),
    };
    if let [Value::BulkString(b)] = items.as_slice() {
        match b.as_slice() {
            b"lost" => return Err(StoreError::SkuLost),
            b"stale" => return Err(StoreError::Stale),
            b"fenced" => return Ok(vec![Decision::Fenced; n]),
            _ => {}
        }
    }
    if items.len() != 1 + 2 * n {
        return Err(StoreError::Protocol(format!(
            "claim: {} values for {n} claims",
            items.len()
        )));
    }
    let expires_ms = match items[0] {
        Value::Int(0) => None,
        Value::Int(ms) => Some(ms),
        ref other => return Err(StoreError::Protocol(format!("claim expiry {other:?}"))),
    };
    items[1..]
        .chunks_exact(2)
        .map(|pair| parse_decision(&pair[0], &pair[1], expires_ms))
        .collect()
}

fn parse_decision(
    code: &Value,
    value: &Value,
    expires_ms: Option<i64>,
) -> Result<Decision, StoreError> {
    let bad = || StoreError::Protocol(format!("claim result {code:?} {value:?}"));
    let int = |v: &Value| match v {
        Value::Int(n) => Ok(*n),
        _ => Err(bad()),
    };
    Ok(match int(code)? {
        1 => Decision::Won {
            remaining: int(value)?,
            expires_ms,
        },
        2 => {
            let rec = match value {
                Value::BulkString(b) => std::str::from_utf8(b).ok().and_then(ClaimRecord::parse),
                _ => None,
            }
            .ok_or_else(bad)?;
            Decision::Replay {
                claim_id: rec.claim_id,
                quantity: rec.quantity,
                remaining: rec.remaining,
                created_ms: rec.created_ms,
                expires_ms: rec.expires_ms,
            }
        }
        3 => Decision::SoldOut {
            remaining: int(value)?,
        },
        4 => Decision::LimitReached { held: int(value)? },
        5 => Decision::KeyReused,
        7 => Decision::NotOpen,
        8 => Decision::Closed,
        _ => return Err(bad()),
    })
}

/// Reads whether each of `claim_ids` (all in one records bucket) won, fencing the calls that
/// did not run (see resolve_claim.lua). Returns, per id, the stock left right after it won,
/// or `None` when it did not (and now cannot) win.
///
/// # Errors
/// The Redis error of the call; the outcomes then stay unknown.
pub async fn resolve_claims<C: ConnectionLike>(
    con: &mut C,
    keys: &SkuKeys,
    claim_ids: &[Uuid],
) -> Result<Vec<Option<i64>>, StoreError> {
    let Some(first) = claim_ids.first() else {
        return Ok(Vec::new());
    };
    let mut inv = SCRIPTS.resolve_claim.prepare_invoke();
    inv.key(keys.claim(first)).arg(CLAIM_RECORD_TTL_SECS);
    for id in claim_ids {
        inv.arg(crate::ids::call_of(id).to_string())
            .arg(crate::ids::index_of(id));
    }
    let raw: Vec<i64> = inv.invoke_async(con).await?;
    if raw.len() != claim_ids.len() {
        return Err(StoreError::Protocol(format!(
            "resolve: {} answers for {} ids",
            raw.len(),
            claim_ids.len()
        )));
    }
    Ok(raw.into_iter().map(|r| (r >= 0).then_some(r)).collect())
}

/// Result of declaring a SKU in Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Declared {
    Seeded,
    AlreadyPresent,
    Lost,
    /// A state this catalog row did not seed is present; nothing changed.
    Foreign,
}

/// What Redis needs of a SKU's terms: the limit, hold and offer times, the sale window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Terms {
    pub per_user_limit: i32,
    pub hold_ms: i64,
    pub offer_ms: i64,
    pub opens_ms: Option<i64>,
    pub closes_ms: Option<i64>,
}

impl Terms {
    /// A SKU with only a per-user limit: claims final at once, no sale window.
    pub fn limit(per_user_limit: i32) -> Terms {
        Terms {
            per_user_limit,
            hold_ms: 0,
            offer_ms: crate::lifecycle::DEFAULT_OFFER_SECS * 1000,
            opens_ms: None,
            closes_ms: None,
        }
    }

    /// The terms of a catalog row. An offer is held `offer_seconds`, else `hold_seconds`, else
    /// [`crate::lifecycle::DEFAULT_OFFER_SECS`]: an offer always leaves time to take it.
    pub fn of(row: &crate::catalog::Sku) -> Terms {
        let offer_secs = [i64::from(row.offer_seconds), i64::from(row.hold_seconds)]
            .into_iter()
            .find(|s| *s > 0)
            .unwrap_or(crate::lifecycle::DEFAULT_OFFER_SECS);
        Terms {
            per_user_limit: row.per_user_limit,
            hold_ms: i64::from(row.hold_seconds) * 1000,
            offer_ms: offer_secs * 1000,
            opens_ms: row.opens_at.map(|t| t.timestamp_millis()),
            closes_ms: row.closes_at.map(|t| t.timestamp_millis()),
        }
    }
}

fn opt_ms(ms: Option<i64>) -> String {
    ms.map_or(String::new(), |v| v.to_string())
}

/// Seeds the stock only if absent (`seed`), or updates the terms of a present SKU.
///
/// # Errors
/// The Redis error of the call.
pub async fn declare_sku<C: ConnectionLike>(
    con: &mut C,
    keys: &SkuKeys,
    seed: bool,
    total: i64,
    terms: &Terms,
    declare_id: &Uuid,
) -> Result<Declared, StoreError> {
    declare_shard(con, keys, seed, total, terms, declare_id, 0).await
}

/// [`declare_sku`] for one shard of a SKU: a seed starts the state's sequence at `seq_base`
/// (see [`crate::shards::seq_base`]).
///
/// # Errors
/// The Redis error of the call.
pub async fn declare_shard<C: ConnectionLike>(
    con: &mut C,
    keys: &SkuKeys,
    seed: bool,
    total: i64,
    terms: &Terms,
    declare_id: &Uuid,
    seq_base: i64,
) -> Result<Declared, StoreError> {
    let r: i64 = SCRIPTS
        .declare_sku
        .key(keys.state())
        .key(keys.journal())
        .arg(if seed { "seed" } else { "update" })
        .arg(total)
        .arg(terms.per_user_limit)
        .arg(declare_id.to_string())
        .arg(terms.hold_ms)
        .arg(terms.offer_ms)
        .arg(opt_ms(terms.opens_ms))
        .arg(opt_ms(terms.closes_ms))
        .arg(seq_base)
        .invoke_async(con)
        .await?;
    Ok(match r {
        1 => Declared::Seeded,
        0 => Declared::AlreadyPresent,
        -2 => Declared::Foreign,
        _ => Declared::Lost,
    })
}

/// What a restock operation did in Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restocked {
    /// Applied (now or by an earlier send of the same operation): the remaining stock and the
    /// state sequence the operation produced.
    Applied { remaining: i64, seq: i64 },
    /// Refused: the stock would have gone below 0. Nothing changed.
    Refused,
    /// Not applied, and fenced so that it never will be.
    NotApplied,
    /// Not applied: a newer operator action touched the state (this caller's lock is gone).
    Superseded,
}

/// Runs restock.lua for `op_id` in `mode`: "apply" moves the stock once; "resolve" reads an
/// earlier apply's outcome back, fencing it when it has not happened (so it never will).
/// `epoch` is the caller's operator epoch; `floor` the ledger's high-water mark (a state
/// behind it is marked stale, not moved).
///
/// # Errors
/// [`StoreError::SkuLost`] when Redis holds no state for the SKU, [`StoreError::Stale`] when
/// the state is marked stale, or the Redis error of the call (an apply's outcome is then
/// unknown: resolve it, never send it again).
pub async fn restock<C: ConnectionLike>(
    con: &mut C,
    keys: &SkuKeys,
    op_id: &Uuid,
    delta: i64,
    mode: RestockMode,
    epoch: i64,
    floor: i64,
) -> Result<Restocked, StoreError> {
    restock_at(con, keys, op_id, delta, mode, epoch, Floor::seq(floor)).await
}

/// As [`restock`], with the whole floor (the ledger's mark and incarnation: see [`claim_at`]).
///
/// # Errors
/// As [`restock`].
pub async fn restock_at<C: ConnectionLike>(
    con: &mut C,
    keys: &SkuKeys,
    op_id: &Uuid,
    delta: i64,
    mode: RestockMode,
    epoch: i64,
    floor: Floor,
) -> Result<Restocked, StoreError> {
    let mut inv = SCRIPTS.restock.prepare_invoke();
    for k in keys.lifecycle() {
        inv.key(k);
    }
    inv.key(keys.restock_op(op_id))
        .arg(match mode {
            RestockMode::Apply => "apply",
            RestockMode::Resolve => "resolve",
        })
        .arg(delta)
        .arg(RECORD_TTL_SECS)
        .arg(epoch)
        .arg(floor);
    let (code, remaining, seq): (i64, i64, i64) = inv.invoke_async(con).await?;
    match code {
        1 | 2 => Ok(Restocked::Applied { remaining, seq }),
        0 => Ok(Restocked::Refused),
        3 => Ok(Restocked::NotApplied),
        -3 => Err(StoreError::Stale),
        -4 => Ok(Restocked::Superseded),
        _ => Err(StoreError::SkuLost),
    }
}

/// Closes the SKU for a restore under operator `epoch` (see close_sku.lua). Returns `false`
/// when a newer operator action touched the state: this restore's lock is gone.
///
/// # Errors
/// The Redis error of the call.
pub async fn close_sku<C: ConnectionLike>(
    con: &mut C,
    keys: &SkuKeys,
    epoch: i64,
) -> Result<bool, StoreError> {
    let r: i64 = SCRIPTS
        .close_sku
        .key(keys.state())
        .arg(epoch)
        .invoke_async(con)
        .await?;
    Ok(r == 1)
}

/// Which half of restock.lua to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestockMode {
    Apply,
    Resolve,
}

/// Marks the SKU's state stale (see mark_stale.lua): every gateway fails closed on it until a
/// restore. Returns whether a state was there to mark.
///
/// # Errors
/// The Redis error of the call.
pub async fn mark_stale<C: ConnectionLike>(
    con: &mut C,
    keys: &SkuKeys,
    reason: &str,
) -> Result<bool, StoreError> {
    let r: i64 = SCRIPTS
        .mark_stale
        .key(keys.state())
        .arg(reason)
        .invoke_async(con)
        .await?;
    Ok(r == 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_sku_is_an_error_not_a_sell_out() {
        let reply = Value::Array(vec![Value::BulkString(b"lost".to_vec())]);
        assert!(matches!(
            parse_claim_reply(reply, 1),
            Err(StoreError::SkuLost)
        ));
    }

    #[test]
    fn a_fenced_call_decides_none_of_its_claims() {
        let reply = Value::Array(vec![Value::BulkString(b"fenced".to_vec())]);
        assert_eq!(
            parse_claim_reply(reply, 3).unwrap(),
            vec![Decision::Fenced; 3]
        );
    }

    #[test]
    fn a_stale_sku_is_an_error_not_a_sell_out() {
        let reply = Value::Array(vec![Value::BulkString(b"stale".to_vec())]);
        assert!(matches!(
            parse_claim_reply(reply, 1),
            Err(StoreError::Stale)
        ));
    }
}
