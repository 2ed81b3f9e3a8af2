//! Reading and acknowledging a SKU's journal: the Redis Stream claim.lua appends winners to
//! (one entry per call, carrying all its winners: `call_entry.rs`), consumed by the group
//! [`GROUP`] so that each entry is owned by one writer at a time.
//!
//! This is the one place that knows an entry's layout (see claim.lua): an entry it cannot
//! read is not skipped (it would stay pending forever and its units in `inflight`) but handed
//! on as an [`Unreadable`] for the quarantine.

use std::collections::BTreeMap;
use std::time::Duration;

use redis::Value;

use super::batch::{Change, Other, WaitChange};
use super::{call_entry, Batch, Unreadable, Winner, READ_COUNT};
use crate::error::StoreError;
use crate::lifecycle::status::{ClaimStatus, EntryStatus};
use crate::record::ClaimRecord;
use crate::scripts::SCRIPTS;
use crate::store::Store;
use uuid::Uuid;

pub const GROUP: &str = "writers";

/// New entries (`from` = ">") or this consumer's own unacknowledged ones (`from` = "0").
pub async fn read(
    store: &Store,
    consumer: &str,
    sku: &str,
    from: &str,
) -> Result<Batch, StoreError> {
    let mut cmd = redis::cmd("XREADGROUP");
    cmd.arg("GROUP")
        .arg(GROUP)
        .arg(consumer)
        .arg("COUNT")
        .arg(READ_COUNT)
        .arg("STREAMS")
        .arg(store.keys(sku).journal())
        .arg(from);
    // Reply: [[stream, [[id, [field, value, ...]], ...]]] or nil.
    let mut out = Batch::default();
    if let Value::Array(streams) = read_call(store, sku, cmd).await? {
        for s in streams {
            if let Value::Array(mut parts) = s {
                if parts.len() == 2 {
                    parse_entries(sku, parts.remove(1), &mut out);
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
    sku: &str,
) -> Result<Batch, StoreError> {
    let mut cmd = redis::cmd("XAUTOCLAIM");
    cmd.arg(store.keys(sku).journal())
        .arg(GROUP)
        .arg(consumer)
        .arg(idle.as_millis() as u64)
        .arg("0-0")
        .arg("COUNT")
        .arg(READ_COUNT);
    // Reply: [next-cursor, [[id, fields], ...], [deleted ids]].
    let mut out = Batch::default();
    if let Value::Array(mut parts) = read_call(store, sku, cmd).await? {
        if parts.len() >= 2 {
            parse_entries(sku, parts.remove(1), &mut out);
        }
    }
    if !out.is_empty() {
        tracing::info!(
            sku,
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
async fn read_call(store: &Store, sku: &str, cmd: redis::Cmd) -> Result<Value, StoreError> {
    match store
        .background_read_replicated(&cmd, &store.keys(sku))
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
    sku: &str,
    entry_id: &str,
) -> Result<Option<Vec<u8>>, StoreError> {
    let mut cmd = redis::cmd("XRANGE");
    cmd.arg(store.keys(sku).journal())
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

/// The winners one journal entry (`[id, [field, value, ...]]`, as `XRANGE` or `XREADGROUP`
/// returns it) carries, as the writer reads them; `None` for an entry the writer would
/// quarantine. For tools and tests that look into the journal.
pub fn winners_of(sku: &str, entry: Value) -> Option<Vec<Winner>> {
    match parse_entry(sku, entry)? {
        Ok(p) => Some(p.winners),
        Err(_) => None,
    }
}

/// What one entry (`[id, [field, value, ...]]`, as `XRANGE` returns it) carries, as a batch
/// of its own: for the SKU view, which looks up what of it the ledger holds (src/books.rs).
pub fn entry_batch(sku: &str, entry: Value) -> Batch {
    parse_one(sku, entry)
}

/// What one entry (`[id, [field, value, ...]]`) carries, as a batch of its own.
pub(super) fn parse_one(sku: &str, entry: Value) -> Batch {
    let mut out = Batch::default();
    parse_entries(sku, Value::Array(vec![entry]), &mut out);
    out
}

fn parse_entries(sku: &str, v: Value, out: &mut Batch) {
    let Value::Array(entries) = v else {
        return;
    };
    for e in entries {
        match parse_entry(sku, e) {
            Some(Ok(p)) => {
                let units = p.change.as_ref().map_or(0, |c| c.units());
                if p.winners.is_empty() {
                    out.others.push(Other {
                        entry_id: p.entry_id,
                        units,
                    });
                } else {
                    out.winners.extend(p.winners);
                }
                out.changes.extend(p.change);
                out.waits.extend(p.wait);
            }
            Some(Err(u)) => out.unreadable.push(u),
            None => {}
        }
    }
}

/// What one journal entry carries: the winners of one claim.lua call (`call_entry.rs`), a
/// hold's status change (`s`), a waitlist change (`w`), or several (an offer is a winner, in
/// full in its field `c`, and its entry's change).
struct Parsed {
    entry_id: String,
    winners: Vec<Winner>,
    change: Option<Change>,
    wait: Option<WaitChange>,
}

impl Change {
    /// The units to acknowledge for it: a cancel or expiry gave its units back in Redis.
    fn units(&self) -> i32 {
        if self.status.gave_back() {
            -self.quantity
        } else {
            0
        }
    }
}

/// The entry, or the entry as it is when it holds something this code cannot read. `None` for
/// a reply that is no entry at all (an id without fields: deleted since it was delivered).
fn parse_entry(sku: &str, v: Value) -> Option<Result<Parsed, Unreadable>> {
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
    let values = |name: &'static [u8]| {
        fields
            .chunks(2)
            .filter(move |kv| as_bytes(&kv[0]) == Some(name))
            .filter_map(|kv| kv.get(1).and_then(as_bytes))
    };
    let field = |name: &'static [u8]| values(name).next();
    let (s, w, k) = (field(b"s"), field(b"w"), field(b"k"));
    let cs: Vec<&[u8]> = values(b"c").collect();
    let shared = k.map(|call| call_entry::Shared {
        call,
        ms: field(b"t"),
        seq: field(b"q"),
        stock: field(b"r"),
        expires: field(b"x"),
    });
    let winners: Option<Vec<Winner>> = match &shared {
        // A call's entry (claim.lua) carries winners only.
        Some(shared) => (s.is_none() && w.is_none())
            .then(|| call_entry::winners(sku, &entry_id, shared, &cs))
            .flatten(),
        // One winner in full (a waitlist offer beside its entry's change `w`; an entry of an
        // earlier claim.lua), or none.
        None => cs
            .iter()
            .map(|c| {
                let c = std::str::from_utf8(c).ok()?;
                parse_packed(sku, entry_id.clone(), c, w.is_some())
            })
            .collect::<Option<Vec<Winner>>>()
            .filter(|ws| ws.len() <= 1),
    };
    let change = text(s).map(|s| s.and_then(|s| parse_change(&entry_id, s)));
    let wait = text(w).map(|w| w.and_then(|w| parse_wait(&entry_id, w)));
    let readable = (!cs.is_empty() || k.is_some() || s.is_some() || w.is_some())
        && winners.is_some()
        && !matches!(change, Some(None))
        && !matches!(wait, Some(None));
    if readable {
        return Some(Ok(Parsed {
            entry_id,
            winners: winners.unwrap_or_default(),
            change: change.flatten(),
            wait: wait.flatten(),
        }));
    }
    // What can still be made out, so the quarantine row is found by claim and counted: the
    // first claim id, and the units of every winner (all of them, or none is claimed).
    let (claim_id, units) = match &shared {
        Some(shared) => call_entry::heads(shared, &cs),
        None => {
            let heads: Vec<(Option<Uuid>, Option<i32>)> = match cs.is_empty() {
                true => vec![head(s.unwrap_or_default())],
                false => cs.iter().map(|c| head(c)).collect(),
            };
            let units = heads
                .iter()
                .map(|h| h.1.filter(|q| *q > 0 && !cs.is_empty()))
                .sum::<Option<i32>>();
            (heads.first().and_then(|h| h.0), units)
        }
    };
    Some(Err(Unreadable {
        entry_id,
        raw: raw_fields(&fields),
        claim_id,
        units,
    }))
}

/// The claim id and quantity at the head of a packed record, as far as they can be read.
fn head(packed: &[u8]) -> (Option<Uuid>, Option<i32>) {
    let mut it = packed.splitn(3, |b| *b == b'|');
    let claim_id = it.next().and_then(|c| Uuid::try_parse_ascii(c).ok());
    let units = it
        .next()
        .and_then(|q| std::str::from_utf8(q).ok())
        .and_then(|q| q.parse::<i32>().ok());
    (claim_id, units)
}

/// A field's value as text: `None` when absent, `Some(None)` when not UTF-8.
fn text(b: Option<&[u8]>) -> Option<Option<&str>> {
    b.map(|b| std::str::from_utf8(b).ok())
}

/// "claim_id|status|quantity|ms|seq" (lua/lib/lifecycle.lua).
fn parse_change(entry_id: &str, raw: &str) -> Option<Change> {
    let mut it = raw.split('|');
    let claim_id = Uuid::parse_str(it.next()?).ok()?;
    let status = it.next()?.parse::<ClaimStatus>().ok()?;
    if !status.is_hold_change() {
        return None;
    }
    let c = Change {
        entry_id: entry_id.to_string(),
        claim_id,
        status,
        quantity: it.next()?.parse().ok().filter(|q: &i32| *q > 0)?,
        ms: it.next()?.parse().ok()?,
        seq: it.next()?.parse().ok()?,
    };
    it.next().is_none().then_some(c)
}

/// "entry_id|status|order|ms|seq|len(user)|user" (lua/lib/lifecycle.lua).
fn parse_wait(entry_id: &str, raw: &str) -> Option<WaitChange> {
    let mut it = raw.splitn(7, '|');
    let waitlist_entry = Uuid::parse_str(it.next()?).ok()?;
    let status = it.next()?.parse::<EntryStatus>().ok()?;
    let order = it.next()?.parse().ok()?;
    let ms = it.next()?.parse().ok()?;
    let seq = it.next()?.parse().ok()?;
    let len: usize = it.next()?.parse().ok()?;
    let user = it.next()?;
    (user.len() == len).then(|| WaitChange {
        journal_entry: entry_id.to_string(),
        entry_id: waitlist_entry,
        user: user.to_string(),
        status,
        order,
        ms,
        seq,
    })
}

/// An entry's fields as `field=value` pairs joined by `\n`, byte for byte.
fn raw_fields(fields: &[Value]) -> Vec<u8> {
    let mut raw = Vec::new();
    for (i, kv) in fields.chunks(2).enumerate() {
        if i > 0 {
            raw.push(b'\n');
        }
        raw.extend_from_slice(as_bytes(&kv[0]).unwrap_or_default());
        raw.push(b'=');
        raw.extend_from_slice(kv.get(1).and_then(as_bytes).unwrap_or_default());
    }
    raw
}

/// A winner as an entry of one winner in full (field `c`, a [`ClaimRecord`]): the quarantine's
/// fallback when the entry has left the journal since it was read.
pub fn render(w: &Winner) -> Vec<u8> {
    let record = ClaimRecord {
        claim_id: w.claim_id,
        quantity: w.quantity.unsigned_abs(),
        created_ms: w.created_ms,
        remaining: w.remaining_after.unwrap_or(0),
        seq: w.seq,
        user: w.user.clone(),
        idempotency_key: w.idempotency_key.clone(),
        expires_ms: w.expires_ms,
    };
    format!("c={}", record.render()).into_bytes()
}

/// Unpacks a winner's record (see [`ClaimRecord`]); `offer` when the entry also carries its
/// waitlist entry's change (a waitlist offer).
fn parse_packed(sku: &str, entry_id: String, c: &str, offer: bool) -> Option<Winner> {
    let r = ClaimRecord::parse(c)?;
    Some(Winner {
        entry_id,
        claim_id: r.claim_id,
        // The row's SKU is the catalog's, whichever of its shards journaled the win.
        sku: crate::keys::split_shard(sku).0.to_string(),
        user: r.user,
        quantity: i32::try_from(r.quantity).ok()?,
        idempotency_key: r.idempotency_key,
        remaining_after: Some(r.remaining),
        created_ms: r.created_ms,
        seq: r.seq,
        expires_ms: r.expires_ms,
        offer,
    })
}

fn as_bytes(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

fn as_string(v: Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b).ok(),
        Value::SimpleString(s) => Some(s),
        _ => None,
    }
}

/// Acknowledges settled entries (and drops their units from `inflight`, once): each entry once,
/// with the units of all its winners.
///
/// # Errors
/// Redis unreachable or timed out; acknowledging twice is harmless.
/// `forget`: holds and waitlist entries whose final status is now in PostgreSQL.
pub async fn ack(
    store: &Store,
    sku: &str,
    batch: &Batch,
    forget: &[Uuid],
) -> Result<(), StoreError> {
    let keys = store.keys(sku);
    let mut inv = SCRIPTS.ack_journal.prepare_invoke();
    inv.key(keys.state())
        .key(keys.journal())
        .key(keys.holds())
        .key(keys.waitlist_entries())
        .arg(GROUP);
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
    inv.arg(entries.len());
    for (entry_id, units) in &entries {
        inv.arg(*entry_id).arg(*units);
    }
    for id in forget {
        inv.arg(id.to_string());
    }
    let mut con = store.hot();
    let reply = store
        .bounded(async { Ok(inv.invoke_async::<i64>(&mut con).await?) })
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
