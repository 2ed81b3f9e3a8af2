//! The SKU catalog: rows in PostgreSQL, cached in process so that an unknown SKU is refused
//! without a Redis round trip and a known one without a PostgreSQL round trip.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dashmap::DashMap;
use serde::Serialize;
use sqlx::PgPool;

use crate::error::DbError;

/// A negative answer is trusted this long, so a flood of unknown SKUs costs one query each
/// per second, while a SKU declared on another gateway becomes visible quickly.
const NEGATIVE_TTL: Duration = Duration::from_secs(1);
/// A cached SKU is re-read in the background after this long (limits changed elsewhere).
pub const REFRESH_AFTER: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct Sku {
    pub sku: String,
    pub total: i64,
    pub per_user_limit: i32,
    pub hold_seconds: i32,
    #[serde(skip)]
    pub seeded: bool,
    /// The ledger's high-water mark of the SKU's state sequence (see [`crate::freshness`]).
    #[serde(skip)]
    pub redis_seq: i64,
    /// Stamped on the Redis state this row seeded.
    #[serde(skip)]
    pub declare_id: uuid::Uuid,
}

enum Entry {
    Known(Arc<Sku>, Instant),
    Unknown(Instant),
}

/// Catalog reads and writes; cloning shares the cache.
#[derive(Clone)]
pub struct Catalog {
    db: PgPool,
    cache: Arc<DashMap<String, Entry>>,
    /// Age after which a cached row is re-read in the background ([`REFRESH_AFTER`]).
    refresh_after: Duration,
}

impl Catalog {
    pub fn new(db: PgPool) -> Self {
        Self::with_refresh_after(db, REFRESH_AFTER)
    }

    pub fn with_refresh_after(db: PgPool, refresh_after: Duration) -> Self {
        Catalog {
            db,
            cache: Arc::new(DashMap::new()),
            refresh_after,
        }
    }

    /// The SKU, from the cache when fresh enough.
    ///
    /// # Errors
    /// The database error when the cache cannot answer and PostgreSQL is unreachable.
    pub async fn get(&self, sku: &str) -> Result<Option<Arc<Sku>>, DbError> {
        // Copy out and drop the shard guard before anything else touches the map: a DashMap
        // guard held across `get_mut` on the same shard deadlocks the worker thread.
        let hit = self.cache.get(sku).and_then(|e| match &*e {
            Entry::Known(s, at) => Some(Some((s.clone(), at.elapsed() > self.refresh_after))),
            Entry::Unknown(at) if at.elapsed() < NEGATIVE_TTL => Some(None),
            Entry::Unknown(_) => None,
        });
        match hit {
            Some(Some((s, stale))) => {
                if stale {
                    self.refresh_in_background(sku);
                }
                Ok(Some(s))
            }
            Some(None) => Ok(None),
            None => self.load(sku).await,
        }
    }

    /// Reads the SKU from PostgreSQL and caches the answer.
    ///
    /// # Errors
    /// The database error.
    pub async fn load(&self, sku: &str) -> Result<Option<Arc<Sku>>, DbError> {
        let row = fetch(&self.db, sku).await?;
        Ok(self.remember(sku, row))
    }

    pub fn remember(&self, sku: &str, row: Option<Sku>) -> Option<Arc<Sku>> {
        let now = Instant::now();
        match row {
            Some(s) => {
                let s = Arc::new(s);
                self.cache
                    .insert(sku.to_string(), Entry::Known(s.clone(), now));
                Some(s)
            }
            None => {
                self.cache.insert(sku.to_string(), Entry::Unknown(now));
                None
            }
        }
    }

    fn refresh_in_background(&self, sku: &str) {
        // Re-stamp first so one stale entry starts one refresh, not one per request.
        if let Some(mut e) = self.cache.get_mut(sku) {
            if let Entry::Known(s, _) = &*e {
                *e = Entry::Known(s.clone(), Instant::now());
            }
        }
        let this = self.clone();
        let sku = sku.to_string();
        tokio::spawn(async move {
            // A failed refresh keeps the cached row: claims never wait on PostgreSQL.
            if let Ok(row) = fetch(&this.db, &sku).await {
                this.remember(&sku, row);
            }
        });
    }

    pub fn db(&self) -> &PgPool {
        &self.db
    }
}

/// # Errors
/// The database error.
pub async fn fetch(db: &PgPool, sku: &str) -> Result<Option<Sku>, DbError> {
    Ok(sqlx::query_as::<_, Sku>(
        "SELECT sku, total, per_user_limit, hold_seconds, seeded, redis_seq, declare_id
           FROM skus WHERE sku = $1",
    )
    .bind(sku)
    .fetch_optional(db)
    .await?)
}

/// Every SKU id, for the writer and reconcile.
///
/// # Errors
/// The database error.
pub async fn all_ids(db: &PgPool) -> Result<Vec<String>, DbError> {
    Ok(
        sqlx::query_scalar::<_, String>("SELECT sku FROM skus ORDER BY sku")
            .fetch_all(db)
            .await?,
    )
}

/// Whether `s` is a valid SKU id (`^[A-Za-z0-9._-]{1,64}$`).
pub fn valid_sku_id(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::valid_sku_id;

    #[test]
    fn sku_ids_follow_the_contract() {
        assert!(valid_sku_id("drop-1.A_b"));
        assert!(!valid_sku_id(""));
        assert!(!valid_sku_id(&"a".repeat(65)));
        assert!(!valid_sku_id("a{b}"));
        assert!(!valid_sku_id("é"));
    }
}
