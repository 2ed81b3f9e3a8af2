//! Reading and acknowledging a SKU's journal: the Redis Stream claim.lua appends winners to,
//! consumed by the group [`GROUP`] so that each entry is owned by one writer at a time.

use std::time::Duration;

use redis::Value;
use uuid::Uuid;

use super::{Winner, READ_COUNT};
use crate::error::StoreError;
use crate::scripts::SCRIPTS;
use crate::store::Store;

pub const GROUP: &str = "writers";

/// New entries (`from` = ">") or this consumer's own unacknowledged ones (`from` = "0").
pub async fn read(
    store: &Store,
    consumer: &str,
    sku: &str,
    from: &str,
) -> Result<Vec<Winner>, StoreError> {
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
    let mut out = Vec::new();
    if let Value::Array(streams) = stream_call(store, cmd).await? {
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

/// Takes over entries another consumer (a gateway that died) left idle for `idle`.
pub async fn autoclaim(
    store: &Store,
    consumer: &str,
    idle: Duration,
    sku: &str,
) -> Result<Vec<Winner>, StoreError> {
    let mut cmd = redis::cmd("XAUTOCLAIM");
    cmd.arg(store.keys(sku).journal())
        .arg(GROUP)
        .arg(consumer)
        .arg(idle.as_millis() as u64)
        .arg("0-0")
        .arg("COUNT")
        .arg(READ_COUNT);
    // Reply: [next-cursor, [[id, fields], ...], [deleted ids]].
    let out = match stream_call(store, cmd).await? {
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

/// Runs a stream command on a dedicated pool connection (never queued with claims); a stream
/// or group that does not exist (Redis lost the SKU) simply has nothing to read.
async fn stream_call(store: &Store, cmd: redis::Cmd) -> Result<Value, StoreError> {
    let mut con = store
        .pool()
        .get()
        .await
        .map_err(|e| StoreError::Unavailable(e.to_string()))?;
    let reply = store
        .bounded(async { Ok(cmd.query_async(&mut *con).await?) })
        .await;
    match reply {
        Err(StoreError::Redis(r)) if r.code() == Some("NOGROUP") => Ok(Value::Nil),
        other => other,
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
    let mut it = fields.into_iter();
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        if as_string(k).as_deref() == Some("c") {
            return parse_packed(sku, entry_id, &as_string(v)?);
        }
    }
    None
}

/// Unpacks a winner's record `claim_id|quantity|ms|remaining|len(user)|user idem` (see
/// claim.lua).
fn parse_packed(sku: &str, entry_id: String, c: &str) -> Option<Winner> {
    let mut head = c.splitn(6, '|');
    let claim_id = Uuid::parse_str(head.next()?).ok()?;
    let quantity: i32 = head.next()?.parse().ok()?;
    let created_ms: i64 = head.next()?.parse().ok()?;
    let remaining_after: Option<i64> = head.next()?.parse().ok();
    let user_len: usize = head.next()?.parse().ok()?;
    let rest = head.next()?;
    let user = rest.get(..user_len)?.to_string();
    let idem = rest.get(user_len..)?;
    (quantity > 0).then(|| Winner {
        entry_id,
        claim_id,
        sku: sku.to_string(),
        user,
        quantity,
        idempotency_key: (!idem.is_empty()).then(|| idem.to_string()),
        remaining_after,
        created_ms,
    })
}

fn as_string(v: Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b).ok(),
        Value::SimpleString(s) => Some(s),
        _ => None,
    }
}

/// Acknowledges written entries (and drops their units from `inflight`, once).
pub async fn ack(store: &Store, sku: &str, winners: &[Winner]) -> Result<(), StoreError> {
    let keys = store.keys(sku);
    let mut inv = SCRIPTS.ack_journal.prepare_invoke();
    inv.key(keys.state()).key(keys.journal()).arg(GROUP);
    for w in winners {
        inv.arg(&w.entry_id).arg(w.quantity);
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
        let w = parse_packed("s", "1-0".into(), &format!("{id}|2|1700|40|3|a|bk|ey")).unwrap();
        assert_eq!((w.claim_id, w.quantity, w.created_ms), (id, 2, 1700));
        assert_eq!(w.remaining_after, Some(40));
        assert_eq!(w.user, "a|b");
        assert_eq!(w.idempotency_key.as_deref(), Some("k|ey"));
        let w = parse_packed("s", "1-0".into(), &format!("{id}|1|1|0|1|u")).unwrap();
        assert_eq!((w.user.as_str(), w.idempotency_key), ("u", None));
        assert!(parse_packed("s", "1-0".into(), &format!("{id}|1|1|0|9|u")).is_none());
    }
}
