//! The errors of the layers below as [`ApiError`]s: which refusal or failure each one is.

use super::ApiError;
use crate::catalog::CatalogError;
use crate::error::{DbError, InventoryError, Refusal, StoreError};

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        ApiError::Unavailable(e)
    }
}

impl From<CatalogError> for ApiError {
    fn from(e: CatalogError) -> Self {
        match e {
            CatalogError::Db(e) => ApiError::Database(e),
            CatalogError::Busy => ApiError::Overloaded,
        }
    }
}

impl From<DbError> for ApiError {
    fn from(e: DbError) -> Self {
        ApiError::Database(e)
    }
}

impl From<crate::lifecycle::LifecycleError> for ApiError {
    fn from(e: crate::lifecycle::LifecycleError) -> Self {
        use crate::lifecycle::LifecycleError as L;
        match e {
            L::Store(e) => e.into(),
            L::Db(e) => e.into(),
            L::Catalog(e) => e.into(),
        }
    }
}

impl From<InventoryError> for ApiError {
    fn from(e: InventoryError) -> Self {
        match e {
            InventoryError::Refused(Refusal::UnknownSku) => ApiError::UnknownSku,
            InventoryError::Refused(Refusal::SkuExists) => ApiError::SkuExists,
            InventoryError::Refused(Refusal::InsufficientStock) => ApiError::InsufficientStock,
            InventoryError::Refused(Refusal::StatePresent) => ApiError::StatePresent(
                "Redis already holds state for this SKU id that this catalog never declared \
                 (another deployment's keys under the same DROPGATE_KEY_PREFIX?): it is never \
                 adopted; remove those keys or choose another SKU id",
            ),
            InventoryError::Refused(Refusal::OperatorBusy) => ApiError::OperatorBusy,
            InventoryError::Store(e) => ApiError::Unavailable(e),
            InventoryError::Db(e) => ApiError::Database(e),
        }
    }
}
