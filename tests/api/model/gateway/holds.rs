//! The operations on claims and entries after the claim: confirm and cancel (or nothing: the
//! hold is left to expire), lookups of claims, and the waitlist: join, read (an offer read is
//! confirmed or left to lapse), leave. Each acts as the owner (a token with or without the
//! SKU), sometimes as the admin, sometimes with the owner's token for another SKU, which must
//! answer 404 as for a stranger (API.md).

use std::time::Instant;

use rand::rngs::StdRng;
use rand::Rng;
use uuid::Uuid;

use super::history::{Joined, Owned};
use super::ops::{answer, buyer, foreign_token, own_token, Ctx};
use crate::helpers::{code, ADMIN};

/// Who acts: (bearer, whether it is the owner's token for another SKU).
fn actor(rng: &mut StdRng, user: &str, sku: &str) -> (String, bool) {
    match rng.random_range(0..20) {
        0 | 1 => (foreign_token(user, sku), true),
        2 => (ADMIN.to_string(), false),
        _ => (own_token(rng, user, sku), false),
    }
}

/// A claim won earlier, mostly of a SKU with holds.
fn pick(cx: &Ctx<'_>, rng: &mut StdRng) -> Option<Owned> {
    let h = cx.history.lock();
    if h.owned.is_empty() {
        return None;
    }
    // Recent claims are the live holds; now and then an old one (ended long ago).
    let n = h.owned.len();
    let i = if rng.random_bool(0.8) {
        n - 1 - rng.random_range(0..n.min(40))
    } else {
        rng.random_range(0..n)
    };
    Some(h.owned[i].clone())
}

pub async fn decide(cx: &Ctx<'_>, rng: &mut StdRng) -> Result<(), String> {
    let Some(o) = pick(cx, rng) else {
        return Ok(());
    };
    let op = match rng.random_range(0..4) {
        0..=1 => "confirm",
        2 => "cancel",
        // Left alone: a hold nobody decides expires.
        _ => return Ok(()),
    };
    let (auth, foreign) = actor(rng, &o.user, &o.sku);
    let asked = Instant::now();
    let r = cx
        .http
        .post(format!("{}/v1/claims/{}/{op}", cx.base, o.claim))
        .bearer_auth(auth)
        .send()
        .await;
    let (status, body, _) = answer(r).await;
    let c = code(&body).to_string();
    let mut h = cx.history.lock();
    h.count(op, status, &c);
    let fail = |why: &str| {
        Err(format!(
            "{op} of {} ({o:?}): {why}: {status} {body}",
            o.claim
        ))
    };
    if foreign {
        return match (status, c.as_str()) {
            (404, "unknown_claim") | (0, _) | (503, _) | (429, _) => Ok(()),
            _ => fail("a token for another SKU was not refused as a stranger"),
        };
    }
    let asked_for = if op == "confirm" {
        "confirmed"
    } else {
        "cancelled"
    };
    match (status, c.as_str()) {
        (200, _) => {
            let s = body["status"].as_str().unwrap_or("");
            // A claim final at once is confirmed already.
            if s != asked_for && !(op == "confirm" && s == "issued") {
                return fail("a 200 must carry the status it asked for");
            }
            h.read(o.claim, op, s, asked);
        }
        (409, "hold_expired") => h.read(o.claim, op, "expired", asked),
        (409, "claim_cancelled") => h.read(o.claim, op, "cancelled", asked),
        (409, "claim_compensated") => h.read(o.claim, op, "compensated", asked),
        // Confirmed, or final at once: either way no hold any more.
        (409, "claim_confirmed") => h.read(o.claim, op, "final", asked),
        (404, "unknown_claim") if !o.answered => {}
        (0, _) | (429, "overloaded") | (503, "unavailable" | "outcome_unknown") => {}
        _ => return fail("not an answer the contract allows"),
    }
    Ok(())
}

pub async fn lookup(cx: &Ctx<'_>, rng: &mut StdRng) -> Result<(), String> {
    let Some(o) = pick(cx, rng) else {
        return Ok(());
    };
    let (auth, foreign) = actor(rng, &o.user, &o.sku);
    let asked = Instant::now();
    let r = cx
        .http
        .get(format!("{}/v1/claims/{}", cx.base, o.claim))
        .bearer_auth(auth)
        .send()
        .await;
    let (status, body, _) = answer(r).await;
    let c = code(&body).to_string();
    let mut h = cx.history.lock();
    h.count("get", status, &c);
    let fail = |why: &str| {
        Err(format!(
            "GET of {} ({o:?}): {why}: {status} {body}",
            o.claim
        ))
    };
    match (status, c.as_str(), foreign) {
        (404, "unknown_claim", true) => {}
        (_, _, true) if matches!(status, 0 | 429 | 503) => {}
        (_, _, true) => return fail("a token for another SKU read a claim"),
        (200, _, _) => {
            let s = body["status"].as_str().unwrap_or("");
            if body["claim_id"] != o.claim.to_string().as_str() || body["user"] != o.user.as_str() {
                return fail("another claim");
            }
            h.read(o.claim, "GET", s, asked);
        }
        (404, _, _) if o.answered => return fail("a claim answered 201 is not found"),
        (404, _, _) | (0, _, _) | (429, _, _) | (503, _, _) => {}
        _ => return fail("not an answer the contract allows"),
    }
    Ok(())
}

/// The waitlist of the held SKU or of the seated one (whose join asks for 1 to its limit of
/// seats: the offer holds the best seats for them): join (409 `in_stock` while units
/// remain), read an entry (an offer is confirmed at once or left to lapse), leave.
pub async fn waitlist(cx: &Ctx<'_>, rng: &mut StdRng) -> Result<(), String> {
    let sku = if rng.random_bool(0.5) {
        "h0"
    } else {
        super::seats::SKU
    };
    let body = match sku {
        "h0" => serde_json::json!({}),
        _ => serde_json::json!({"quantity": rng.random_range(1..=super::skus::spec(sku).limit)}),
    };
    let known = {
        let h = cx.history.lock();
        (!h.entries.is_empty() && rng.random_bool(0.6))
            .then(|| h.entries[rng.random_range(0..h.entries.len())].clone())
    };
    let Some(e) = known else {
        let user = buyer(rng, sku);
        let r = cx
            .http
            .post(format!("{}/v1/skus/{sku}/waitlist", cx.base))
            .bearer_auth(own_token(rng, &user, sku))
            .json(&body)
            .send()
            .await;
        let (status, body, _) = answer(r).await;
        let c = code(&body).to_string();
        let mut h = cx.history.lock();
        h.count(if sku == "h0" { "join" } else { "seat-join" }, status, &c);
        match (status, c.as_str()) {
            (200 | 201, _) => {
                let Some(entry) = body["entry_id"].as_str().and_then(|s| s.parse().ok()) else {
                    return Err(format!("join answered {status} without an entry: {body}"));
                };
                h.entries.push(Joined {
                    entry,
                    sku: sku.into(),
                    user,
                });
            }
            (409, "in_stock" | "limit_reached") | (0, _) | (429, _) | (503, _) => {}
            _ => return Err(format!("join of {sku} by {user}: {status} {body}")),
        }
        return Ok(());
    };
    let leave = rng.random_bool(0.15);
    let (auth, foreign) = actor(rng, &e.user, &e.sku);
    let url = format!("{}/v1/waitlist/{}", cx.base, e.entry);
    let req = if leave {
        cx.http.delete(url)
    } else {
        cx.http.get(url)
    };
    let asked = Instant::now();
    let (status, body, _) = answer(req.bearer_auth(auth).send().await).await;
    let c = code(&body).to_string();
    let mut h = cx.history.lock();
    h.count(if leave { "leave" } else { "entry" }, status, &c);
    let fail = |why: &str| Err(format!("entry {} ({e:?}): {why}: {status} {body}", e.entry));
    if foreign {
        return match (status, c.as_str()) {
            (404, "unknown_entry") | (0, _) | (429, _) | (503, _) => Ok(()),
            _ => fail("a token for another SKU was not refused as a stranger"),
        };
    }
    match status {
        200 => {
            let s = body["status"].as_str().unwrap_or("");
            if !matches!(s, "waiting" | "offered" | "claimed" | "expired" | "left") {
                return fail("no such entry status");
            }
            if let Some(claim) = body["claim_id"]
                .as_str()
                .and_then(|s| s.parse::<Uuid>().ok())
            {
                if !h.owned.iter().any(|o| o.claim == claim) {
                    // An offer is a held claim of the entry's owner, decided in Redis.
                    h.owned.push(Owned {
                        claim,
                        sku: e.sku.clone(),
                        user: e.user.clone(),
                        answered: true,
                    });
                }
                // `offered` may lag its claim's end; `claimed` is final.
                if s == "claimed" {
                    h.read(claim, "entry", "confirmed", asked);
                }
            }
        }
        404 if c == "unknown_entry" => return fail("an entry joined is not found"),
        0 | 429 | 503 => {}
        _ => return fail("not an answer the contract allows"),
    }
    Ok(())
}
