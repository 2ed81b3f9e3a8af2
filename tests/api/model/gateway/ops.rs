//! The clients' operations, one per step, drawn from the step's own seeded generator: claims
//! (fresh keys, replays of earlier keys, no key; one unit or several; tokens with and without
//! `sku`, tokens as an identity provider issues them (an OAuth scope list, `aud`, `iat`, `jti`,
//! a past `nbf`, the rotated secret named by `kid`), and tokens that must be refused: for
//! another SKU, a `kid` under another secret, a future `nbf`, a visitor's `queue` scope), the
//! hold and waitlist operations
//! (`holds.rs`) and the operator's (`admin.rs`).

use std::time::Instant;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::Rng;
use serde_json::{json, Value};

use super::history::{Attempt, History, Owned};
use super::skus::{max_limit, spec, Knobs, SKUS};
use crate::helpers::{code, token, token_for};

/// What a step acts through.
pub struct Ctx<'a> {
    pub http: &'a reqwest::Client,
    pub base: &'a str,
    pub history: &'a Mutex<History>,
    pub knobs: &'a Knobs,
    /// Direct reads, to say what Redis held when an answer broke the rules.
    pub probe: Option<&'a crate::helpers::Probe>,
}

/// An answer: status (0 when the connection failed: the gateway was killed mid-request, the
/// outcome is unknown to the client), body, and whether it was a replay.
pub async fn answer(r: reqwest::Result<reqwest::Response>) -> (u16, Value, bool) {
    match r {
        Ok(r) => {
            let replayed = r.headers().contains_key("idempotency-replayed");
            let s = r.status().as_u16();
            (s, r.json::<Value>().await.unwrap_or(Value::Null), replayed)
        }
        Err(_) => (0, Value::Null, false),
    }
}

pub async fn step(cx: &Ctx<'_>, rng: &mut StdRng, step: u64) -> Result<(), String> {
    let roll = rng.random_range(0..100);
    match roll {
        0..=2 => super::admin::restock(cx, rng).await,
        3 if cx.knobs.on("restore") => super::admin::restore(cx, rng).await,
        4 if cx.knobs.on("terms") => super::admin::terms(cx, rng).await,
        5..=13 => super::holds::decide(cx, rng).await,
        14..=19 => super::holds::waitlist(cx, rng).await,
        20..=25 => super::holds::lookup(cx, rng).await,
        26 | 27 => foreign_token_claim(cx, rng, step).await,
        _ => claim(cx, rng, step).await,
    }
}

/// A buyer of `sku`: one in twenty has every row refused by the model's trigger, so those
/// claims are parked and finally compensated.
pub fn buyer(rng: &mut StdRng, sku: &str) -> String {
    let n = rng.random_range(0..spec(sku).users);
    if rng.random_bool(0.05) {
        format!("x{n}-{sku}")
    } else {
        format!("u{n}-{sku}")
    }
}

/// The model's gateways hold two admission secrets (a rotation under way): this one first,
/// named [`ROTATED_KID`], then the tests' `SECRET`, unnamed (docs/tokens.md).
pub const ROTATED: &str = "model-rotated-secret-0123456789";
pub const ROTATED_KID: &str = "mk2";

/// The buyer's admission token: unscoped, carrying the SKU it is used on, or an identity
/// provider's access token (with or without `sku`).
pub fn own_token(rng: &mut StdRng, user: &str, sku: &str) -> String {
    match rng.random_range(0..10) {
        0..=2 => token_for(user, sku),
        3 => idp_token(rng, user, Some(sku), json!({})),
        4 => idp_token(rng, user, None, json!({})),
        _ => token(user),
    }
}

/// An access token as identity providers issue them, signed with the rotated secret by its
/// `kid`: a scope list without `queue`, `aud`, `iat`, `jti`, a past `nbf` (past any skew of
/// the gateways' clocks), an unknown claim; `extra` claims on top.
fn idp_token(rng: &mut StdRng, user: &str, sku: Option<&str>, extra: Value) -> String {
    let now = chrono::Utc::now().timestamp();
    let mut c = json!({
        "sub": user, "exp": now + 600, "iat": now, "nbf": now - 120,
        "jti": format!("j{}", rng.random::<u64>()), "scope": "openid profile",
        "aud": ["shop", "dropgate"], "azp": "web",
    });
    if let Some(sku) = sku {
        c["sku"] = json!(sku);
    }
    for (k, v) in extra.as_object().into_iter().flatten() {
        c[k] = v.clone();
    }
    crate::tokens::hs256(&c, ROTATED, Some(ROTATED_KID))
}

/// A token of this buyer the gateway must refuse (401): for another SKU, naming the rotated
/// key's `kid` but signed with the other secret, before its `nbf` (beyond any clock skew), or
/// a visitor token (`queue` in its scope list).
fn refused_token(rng: &mut StdRng, user: &str, sku: &str) -> String {
    let now = chrono::Utc::now().timestamp();
    match rng.random_range(0..4) {
        0 => foreign_token(user, sku),
        1 => crate::tokens::hs256(
            &json!({"sub": user, "exp": now + 600}),
            crate::helpers::SECRET,
            Some(ROTATED_KID),
        ),
        2 => idp_token(rng, user, None, json!({"nbf": now + 600})),
        _ => idp_token(rng, user, None, json!({"scope": "openid queue"})),
    }
}

/// A token of the same buyer carrying another SKU.
pub fn foreign_token(user: &str, sku: &str) -> String {
    let other = SKUS.iter().find(|s| s.name != sku).expect("two SKUs").name;
    token_for(user, other)
}

async fn claim(cx: &Ctx<'_>, rng: &mut StdRng, step: u64) -> Result<(), String> {
    let sku = SKUS[rng.random_range(0..SKUS.len())].name;
    if super::queue::queued(sku) {
        // Its claims take its queue's tokens: the waiting room's operations.
        return super::queue::step(cx, rng, step).await;
    }
    if super::seats::seated(sku) {
        return super::seats::claim(cx, rng, step).await;
    }
    let user = buyer(rng, sku);
    let token = own_token(rng, &user, sku);
    claim_as(cx, rng, step, sku, user, token, None).await
}

/// A claim of `sku` by `user` with `token` (its key fresh, a replay of an earlier one, or
/// none). `expires`: a short-lived token's expiry (unix s), which a gateway whose clock runs
/// ahead may already find past (401).
pub async fn claim_as(
    cx: &Ctx<'_>,
    rng: &mut StdRng,
    step: u64,
    sku: &str,
    user: String,
    token: String,
    expires: Option<i64>,
) -> Result<(), String> {
    let prior = cx
        .history
        .lock()
        .keys
        .get(&(sku.to_string(), user.clone()))
        .cloned()
        .unwrap_or_default();
    // Now and then one past the declared limit: 400 unless a change of terms raised it.
    let fresh_qty = |rng: &mut StdRng| {
        if rng.random_bool(0.1) {
            max_limit(sku)
        } else {
            rng.random_range(1..=spec(sku).limit)
        }
    };
    let (key, qty) = match rng.random_range(0..10) {
        0..=6 => (Some(format!("k{step}")), fresh_qty(rng)),
        7 | 8 if !prior.is_empty() => {
            let (k, q) = prior[rng.random_range(0..prior.len())].clone();
            // A replay, or the same key with another quantity (422, nothing moves).
            let q = if rng.random_bool(0.1) {
                q % max_limit(sku) + 1
            } else {
                q
            };
            (Some(k), q)
        }
        _ => (None, fresh_qty(rng)),
    };
    let mut req = cx
        .http
        .post(format!("{}/v1/skus/{sku}/claims", cx.base))
        .bearer_auth(token)
        .json(&json!({ "quantity": qty }));
    if let Some(k) = &key {
        req = req.header("idempotency-key", k);
        let mut h = cx.history.lock();
        let used = h.keys.entry((sku.to_string(), user.clone())).or_default();
        if !used.iter().any(|(u, _)| u == k) {
            used.push((k.clone(), qty));
        }
    }
    let asked = Instant::now();
    let (status, body, replayed) = answer(req.send().await).await;
    let code = code(&body).to_string();
    let allowed = matches!(
        (status, code.as_str()),
        (201, "")
            | (409, "sold_out" | "limit_reached")
            | (422, "idempotency_key_reused")
            | (429, "overloaded")
            | (503, "unavailable" | "outcome_unknown")
            | (0, "")
    ) || (status, code.as_str()) == (400, "bad_request") && qty > spec(sku).limit
        || (status, code.as_str()) == (401, "unauthorized")
            && expires
                .is_some_and(|e| e - chrono::Utc::now().timestamp() < super::queue::SKEW_SECS);
    if !allowed {
        return Err(format!(
            "claim of {qty} {sku} by {user} answered {status} {body}"
        ));
    }
    let claim_id = body["claim_id"].as_str().and_then(|s| s.parse().ok());
    if (status == 201 || code == "outcome_unknown") && claim_id.is_none() {
        return Err(format!("{status} {code} without a claim id: {body}"));
    }
    if status == 201
        && (body["user"] != user.as_str() || body["quantity"] != qty || body["sku"] != sku)
    {
        return Err(format!("201 for another request: {body}"));
    }
    let mut h = cx.history.lock();
    h.count("claim", status, &code);
    if let Some(id) = claim_id {
        if status == 201 && !replayed {
            let s = body["status"].as_str().unwrap_or("");
            if !matches!(s, "issued" | "held" | "confirmed" | "cancelled" | "expired") {
                return Err(format!("201 with status {s:?}: {body}"));
            }
            // A first answer tells the status the claim won with (a replay, the first body).
            h.read(id, "won", s, asked);
        }
        h.owned.push(Owned {
            claim: id,
            sku: sku.into(),
            user: user.clone(),
            answered: status == 201,
        });
    }
    h.attempts.push(Attempt {
        sku: sku.into(),
        user,
        key,
        qty,
        status,
        code,
        claim_id,
        replayed,
    });
    Ok(())
}

/// A claim with a token that must be refused ([`refused_token`]): 401 `unauthorized`, and
/// nothing moves (its key must never appear in the ledger).
async fn foreign_token_claim(cx: &Ctx<'_>, rng: &mut StdRng, step: u64) -> Result<(), String> {
    let sku = SKUS[rng.random_range(0..SKUS.len())].name;
    let user = buyer(rng, sku);
    let key = format!("f{step}");
    let r = cx
        .http
        .post(format!("{}/v1/skus/{sku}/claims", cx.base))
        .bearer_auth(refused_token(rng, &user, sku))
        .header("idempotency-key", &key)
        .json(&json!({ "quantity": 1 }))
        .send()
        .await;
    let (status, body, _) = answer(r).await;
    let c = code(&body).to_string();
    if !matches!(
        (status, c.as_str()),
        (401, "unauthorized") | (0, "") | (429, _)
    ) {
        return Err(format!(
            "a claim on {sku} with a token to refuse: {status} {body}"
        ));
    }
    let mut h = cx.history.lock();
    h.count("foreign-claim", status, &c);
    h.refused.push((sku.into(), user, key));
    Ok(())
}
