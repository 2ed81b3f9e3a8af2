//! The batched writer: moves winners from each SKU's journal (a Redis Stream appended by
//! claim.lua in the same atomic step as the decrement) into PostgreSQL's `issuances`.
//!
//! Delivery is at least once and the insert is idempotent (`ON CONFLICT (claim_id) DO
//! NOTHING`), so every winner is written exactly once: an entry is acknowledged only after the
//! commit that holds it, and entries left unacknowledged by a gateway that died are taken over
//! with XAUTOCLAIM once they have been idle for `journal_claim_idle`.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;
use sqlx::PgPool;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::catalog;
use crate::error::{DbError, StoreError};
use crate::keys::SkuKeys;
use crate::metrics as m;
use crate::scripts::SCRIPTS;
use crate::store::Store;

pub const GROUP: &str = "writers";
/// Entries read per SKU per round; also the largest insert batch.
const READ_COUNT: usize = 2048;
/// Every SKU of the catalog is read this often, wake-up or not.
const SWEEP: Duration = Duration::from_millis(500);
/// Retry pace of the writer itself while PostgreSQL or Redis is unreachable.
const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

/// How the claim path tells the writer that winners are waiting: a wake-up, and the SKUs
/// that won since, so a SKU declared a moment ago is read before the next catalog refresh.
#[derive(Default)]
pub struct WriterSignal {
    wake: Notify,
    skus: parking_lot::Mutex<HashSet<String>>,
}

impl WriterSignal {
    /// Called after a win. Takes the lock only to check a small set; allocates only for a SKU
    /// the writer has not been told about yet.
    pub fn won(&self, sku: &str) {
        {
            let mut skus = self.skus.lock();
            if !skus.contains(sku) {
                skus.insert(sku.to_string());
            }
        }
        self.wake.notify_one();
    }

    /// The SKUs signalled since the last call.
    fn take(&self) -> HashSet<String> {
        std::mem::take(&mut *self.skus.lock())
    }
}

/// One winner as the journal holds it.
#[derive(Debug, Clone)]
pub struct Winner {
    /// Stream entry id, acknowledged after the commit.
    pub entry_id: String,
    pub claim_id: Uuid,
    pub sku: String,
    pub user: String,
    pub quantity: i32,
    pub idempotency_key: Option<String>,
    pub remaining_after: Option<i64>,
    pub created_ms: i64,
}

/// Moves journaled winners into PostgreSQL.
pub struct Writer {
    store: Store,
    db: PgPool,
    /// This process's consumer name in the group; a restarted gateway is a new consumer and
    /// its predecessor's unacknowledged entries are taken over by idle time.
    consumer: String,
    /// Woken by the claim path after a win, so a winner is written within milliseconds.
    signal: Arc<WriterSignal>,
    claim_idle: Duration,
    /// Delay before a parked row's first retry (DROPGATE_REPROCESS_BACKOFF_MS).
    first_retry: Duration,
}

impl Writer {
    pub fn new(
        store: Store,
        db: PgPool,
        signal: Arc<WriterSignal>,
        claim_idle: Duration,
        first_retry: Duration,
    ) -> Self {
        Writer {
            store,
            db,
            consumer: format!("gw-{}", Uuid::new_v4().simple()),
            signal,
            claim_idle,
            first_retry,
        }
    }

    /// Runs until `shutdown`, then drains what the journals hold once more and returns.
    ///
    /// SKUs that won on this gateway are read as soon as the claim path signals them; every
    /// SKU of the catalog is swept once per [`SWEEP`] (winners of other gateways, entries of
    /// dead ones, retries after a failure), so the cost of idle SKUs stays flat.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut catalog_skus: Vec<String> = Vec::new();
        let mut last_sweep: Option<Instant> = None;
        let mut last_autoclaim = Instant::now();
        let mut backoff = Duration::ZERO;
        // SKUs whose last read came back full: more is waiting.
        let mut unfinished: HashSet<String> = HashSet::new();
        loop {
            let stopping = shutdown.is_cancelled();
            let sweep =
                stopping || !backoff.is_zero() || last_sweep.is_none_or(|t| t.elapsed() > SWEEP);
            let mut targets: HashSet<String> = self.signal.take();
            targets.extend(unfinished.drain());
            if sweep {
                if let Ok(list) = catalog::all_ids(&self.db).await {
                    catalog_skus = list;
                }
                targets.extend(catalog_skus.iter().cloned());
                last_sweep = Some(Instant::now());
            }
            let autoclaim = sweep && last_autoclaim.elapsed() > self.claim_idle / 2;
            if autoclaim {
                last_autoclaim = Instant::now();
            }
            let mut moved = 0usize;
            let mut failed = false;
            for sku in &targets {
                match self.pass(sku, autoclaim, !backoff.is_zero()).await {
                    Ok(n) => {
                        moved += n;
                        if n >= READ_COUNT {
                            unfinished.insert(sku.clone());
                        }
                    }
                    Err(e) => {
                        failed = true;
                        tracing::warn!(sku, error = %e, "writer pass failed; the journal keeps the winners");
                    }
                }
            }
            if failed {
                backoff = (backoff * 2).clamp(BACKOFF_MIN, BACKOFF_MAX);
            } else {
                backoff = Duration::ZERO;
            }
            if stopping {
                if moved == 0 || failed {
                    break;
                }
                continue;
            }
            if !unfinished.is_empty() && !failed {
                continue;
            }
            let pause = if failed { backoff } else { SWEEP };
            tokio::select! {
                _ = self.signal.wake.notified(), if !failed => {}
                _ = tokio::time::sleep(pause) => {}
                _ = shutdown.cancelled() => {}
            }
        }
        tracing::info!(consumer = %self.consumer, "writer stopped");
    }

    /// Reads one SKU's journal and writes what it holds. `own_pending` re-reads entries this
    /// consumer took but could not write (after a failure), before new ones.
    async fn pass(
        &mut self,
        sku: &str,
        autoclaim: bool,
        own_pending: bool,
    ) -> Result<usize, WriteError> {
        let keys = self.store.keys(sku);
        let mut winners = Vec::new();
        if autoclaim {
            winners.extend(self.autoclaim(sku, &keys).await?);
        }
        if own_pending {
            winners.extend(self.read(sku, &keys, "0").await?);
        }
        if winners.is_empty() {
            winners = self.read(sku, &keys, ">").await?;
        }
        if winners.is_empty() {
            return Ok(0);
        }
        // The same entry may come from two reads above; write it once.
        winners.sort_by(|a, b| a.entry_id.cmp(&b.entry_id));
        winners.dedup_by(|a, b| a.entry_id == b.entry_id);
        let started = Instant::now();
        write_batch(&self.db, &winners, self.first_retry).await?;
        m::writer_batch(winners.len(), started.elapsed());
        let now = crate::claims::now_ms();
        for w in &winners {
            m::journal_lag(Duration::from_millis((now - w.created_ms).max(0) as u64));
        }
        ack(&self.store, &keys, &winners).await?;
        Ok(winners.len())
    }

    async fn read(&self, sku: &str, keys: &SkuKeys, from: &str) -> Result<Vec<Winner>, WriteError> {
        let mut con = self
            .store
            .pool()
            .get()
            .await
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        let reply: Value = self
            .store
            .bounded(async {
                Ok(redis::cmd("XREADGROUP")
                    .arg("GROUP")
                    .arg(GROUP)
                    .arg(&self.consumer)
                    .arg("COUNT")
                    .arg(READ_COUNT)
                    .arg("STREAMS")
                    .arg(keys.journal())
                    .arg(from)
                    .query_async(&mut *con)
                    .await?)
            })
            .await
            .or_else(nogroup_is_empty)?;
        // Reply: [[stream, [[id, [field, value, ...]], ...]]] or nil.
        let mut out = Vec::new();
        if let Value::Array(streams) = reply {
            for s in streams {
                if let Value::Array(mut parts) = s {
                    if parts.len() == 2 {
                        out.extend(parse_entries(sku, parts.remove(1)));
                    }
                }
            }
        }
        Ok(out)
    }

    async fn autoclaim(&self, sku: &str, keys: &SkuKeys) -> Result<Vec<Winner>, WriteError> {
        let mut con = self
            .store
            .pool()
            .get()
            .await
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        let reply: Value = self
            .store
            .bounded(async {
                Ok(redis::cmd("XAUTOCLAIM")
                    .arg(keys.journal())
                    .arg(GROUP)
                    .arg(&self.consumer)
                    .arg(self.claim_idle.as_millis() as u64)
                    .arg("0-0")
                    .arg("COUNT")
                    .arg(READ_COUNT)
                    .query_async(&mut *con)
                    .await?)
            })
            .await
            .or_else(nogroup_is_empty)?;
        // Reply: [next-cursor, [[id, fields], ...], [deleted ids]].
        let out = match reply {
            Value::Array(mut parts) if parts.len() >= 2 => parse_entries(sku, parts.remove(1)),
            _ => Vec::new(),
        };
        if !out.is_empty() {
            tracing::info!(
                sku,
                entries = out.len(),
                "took over journal entries of a gateway that stopped"
            );
        }
        Ok(out)
    }
}

/// A stream or group that does not exist (Redis lost the SKU) simply has nothing to read.
fn nogroup_is_empty(e: StoreError) -> Result<Value, StoreError> {
    match &e {
        StoreError::Redis(r) if r.code() == Some("NOGROUP") => Ok(Value::Nil),
        _ => Err(e),
    }
}

fn parse_entries(sku: &str, v: Value) -> Vec<Winner> {
    let Value::Array(entries) = v else {
        return Vec::new();
    };
    entries
        .into_iter()
        .filter_map(|e| parse_entry(sku, e))
        .collect()
}

fn parse_entry(sku: &str, v: Value) -> Option<Winner> {
    let Value::Array(mut parts) = v else {
        return None;
    };
    if parts.len() != 2 {
        return None;
    }
    let Value::Array(fields) = parts.pop()? else {
        return None;
    };
    let entry_id = as_string(parts.pop()?)?;
    let mut w = Winner {
        entry_id,
        claim_id: Uuid::nil(),
        sku: sku.to_string(),
        user: String::new(),
        quantity: 0,
        idempotency_key: None,
        remaining_after: None,
        created_ms: 0,
    };
    let mut it = fields.into_iter();
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        let (k, v) = (as_string(k)?, as_string(v)?);
        match k.as_str() {
            "id" => w.claim_id = Uuid::parse_str(&v).ok()?,
            "user" => w.user = v,
            "qty" => w.quantity = v.parse().ok()?,
            "idem" if !v.is_empty() => w.idempotency_key = Some(v),
            "ms" => w.created_ms = v.parse().ok()?,
            "rem" => w.remaining_after = v.parse().ok(),
            _ => {}
        }
    }
    (!w.claim_id.is_nil() && w.quantity > 0).then_some(w)
}

fn as_string(v: Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b).ok(),
        Value::SimpleString(s) => Some(s),
        _ => None,
    }
}

/// Acknowledges written entries (and drops their units from `inflight`, once).
async fn ack(store: &Store, keys: &SkuKeys, winners: &[Winner]) -> Result<(), StoreError> {
    let mut inv = SCRIPTS.ack_journal.prepare_invoke();
    inv.key(keys.state()).key(keys.journal()).arg(GROUP);
    for w in winners {
        inv.arg(&w.entry_id).arg(w.quantity);
    }
    let mut con = store.hot();
    store
        .bounded(async { Ok(inv.invoke_async::<i64>(&mut con).await?) })
        .await?;
    Ok(())
}

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Db(#[from] DbError),
}

impl From<sqlx::Error> for WriteError {
    fn from(e: sqlx::Error) -> Self {
        WriteError::Db(DbError::from(e))
    }
}

const INSERT_ISSUANCES: &str = "INSERT INTO issuances
      (claim_id, sku, user_id, quantity, idempotency_key, remaining_after, created_at)
    SELECT c, s, u, q, k, r, to_timestamp(ms::double precision / 1000)
      FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::int4[], $5::text[], $6::int8[], $7::int8[])
        AS t(c, s, u, q, k, r, ms)
    ON CONFLICT (claim_id) DO NOTHING";

/// Inserts winners in one statement; when PostgreSQL refuses the batch, splits it so the good
/// rows land, and moves each refused row to `persistence_pending` with the database's reason.
///
/// # Errors
/// A retryable database error (unreachable): nothing is acknowledged and the batch is tried
/// again later.
pub async fn write_batch(
    db: &PgPool,
    winners: &[Winner],
    first_retry: Duration,
) -> Result<(), DbError> {
    let mut stack: Vec<&[Winner]> = vec![winners];
    while let Some(chunk) = stack.pop() {
        match insert(db, chunk).await {
            Ok(()) => {}
            Err(e) if e.is_retryable() => return Err(e),
            Err(e) if chunk.len() == 1 => {
                m::writer_refused(1);
                park(db, &chunk[0], &e.to_string(), first_retry).await?;
            }
            Err(_) => {
                let (a, b) = chunk.split_at(chunk.len() / 2);
                stack.push(b);
                stack.push(a);
            }
        }
    }
    Ok(())
}

async fn insert(db: &PgPool, rows: &[Winner]) -> Result<(), DbError> {
    sqlx::query(INSERT_ISSUANCES)
        .bind(rows.iter().map(|w| w.claim_id).collect::<Vec<_>>())
        .bind(rows.iter().map(|w| w.sku.as_str()).collect::<Vec<_>>())
        .bind(rows.iter().map(|w| w.user.as_str()).collect::<Vec<_>>())
        .bind(rows.iter().map(|w| w.quantity).collect::<Vec<_>>())
        .bind(
            rows.iter()
                .map(|w| w.idempotency_key.as_deref())
                .collect::<Vec<_>>(),
        )
        .bind(rows.iter().map(|w| w.remaining_after).collect::<Vec<_>>())
        .bind(rows.iter().map(|w| w.created_ms).collect::<Vec<_>>())
        .execute(db)
        .await?;
    Ok(())
}

/// Records a winner PostgreSQL refused, for the reprocessing loop.
async fn park(db: &PgPool, w: &Winner, reason: &str, first_retry: Duration) -> Result<(), DbError> {
    tracing::warn!(claim_id = %w.claim_id, sku = %w.sku, reason, "postgres refused a winner; parked in persistence_pending");
    sqlx::query(
        "INSERT INTO persistence_pending
           (claim_id, sku, user_id, quantity, idempotency_key, remaining_after, created_at,
            failure_reason, next_attempt_at)
         VALUES ($1, $2, $3, $4, $5, $6, to_timestamp($7::double precision / 1000), $8,
                 now() + make_interval(secs => $9::double precision / 1000))
         ON CONFLICT (claim_id) DO NOTHING",
    )
    .bind(w.claim_id)
    .bind(&w.sku)
    .bind(&w.user)
    .bind(w.quantity)
    .bind(&w.idempotency_key)
    .bind(w.remaining_after)
    .bind(w.created_ms)
    .bind(reason)
    .bind(first_retry.as_millis() as f64)
    .execute(db)
    .await?;
    Ok(())
}
