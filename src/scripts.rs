//! The Lua scripts, loaded once at start, and the typed wrappers that call them.
//!
//! Callers never see KEYS/ARGV order: each wrapper takes the SKU's [`SkuKeys`] and typed
//! arguments and returns a typed answer. `Script::invoke_async` sends EVALSHA and reloads the
//! script on NOSCRIPT, so a Redis that restarted empty keeps working.

use std::sync::LazyLock;

use redis::aio::ConnectionLike;
use redis::{Script, Value};
use uuid::Uuid;

use crate::config::RECORD_TTL_SECS;
use crate::error::StoreError;
use crate::keys::SkuKeys;

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

/// Decides `claims` (all on the SKU of `keys`) in order, in one script call.
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
    let mut inv = SCRIPTS.claim.prepare_invoke();
    inv.key(keys.state())
        .key(keys.users())
        .key(keys.journal())
        .arg(now_ms)
        .arg(RECORD_TTL_SECS)
        .arg(claims.len());
    for c in claims {
        let claim_key = keys.claim(&c.claim_id);
        match &c.idempotency_key {
            Some(k) => inv.key(&claim_key).key(keys.idempotency(&c.user, k)),
            None => inv.key(&claim_key).key(&claim_key),
        };
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
    if items.len() != n {
        return Err(StoreError::Protocol(format!(
            "claim: {} results for {n} claims",
            items.len()
        )));
    }
    items.into_iter().map(parse_decision).collect()
}

fn parse_decision(v: Value) -> Result<Decision, StoreError> {
    let bad = |v: &Value| StoreError::Protocol(format!("claim result {v:?}"));
    let Value::Array(f) = &v else {
        return Err(bad(&v));
    };
    let int = |i: usize| match f.get(i) {
        Some(Value::Int(n)) => Ok(*n),
        _ => Err(bad(&v)),
    };
    Ok(match int(0)? {
        1 => Decision::Won { remaining: int(1)? },
        2 => {
            let id = match f.get(1) {
                Some(Value::BulkString(b)) => std::str::from_utf8(b)
                    .ok()
                    .and_then(|s| Uuid::parse_str(s).ok())
                    .ok_or_else(|| bad(&v))?,
                _ => return Err(bad(&v)),
            };
            Decision::Replay {
                claim_id: id,
                quantity: u32::try_from(int(2)?).map_err(|_| bad(&v))?,
                remaining: int(3)?,
                created_ms: int(4)?,
            }
        }
        3 => Decision::SoldOut { remaining: int(1)? },
        4 => Decision::LimitReached { held: int(1)? },
        5 => Decision::KeyReused,
        6 => Decision::Fenced,
        _ => return Err(bad(&v)),
    })
}

/// A claim record as claim.lua stores it: `claim_id|quantity|remaining|created_ms`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRecord {
    pub claim_id: Uuid,
    pub quantity: u32,
    pub remaining: i64,
    pub created_ms: i64,
}

impl ClaimRecord {
    pub fn parse(raw: &str) -> Option<ClaimRecord> {
        let mut it = raw.split('|');
        let rec = ClaimRecord {
            claim_id: Uuid::parse_str(it.next()?).ok()?,
            quantity: it.next()?.parse().ok()?,
            remaining: it.next()?.parse().ok()?,
            created_ms: it.next()?.parse().ok()?,
        };
        it.next().is_none().then_some(rec)
    }
}

/// Reads whether `claim_id` won, fencing it if it did not (see resolve_claim.lua).
///
/// # Errors
/// The Redis error of the call; the outcome then stays unknown.
pub async fn resolve_claim<C: ConnectionLike>(
    con: &mut C,
    keys: &SkuKeys,
    claim_id: &Uuid,
) -> Result<Option<ClaimRecord>, StoreError> {
    let raw: Option<String> = SCRIPTS
        .resolve_claim
        .key(keys.claim(claim_id))
        .arg(RECORD_TTL_SECS)
        .invoke_async(con)
        .await?;
    match raw {
        None => Ok(None),
        Some(r) => ClaimRecord::parse(&r)
            .map(Some)
            .ok_or_else(|| StoreError::Protocol(format!("claim record {r:?}"))),
    }
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

/// Applies `delta` to the remaining stock unless it would go below 0.
/// Returns `Ok(Ok(remaining))` when applied, `Ok(Err(remaining))` when refused.
///
/// # Errors
/// [`StoreError::SkuLost`] when Redis holds no state for the SKU, or the Redis error.
pub async fn restock<C: ConnectionLike>(
    con: &mut C,
    keys: &SkuKeys,
    delta: i64,
) -> Result<Result<i64, i64>, StoreError> {
    let (applied, remaining): (i64, i64) = SCRIPTS
        .restock
        .key(keys.state())
        .arg(delta)
        .invoke_async(con)
        .await?;
    match applied {
        1 => Ok(Ok(remaining)),
        0 => Ok(Err(remaining)),
        _ => Err(StoreError::SkuLost),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_records_round_trip_and_reject_garbage() {
        let id = Uuid::now_v7();
        let rec = ClaimRecord::parse(&format!("{id}|2|40|1700000000000")).unwrap();
        assert_eq!(rec.claim_id, id);
        assert_eq!(rec.quantity, 2);
        assert!(ClaimRecord::parse("void").is_none());
        assert!(ClaimRecord::parse(&format!("{id}|2|40|1|extra")).is_none());
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
