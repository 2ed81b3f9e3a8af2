//! A journal entry's layout (see claim.lua, `lua/lib/lifecycle.lua`): the one parser of the
//! entries, for the writer and the SKU view. An entry it cannot read is not skipped (it would
//! stay pending forever and its units in `inflight`) but handed on as an [`Unreadable`] for
//! the quarantine.

use redis::Value;
use uuid::Uuid;

use super::batch::{Change, Other, WaitChange};
use super::{call_entry, Batch, Unreadable, Winner};
use crate::keys::ShardName;
use crate::record::ClaimRecord;
use crate::status::{ClaimStatus, EntryStatus};

/// The winners one journal entry (`[id, [field, value, ...]]`, as `XRANGE` or `XREADGROUP`
/// returns it) carries, as the writer reads them; `None` for an entry the writer would
/// quarantine. For tools and tests that look into the journal.
pub fn winners_of(name: &str, entry: Value) -> Option<Vec<Winner>> {
    match parse_entry(&ShardName::parse(name), entry)? {
        Ok(p) => Some(p.winners),
        Err(_) => None,
    }
}

/// What one entry (`[id, [field, value, ...]]`, as `XRANGE` returns it) carries, as a batch
/// of its own: for the SKU view, which looks up what of it the ledger holds (src/books.rs).
pub fn entry_batch(name: &ShardName, entry: Value) -> Batch {
    parse_one(name, entry)
}

/// What one entry (`[id, [field, value, ...]]`) carries, as a batch of its own.
pub fn parse_one(name: &ShardName, entry: Value) -> Batch {
    let mut out = Batch::default();
    parse_entries(name, Value::Array(vec![entry]), &mut out);
    out
}

pub(super) fn parse_entries(name: &ShardName, v: Value, out: &mut Batch) {
    let Value::Array(entries) = v else {
        return;
    };
    for e in entries {
        match parse_entry(name, e) {
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
pub(super) struct Parsed {
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
pub(super) fn parse_entry(name: &ShardName, v: Value) -> Option<Result<Parsed, Unreadable>> {
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
        seats: field(b"z"),
    });
    let winners: Option<Vec<Winner>> = match &shared {
        // A call's entry (claim.lua) carries winners only.
        Some(shared) => (s.is_none() && w.is_none())
            .then(|| call_entry::winners(name, &entry_id, shared, &cs))
            .flatten(),
        // One winner in full (a waitlist offer beside its entry's change `w`; an entry of an
        // earlier claim.lua), or none.
        None => cs
            .iter()
            .map(|c| {
                let c = std::str::from_utf8(c).ok()?;
                let mut won = parse_packed(name, entry_id.clone(), c, w.is_some())?;
                // A seated SKU's offer names its seats (lib/lifecycle.lua offer_seats).
                if let Some(z) = field(b"z") {
                    won.seats = Some(std::str::from_utf8(z).ok()?.to_string());
                }
                Some(won)
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

/// "entry_id|status|order|ms|seq|len(user)|user", and "|quantity" above 1
/// (lua/lib/lifecycle.lua).
fn parse_wait(entry_id: &str, raw: &str) -> Option<WaitChange> {
    let mut it = raw.splitn(7, '|');
    let waitlist_entry = Uuid::parse_str(it.next()?).ok()?;
    let status = it.next()?.parse::<EntryStatus>().ok()?;
    let order = it.next()?.parse().ok()?;
    let ms = it.next()?.parse().ok()?;
    let seq = it.next()?.parse().ok()?;
    let len: usize = it.next()?.parse().ok()?;
    let (user, quantity) = crate::record::user_and_quantity(it.next()?, len)?;
    Some(WaitChange {
        journal_entry: entry_id.to_string(),
        entry_id: waitlist_entry,
        user: user.to_string(),
        status,
        order,
        ms,
        seq,
        quantity,
    })
}

/// An entry's fields as `field=value` pairs joined by `\n`, byte for byte.
pub(super) fn raw_fields(fields: &[Value]) -> Vec<u8> {
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
pub(super) fn parse_packed(
    name: &ShardName,
    entry_id: String,
    c: &str,
    offer: bool,
) -> Option<Winner> {
    let r = ClaimRecord::parse(c)?;
    Some(Winner {
        entry_id,
        claim_id: r.claim_id,
        // The row's SKU is the catalog's, whichever of its shards journaled the win.
        sku: name.sku().as_str().to_owned(),
        user: r.user,
        quantity: i32::try_from(r.quantity).ok()?,
        idempotency_key: r.idempotency_key,
        remaining_after: Some(r.remaining),
        created_ms: r.created_ms,
        seq: r.seq,
        expires_ms: r.expires_ms,
        offer,
        seats: None,
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
