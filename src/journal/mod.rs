//! A SKU's journal: the Redis Stream claim.lua appends winners to (one entry per call, carrying
//! all its winners: `call_entry.rs`) and every lifecycle script its changes to, in the same
//! atomic step as the decision; consumed by the group [`GROUP`] so that each entry is owned by
//! one writer at a time (src/writer/), and read by the SKU view (src/books.rs).
//!
//! - reading it ([`read`], [`autoclaim`], [`raw_entry`]) and acknowledging what PostgreSQL
//!   holds ([`ack`]), here;
//! - what an entry carries ([`Batch`]: winners, hold and waitlist changes, what cannot be
//!   read) and its one parser (`entry.rs`);
//! - the writer's wake-up ([`WriterSignal`]) and the consumer names of writers that are gone
//!   (`consumers.rs`).

use std::collections::BTreeMap;
use std::time::Duration;

use redis::Value;

use crate::error::StoreError;
use crate::keys::ShardName;
use crate::scripts;
use crate::store::Store;

mod batch;
mod call_entry;
mod consumers;
mod entry;
mod signal;

pub use crate::keys::JOURNAL_GROUP as GROUP;
pub use crate::scripts::journal::Forget;
pub use batch::{Batch, Change, Other, Unreadable, WaitChange, Winner};
pub use consumers::{reap_idle_consumers, GONE_AFTER_CLAIM_IDLES};
pub use entry::{entry_batch, parse_one, render, winners_of};
use entry::{parse_entries, raw_fields};
pub use signal::WriterSignal;

/// Entries read per SKU per round. An entry holds the winners of one claim.lua call (up to
/// 128), so the largest insert batch is 32,768 rows.
pub const READ_COUNT: usize = 256;

/// New entries (`from` = ">") or this consumer's own unacknowledged ones (`from` = "0").
pub async fn read(
    store: &Store,
    consumer: &str,
    name: &ShardName,
    from: &str,
) -> Result<Batch, StoreError> {
    let mut cmd = redis::cmd("XREADGROUP");
    cmd.arg("GROUP")
        .arg(GROUP)
        .arg(consumer)
        .arg("COUNT")
        .arg(READ_COUNT)
        .arg("STREAMS")
        .arg(store.keys(name).journal())
        .arg(from);
    // Reply: [[stream, [[id, [field, value, ...]], ...]]] or nil.
    let mut out = Batch::default();
    if let Value::Array(streams) = read_call(store, name, cmd).await? {
        for s in streams {
            if let Value::Array(mut parts) = s {
                if parts.len() == 2 {
                    parse_entries(name, parts.remove(1), &mut out);
                }
            }
        }
    }
    Ok(out)
}

/// Takes over entries another consumer (a gateway that died) left idle for `idle`.
pub async fn autoclaim(
    store: &Store,
    consumer: &str,
    idle: Duration,
    name: &ShardName,
) -> Result<Batch, StoreError> {
    let mut cmd = redis::cmd("XAUTOCLAIM");
    cmd.arg(store.keys(name).journal())
        .arg(GROUP)
        .arg(consumer)
        .arg(idle.as_millis() as u64)
        .arg("0-0")
        .arg("COUNT")
        .arg(READ_COUNT);
    // Reply: [next-cursor, [[id, fields], ...], [deleted ids]].
    let mut out = Batch::default();
    if let Value::Array(mut parts) = read_call(store, name, cmd).await? {
        if parts.len() >= 2 {
            parse_entries(name, parts.remove(1), &mut out);
        }
    }
    if !out.is_empty() {
        tracing::info!(
            sku = name.as_str(),
            entries = out.len(),
            "took over journal entries of a gateway that stopped"
        );
    }
    Ok(out)
}

/// Runs a stream command on a dedicated pool connection (never queued with claims); a stream
/// or group that does not exist (Redis lost the SKU) simply has nothing to read.
async fn stream_call(store: &Store, cmd: redis::Cmd) -> Result<Value, StoreError> {
    match store.background_query(&cmd).await {
        Err(StoreError::Redis(r)) if r.code() == Some("NOGROUP") => Ok(Value::Nil),
        other => other,
    }
}

/// [`stream_call`] for a read that hands entries to the writer: with replicas required, the
/// entries it returns are on them (see [`Store::background_read_replicated`]).
async fn read_call(store: &Store, name: &str, cmd: redis::Cmd) -> Result<Value, StoreError> {
    match store
        .background_read_replicated(&cmd, &store.keys(name))
        .await
    {
        Err(StoreError::Redis(r)) if r.code() == Some("NOGROUP") => Ok(Value::Nil),
        other => other,
    }
}

/// The entry's bytes exactly as Redis holds them (`XRANGE` of its id), for the quarantine;
/// `None` when the entry is no longer in the journal.
///
/// # Errors
/// Redis unreachable.
pub async fn raw_entry(
    store: &Store,
    name: &str,
    entry_id: &str,
) -> Result<Option<Vec<u8>>, StoreError> {
    let mut cmd = redis::cmd("XRANGE");
    cmd.arg(store.keys(name).journal())
        .arg(entry_id)
        .arg(entry_id);
    // Reply: [[id, [field, value, ...]]] or [].
    let Value::Array(mut entries) = stream_call(store, cmd).await? else {
        return Ok(None);
    };
    Ok(match entries.pop() {
        Some(Value::Array(mut parts)) if parts.len() == 2 => match parts.pop() {
            Some(Value::Array(fields)) => Some(raw_fields(&fields)),
            _ => None,
        },
        _ => None,
    })
}

/// Acknowledges settled entries (and drops their units from `inflight`, once): each entry once,
/// with the units of all its winners.
///
/// # Errors
/// Redis unreachable or timed out; acknowledging twice is harmless.
/// `forget`: hold records and waitlist entries whose final status is now in PostgreSQL.
pub async fn ack(
    store: &Store,
    name: &str,
    batch: &Batch,
    forget: &Forget,
) -> Result<(), StoreError> {
    let keys = store.keys(name);
    let mut entries: BTreeMap<&str, i64> = BTreeMap::new();
    for w in &batch.winners {
        *entries.entry(&w.entry_id).or_default() += i64::from(w.quantity);
    }
    for u in &batch.unreadable {
        // Units that cannot be read stay in `inflight`: the view then shows the mismatch.
        *entries.entry(&u.entry_id).or_default() += i64::from(u.units.unwrap_or(0));
    }
    for o in &batch.others {
        *entries.entry(&o.entry_id).or_default() += i64::from(o.units);
    }
    let entries: Vec<(&str, i64)> = entries.into_iter().collect();
    let mut con = store.hot();
    let reply = store
        .bounded(scripts::journal::ack_journal(
            &mut con, &keys, &entries, forget,
        ))
        .await;
    match reply {
        // The journal is gone (Redis lost the SKU, a restore rebuilt it from the ledger):
        // there is nothing left to acknowledge.
        Err(StoreError::Redis(r)) if r.code() == Some("NOGROUP") => Ok(()),
        other => other.map(|_| ()),
    }
}

#[cfg(test)]
mod tests;
