//! Knowing when Redis came back with older data (a restart from an older snapshot, an AOF
//! tail lost with its host, a failover to a lagging replica). See docs/freshness.md.
//!
//! Every script that changes a SKU's state bumps the state's sequence (`seq`); every winner's
//! journal entry carries the sequence it produced; the writer commits the highest one it wrote
//! to `skus.redis_seq` (the high-water mark). A state whose sequence is behind the mark has
//! forgotten sales PostgreSQL holds, so it must never sell again: it is marked stale in Redis
//! (every gateway then fails closed on it) until `restore` rewrites it from the ledger.
//!
//! A sequence alone stops telling once an older state's own moves carry it past the mark, so
//! the state also carries an incarnation (`inc`, a Redis-clock time): stamped by restore and
//! advanced every second by the refresher of a gateway that found the state fresh and moving
//! (`lua/rotate.lua`), then recorded in `skus.redis_inc` once the replicas hold it. A copy
//! taken before that rotation carries an older incarnation whatever its sequence becomes.
//!
//! The checks: every script that changes a state (`lua/lib/fresh.lua`, prepended) compares it
//! with the floor its caller sends, the mark and incarnation this gateway knows ([`Marks`]:
//! every catalog SKU's, loaded at start before anything is served, new SKUs as they appear,
//! its own writer's commits and a refresh every second of the SKUs it moves); the writer looks
//! for a sequence PostgreSQL already holds for another claim (a state that went back and sold
//! again before any script saw the mark); and the refresher compares every catalog SKU's state
//! once at start (or when the SKU appears) and the SKUs this gateway moves every second.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use sqlx::PgPool;

use crate::error::DbError;
use crate::metrics as m;
use crate::scripts;
use crate::store::Store;

mod refresh;

pub use refresh::{load_new, Refresher};

/// How often active SKUs' marks are re-read from PostgreSQL and compared with Redis.
const REFRESH: Duration = Duration::from_secs(1);

/// What a state must not be older than (`lua/lib/fresh.lua`): the ledger's high-water mark of
/// its sequence and the latest incarnation PostgreSQL recorded for it, as this gateway knows
/// them. Sent as `"seq:inc"`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Floor {
    pub seq: i64,
    pub inc: i64,
}

impl Floor {
    /// A floor of a sequence alone (incarnation 0: nothing recorded).
    pub fn seq(seq: i64) -> Floor {
        Floor { seq, inc: 0 }
    }
}

impl redis::ToRedisArgs for Floor {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        out.write_arg(format!("{}:{}", self.seq, self.inc).as_bytes());
    }
}

/// One Redis name's mark, as this gateway knows it.
#[derive(Default)]
struct Mark {
    seq: AtomicI64,
    inc: AtomicI64,
    /// Set once a script call of this gateway took its floor: the refresher then keeps the
    /// mark current every round (a SKU only loaded from the catalog is compared once).
    used: AtomicBool,
    /// The state's sequence at its last rotation by this gateway (-1: none yet).
    rotated_at: AtomicI64,
}

/// The highest state sequence and incarnation this gateway knows PostgreSQL recorded, per
/// Redis name: every SKU of the catalog (loaded at start and as new SKUs appear, before any
/// script call of this gateway moves them: [`load_new`]), shards included.
#[derive(Default)]
pub struct Marks {
    map: DashMap<String, Arc<Mark>>,
    /// The highest catalog `tag` loaded so far (tags only grow: new SKUs are those above).
    loaded_tag: AtomicI64,
    /// Names loaded from the catalog whose Redis state the refresher has not compared yet.
    unchecked: parking_lot::Mutex<Vec<String>>,
    /// Every name loaded from the catalog, and where the refresher's walk over them is: each
    /// round re-reads the floors of [`WALK`] of them, so a name this gateway has not moved yet
    /// has a floor at most a walk old when it first does.
    loaded: parking_lot::Mutex<(Vec<String>, usize)>,
}

/// Names whose floors each refresher round re-reads besides the ones this gateway moves: a
/// catalog of up to this many SKUs is re-read every second, a larger one in turns.
const WALK: usize = 2_000;

impl Marks {
    fn mark(&self, sku: &str) -> Arc<Mark> {
        if let Some(m) = self.map.get(sku) {
            return m.clone();
        }
        self.map
            .entry(sku.to_string())
            .or_insert_with(|| {
                Arc::new(Mark {
                    rotated_at: AtomicI64::new(-1),
                    ..Mark::default()
                })
            })
            .clone()
    }

    /// The mark of `sku` (0 when unknown: nothing to compare against yet).
    pub fn floor(&self, sku: &str) -> i64 {
        self.map
            .get(sku)
            .map_or(0, |m| m.seq.load(Ordering::Relaxed))
    }

    /// The floor of the Redis name `sku` for a script call that may change its state; the
    /// name is then kept current every round.
    pub fn fence(&self, sku: &str) -> Floor {
        let m = self.mark(sku);
        m.used.store(true, Ordering::Relaxed);
        Floor {
            seq: m.seq.load(Ordering::Relaxed),
            inc: m.inc.load(Ordering::Relaxed),
        }
    }

    /// The floor of `sku` as known, without making it a name kept current.
    fn fence_peek(&self, sku: &str) -> Floor {
        self.map.get(sku).map_or(Floor::default(), |m| Floor {
            seq: m.seq.load(Ordering::Relaxed),
            inc: m.inc.load(Ordering::Relaxed),
        })
    }

    /// Raises the mark of `sku` to `mark` (marks only grow).
    pub fn observe(&self, sku: &str, mark: i64) {
        let m = self.mark(sku);
        m.used.store(true, Ordering::Relaxed);
        m.seq.fetch_max(mark, Ordering::Relaxed);
    }

    /// Raises the recorded incarnation of `sku` to `inc`.
    pub fn observe_inc(&self, sku: &str, inc: i64) {
        self.mark(sku).inc.fetch_max(inc, Ordering::Relaxed);
    }

    /// Learns a name's mark from the catalog without making it one this gateway keeps current.
    fn learn(&self, sku: &str, seq: i64, inc: i64) {
        let m = self.mark(sku);
        m.seq.fetch_max(seq, Ordering::Relaxed);
        m.inc.fetch_max(inc, Ordering::Relaxed);
    }

    fn active(&self) -> Vec<String> {
        self.map
            .iter()
            .filter(|e| e.value().used.load(Ordering::Relaxed))
            .map(|e| e.key().clone())
            .collect()
    }

    /// The next [`WALK`] loaded names not in use here (in turns over the whole catalog).
    fn walk(&self) -> Vec<String> {
        let mut loaded = self.loaded.lock();
        let (names, at) = &mut *loaded;
        if names.is_empty() {
            return Vec::new();
        }
        let mut out = Vec::with_capacity(WALK.min(names.len()));
        for _ in 0..WALK.min(names.len()) {
            *at %= names.len();
            let name = &names[*at];
            *at += 1;
            if !self
                .map
                .get(name)
                .is_some_and(|m| m.used.load(Ordering::Relaxed))
            {
                out.push(name.clone());
            }
        }
        out
    }
}

/// Checks a written batch of winners of `sku` for sequences PostgreSQL already held for other
/// claims, and raises the SKU's mark to the batch's highest (`lifecycle_seq`: the highest
/// sequence of the batch's hold and waitlist records, which name no new claim). Returns the
/// new mark.
///
/// # Errors
/// The database error (the batch is written; the caller retries the check with the next one).
pub async fn record_batch(
    db: &PgPool,
    store: &Store,
    marks: &Marks,
    sku: &str,
    written: &[(i64, uuid::Uuid)],
    lifecycle_seq: Option<i64>,
) -> Result<i64, DbError> {
    // `sku` is a Redis name: a shard of a sharded SKU keeps its mark apart (its sequences
    // are its own, src/shards/mod.rs), and its rows carry the catalog SKU.
    let (catalog_sku, shard) = crate::keys::split_shard(sku);
    let (seqs, ids): (Vec<i64>, Vec<uuid::Uuid>) = written.iter().copied().unzip();
    let (clashes, mark): (i64, i64) = if shard == 0 {
        sqlx::query_as(
            "WITH batch AS (SELECT * FROM UNNEST($2::int8[], $3::uuid[]) AS t(seq, claim_id)),
                  mark AS (UPDATE skus SET redis_seq = GREATEST(redis_seq, (SELECT max(seq) FROM batch),
                                                                $4::int8)
                            WHERE sku = $1 RETURNING redis_seq)
             SELECT (SELECT count(*) FROM issuances i JOIN batch b
                       ON i.sku = $1 AND i.seq = b.seq AND i.claim_id <> b.claim_id),
                    COALESCE((SELECT redis_seq FROM mark), 0)",
        )
        .bind(catalog_sku)
        .bind(&seqs)
        .bind(&ids)
        .bind(lifecycle_seq)
        .fetch_one(db)
        .await?
    } else {
        let top = seqs.iter().copied().chain(lifecycle_seq).max().unwrap_or(0);
        let mark = crate::shards::marks::raise(db, sku, top).await?;
        let clashes: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM issuances i
               JOIN UNNEST($2::int8[], $3::uuid[]) AS b(seq, claim_id)
                 ON i.sku = $1 AND i.seq = b.seq AND i.claim_id <> b.claim_id",
        )
        .bind(catalog_sku)
        .bind(&seqs)
        .bind(&ids)
        .fetch_one(db)
        .await?;
        (clashes, mark)
    };
    marks.observe(sku, mark);
    if clashes > 0 {
        close_stale(store, sku, "a state sequence was used twice").await;
    }
    Ok(mark)
}

/// Marks the SKU's Redis state stale (every gateway fails closed on it until a restore).
pub async fn close_stale(store: &Store, sku: &str, why: &str) {
    let keys = store.keys(sku);
    let mut con = store.hot();
    match store
        .bounded(scripts::mark_stale(&mut con, &keys, why))
        .await
    {
        Ok(true) => {
            m::stale_state();
            tracing::error!(
                sku,
                why,
                "redis holds an older state than the ledger: the SKU is closed until restore"
            );
        }
        Ok(false) => {}
        Err(e) => tracing::warn!(sku, error = %e, "could not mark a stale state; retrying"),
    }
}
