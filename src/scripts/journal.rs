//! The journal's scripts: acknowledging written entries (`ack_journal.lua`), reading the
//! unacknowledged entries before one (`pending_before.lua`), and forgetting the consumer names
//! of writers that are gone (`reap_consumers.lua`). Each takes the SKU's journal, consumed by
//! the group [`JOURNAL_GROUP`].

use std::sync::LazyLock;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Script, Value};
use uuid::Uuid;

use super::SCRIPTS;
use crate::error::StoreError;
use crate::keys::{SkuKeys, JOURNAL_GROUP};

/// Not in the registry ([`super::SCRIPTS`]): its only caller is a background sweep, so it is
/// never preloaded, and `invoke_async` loads it on first use.
static REAP_CONSUMERS: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/reap_consumers.lua")));

/// The Redis records a batch made obsolete: hold records of claims whose final status
/// `issuances` holds, and records of waitlist entries that ended. Kept apart because
/// `ack_journal.lua` drops a parked offer's hold record only with its claim, never with its
/// entry (a compensation reads it).
#[derive(Debug, Default)]
pub struct Forget {
    pub holds: Vec<Uuid>,
    pub entries: Vec<Uuid>,
}

/// Acknowledges journal entries whose winners PostgreSQL now holds (`ack_journal.lua`):
/// `entries` are (entry id, the units of all its winners), each id once; `forget` the records
/// whose final status PostgreSQL now holds (they are dropped).
/// Returns the entries this call acknowledged.
///
/// # Errors
/// The Redis error of the call (`NOGROUP` when the journal is gone); acknowledging twice is
/// harmless.
pub async fn ack_journal<C: ConnectionLike>(
    con: &mut C,
    keys: &SkuKeys,
    entries: &[(&str, i64)],
    forget: &Forget,
) -> Result<i64, StoreError> {
    let mut inv = SCRIPTS.ack_journal.prepare_invoke();
    inv.key(keys.state())
        .key(keys.journal())
        .key(keys.holds())
        .key(keys.waitlist_entries())
        .arg(JOURNAL_GROUP);
    inv.arg(entries.len());
    for (entry_id, units) in entries {
        inv.arg(*entry_id).arg(*units);
    }
    inv.arg(forget.holds.len());
    for id in forget.holds.iter().chain(&forget.entries) {
        inv.arg(id.to_string());
    }
    Ok(inv.invoke_async(con).await?)
}

/// (entry id, its owner, the entry as XRANGE returns it) of the unacknowledged entries before
/// `before`, oldest first, at most `limit`.
///
/// # Errors
/// The Redis error of the call.
pub async fn pending_before<C: ConnectionLike>(
    con: &mut C,
    keys: &SkuKeys,
    before: &str,
    limit: usize,
) -> Result<Vec<(String, String, Value)>, StoreError> {
    let reply: Value = SCRIPTS
        .pending_before
        .key(keys.journal())
        .arg(JOURNAL_GROUP)
        .arg(before)
        .arg(limit)
        .invoke_async(con)
        .await?;
    let Value::Array(items) = reply else {
        return Ok(Vec::new());
    };
    Ok(items
        .into_iter()
        .filter_map(|item| {
            let Value::Array(mut parts) = item else {
                return None;
            };
            if parts.len() != 3 {
                return None;
            }
            let fields = parts.pop()?;
            let owner = text(parts.pop()?)?;
            let id = text(parts.pop()?)?;
            let entry = Value::Array(vec![Value::BulkString(id.clone().into_bytes()), fields]);
            Some((id, owner, entry))
        })
        .collect())
}

fn text(v: Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b).ok(),
        Value::SimpleString(s) => Some(s),
        _ => None,
    }
}

/// Removes from the journal group of `keys` the consumers that hold no pending entries and
/// have been idle for at least `idle`, except `own` (`reap_consumers.lua`). Returns the names
/// removed.
///
/// # Errors
/// The Redis error of the call; nothing is removed then.
pub async fn reap_consumers<C: ConnectionLike>(
    con: &mut C,
    keys: &SkuKeys,
    idle: Duration,
    own: &str,
) -> Result<Vec<String>, StoreError> {
    Ok(REAP_CONSUMERS
        .key(keys.journal())
        .arg(JOURNAL_GROUP)
        .arg(idle.as_millis() as u64)
        .arg(own)
        .invoke_async(con)
        .await?)
}
