//! The waiting room's tickets in PostgreSQL (`queue_tickets`, migration 0023): as durable as
//! claims. Every join and every round that admits logs itself in Redis in the same atomic step
//! that makes it (the line's log, `{sku}:q:log`, `lua/lib/queue.lua`), numbered by the line's
//! own sequence (`qseq`). The [`Recorder`], a task of every gateway, copies each queued SKU's
//! log into `queue_tickets` in batches and raises `skus.queue_seq` (the line's mark) in the
//! same transaction, then trims what it wrote.
//!
//! Two uses: a line in Redis whose `qseq` is behind the mark is an older copy (a rollback, a
//! failover to a lagging replica) and fails closed like an older state; and a restore puts
//! every ticket back in place and state ([`super::rebuild`]).
//!
//! A join is answered, and an admitted ticket's token handed out, only once the line is recorded
//! up to the reading that answers it ([`recorded`]: this gateway's recorder is woken at once,
//! so joins arriving together share one transaction).
//!
//! Several gateways may copy the same entries at once: joins are `ON CONFLICT DO NOTHING`, an
//! admission is kept only where none was recorded (a ticket is admitted once, I4), the mark
//! only grows. An entry is trimmed only after its transaction committed, so a SIGKILL between
//! the two leaves it to be copied again, to the same effect.

use std::time::Duration;

use redis::Value;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::error::StoreError;
use crate::keys::SkuKeys;
use crate::store::Store;

/// Between the recorder's rounds: how far the ledger's copy of a line lags Redis's.
const TICK: Duration = Duration::from_millis(100);
/// Log entries one transaction copies (a round of admissions is one entry).
const BATCH: usize = 2000;

/// One change of a line, as its log holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Joined {
        ticket: Uuid,
        visitor: String,
        ord: i64,
    },
    Admitted {
        tickets: Vec<Uuid>,
        at_ms: i64,
        expires_ms: i64,
    },
}

/// One log entry: its stream id, the line's sequence it took, the change.
#[derive(Debug, Clone)]
pub struct Entry {
    pub id: String,
    pub seq: i64,
    pub change: Change,
}

pub struct Recorder {
    pub store: Store,
    pub db: PgPool,
}

impl Recorder {
    pub async fn run(self, shutdown: CancellationToken) {
        loop {
            let stopping = shutdown.is_cancelled();
            if let Err(e) = self.round().await {
                tracing::debug!(error = %e, "queue tickets: a round did not finish; the log keeps what was not written");
            }
            if stopping {
                break;
            }
            tokio::select! {
                _ = tokio::time::sleep(TICK) => {}
                _ = self.store.line_wake().notified() => {}
                _ = shutdown.cancelled() => {}
            }
        }
        tracing::info!("queue ticket recorder stopped");
    }

    /// Reads every queued SKU's mark (raising this gateway's floors) and copies its log.
    async fn round(&self) -> Result<(), crate::error::InventoryError> {
        let rows: Vec<(String, i64)> = sqlx::query_as(
            "SELECT sku, queue_seq FROM skus WHERE queue_admit_per_second IS NOT NULL",
        )
        .fetch_all(&self.db)
        .await?;
        // Every floor first: a SKU whose log cannot be copied now (Redis away) must not keep
        // another's floor behind the ledger (an older line would pass it meanwhile).
        for (sku, mark) in &rows {
            self.store.raise_line_floor(sku, *mark);
        }
        let mut failed = None;
        for (sku, _) in rows {
            if let Err(e) = flush(&self.store, &self.db, &sku).await {
                failed = Some(e);
            }
        }
        failed.map_or(Ok(()), Err)
    }
}

/// How long a join (or an admitted ticket's reading) waits for its line to be recorded before
/// it answers 503 (the visitor joins again: the same ticket).
pub const RECORD_WAIT: Duration = Duration::from_secs(3);

/// Waits until PostgreSQL holds `sku`'s line up to `seq` (this gateway's recorder is woken;
/// another gateway's record shows in the marks it re-reads). `false` past [`RECORD_WAIT`].
/// A join is answered, and an admission's token handed out, only then: a ticket a visitor was
/// told of is never one that Redis losing its data or coming back older can forget.
pub async fn recorded(store: &Store, sku: &str, seq: i64) -> bool {
    let deadline = tokio::time::Instant::now() + RECORD_WAIT;
    loop {
        if store.line_floor(sku) >= seq {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        store.line_wake().notify_one();
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
}

/// Loads every queued SKU's line mark into the store's floors: at start, before anything is
/// served, so a line older than the ledger fails closed on its first call.
///
/// # Errors
/// The database error.
pub async fn load_marks(store: &Store, db: &PgPool) -> Result<usize, sqlx::Error> {
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT sku, queue_seq FROM skus WHERE queue_seq > 0")
            .fetch_all(db)
            .await?;
    for (sku, mark) in &rows {
        store.raise_line_floor(sku, *mark);
    }
    Ok(rows.len())
}

/// Copies `sku`'s whole log into PostgreSQL, a batch per transaction, trimming each batch once
/// it is committed.
///
/// # Errors
/// The Redis or database error; what was not copied stays in the log.
/// [`StoreError::Stale`] when the log contradicts the ledger ([`Recorded::Clash`]): the line
/// was closed, nothing of the batch written.
pub async fn flush(
    store: &Store,
    db: &PgPool,
    sku: &str,
) -> Result<(), crate::error::InventoryError> {
    let keys = store.keys(sku);
    loop {
        let entries = store.bounded(read_log(store, &keys)).await?;
        if entries.is_empty() {
            return Ok(());
        }
        if let Recorded::Clash(why) = record(db, sku, &entries).await? {
            // Nothing of it was written and nothing is trimmed: the line stays closed, and no
            // visitor is answered from it, until a restore rebuilds it from the ledger.
            crate::freshness::close_stale(store, sku, &why).await;
            return Err(StoreError::Stale.into());
        }
        if let Some(top) = entries.iter().map(|e| e.seq).max() {
            store.raise_line_floor(sku, top);
        }
        let ids: Vec<&str> = entries.iter().map(|e| e.id.as_str()).collect();
        let mut con = store.hot();
        let log = &keys.queue()[10];
        store
            .bounded(async {
                Ok(redis::cmd("XDEL")
                    .arg(log)
                    .arg(&ids)
                    .query_async::<i64>(&mut con)
                    .await?)
            })
            .await?;
        if entries.len() < BATCH {
            return Ok(());
        }
    }
}

async fn read_log(store: &Store, keys: &SkuKeys) -> Result<Vec<Entry>, StoreError> {
    let mut con = store.hot();
    let log = &keys.queue()[10];
    let v: Value = redis::cmd("XRANGE")
        .arg(log)
        .arg("-")
        .arg("+")
        .arg("COUNT")
        .arg(BATCH)
        .query_async(&mut con)
        .await?;
    parse(v)
}

/// The log entries of an XRANGE answer; one it cannot read is a protocol error (the log is
/// written by this gateway's own scripts only).
pub fn parse(v: Value) -> Result<Vec<Entry>, StoreError> {
    let bad = |what: &str| StoreError::Protocol(format!("queue log: {what}"));
    let Value::Array(items) = v else {
        return Err(bad("not an array"));
    };
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let Value::Array(pair) = item else {
            return Err(bad("entry"));
        };
        let [id, Value::Array(fields)] = &pair[..] else {
            return Err(bad("entry shape"));
        };
        let id = bytes(id).ok_or_else(|| bad("id"))?;
        let field = |name: &str| -> Option<&[u8]> {
            fields
                .chunks(2)
                .find(|kv| bytes(&kv[0]).as_deref() == Some(name.as_bytes()))
                .and_then(|kv| raw(&kv[1]))
        };
        let num = |name: &str| -> Result<i64, StoreError> {
            field(name)
                .and_then(|b| std::str::from_utf8(b).ok())
                .and_then(|s| s.parse::<f64>().ok())
                .map(|f| f as i64)
                .ok_or_else(|| bad(name))
        };
        let uuid = |b: &[u8]| Uuid::from_slice(b).map_err(|_| bad("ticket"));
        let change = match field("k") {
            Some(b"j") => Change::Joined {
                ticket: uuid(field("t").ok_or_else(|| bad("t"))?)?,
                visitor: String::from_utf8_lossy(field("v").unwrap_or_default()).into_owned(),
                ord: num("o")?,
            },
            Some(b"a") => Change::Admitted {
                tickets: field("t")
                    .unwrap_or_default()
                    .chunks(16)
                    .map(uuid)
                    .collect::<Result<_, _>>()?,
                at_ms: num("at")?,
                expires_ms: num("ex")?,
            },
            _ => return Err(bad("kind")),
        };
        out.push(Entry {
            id: String::from_utf8_lossy(&id).into_owned(),
            seq: num("n")?,
            change,
        });
    }
    Ok(out)
}

fn raw(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

fn bytes(v: &Value) -> Option<Vec<u8>> {
    raw(v).map(<[u8]>::to_vec)
}

/// What [`record`] did with a batch of the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    Written,
    /// The log says what the ledger holds otherwise (a ticket joined at another place, or
    /// admitted at another time): Redis holds an older line that moved on (a rollback within
    /// the moment before a gateway learnt the mark). Nothing was written.
    Clash(String),
}

/// Writes `entries` of `sku`'s log in one transaction: joins, then admissions (an admission's
/// join is earlier in the same log, so in this batch or an earlier committed one), then the
/// line's mark. Entries copied again (by another gateway, or after a crash before the trim)
/// write nothing new; an entry that contradicts the ledger writes nothing at all.
async fn record(db: &PgPool, sku: &str, entries: &[Entry]) -> Result<Recorded, sqlx::Error> {
    let (mut tickets, mut visitors, mut ords) = (Vec::new(), Vec::new(), Vec::new());
    let (mut admitted, mut ats, mut exps) = (Vec::new(), Vec::new(), Vec::new());
    for e in entries {
        match &e.change {
            Change::Joined {
                ticket,
                visitor,
                ord,
            } => {
                tickets.push(*ticket);
                visitors.push(visitor.clone());
                ords.push(*ord);
            }
            Change::Admitted {
                tickets: t,
                at_ms,
                expires_ms,
            } => {
                for ticket in t {
                    admitted.push(*ticket);
                    ats.push(*at_ms);
                    exps.push(*expires_ms);
                }
            }
        }
    }
    let top = entries.iter().map(|e| e.seq).max().unwrap_or(0);
    let mut tx = db.begin().await?;
    if !tickets.is_empty() {
        sqlx::query(
            "INSERT INTO queue_tickets (sku, ticket, visitor, ord)
             SELECT $1, * FROM UNNEST($2::uuid[], $3::text[], $4::int8[])
             ON CONFLICT (sku, ticket) DO NOTHING",
        )
        .bind(sku)
        .bind(&tickets)
        .bind(&visitors)
        .bind(&ords)
        .execute(&mut *tx)
        .await?;
        let moved: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM queue_tickets q
               JOIN UNNEST($2::uuid[], $3::int8[]) AS j(ticket, ord) ON q.ticket = j.ticket
              WHERE q.sku = $1 AND q.ord <> j.ord",
        )
        .bind(sku)
        .bind(&tickets)
        .bind(&ords)
        .fetch_one(&mut *tx)
        .await?;
        if moved > 0 {
            return Ok(Recorded::Clash(format!(
                "line-clash: {moved} ticket(s) joined again at another place"
            )));
        }
    }
    if !admitted.is_empty() {
        sqlx::query(
            "UPDATE queue_tickets q SET admitted_ms = a.at, expires_ms = a.ex
               FROM UNNEST($2::uuid[], $3::int8[], $4::int8[]) AS a(ticket, at, ex)
              WHERE q.sku = $1 AND q.ticket = a.ticket AND q.admitted_ms IS NULL",
        )
        .bind(sku)
        .bind(&admitted)
        .bind(&ats)
        .bind(&exps)
        .execute(&mut *tx)
        .await?;
        let twice: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM queue_tickets q
               JOIN UNNEST($2::uuid[], $3::int8[]) AS a(ticket, at) ON q.ticket = a.ticket
              WHERE q.sku = $1 AND q.admitted_ms IS DISTINCT FROM a.at",
        )
        .bind(sku)
        .bind(&admitted)
        .bind(&ats)
        .fetch_one(&mut *tx)
        .await?;
        if twice > 0 {
            return Ok(Recorded::Clash(format!(
                "line-clash: {twice} ticket(s) admitted again"
            )));
        }
    }
    sqlx::query("UPDATE skus SET queue_seq = GREATEST(queue_seq, $2) WHERE sku = $1")
        .bind(sku)
        .bind(top)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(Recorded::Written)
}
