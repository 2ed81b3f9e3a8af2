//! Forgetting the consumer names of gateways that are gone. Every gateway's writer joins each
//! SKU's journal group under a fresh name (`gw-<uuid>`), so without this every restart would
//! leave one more name behind in every SKU's group, forever.

use std::time::Duration;

use crate::error::StoreError;
use crate::store::Store;

/// A consumer holding nothing is taken for gone after this many claim-idle times (the idle
/// time after which its entries would be taken over anyway): long enough that a gateway
/// stalled for a while keeps its name, short enough that names do not pile up.
pub const GONE_AFTER_CLAIM_IDLES: u32 = 10;

/// Removes from the SKU's journal group the consumers that hold no pending entries and have
/// been idle for at least `idle`, except `own`. Returns the names removed.
///
/// # Errors
/// Redis unreachable or timed out; nothing is removed then, or the removal is simply redone
/// by the next sweep.
pub async fn reap_idle_consumers(
    store: &Store,
    name: &str,
    idle: Duration,
    own: &str,
) -> Result<Vec<String>, StoreError> {
    let keys = store.keys(name);
    let mut con = store.hot();
    let removed = store
        .bounded(crate::scripts::journal::reap_consumers(
            &mut con, &keys, idle, own,
        ))
        .await?;
    if !removed.is_empty() {
        tracing::info!(sku = name, consumers = ?removed, "removed the journal consumer names of gateways that are gone");
    }
    Ok(removed)
}
