//! A restore's part for the waiting room: the line rebuilt from the tickets PostgreSQL holds
//! ([`super::tickets`]), every ticket back in its place (the line's order) and its state (its
//! admission and the admission's fixed expiry), so after Redis lost the line or came back with
//! an older one no visitor loses their ticket, place or token, and no ticket admitted before is
//! admitted again.
//!
//! It runs while the restore has the SKU's state out of Redis (`close_sku.lua`): every queue
//! script then answers `lost`, so nothing joins, reads or admits a half-built line. Work grows
//! with the line, so it is written [`CHUNK`] tickets a pipeline.

use futures_util::TryStreamExt;
use sqlx::PgPool;
use uuid::Uuid;

use crate::error::InventoryError;
use crate::store::Store;

/// Tickets one pipeline writes.
const CHUNK: usize = 5000;
/// Orders from here up are arrivals after the opening: 2^52 + the arrival number
/// (`lua/join_queue.lua`).
const ARRIVALS: i64 = 1 << 52;

/// What the rebuild put back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rebuilt {
    pub waiting: u64,
    pub admitted: u64,
    /// The line's sequence it starts from: the mark PostgreSQL holds.
    pub seq: i64,
}

/// Rebuilds `sku`'s line from the ledger: what the log in Redis still holds is copied first
/// (a forced restore of a line Redis did not lose), then the line's keys are written anew.
///
/// # Errors
/// Redis or database errors; the SKU's state is still out of Redis then, so the line stays
/// closed until a restore finishes.
pub async fn rebuild(store: &Store, db: &PgPool, sku: &str) -> Result<Rebuilt, InventoryError> {
    match super::tickets::flush(store, db, sku).await {
        // An older line that moved on contradicts the ledger: what it says is dropped (no
        // visitor was answered from it), the ledger's line is written below.
        Err(InventoryError::Store(crate::error::StoreError::Stale)) => {}
        r => r?,
    }
    let mark: i64 = sqlx::query_scalar("SELECT queue_seq FROM skus WHERE sku = $1")
        .bind(sku)
        .fetch_one(db)
        .await?;
    let keys = store.keys(sku);
    let [hash, line, admitted, _, _, _, _, exp, live, who, log] = keys.queue();
    let mut con = store.hot();
    store
        .bounded(async {
            Ok(redis::cmd("DEL")
                .arg(&line)
                .arg(&admitted)
                .arg(&exp)
                .arg(&live)
                .arg(&who)
                .arg(&log)
                .query_async::<()>(&mut con)
                .await?)
        })
        .await?;
    let mut out = Rebuilt {
        seq: mark,
        ..Rebuilt::default()
    };
    let (mut arrivals, mut first_ms) = (0i64, 0i64);
    let mut rows = sqlx::query_as::<_, (Uuid, String, i64, Option<i64>, Option<i64>)>(
        "SELECT ticket, visitor, ord, admitted_ms, expires_ms FROM queue_tickets WHERE sku = $1",
    )
    .bind(sku)
    .fetch(db);
    let mut pipe = redis::pipe();
    let mut in_pipe = 0;
    while let Some((ticket, visitor, ord, at, ex)) = rows.try_next().await? {
        let t = ticket.as_bytes().as_slice();
        pipe.cmd("HSET").arg(&who).arg(t).arg(&visitor).ignore();
        if ord >= ARRIVALS {
            arrivals = arrivals.max(ord - ARRIVALS);
        }
        match (at, ex) {
            (Some(at), Some(ex)) => {
                pipe.cmd("ZADD").arg(&admitted).arg(at).arg(t).ignore();
                pipe.cmd("HSET").arg(&exp).arg(t).arg(ex).ignore();
                pipe.cmd("ZADD").arg(&live).arg(ex).arg(t).ignore();
                first_ms = if first_ms == 0 { at } else { first_ms.min(at) };
                out.admitted += 1;
            }
            _ => {
                pipe.cmd("ZADD").arg(&line).arg(ord).arg(t).ignore();
                out.waiting += 1;
            }
        }
        in_pipe += 1;
        if in_pipe == CHUNK {
            send(store, &mut pipe).await?;
            in_pipe = 0;
        }
    }
    drop(rows);
    pipe.cmd("HSET")
        .arg(&hash)
        .arg("qseq")
        .arg(mark)
        .arg("admitted_total")
        .arg(out.admitted)
        .ignore();
    // New arrivals queue behind every arrival the ledger holds.
    pipe.cmd("HSET")
        .arg(&hash)
        .arg("seq")
        .arg(arrivals)
        .ignore();
    if first_ms > 0 {
        pipe.cmd("HSET")
            .arg(&hash)
            .arg("first_ms")
            .arg(first_ms)
            .ignore();
    }
    send(store, &mut pipe).await?;
    store.raise_line_floor(sku, mark);
    Ok(out)
}

async fn send(store: &Store, pipe: &mut redis::Pipeline) -> Result<(), InventoryError> {
    let mut con = store.hot();
    store
        .bounded(async { Ok(pipe.query_async::<()>(&mut con).await?) })
        .await?;
    *pipe = redis::pipe();
    Ok(())
}
