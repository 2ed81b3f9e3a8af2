//! The operator's scripts and the terms they set: declare (`declare_sku.lua`), restock
//! (`restock.lua`), close a SKU for a restore and rebuild it (`close_sku.lua`,
//! `restore_sku.lua`).

use redis::aio::ConnectionLike;
use uuid::Uuid;

use super::{Floor, SCRIPTS};
use crate::config::RECORD_TTL_SECS;
use crate::error::StoreError;
use crate::keys::SkuKeys;

/// Offers are held this long when the SKU names no time of its own: a buyer offered a unit
/// needs time to take it even on a SKU whose claims are final at once.
pub const DEFAULT_OFFER_SECS: i64 = 300;

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
            offer_ms: DEFAULT_OFFER_SECS * 1000,
            opens_ms: None,
            closes_ms: None,
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
/// (see [`crate::layout::seq_base`]).
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
        .key(keys.op_fence())
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

/// One Redis SKU (a SKU, or one shard of one) as `restore_sku.lua` rebuilds it from the ledger.
#[derive(Debug, Clone)]
pub struct Rebuild<'a> {
    /// The per-user counts the caller staged in chunks, moved over the counts in one step.
    pub staged: &'a str,
    /// Its stock according to the ledger.
    pub stock: i64,
    pub per_user_limit: i32,
    /// The state sequence to start from (above every sequence PostgreSQL recorded).
    pub seq: i64,
    /// The catalog row's declare id.
    pub declare_id: Uuid,
    /// The restore's operator epoch, stamped on the state.
    pub epoch: i64,
    pub terms: Terms,
    /// The waitlist's highest join order (the line was restored before this call).
    pub wl_order: i64,
    /// On a shard of a sharded SKU only: the generation stamped on the state, so no transfer
    /// begun before the restore is applied to it (its transfers not yet done are dropped).
    pub generation: Option<i64>,
    /// A seated SKU's rows (`SeatPlan::rows_spec`), written into the state in the same step:
    /// the waitlist's offers search them (`lua/seat_rows.lua` on a declare).
    pub rows: Option<String>,
}

/// Rebuilds the state of `keys` as `rebuild` says, only where no state is present
/// (`restore_sku.lua`). Returns `false` when a state is present (nothing changes).
/// A restock that found the state missing under a newer epoch since (the operator fence) is
/// [`StoreError::Unavailable`]: this restore read an older total; the next one rebuilds.
///
/// # Errors
/// The Redis error of the call.
pub async fn restore_sku<C: ConnectionLike>(
    con: &mut C,
    keys: &SkuKeys,
    rebuild: &Rebuild<'_>,
) -> Result<bool, StoreError> {
    let mut inv = SCRIPTS.restore_sku.prepare_invoke();
    inv.key(keys.state())
        .key(keys.users())
        .key(keys.journal())
        .key(rebuild.staged)
        .key(keys.op_fence());
    if rebuild.generation.is_some() {
        inv.key(keys.transfers());
    }
    let terms = &rebuild.terms;
    inv.arg(rebuild.stock)
        .arg(rebuild.per_user_limit)
        .arg(rebuild.seq)
        .arg(rebuild.declare_id.to_string())
        .arg(rebuild.epoch)
        .arg(terms.hold_ms)
        .arg(terms.offer_ms)
        .arg(opt_ms(terms.opens_ms))
        .arg(opt_ms(terms.closes_ms))
        .arg(rebuild.wl_order);
    match (rebuild.generation, &rebuild.rows) {
        (Some(generation), rows) => {
            inv.arg(generation).arg(rows.as_deref().unwrap_or(""));
        }
        (None, Some(rows)) => {
            inv.arg("").arg(rows);
        }
        (None, None) => {}
    }
    let applied: i64 = inv.invoke_async(con).await?;
    if applied == -4 {
        return Err(StoreError::Unavailable(
            "a newer operator action moved the SKU while its state was absent".into(),
        ));
    }
    Ok(applied == 1)
}
