//! A SKU's operator lock, and the operator epoch its holder takes.

use sqlx::pool::PoolConnection;
use sqlx::{PgPool, Postgres};

use crate::error::DbError;
use crate::sku::SkuId;

/// A SKU's operator lock: a PostgreSQL session advisory lock held on a connection of its own
/// across the Redis step, so declare, restock and restore of one SKU never interleave (on any
/// gateway). The connection is closed, not pooled, when the guard drops: the lock can never
/// outlive the action, even on an error path, and a gateway that dies releases it too.
///
/// A lock is no fence: a holder whose connection was cut has lost it without knowing. So each
/// holder also takes the SKU's next operator epoch before its first Redis step, and every
/// Redis step of the action carries it: a state a newer action has touched refuses an older
/// one. The epoch is taken then, not with the lock, so an action refused before it touches
/// Redis (a restock below zero, a restore while the state is present) leaves the catalog row
/// as it was (schemathesis found refusals moving it; tests/api/findings.rs).
pub struct SkuLock {
    /// The session holding the advisory lock; the epoch is taken on it too.
    con: PoolConnection<Postgres>,
    sku: String,
    /// This action's operator epoch once taken (0 when the SKU has no catalog row yet).
    epoch: Option<i64>,
}

impl SkuLock {
    /// # Errors
    /// The database error.
    pub async fn acquire(db: &PgPool, sku: &SkuId) -> Result<SkuLock, DbError> {
        Self::take(db, sku, true)
            .await?
            .ok_or_else(|| DbError::from(sqlx::Error::RowNotFound))
    }

    /// The lock if it is free now (`None` when another action holds it): for background work
    /// that must not queue behind an operator.
    ///
    /// # Errors
    /// The database error.
    pub async fn try_acquire(db: &PgPool, sku: &SkuId) -> Result<Option<SkuLock>, DbError> {
        Self::take(db, sku, false).await
    }

    async fn take(db: &PgPool, sku: &SkuId, wait: bool) -> Result<Option<SkuLock>, DbError> {
        let mut con = db.acquire().await?;
        con.close_on_drop();
        let sql = if wait {
            "SELECT true FROM pg_advisory_lock(hashtext('dropgate.sku.' || $1))"
        } else {
            "SELECT pg_try_advisory_lock(hashtext('dropgate.sku.' || $1))"
        };
        let taken: bool = sqlx::query_scalar(sql)
            .bind(sku)
            .fetch_one(&mut *con)
            .await?;
        if !taken {
            return Ok(None);
        }
        Ok(Some(SkuLock {
            con,
            sku: sku.to_string(),
            epoch: None,
        }))
    }

    /// This action's operator epoch: the SKU's next one, taken on the first call.
    ///
    /// # Errors
    /// The database error.
    pub async fn epoch(&mut self) -> Result<i64, DbError> {
        if let Some(e) = self.epoch {
            return Ok(e);
        }
        let taken: Option<i64> = sqlx::query_scalar(
            "UPDATE skus SET op_epoch = op_epoch + 1 WHERE sku = $1 RETURNING op_epoch",
        )
        .bind(&self.sku)
        .fetch_optional(&mut *self.con)
        .await?;
        let e = taken.unwrap_or(0);
        self.epoch = Some(e);
        Ok(e)
    }
}
