//! The SKU catalog: rows in PostgreSQL, cached in process so that an unknown SKU is refused
//! without a Redis round trip and a known one without a PostgreSQL round trip.
//!
//! The request path reads through its own small pool (see [`crate::db`]), and a lookup of an
//! uncached id waits for one of [`MAX_LOOKUPS_IN_FLIGHT`] turns: a flood of random ids costs a
//! bounded share of PostgreSQL, never the writer's connections, and a bounded amount of
//! memory ([`MAX_NEGATIVE_ENTRIES`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dashmap::mapref::entry::Entry as Slot;
use dashmap::DashMap;
use serde::Serialize;
use sqlx::PgPool;
use tokio::sync::Semaphore;

use crate::error::DbError;
use crate::scripts::operator::{Terms, DEFAULT_OFFER_SECS};
use crate::sku::SkuId;

/// A negative answer is trusted this long, so a repeated unknown id costs one query per
/// second, while a SKU declared on another gateway becomes visible quickly.
const NEGATIVE_TTL: Duration = Duration::from_secs(1);
/// Unknown ids remembered at most. Past it, expired ones are swept (at most once per
/// [`NEGATIVE_TTL`]) and, if the cache is still full, an unknown id is answered without being
/// remembered. Known SKUs are always cached: their number is the catalog's, not the caller's.
pub const MAX_NEGATIVE_ENTRIES: usize = 100_000;
/// PostgreSQL lookups of uncached ids in flight at once per gateway: fewer than the request
/// pool's connections, so admin routes and claim lookups still get one during a flood.
pub const MAX_LOOKUPS_IN_FLIGHT: usize = 2;
/// How long a claim for an uncached id waits for a lookup turn before it is shed (429).
const LOOKUP_WAIT: Duration = Duration::from_millis(500);
/// A cached SKU is re-read in the background after this long (limits changed elsewhere).
pub const REFRESH_AFTER: Duration = Duration::from_secs(5);

/// Why the catalog could not answer a request-path lookup.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error(transparent)]
    Db(#[from] DbError),
    /// Every lookup turn stayed taken for [`LOOKUP_WAIT`]: shed, retry later.
    #[error("too many catalog lookups in flight")]
    Busy,
}

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
    /// How long a waitlist offer is held.
    #[serde(skip)]
    pub offer_seconds: i32,
    /// The sale window (Redis's clock decides).
    #[serde(skip)]
    pub opens_at: Option<chrono::DateTime<chrono::Utc>>,
    #[serde(skip)]
    pub closes_at: Option<chrono::DateTime<chrono::Utc>>,
    /// Carried in every id minted for this SKU (see [`crate::ids`]).
    #[serde(skip)]
    pub tag: i32,
    /// How many Redis shards the SKU is spread over (1: one Redis SKU, as always) and their
    /// placement salts: every shard's Redis name comes from here (see [`crate::shards`]).
    #[serde(skip)]
    #[sqlx(flatten)]
    pub layout: crate::layout::Layout,
    /// The SKU's waiting room, when it has one ([`crate::queue`]).
    #[serde(skip)]
    #[sqlx(flatten)]
    pub queue: crate::queue::QueueRow,
    /// A seated SKU's plan as declared (JSON), `None` for general admission (docs/seats.md).
    #[serde(skip)]
    pub seats: Option<String>,
    /// That plan, parsed once when the row is read.
    #[serde(skip)]
    #[sqlx(skip)]
    pub plan: Option<std::sync::Arc<crate::seating::SeatPlan>>,
}

impl Sku {
    /// The row's SKU id (trusted: only a checked id was ever declared).
    pub fn id(&self) -> &SkuId {
        SkuId::trusted(&self.sku)
    }

    /// What Redis needs of this row's terms. An offer is held `offer_seconds`, else `hold_seconds`, else
    /// [`DEFAULT_OFFER_SECS`]: an offer always leaves time to take it.
    pub fn terms(&self) -> Terms {
        let offer_secs = [i64::from(self.offer_seconds), i64::from(self.hold_seconds)]
            .into_iter()
            .find(|s| *s > 0)
            .unwrap_or(DEFAULT_OFFER_SECS);
        Terms {
            per_user_limit: self.per_user_limit,
            hold_ms: i64::from(self.hold_seconds) * 1000,
            offer_ms: offer_secs * 1000,
            opens_ms: self.opens_at.map(|t| t.timestamp_millis()),
            closes_ms: self.closes_at.map(|t| t.timestamp_millis()),
        }
    }
}

enum Entry {
    Known(Arc<Sku>, Instant),
    Unknown(Instant),
}

/// Catalog reads and writes; cloning shares the cache.
#[derive(Clone)]
pub struct Catalog {
    /// The request path's pool, never the writer's: catalog misses cannot starve the ledger.
    db: PgPool,
    cache: Arc<DashMap<String, Entry>>,
    /// Age after which a cached row is re-read in the background ([`REFRESH_AFTER`]).
    refresh_after: Duration,
    /// Unknown entries in `cache`, counted beside it because counting in the map is O(n).
    negatives: Arc<AtomicUsize>,
    /// Turns for looking up an uncached id ([`MAX_LOOKUPS_IN_FLIGHT`]).
    lookups: Arc<Semaphore>,
    /// When a full cache last swept its expired unknown entries: at most once per TTL.
    last_sweep: Arc<parking_lot::Mutex<Instant>>,
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
            negatives: Arc::new(AtomicUsize::new(0)),
            lookups: Arc::new(Semaphore::new(MAX_LOOKUPS_IN_FLIGHT)),
            last_sweep: Arc::new(parking_lot::Mutex::new(Instant::now())),
        }
    }

    /// The SKU, from the cache when fresh enough; otherwise looked up in its turn.
    ///
    /// # Errors
    /// [`CatalogError::Busy`] when no lookup turn came within [`LOOKUP_WAIT`];
    /// [`CatalogError::Db`] when the cache cannot answer and PostgreSQL is unreachable.
    pub async fn get(&self, sku: &SkuId) -> Result<Option<Arc<Sku>>, CatalogError> {
        if let Some(hit) = self.cached(sku) {
            return Ok(hit);
        }
        let _turn = tokio::time::timeout(LOOKUP_WAIT, self.lookups.acquire())
            .await
            .map_err(|_| CatalogError::Busy)?
            .map_err(|_| CatalogError::Busy)?;
        // Requests for the same id queue behind the first: the first one's answer serves them.
        if let Some(hit) = self.cached(sku) {
            return Ok(hit);
        }
        Ok(self.load(sku).await?)
    }

    /// `Some(answer)` when the cache can answer: the row, or `None` for a fresh negative.
    fn cached(&self, sku: &SkuId) -> Option<Option<Arc<Sku>>> {
        // Copy out and drop the shard guard before anything else touches the map: a DashMap
        // guard held across `get_mut` on the same shard deadlocks the worker thread.
        let hit = self.cache.get(sku.as_str()).and_then(|e| match &*e {
            Entry::Known(s, at) => Some(Some((s.clone(), at.elapsed() > self.refresh_after))),
            Entry::Unknown(at) if at.elapsed() < NEGATIVE_TTL => Some(None),
            Entry::Unknown(_) => None,
        })?;
        Some(hit.map(|(s, stale)| {
            if stale {
                self.refresh_in_background(sku);
            }
            s
        }))
    }

    /// Reads the SKU from PostgreSQL and caches the answer.
    ///
    /// # Errors
    /// The database error.
    pub async fn load(&self, sku: &SkuId) -> Result<Option<Arc<Sku>>, DbError> {
        let row = fetch(&self.db, sku).await?;
        Ok(self.remember(sku, row))
    }

    pub fn remember(&self, sku: &SkuId, row: Option<Sku>) -> Option<Arc<Sku>> {
        let now = Instant::now();
        match row {
            Some(s) => {
                let s = Arc::new(s);
                let old = self
                    .cache
                    .insert(sku.to_string(), Entry::Known(s.clone(), now));
                if matches!(old, Some(Entry::Unknown(_))) {
                    self.negatives.fetch_sub(1, Ordering::Relaxed);
                }
                Some(s)
            }
            None => {
                self.remember_unknown(sku, now);
                None
            }
        }
    }

    fn remember_unknown(&self, sku: &SkuId, now: Instant) {
        if self.negatives.load(Ordering::Relaxed) >= MAX_NEGATIVE_ENTRIES {
            self.sweep_expired(now);
        }
        let full = self.negatives.load(Ordering::Relaxed) >= MAX_NEGATIVE_ENTRIES;
        match self.cache.entry(sku.to_string()) {
            Slot::Occupied(mut o) => {
                if matches!(o.get(), Entry::Known(..)) {
                    self.negatives.fetch_add(1, Ordering::Relaxed);
                }
                o.insert(Entry::Unknown(now));
            }
            Slot::Vacant(v) if !full => {
                v.insert(Entry::Unknown(now));
                self.negatives.fetch_add(1, Ordering::Relaxed);
            }
            // Answered, not remembered: the next request for it waits for a lookup turn.
            Slot::Vacant(_) => {}
        }
    }

    fn sweep_expired(&self, now: Instant) {
        {
            let mut last = self.last_sweep.lock();
            if now.saturating_duration_since(*last) < NEGATIVE_TTL {
                return;
            }
            *last = now;
        }
        let mut removed = 0;
        self.cache.retain(|_, e| match e {
            Entry::Unknown(at) if now.saturating_duration_since(*at) >= NEGATIVE_TTL => {
                removed += 1;
                false
            }
            _ => true,
        });
        self.negatives.fetch_sub(removed, Ordering::Relaxed);
    }

    /// Unknown ids remembered now.
    pub fn cached_unknown(&self) -> usize {
        self.negatives.load(Ordering::Relaxed)
    }

    /// Entries of either kind in the cache (counted in the map itself).
    pub fn cached_entries(&self) -> usize {
        self.cache.len()
    }

    fn refresh_in_background(&self, sku: &SkuId) {
        // Re-stamp first so one stale entry starts one refresh, not one per request.
        if let Some(mut e) = self.cache.get_mut(sku.as_str()) {
            if let Entry::Known(s, _) = &*e {
                *e = Entry::Known(s.clone(), Instant::now());
            }
        }
        let this = self.clone();
        let sku = sku.to_string();
        tokio::spawn(async move {
            // A failed refresh keeps the cached row: claims never wait on PostgreSQL.
            // A copy of the checked id this was called with.
            let sku = SkuId::trusted(&sku);
            if let Ok(row) = fetch(&this.db, sku).await {
                this.remember(sku, row);
            }
        });
    }

    pub fn db(&self) -> &PgPool {
        &self.db
    }

    /// The SKU whose tag an id carries (see [`crate::ids`]); cached like ids are.
    ///
    /// # Errors
    /// The database error.
    pub async fn by_tag(&self, tag: i32) -> Result<Option<Arc<Sku>>, CatalogError> {
        let sku: Option<String> = sqlx::query_scalar("SELECT sku FROM skus WHERE tag = $1")
            .bind(tag)
            .fetch_optional(&self.db)
            .await
            .map_err(DbError::from)?;
        match sku {
            Some(sku) => self.get(SkuId::trusted(&sku)).await,
            None => Ok(None),
        }
    }
}

/// # Errors
/// The database error.
pub async fn fetch(db: &PgPool, sku: &SkuId) -> Result<Option<Sku>, DbError> {
    Ok(sqlx::query_as::<_, Sku>(
        "SELECT sku, total, per_user_limit, hold_seconds, seeded, redis_seq, declare_id,
                offer_seconds, opens_at, closes_at, tag, shards, shard_salts,
                queue_admit_per_second, queue_admission_ttl_seconds, queue_prequeue_from,
                queue_seed, queue_overbook_milli, queue_version, queue_page, seats
           FROM skus WHERE sku = $1",
    )
    .bind(sku)
    .fetch_optional(db)
    .await?
    .map(|mut row: Sku| {
        row.plan = row
            .seats
            .as_deref()
            .and_then(|j| serde_json::from_str(j).ok())
            .and_then(|v| crate::seating::SeatPlan::parse(&v).ok())
            .map(std::sync::Arc::new);
        row
    }))
}

/// Every SKU id, for reconcile (a one-off walk; no background loop reads the whole catalog).
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

/// Whether `s` is a valid SKU id (`^[A-Za-z0-9._-]{1,64}$`; the rule is [`SkuId::parse`]'s).
pub fn valid_sku_id(s: &str) -> bool {
    SkuId::parse(s).is_some()
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
