//! The freshness scripts (src/freshness.rs): mark a state stale (`mark_stale.lua`), and
//! advance a fresh state's incarnation (`rotate.lua`).

use redis::aio::ConnectionLike;

use super::{Floor, SCRIPTS};
use crate::error::StoreError;
use crate::keys::SkuKeys;

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

/// What `rotate.lua` did to a state's incarnation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rotation {
    /// The state now carries this new incarnation (to be recorded once the replicas hold it).
    Advanced(i64),
    /// Nothing changed: another gateway rotated it since it was read, or the state is missing.
    Skipped,
    /// The state is stale or older than the floor: marked stale.
    Stale,
}

/// Advances the incarnation of the state of `keys`, which the caller read as `read`, if the
/// state is not older than `floor` (`rotate.lua`).
///
/// # Errors
/// The Redis error of the call.
pub async fn rotate<C: ConnectionLike>(
    con: &mut C,
    keys: &SkuKeys,
    floor: Floor,
    read: i64,
) -> Result<Rotation, StoreError> {
    let (code, inc): (i64, i64) = SCRIPTS
        .rotate
        .key(keys.state())
        .arg(floor)
        .arg(read)
        .invoke_async(con)
        .await?;
    Ok(match code {
        1 => Rotation::Advanced(inc),
        0 | -1 => Rotation::Skipped,
        _ => Rotation::Stale,
    })
}
