//! The Lua scripts, loaded once at start, and the typed wrappers that call them.
//!
//! Callers never see KEYS/ARGV order: each wrapper takes the SKU's [`SkuKeys`] and typed
//! arguments and returns a typed answer. `Script::invoke_async` sends EVALSHA and reloads the
//! script on NOSCRIPT, so a Redis that restarted empty keeps working.

use std::sync::LazyLock;

use redis::aio::ConnectionLike;
use redis::{Script, Value};
use uuid::Uuid;

use crate::config::{CLAIM_RECORD_TTL_SECS, RECORD_TTL_SECS};
use crate::error::StoreError;
use crate::keys::{bucket_of, SkuKeys};

/// The script registry; the SHA1 of each is computed once.
pub struct Scripts {
    pub claim: Script,
    pub resolve_claim: Script,
    pub declare_sku: Script,
    pub restock: Script,
    pub ack_journal: Script,
    pub compensate: Script,
    pub restore_sku: Script,
}

pub static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    claim: Script::new(include_str!("../lua/claim.lua")),
    resolve_claim: Script::new(include_str!("../lua/resolve_claim.lua")),
    declare_sku: Script::new(include_str!("../lua/declare_sku.lua")),
    restock: Script::new(include_str!("../lua/restock.lua")),
    ack_journal: Script::new(include_str!("../lua/ack_journal.lua")),
    compensate: Script::new(include_str!("../lua/compensate.lua")),
    restore_sku: Script::new(include_str!("../lua/restore_sku.lua")),
});

/// Loads every script into Redis (SCRIPT LOAD), so the first claim does not pay for it.
///
/// # Errors
/// The Redis error of the first script that failed to load.
pub async fn load_all<C: ConnectionLike>(con: &mut C) -> Result<(), StoreError> {
    let s = &*SCRIPTS;
    for script in [
        &s.claim,
        &s.resolve_claim,
        &s.declare_sku,
        &s.restock,
        &s.ack_journal,
        &s.compensate,
        &s.restore_sku,
    ] {
        script.prepare_invoke().load_async(con).await?;
    }
    Ok(())
}

/// One claim to decide, with the id the gateway minted before the call.
#[derive(Debug, Clone)]
pub struct ClaimInput {
    pub claim_id: Uuid,
    pub user: String,
    pub quantity: u32,
    pub idempotency_key: Option<String>,
}

/// What Redis decided for one claim. Business outcomes are values, not errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Won {
        remaining: i64,
    },
    /// The same Idempotency-Key won earlier with the same request.
    Replay {
        claim_id: Uuid,
        quantity: u32,
        remaining: i64,
        created_ms: i64,
    },
    SoldOut {
        remaining: i64,
    },
    LimitReached {
        held: i64,
    },
    KeyReused,
    /// The claim id was fenced by a resolver after an earlier timeout; it did not win.
    Fenced,
    /// Never sent to Redis: the gateway shed it (its SKU's queue was full).
    Shed,
}

/// Decides `claims` (all on the SKU of `keys`, all ids in one records bucket: see
/// [`crate::keys::bucket_of`]) in order, in one script call.
///
/// # Errors
/// [`StoreError::SkuLost`] when Redis holds no state for the SKU (nothing was written), or the
/// Redis error of the call.
pub async fn claim<C: ConnectionLike>(
    con: &mut C,
    keys: &SkuKeys,
    claims: &[ClaimInput],
    now_ms: i64,
) -> Result<Vec<Decision>, StoreError> {
    let Some(first) = claims.first() else {
        return Ok(Vec::new());
    };
    let bucket = bucket_of(&first.claim_id);
    if claims.iter().any(|c| bucket_of(&c.claim_id) != bucket) {
        return Err(StoreError::Protocol(
            "claims span two record buckets".into(),
        ));
    }
    let mut inv = SCRIPTS.claim.prepare_invoke();
    inv.key(keys.state())
        .key(keys.users())
        .key(keys.journal())
        .key(keys.claims_bucket(bucket))
        .arg(now_ms)
        .arg(RECORD_TTL_SECS)
        .arg(CLAIM_RECORD_TTL_SECS)
        .arg(claims.len());
    for c in claims {
        if let Some(k) = &c.idempotency_key {
            inv.key(keys.idempotency(&c.user, k));
        }
        inv.arg(c.claim_id.to_string())
            .arg(&c.user)
            .arg(c.quantity)
            .arg(c.idempotency_key.as_deref().unwrap_or(""));
    }
    let reply: Value = inv.invoke_async(con).await?;
    parse_claim_reply(reply, claims.len())
}

fn parse_claim_reply(reply: Value, n: usize) -> Result<Vec<Decision>, StoreError> {
    let items = match reply {
        Value::Array(items) => items,
        other => return Err(StoreError::Protocol(format!("claim: {other:?}"))),
    };
    if let [Value::BulkString(b)] = items.as_slice() {
        if b == b"lost" {
            return Err(StoreError::SkuLost);
        }
    }
    if items.len() != 2 * n {
        return Err(StoreError::Protocol(format!(
            "claim: {} values for {n} claims",
            items.len()
        )));
    }
    items
        .chunks_exact(2)
        .map(|pair| parse_decision(&pair[0], &pair[1]))
        .collect()
}

fn parse_decision(code: &Value, value: &Value) -> Result<Decision, StoreError> {
    let bad = || StoreError::Protocol(format!("claim result {code:?} {value:?}"));
    let int = |v: &Value| match v {
        Value::Int(n) => Ok(*n),
        _ => Err(bad()),
    };
    Ok(match int(code)? {
        1 => Decision::Won {
            remaining: int(value)?,
        },
        2 => {
            let rec = match value {
                Value::BulkString(b) => std::str::from_utf8(b).ok().and_then(ClaimRecord::parse),
                _ => None,
            }
            .ok_or_else(bad)?;
            Decision::Replay {
                claim_id: rec.claim_id,
                quantity: rec.quantity,
                remaining: rec.remaining,
                created_ms: rec.created_ms,
            }
        }
        3 => Decision::SoldOut {
            remaining: int(value)?,
        },
        4 => Decision::LimitReached { held: int(value)? },
        5 => Decision::KeyReused,
        6 => Decision::Fenced,
        _ => return Err(bad()),
    })
}

/// A winner's record as claim.lua stores it:
/// `claim_id|quantity|created_ms|remaining|len(user)|user idem`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRecord {
    pub claim_id: Uuid,
    pub quantity: u32,
    pub remaining: i64,
    pub created_ms: i64,
}

impl ClaimRecord {
    pub fn parse(raw: &str) -> Option<ClaimRecord> {
        let mut it = raw.splitn(6, '|');
        let claim_id = Uuid::parse_str(it.next()?).ok()?;
        let quantity = it.next()?.parse().ok()?;
        let created_ms = it.next()?.parse().ok()?;
        let remaining = it.next()?.parse().ok()?;
        let user_len: usize = it.next()?.parse().ok()?;
        it.next()?.get(..user_len)?;
        Some(ClaimRecord {
            claim_id,
            quantity,
            remaining,
            created_ms,
        })
    }

    /// Renders the record claim.lua would have written (restore rebuilds idempotency records).
    pub fn render(
        claim_id: &Uuid,
        quantity: i64,
        created_ms: i64,
        remaining: i64,
        user: &str,
        idem: &str,
    ) -> String {
        format!(
            "{claim_id}|{quantity}|{created_ms}|{remaining}|{}|{user}{idem}",
            user.len()
        )
    }
}

/// Reads whether `claim_id` won, fencing it if it did not (see resolve_claim.lua). Returns the
/// stock left right after it won, or `None` when it did not (and now cannot) win.
///
/// # Errors
/// The Redis error of the call; the outcome then stays unknown.
pub async fn resolve_claim<C: ConnectionLike>(
    con: &mut C,
    keys: &SkuKeys,
    claim_id: &Uuid,
) -> Result<Option<i64>, StoreError> {
    Ok(SCRIPTS
        .resolve_claim
        .key(keys.claim(claim_id))
        .arg(claim_id.to_string())
        .arg(CLAIM_RECORD_TTL_SECS)
        .invoke_async(con)
        .await?)
}

/// Result of declaring a SKU in Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Declared {
    Seeded,
    AlreadyPresent,
    Lost,
}

/// Seeds the stock only if absent (`seed`), or updates the limit of a present SKU.
///
/// # Errors
/// The Redis error of the call.
pub async fn declare_sku<C: ConnectionLike>(
    con: &mut C,
    keys: &SkuKeys,
    seed: bool,
    total: i64,
    per_user_limit: i32,
) -> Result<Declared, StoreError> {
    let r: i64 = SCRIPTS
        .declare_sku
        .key(keys.state())
        .key(keys.journal())
        .arg(if seed { "seed" } else { "update" })
        .arg(total)
        .arg(per_user_limit)
        .invoke_async(con)
        .await?;
    Ok(match r {
        1 => Declared::Seeded,
        0 => Declared::AlreadyPresent,
        _ => Declared::Lost,
    })
}

/// What a restock operation did in Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restocked {
    /// Applied (now or by an earlier send of the same operation); the remaining stock.
    Applied(i64),
    /// Refused: the stock would have gone below 0. Nothing changed.
    Refused,
    /// Not applied, and fenced so that it never will be.
    NotApplied,
}

/// Applies `delta` to the remaining stock once for `op_id` (see restock.lua). When the call's
/// answer does not come, the outcome is read back (and fenced) instead of sent again.
///
/// # Errors
/// [`StoreError::SkuLost`] when Redis holds no state for the SKU, or the Redis error of the
/// read-back (the outcome is then unknown).
pub async fn restock<C: ConnectionLike>(
    con: &mut C,
    keys: &SkuKeys,
    op_id: &Uuid,
    delta: i64,
    timeout: std::time::Duration,
) -> Result<Restocked, StoreError> {
    let call = |mode: &'static str| {
        let mut inv = SCRIPTS.restock.prepare_invoke();
        inv.key(keys.state())
            .key(keys.restock_op(op_id))
            .arg(mode)
            .arg(delta)
            .arg(RECORD_TTL_SECS);
        inv
    };
    let applied =
        tokio::time::timeout(timeout, call("apply").invoke_async::<(i64, i64)>(con)).await;
    let (code, remaining) = match applied {
        Ok(Ok(r)) => r,
        Ok(Err(e)) if !e.is_timeout() => return Err(e.into()),
        _ => call("resolve").invoke_async(con).await?,
    };
    match code {
        1 | 2 => Ok(Restocked::Applied(remaining)),
        0 => Ok(Restocked::Refused),
        3 => Ok(Restocked::NotApplied),
        _ => Err(StoreError::SkuLost),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_records_round_trip_and_reject_garbage() {
        let id = Uuid::now_v7();
        let raw = ClaimRecord::render(&id, 2, 1_700_000_000_000, 40, "u|1", "key");
        let rec = ClaimRecord::parse(&raw).unwrap();
        assert_eq!(rec.claim_id, id);
        assert_eq!((rec.quantity, rec.remaining), (2, 40));
        assert_eq!(rec.created_ms, 1_700_000_000_000);
        assert!(ClaimRecord::parse("void").is_none());
        assert!(ClaimRecord::parse(&format!("{id}|2|40|1|9|short")).is_none());
    }

    #[test]
    fn a_lost_sku_is_an_error_not_a_sell_out() {
        let reply = Value::Array(vec![Value::BulkString(b"lost".to_vec())]);
        assert!(matches!(
            parse_claim_reply(reply, 1),
            Err(StoreError::SkuLost)
        ));
    }
}
