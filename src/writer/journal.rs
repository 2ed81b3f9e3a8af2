//! Reading and acknowledging a SKU's journal: the Redis Stream claim.lua appends winners to,
//! consumed by the group [`GROUP`] so that each entry is owned by one writer at a time.
//!
//! This is the one place that knows an entry's layout (see claim.lua): an entry it cannot
//! read is not skipped (it would stay pending forever and its units in `inflight`) but handed
//! on as an [`Unreadable`] for the quarantine.

use std::time::Duration;

use redis::Value;

use super::batch::{Change, Other, WaitChange};
use super::{Batch, Unreadable, Winner, READ_COUNT};
use crate::error::StoreError;
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

fn parse_entries(sku: &str, v: Value, out: &mut Batch) {
    let Value::Array(entries) = v else {
        return;
    };
    for e in entries {
        match parse_entry(sku, e) {
            Some(Ok(p)) => {
                let units = p.change.as_ref().map_or(0, |c| c.units());
                match p.winner {
                    Some(w) => out.winners.push(w),
                    None => out.others.push(Other {
                        entry_id: p.entry_id,
                        units,
                    }),
                }
                out.changes.extend(p.change);
                out.waits.extend(p.wait);
            }
            Some(Err(u)) => out.unreadable.push(u),
            None => {}
        }
    }
}

/// What one journal entry carries: a winner (field `c`), a hold's status change (`s`), a
/// waitlist change (`w`), or several (an offer is a winner and its entry's change).
struct Parsed {
    entry_id: String,
    winner: Option<Winner>,
    change: Option<Change>,
    wait: Option<WaitChange>,
}

impl Change {
    /// The units to acknowledge for it: a cancel or expiry gave its units back in Redis.
    fn units(&self) -> i32 {
        match self.status.as_str() {
            "cancelled" | "expired" => -self.quantity,
            _ => 0,
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
    let field = |name: &[u8]| {
        fields
            .chunks(2)
            .find(|kv| as_bytes(&kv[0]) == Some(name))
            .and_then(|kv| kv.get(1))
            .and_then(as_bytes)
    };
    let (c, s, w) = (field(b"c"), field(b"s"), field(b"w"));
    let winner =
        text(c).map(|c| c.and_then(|c| parse_packed(sku, entry_id.clone(), c, w.is_some())));
    let change = text(s).map(|s| s.and_then(parse_change));
    let wait = text(w).map(|w| w.and_then(parse_wait));
    let readable = (c.is_some() || s.is_some() || w.is_some())
        && !matches!(winner, Some(None))
        && !matches!(change, Some(None))
        && !matches!(wait, Some(None));
    if readable {
        return Some(Ok(Parsed {
            entry_id,
            winner: winner.flatten(),
            change: change.flatten(),
            wait: wait.flatten(),
        }));
    }
    // What can still be made out, so the quarantine row is found by claim and counted.
    let packed = c.or(s);
    let mut head = packed.unwrap_or_default().splitn(3, |b| *b == b'|');
    let claim_id = head.next().and_then(|c| Uuid::try_parse_ascii(c).ok());
    let units = head
        .next()
        .and_then(|q| std::str::from_utf8(q).ok())
        .and_then(|q| q.parse::<i32>().ok())
        .filter(|q| *q > 0 && c.is_some());
    Some(Err(Unreadable {
        entry_id,
        raw: raw_fields(&fields),
        claim_id,
        units,
    }))
}

/// A field's value as text: `None` when absent, `Some(None)` when not UTF-8.
fn text(b: Option<&[u8]>) -> Option<Option<&str>> {
    b.map(|b| std::str::from_utf8(b).ok())
}

/// "claim_id|status|quantity|ms|seq" (lua/lib/lifecycle.lua).
fn parse_change(raw: &str) -> Option<Change> {
    let mut it = raw.split('|');
    let claim_id = Uuid::parse_str(it.next()?).ok()?;
    let status = it.next()?;
    if !matches!(status, "confirmed" | "cancelled" | "expired") {
        return None;
    }
    let c = Change {
        claim_id,
        status: status.to_string(),
        quantity: it.next()?.parse().ok().filter(|q: &i32| *q > 0)?,
        ms: it.next()?.parse().ok()?,
        seq: it.next()?.parse().ok()?,
    };
    it.next().is_none().then_some(c)
}

/// "entry_id|status|order|ms|seq|len(user)|user" (lua/lib/lifecycle.lua).
fn parse_wait(raw: &str) -> Option<WaitChange> {
    let mut it = raw.splitn(7, '|');
    let entry_id = Uuid::parse_str(it.next()?).ok()?;
    let status = it.next()?;
    if !matches!(
        status,
        "waiting" | "offered" | "claimed" | "expired" | "left"
    ) {
        return None;
    }
    let order = it.next()?.parse().ok()?;
    let ms = it.next()?.parse().ok()?;
    let seq = it.next()?.parse().ok()?;
    let len: usize = it.next()?.parse().ok()?;
    let user = it.next()?;
    (user.len() == len).then(|| WaitChange {
        entry_id,
        user: user.to_string(),
        status: status.to_string(),
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

/// A winner's entry as claim.lua would have written it: the quarantine's fallback when the
/// entry has left the journal since it was read.
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
        sku: sku.to_string(),
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

/// Acknowledges settled entries (and drops their units from `inflight`, once).
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
        .arg(GROUP)
        .arg(batch.len());
    for w in &batch.winners {
        inv.arg(&w.entry_id).arg(w.quantity);
    }
    for u in &batch.unreadable {
        // Units that cannot be read stay in `inflight`: the view then shows the mismatch.
        inv.arg(&u.entry_id).arg(u.units.unwrap_or(0));
    }
    for o in &batch.others {
        inv.arg(&o.entry_id).arg(o.units);
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
mod tests {
    use super::*;

    #[test]
    fn packed_entries_keep_separators_inside_user_and_key() {
        let id = Uuid::now_v7();
        let w = parse_packed(
            "s",
            "1-0".into(),
            &format!("{id}|2|1700|40|9|3|a|bk|ey"),
            false,
        )
        .unwrap();
        assert_eq!(
            (w.claim_id, w.quantity, w.created_ms, w.seq),
            (id, 2, 1700, 9)
        );
        assert_eq!(w.remaining_after, Some(40));
        assert_eq!(w.user, "a|b");
        assert_eq!(w.idempotency_key.as_deref(), Some("k|ey"));
        let w = parse_packed("s", "1-0".into(), &format!("{id}|1|1|0|1|1|u"), false).unwrap();
        assert_eq!((w.user.as_str(), w.idempotency_key), ("u", None));
        assert!(parse_packed("s", "1-0".into(), &format!("{id}|1|1|0|1|9|u"), false).is_none());
    }

    fn entry(c: &[u8]) -> Value {
        Value::Array(vec![
            Value::BulkString(b"7-1".to_vec()),
            Value::Array(vec![
                Value::BulkString(b"c".to_vec()),
                Value::BulkString(c.to_vec()),
            ]),
        ])
    }

    #[test]
    fn an_entry_that_cannot_be_read_is_kept_byte_for_byte_with_what_can_be_made_out() {
        let id = Uuid::now_v7();
        let mut c = format!("{id}|2|1700|40|5|2|").into_bytes();
        c.extend_from_slice(b"\xff\xfe");
        let Some(Err(u)) = parse_entry("s", entry(&c)) else {
            panic!("invalid UTF-8 is not a winner");
        };
        assert_eq!(
            (u.entry_id.as_str(), u.claim_id, u.units),
            ("7-1", Some(id), Some(2))
        );
        assert_eq!(u.raw, [b"c=".as_slice(), &c].concat());
        let Some(Err(u)) = parse_entry("s", entry(b"garbage")) else {
            panic!("garbage is not a winner");
        };
        assert_eq!((u.claim_id, u.units), (None, None));
    }

    #[test]
    fn a_rendered_winner_reads_back_as_itself() {
        let id = Uuid::now_v7();
        let c = format!("{id}|1|1700|40|5|3|a|bkey");
        let w = parse_packed("s", "7-1".into(), &c, false).unwrap();
        assert_eq!(render(&w), format!("c={c}").into_bytes());
    }
}
