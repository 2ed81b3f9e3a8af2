//! The waiting room in the gateway model: `q0`, a queued SKU of few units with holds, a
//! pre-queue of a few seconds and a high admission rate, so a run sees visitors joining
//! (and joining again: the same ticket), tickets read by their visitors, the admin and
//! strangers, admissions, claims with the admission token, claims and waitlist joins with
//! tokens the queue did not mint (403 `not_admitted`, nothing moves), sold out and reopening
//! (cancels, expiries, restocks) and the operator changing `admit_per_second`.
//!
//! Checked as they come: every answer is one the contract allows, every state is the
//! lifecycle table's (`TicketState`), a visitor keeps one ticket. Checked once quiet
//! ([`check`]): nobody holds or held a unit of `q0`, nor a place on its waitlist, without an
//! admission from its queue; every ticket was admitted once (the admitted set against the
//! counter and against every admitted answer's expiry); a visitor's readings follow the
//! table's steps; and once `q0` is sold out, every ticket in line reads `sold_out`.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use dropgate::status::TicketState;
use rand::rngs::StdRng;
use rand::Rng;
use serde_json::{json, Value};
use uuid::Uuid;

use super::history::{History, Joined};
use super::ops::{answer, buyer, claim_as, Ctx};
use super::skus::spec;
use crate::helpers::{code, token, token_for, Api, Probe, ADMIN, SECRET};

pub const SKU: &str = "q0";
/// How long an admission is valid: longer than the skewed gateway's 30 s, so a token used
/// soon after its admission is good on both gateways.
const TTL: i64 = 45;
/// A gateway's clock may run this far ahead of the test's (the nemesis's skew, and slack).
pub const SKEW_SECS: i64 = 32;

pub fn queued(sku: &str) -> bool {
    sku == SKU
}

/// What `q0`'s first declare adds to its body: the queue, and an opening a few seconds in,
/// so the first joins are a pre-queue.
pub fn declare_extra(sku: &str, body: &mut Value) {
    if queued(sku) {
        let opens = chrono::Utc::now() + chrono::Duration::seconds(3);
        body["queue"] = json!({"admit_per_second": 40, "admission_ttl_seconds": TTL});
        body["opens_at"] = json!(opens.to_rfc3339());
    }
}

/// One visitor reading of a ticket.
#[derive(Debug, Clone)]
pub struct TicketRead {
    pub ticket: Uuid,
    pub state: TicketState,
    /// An admitted answer's `admission_expires_at` (unix ms).
    pub expires_ms: Option<i64>,
    pub asked: Instant,
    pub answered: Instant,
}

/// What the clients saw of `q0`'s waiting room.
#[derive(Default)]
pub struct Tickets {
    /// Each visitor's ticket, as its joins answered it, and when the first answer came.
    pub of: HashMap<String, (Uuid, Instant)>,
    /// Tickets a join answered 201 (created) after an earlier answer had shown them.
    pub recreated: Vec<Uuid>,
    pub reads: Vec<TicketRead>,
    /// The last admission token a visitor read, with its expiry (unix s).
    pub tokens: HashMap<String, (String, i64)>,
}

fn visitor(user: &str) -> String {
    crate::queue::visitor(user)
}

fn now_secs() -> i64 {
    chrono::Utc::now().timestamp()
}

pub async fn step(cx: &Ctx<'_>, rng: &mut StdRng, step: u64) -> Result<(), String> {
    match rng.random_range(0..100) {
        0..=29 => join(cx, rng).await,
        30..=59 => read(cx, rng).await,
        60..=79 => {
            let held = {
                let h = cx.history.lock();
                let users: Vec<_> = h.queue.tokens.iter().collect();
                (!users.is_empty()).then(|| {
                    let (u, (t, exp)) = users[rng.random_range(0..users.len())];
                    (u.clone(), t.clone(), *exp)
                })
            };
            let Some((user, t, exp)) = held else {
                return join(cx, rng).await;
            };
            claim_as(cx, rng, step, SKU, user.clone(), t.clone(), Some(exp)).await?;
            // Admitted and too late: the visitor joins the waitlist for units that come back.
            let sold_out = cx
                .history
                .lock()
                .attempts
                .last()
                .is_some_and(|a| a.sku == SKU && a.user == user && a.code == "sold_out");
            if sold_out {
                return join_waitlist(cx, user, t, Some(exp)).await;
            }
            Ok(())
        }
        80..=89 => not_admitted(cx, rng, step).await,
        90..=95 => waitlist(cx, rng).await,
        _ => set_rate(cx, rng).await,
    }
}

/// The checks every ticket answer gets: a state of the table, a position exactly when in
/// line with one, an admission token exactly when admitted (and only to the visitor).
fn ticket_state(body: &Value, visitor: bool) -> Result<TicketState, String> {
    let text = body["state"].as_str().unwrap_or("");
    let s: TicketState = text
        .parse()
        .map_err(|_| format!("ticket state {text:?} is not the table's: {body}"))?;
    let positioned = matches!(s, TicketState::Waiting | TicketState::SoldOut);
    let pos = body["position"].as_i64();
    let token = body["admission_token"].is_string();
    if positioned != pos.is_some_and(|p| p >= 1) || token != (visitor && s == TicketState::Admitted)
    {
        return Err(format!("ticket answer out of its state: {body}"));
    }
    Ok(s)
}

fn expires_ms(body: &Value) -> Option<i64> {
    body["admission_expires_at"]
        .as_str()
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.timestamp_millis())
}

/// Records a visitor's reading (and the admission token it carried).
fn saw(h: &mut History, user: &str, ticket: Uuid, s: TicketState, body: &Value, asked: Instant) {
    let exp = expires_ms(body);
    if let (Some(t), Some(ms)) = (body["admission_token"].as_str(), exp) {
        h.queue
            .tokens
            .insert(user.to_string(), (t.to_string(), ms / 1000));
    }
    h.queue.reads.push(TicketRead {
        ticket,
        state: s,
        expires_ms: exp,
        asked,
        answered: Instant::now(),
    });
}

async fn join(cx: &Ctx<'_>, rng: &mut StdRng) -> Result<(), String> {
    let user = buyer(rng, SKU);
    let asked = Instant::now();
    let r = cx
        .http
        .post(format!("{}/v1/skus/{SKU}/queue", cx.base))
        .bearer_auth(visitor(&user))
        .send()
        .await;
    let (status, body, _) = answer(r).await;
    let c = code(&body).to_string();
    let mut h = cx.history.lock();
    h.count("queue-join", status, &c);
    match (status, c.as_str()) {
        (200 | 201, _) => {}
        (429, "overloaded") | (503, "unavailable") | (0, _) => return Ok(()),
        _ => return Err(format!("join of {SKU} by {user}: {status} {body}")),
    }
    let ticket: Uuid = body["ticket_id"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .ok_or(format!("join without a ticket: {body}"))?;
    let s = ticket_state(&body, true)?;
    match h.queue.of.get(&user) {
        Some((t, _)) if *t != ticket => {
            return Err(format!(
                "{user} joined again and got another ticket: {body}"
            ))
        }
        // Created again by a join asked after an earlier answer showed the ticket.
        Some((_, first)) if status == 201 && asked > *first => h.queue.recreated.push(ticket),
        Some(_) => {}
        None => {
            h.queue.of.insert(user.clone(), (ticket, Instant::now()));
        }
    }
    saw(&mut h, &user, ticket, s, &body, asked);
    Ok(())
}

async fn read(cx: &Ctx<'_>, rng: &mut StdRng) -> Result<(), String> {
    let picked = {
        let h = cx.history.lock();
        let all: Vec<_> = h.queue.of.iter().collect();
        (!all.is_empty()).then(|| {
            let (u, (t, _)) = all[rng.random_range(0..all.len())];
            (u.clone(), *t)
        })
    };
    let Some((user, ticket)) = picked else {
        return join(cx, rng).await;
    };
    // The visitor, the admin, or another visitor (who must find nothing).
    let who = rng.random_range(0..20);
    let bearer = match who {
        0 | 1 => ADMIN.to_string(),
        2 => visitor(&format!("{user}-other")),
        _ => visitor(&user),
    };
    let asked = Instant::now();
    let r = cx
        .http
        .get(format!("{}/v1/queue/{ticket}", cx.base))
        .bearer_auth(bearer)
        .send()
        .await;
    let (status, body, _) = answer(r).await;
    let c = code(&body).to_string();
    let mut h = cx.history.lock();
    h.count("queue-read", status, &c);
    match (status, c.as_str(), who) {
        (404, "unknown_ticket", 2) => Ok(()),
        (_, _, 2) if matches!(status, 0 | 429 | 503) => Ok(()),
        (_, _, 2) => Err(format!("a stranger read {user}'s ticket: {status} {body}")),
        (200, _, _) => {
            let s = ticket_state(&body, who > 2)?;
            if body["ticket_id"] != ticket.to_string().as_str() || body["sku"] != SKU {
                return Err(format!("read of {ticket} answered another ticket: {body}"));
            }
            if who > 2 {
                saw(&mut h, &user, ticket, s, &body, asked);
            }
            Ok(())
        }
        (0, _, _) | (429, "overloaded", _) | (503, "unavailable", _) => Ok(()),
        _ => Err(format!("read of {user}'s ticket {ticket}: {status} {body}")),
    }
}

/// A claim with a token the queue did not mint: the buyer's plain token, one for `q0`, or
/// one whose `tid` is another visitor's ticket. 403 `not_admitted`; its key never in the
/// ledger (the checker's refused keys).
async fn not_admitted(cx: &Ctx<'_>, rng: &mut StdRng, step: u64) -> Result<(), String> {
    let user = if rng.random_bool(0.5) {
        buyer(rng, SKU)
    } else {
        outsider(rng)
    };
    let bearer = forged(cx, rng, &user);
    let key = format!("n{step}");
    let r = cx
        .http
        .post(format!("{}/v1/skus/{SKU}/claims", cx.base))
        .bearer_auth(bearer)
        .header("idempotency-key", &key)
        .json(&json!({ "quantity": 1 }))
        .send()
        .await;
    let (status, body, _) = answer(r).await;
    let c = code(&body).to_string();
    let mut h = cx.history.lock();
    h.count("claim-not-admitted", status, &c);
    if !matches!(
        (status, c.as_str()),
        (403, "not_admitted") | (0, _) | (429, "overloaded") | (503, "unavailable")
    ) {
        return Err(format!(
            "a claim of {SKU} with a token its queue did not mint: {status} {body}"
        ));
    }
    h.refused.push((SKU.into(), user, key));
    Ok(())
}

/// A buyer who never joins the queue: any unit or waitlist place it gets, the checks see.
fn outsider(rng: &mut StdRng) -> String {
    format!("f{}-{SKU}", rng.random_range(0..50))
}

fn forged(cx: &Ctx<'_>, rng: &mut StdRng, user: &str) -> String {
    match rng.random_range(0..3) {
        0 => token(user),
        1 => token_for(user, SKU),
        _ => {
            let other = cx
                .history
                .lock()
                .queue
                .of
                .iter()
                .find(|(u, _)| u.as_str() != user)
                .map_or_else(Uuid::now_v7, |(_, (t, _))| *t);
            let claims = dropgate::auth::AdmissionClaims {
                sub: user.to_string(),
                exp: (now_secs() + 600) as u64,
                sku: Some(SKU.into()),
                scope: None,
                tid: Some(other.to_string()),
            };
            dropgate::auth::sign(&dropgate::config::Secret::new(SECRET), &claims).unwrap()
        }
    }
}

/// `q0`'s waitlist: with an admission token (joins while sold out; its offers are held claims
/// the hold operations decide), or with a token the queue did not mint (403, joins nothing).
async fn waitlist(cx: &Ctx<'_>, rng: &mut StdRng) -> Result<(), String> {
    let admitted = {
        let h = cx.history.lock();
        let all: Vec<_> = h.queue.tokens.iter().collect();
        (!all.is_empty() && rng.random_bool(0.6)).then(|| {
            let (u, (t, exp)) = all[rng.random_range(0..all.len())];
            (u.clone(), t.clone(), *exp)
        })
    };
    let (user, bearer, exp) = match admitted {
        Some((u, t, exp)) => (u, t, Some(exp)),
        None => {
            let u = outsider(rng);
            let t = forged(cx, rng, &u);
            (u, t, None)
        }
    };
    join_waitlist(cx, user, bearer, exp).await
}

/// `user` joins `q0`'s waitlist with `bearer`: its admission token (expiring at `exp`), or a
/// token the queue did not mint (`exp` none).
async fn join_waitlist(
    cx: &Ctx<'_>,
    user: String,
    bearer: String,
    exp: Option<i64>,
) -> Result<(), String> {
    let r = cx
        .http
        .post(format!("{}/v1/skus/{SKU}/waitlist", cx.base))
        .bearer_auth(bearer)
        .send()
        .await;
    let (status, body, _) = answer(r).await;
    let c = code(&body).to_string();
    let mut h = cx.history.lock();
    h.count("queue-waitlist", status, &c);
    let expiring = exp.is_some_and(|e| e - now_secs() < SKEW_SECS);
    match (status, c.as_str(), exp.is_some()) {
        (200 | 201, _, true) => {
            let entry = body["entry_id"]
                .as_str()
                .and_then(|s| s.parse().ok())
                .ok_or(format!("waitlist join without an entry: {body}"))?;
            h.entries.push(Joined {
                entry,
                sku: SKU.into(),
                user,
            });
            Ok(())
        }
        (409, "in_stock" | "limit_reached" | "not_open", true) => Ok(()),
        (401, "unauthorized", true) if expiring => Ok(()),
        (403, "not_admitted", false) => Ok(()),
        // A join is a write: an answer lost is told as such (the entry may exist).
        (0, _, _) | (429, "overloaded", _) | (503, "unavailable" | "outcome_unknown", _) => Ok(()),
        _ => Err(format!(
            "waitlist join of {SKU} by {user} (admitted: {}): {status} {body}",
            exp.is_some()
        )),
    }
}

/// The operator changes `admit_per_second` and `overbook` (PUT with the current total and the
/// spec's terms). Two clients may change them at once through two gateways: the catalog's
/// last version is what Redis must hold once quiet (`checks::settings_never_reverted`).
async fn set_rate(cx: &Ctx<'_>, rng: &mut StdRng) -> Result<(), String> {
    let r = cx
        .http
        .get(format!("{}/admin/skus/{SKU}", cx.base))
        .bearer_auth(ADMIN)
        .send()
        .await;
    let (status, view, _) = answer(r).await;
    let Some(total) = view["total"].as_i64().filter(|_| status == 200) else {
        return Ok(());
    };
    let s = spec(SKU);
    let rate = [5, 20, 40, 100][rng.random_range(0..4)];
    let overbook = [1.0, 1.5, 3.0][rng.random_range(0..3)];
    let body = json!({"total": total, "per_user_limit": s.limit, "hold_seconds": s.hold,
                      "offer_seconds": s.offer,
                      "queue": {"admit_per_second": rate, "admission_ttl_seconds": TTL,
                                "overbook": overbook}});
    let r = cx
        .http
        .put(format!("{}/admin/skus/{SKU}", cx.base))
        .bearer_auth(ADMIN)
        .json(&body)
        .send()
        .await;
    let (status, body, _) = answer(r).await;
    let c = code(&body).to_string();
    cx.history.lock().count("queue-rate", status, &c);
    match (status, c.as_str()) {
        (200, _)
            if body["queue"]["admit_per_second"] == rate
                && body["queue"]["overbook"] == overbook =>
        {
            Ok(())
        }
        (409, "sku_exists") | (503, _) | (429, _) | (0, _) => Ok(()),
        _ => Err(format!(
            "rate {rate}, overbook {overbook} on {SKU}: {status} {body}"
        )),
    }
}

mod checks;
pub use checks::check;

/// `q0`'s Redis keys: the queue hash, the line, the admitted set.
fn keys(probe: &Probe) -> [String; 11] {
    dropgate::keys::SkuKeys::new(&probe.prefix, SKU).queue()
}

async fn zset(probe: &Probe, key: &str) -> Result<Vec<(Uuid, i64)>, String> {
    let v: Vec<(Vec<u8>, f64)> = redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(&mut probe.redis.clone())
        .await
        .map_err(|e| e.to_string())?;
    v.into_iter()
        .map(|(m, s)| {
            Uuid::from_slice(&m)
                .map(|u| (u, s as i64))
                .map_err(|e| e.to_string())
        })
        .collect()
}

/// Reads every ticket in `q0`'s line as the admin, until each reads `want` (at most `limit`).
async fn line_reads(
    api: &Api,
    probe: &Probe,
    want: TicketState,
    limit: Duration,
) -> Result<usize, String> {
    let deadline = Instant::now() + limit;
    loop {
        let line = zset(probe, &keys(probe)[1]).await?;
        let mut off = HashSet::new();
        for (t, _) in &line {
            let r = api
                .http
                .get(format!("{}/v1/queue/{t}", api.base))
                .bearer_auth(ADMIN)
                .send()
                .await
                .map_err(|e| e.to_string())?;
            let body: Value = r.json().await.unwrap_or_default();
            if body["state"] != want.as_str() {
                off.insert(format!("{t}: {body}"));
            }
        }
        if off.is_empty() {
            return Ok(line.len());
        }
        if Instant::now() > deadline {
            let first: Vec<_> = off.into_iter().take(3).collect();
            return Err(format!(
                "{} of {} tickets in {SKU}'s line do not read {want} within {limit:?}: {first:?}",
                first.len(),
                line.len()
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
