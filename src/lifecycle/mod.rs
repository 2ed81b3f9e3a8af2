//! The drop lifecycle: holds (a won claim held until confirmed, cancelled or expired), the
//! waitlist (units that come back go to the head of the line as offers), and the expiry worker.
//!
//! Every decision is one script call on the SKU's keys (`lua/decide_hold.lua`,
//! `lua/expire_holds.lua`, `lua/join_waitlist.lua`, `lua/leave_waitlist.lua`, with
//! `lua/lib/lifecycle.lua`), on Redis's clock; each change is journaled in the same step and
//! reaches PostgreSQL through the writer, like a win. A claim or entry is found by its id alone
//! (the id carries the SKU's tag, see [`crate::ids`]): in Redis while its record is there, in
//! PostgreSQL once its final status is written.

pub mod expiry;
pub mod holds;
pub(crate) mod records;
pub mod rows;
pub mod waitlist;

use std::sync::Arc;

use crate::catalog::{Catalog, CatalogError, Sku};
use crate::error::{DbError, StoreError};

/// Why a lifecycle request could not be answered.
#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    Catalog(#[from] CatalogError),
}

/// The SKU an id minted by this gateway (or any other) belongs to.
///
/// # Errors
/// The catalog's error.
pub async fn sku_of(catalog: &Catalog, id: &uuid::Uuid) -> Result<Option<Arc<Sku>>, CatalogError> {
    catalog.by_tag(crate::ids::tag_of(id)).await
}

/// A read that got no answer is plain "unavailable": only a write can leave an outcome unknown
/// (503 `outcome_unknown` is the promise that something may have changed).
pub(crate) fn read_error(e: StoreError) -> StoreError {
    match e {
        StoreError::Timeout => {
            StoreError::Unavailable("redis did not answer a read in time".into())
        }
        other => other,
    }
}

/// Offers are held this long when the SKU names no time of its own: a buyer offered a unit
/// needs time to take it even on a SKU whose claims are final at once.
pub const DEFAULT_OFFER_SECS: i64 = 300;
