//! The scripts of a sharded SKU (src/shards/): the three steps of a transfer between two
//! shards (`transfer_out.lua`, `transfer_in.lua`, `finish_transfer.lua`), the lines' lease
//! (`line_lease.lua`), the feed's offers from a shard's pool and its release
//! (`offer_pool.lua`, `release_pool.lua`), and the feed lock's release (`unlock.lua`).

use redis::aio::ConnectionLike;
use uuid::Uuid;

use super::{Floor, SCRIPTS};
use crate::error::StoreError;
use crate::keys::SkuKeys;

/// How long a recipient remembers that it applied a transfer: far longer than a transfer can
/// stay pending while any gateway runs (the recovery task finishes one within seconds).
pub const TRANSFER_RECORD_TTL_SECS: u64 = 7 * 24 * 3600;

/// Which of a donor's counts a transfer takes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Open stock (a refill, a restock's gathering): the recipient gives the units back
    /// (`give_back`: its line first, or its pool under a line lease).
    Stock,
    /// The waitlist pool (src/shards/line.rs): units kept for the SKU's lines stay in the
    /// recipient's pool, to be offered there.
    Pool,
}

impl Source {
    /// As `transfer_out.lua` and `transfer_in.lua` take it.
    fn arg(self) -> &'static str {
        match self {
            Source::Stock => "",
            Source::Pool => "pool",
        }
    }
}

/// What step 1 found on the donor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Taken {
    /// Units taken out (now, or by an earlier send of the same id), and the donor's
    /// generation they carry.
    Units(i64, String),
    /// The donor had nothing to give.
    Dry,
}

/// Step 1 of the transfer `id` (`transfer_out.lua`, on the donor of `keys` alone): takes at
/// least `need` units (fewer when the donor holds fewer; at most `cap`) from `source` for the
/// shard `recipient`, recording them in transit. Returns what was taken, and whether this call
/// took it (`false`: an earlier send of the same id did, or the donor was dry).
///
/// # Errors
/// [`StoreError::SkuLost`] / [`StoreError::Stale`] for a donor that fails closed,
/// [`StoreError::Protocol`] for an answer the script does not give, or the Redis error of the
/// call (its effect is then unknown).
#[allow(clippy::too_many_arguments)]
pub async fn transfer_out<C: ConnectionLike>(
    con: &mut C,
    keys: &SkuKeys,
    id: &Uuid,
    recipient: u16,
    need: i64,
    cap: i64,
    now_ms: i64,
    source: Source,
    floor: Floor,
) -> Result<(Taken, bool), StoreError> {
    let (code, units, generation): (i64, i64, String) = SCRIPTS
        .transfer_out
        .key(keys.state())
        .key(keys.transfers())
        .arg(id.to_string())
        .arg(need)
        .arg(cap)
        .arg(recipient)
        .arg(now_ms)
        .arg(source.arg())
        .arg(floor)
        .invoke_async(con)
        .await?;
    match code {
        1 | 2 => Ok((Taken::Units(units, generation), code == 1)),
        0 => Ok((Taken::Dry, false)),
        -3 => Err(StoreError::Stale),
        -1 => Err(StoreError::SkuLost),
        other => Err(StoreError::Protocol(format!(
            "transfer_out answered {other}"
        ))),
    }
}

/// Step 2 of the transfer `id` (`transfer_in.lua`, on the recipient of `keys`): its `units`
/// given back there once, if the recipient's generation is still `generation`. Returns whether
/// they are in the recipient's stock (`false`: a restore rebuilt the SKU since they were taken,
/// and they are never added).
///
/// # Errors
/// [`StoreError::SkuLost`] / [`StoreError::Stale`] when the recipient fails closed (the
/// transfer stays pending), [`StoreError::Protocol`] for an answer the script does not give, or
/// the Redis error of the call.
pub async fn transfer_in<C: ConnectionLike>(
    con: &mut C,
    keys: &SkuKeys,
    id: &Uuid,
    units: i64,
    generation: &str,
    source: Source,
    floor: Floor,
) -> Result<bool, StoreError> {
    let mut inv = SCRIPTS.transfer_in.prepare_invoke();
    for k in keys.lifecycle() {
        inv.key(k);
    }
    inv.key(keys.transfer_in(id))
        .arg(units)
        .arg(generation)
        .arg(TRANSFER_RECORD_TTL_SECS)
        .arg(source.arg())
        .arg(floor);
    let code: i64 = inv.invoke_async(con).await?;
    match code {
        1 | 2 => Ok(true),
        -4 => Ok(false),
        -3 => Err(StoreError::Stale),
        -1 => Err(StoreError::SkuLost),
        other => Err(StoreError::Protocol(format!(
            "transfer_in answered {other}"
        ))),
    }
}

/// Step 3 of the transfer `id` (`finish_transfer.lua`, on the donor of `keys`): the donor
/// forgets it, once the recipient has answered for it.
///
/// # Errors
/// The Redis error of the call (sending it again is harmless).
pub async fn finish_transfer<C: ConnectionLike>(
    con: &mut C,
    keys: &SkuKeys,
    id: &Uuid,
) -> Result<(), StoreError> {
    let _: i64 = SCRIPTS
        .finish_transfer
        .key(keys.state())
        .key(keys.transfers())
        .arg(id.to_string())
        .invoke_async(con)
        .await?;
    Ok(())
}

/// One shard's answer to `line_lease.lua`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LineLease {
    pub stock: i64,
    /// Transfers the shard began and has not finished.
    pub pending: i64,
    /// The join ticket taken (0 when none was asked for).
    pub ticket: i64,
}

/// Sets (or extends) the line lease of the shard of `keys` for `lease_ms` (`line_lease.lua`);
/// with `ticket`, also takes a join ticket (shard 0 only).
///
/// # Errors
/// [`StoreError::SkuLost`] / [`StoreError::Stale`] when the shard fails closed (nothing
/// changes), or the Redis error of the call.
pub async fn line_lease<C: ConnectionLike>(
    con: &mut C,
    keys: &SkuKeys,
    lease_ms: u64,
    ticket: bool,
    floor: Floor,
) -> Result<LineLease, StoreError> {
    let (code, stock, pending, ticket): (i64, i64, i64, i64) = SCRIPTS
        .line_lease
        .key(keys.state())
        .key(keys.transfers())
        .arg(lease_ms)
        .arg(if ticket { "1" } else { "0" })
        .arg(floor)
        .invoke_async(con)
        .await?;
    match code {
        1 => Ok(LineLease {
            stock,
            pending,
            ticket,
        }),
        -3 => Err(StoreError::Stale),
        _ => Err(StoreError::SkuLost),
    }
}

/// Offers up to `most` units of the pool of the shard of `keys` to its line's head
/// (`offer_pool.lua`); with `gather`, first moves the shard's open stock into its pool.
/// Returns the units offered.
///
/// # Errors
/// [`StoreError::SkuLost`] / [`StoreError::Stale`] when the shard fails closed, or the Redis
/// error of the call.
pub async fn offer_pool<C: ConnectionLike>(
    con: &mut C,
    keys: &SkuKeys,
    most: i64,
    gather: bool,
    floor: Floor,
) -> Result<i64, StoreError> {
    let mut inv = SCRIPTS.offer_pool.prepare_invoke();
    for k in keys.lifecycle() {
        inv.key(k);
    }
    inv.arg(most).arg(if gather { "1" } else { "0" }).arg(floor);
    let (code, _pool): (i64, i64) = inv.invoke_async(con).await?;
    match code {
        n if n >= 0 => Ok(n),
        -3 => Err(StoreError::Stale),
        _ => Err(StoreError::SkuLost),
    }
}

/// Gives the pool of the shard of `keys` back once its line lease has lapsed
/// (`release_pool.lua`). Returns the units released (0 while the lease lasts).
///
/// # Errors
/// [`StoreError::SkuLost`] / [`StoreError::Stale`] when the shard fails closed, or the Redis
/// error of the call.
pub async fn release_pool<C: ConnectionLike>(
    con: &mut C,
    keys: &SkuKeys,
    floor: Floor,
) -> Result<i64, StoreError> {
    let mut inv = SCRIPTS.release_pool.prepare_invoke();
    for k in keys.lifecycle() {
        inv.key(k);
    }
    inv.arg(floor);
    let (code, units): (i64, i64) = inv.invoke_async(con).await?;
    match code {
        0 => Ok(0),
        1 => Ok(units),
        -3 => Err(StoreError::Stale),
        _ => Err(StoreError::SkuLost),
    }
}

/// Releases the lock `lock` if `token` still holds it (`unlock.lua`). Returns whether it was
/// released now.
///
/// # Errors
/// The Redis error of the call (a lock left behind lapses by itself).
pub async fn unlock<C: ConnectionLike>(
    con: &mut C,
    lock: &str,
    token: &str,
) -> Result<bool, StoreError> {
    let released: i64 = SCRIPTS
        .unlock
        .key(lock)
        .arg(token)
        .invoke_async(con)
        .await?;
    Ok(released == 1)
}
