//! The active set's script: `retire_sku.lua` takes a SKU out of the set unless a gateway
//! marked it since it was read (src/activity/).

use std::sync::LazyLock;

use redis::aio::ConnectionLike;
use redis::Script;

use crate::error::StoreError;

/// Not in the registry ([`super::SCRIPTS`]): its only caller is a background sweep, so it is
/// never preloaded, and `invoke_async` loads it on first use.
static RETIRE_SKU: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/retire_sku.lua")));

/// Removes the Redis SKU `name` from the active set `active` ([`crate::keys::active_skus`]) if
/// its score is still `score` as the caller read it. Returns whether it was removed now.
///
/// # Errors
/// The Redis error of the call.
pub async fn retire_sku<C: ConnectionLike>(
    con: &mut C,
    active: &str,
    name: &str,
    score: &str,
) -> Result<bool, StoreError> {
    let gone: i64 = RETIRE_SKU
        .key(active)
        .arg(name)
        .arg(score)
        .invoke_async(con)
        .await?;
    Ok(gone == 1)
}
