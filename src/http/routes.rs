//! The buyers' and operations' handlers (routing: [`super::router`]). Each handler validates
//! everything before it touches a store, so bad input changes nothing.

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE, LOCATION};
use hyper::{Request, Response, StatusCode};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::handler::{check_sku, header, json, parse, Result};
use super::limits::read_body;
use super::problem::{full, ApiError, Body};
use super::AppState;
use crate::claims::{Outcome, WonClaim};
use crate::error::StoreError;
use crate::lifecycle::holds;
use crate::lifecycle::rows::ClaimRow;
use crate::metrics as m;
use crate::observe::Closed;
use crate::settle::Settled;
use crate::sku::SkuId;
use crate::status::ClaimStatus;

// === claims ===

#[derive(Deserialize)]
struct ClaimBody {
    quantity: Option<i64>,
}

#[derive(Serialize)]
struct ClaimResponse<'a> {
    claim_id: Uuid,
    sku: &'a SkuId,
    user: &'a str,
    quantity: u32,
    status: ClaimStatus,
    expires_at: Option<String>,
    remaining: i64,
}

pub(super) async fn claim(
    state: &AppState,
    sku: &str,
    req: Request<Incoming>,
) -> Result<Response<Body>> {
    let buyer = state
        .verifier
        .admitted(header(&req, AUTHORIZATION.as_str()), Some(sku))
        .map_err(ApiError::Unauthorized)?;
    let user = buyer.user.clone();
    let sku = check_sku(sku)?;
    let idempotency_key = idempotency_key(&req)?;
    let body = read_body(req, crate::config::MAX_BODY_BYTES).await?;
    // Checked before the catalog is asked, as before seats: a seated body's own fields are
    // read once the SKU is known to be seated.
    let quantity = claim_quantity(&body)?;
    let entry = state
        .catalog
        .get(sku)
        .await
        .map_err(ApiError::from)
        // A catalog that sheds (429) or cannot answer (503) answers the claim: counted with
        // the decisions, so shed load shows in `dropgate_claims_total{outcome="overloaded"}`.
        .inspect_err(|e| m::claim_failed(e.code()))?
        .ok_or(ApiError::UnknownSku)?;
    if entry.queue.0.is_some() {
        // Counted with the decisions: refused tokens at a queued drop show on the dashboard.
        super::queue::admitted_here(state, &entry, &buyer)
            .inspect_err(|e| m::claim_failed(e.code()))?;
    }
    if entry.plan.is_some() {
        // Seats, never a bare count: a count claim would sell units the seat map never gave.
        return seated(state, &entry, sku, &user, &body, idempotency_key).await;
    }
    if quantity < 1 || quantity > i64::from(entry.per_user_limit) {
        return Err(ApiError::BadRequest(format!(
            "quantity must be between 1 and {} (the per-user limit)",
            entry.per_user_limit
        )));
    }
    let started = std::time::Instant::now();
    let decided = state
        .claims
        .claim(&entry, &user, quantity as u32, idempotency_key)
        .await
        .map_err(ApiError::from);
    log_decision(state, sku, quantity, &decided, started.elapsed());
    let outcome = decided.inspect_err(|e| m::claim_failed(e.code()))?;
    let (mut won, replayed) = match outcome {
        Outcome::Won(w) => (w, false),
        Outcome::Replayed(w) => (w, true),
        Outcome::SoldOut => return Err(ApiError::SoldOut),
        Outcome::LimitReached => return Err(ApiError::LimitReached),
        Outcome::KeyReused => return Err(ApiError::KeyReused),
        Outcome::Shed => return Err(ApiError::Overloaded),
        Outcome::NotOpen => return Err(ApiError::NotOpen),
        Outcome::Closed => return Err(ApiError::Closed),
    };
    if won.expires_ms.is_none() && entry.hold_seconds > 0 {
        // A win read back after a lost answer: the hold's expiry is in its Redis record.
        if let Ok(Some(c)) = holds::find_claim(&state.store, &state.catalog, won.claim_id).await {
            won.expires_ms = c.expires_at.map(|t| t.timestamp_millis());
        }
    }
    Ok(won_response(sku, &user, &won, replayed))
}

/// A claim on a seated SKU ([`super::seats::claim`]), counted for the live page like a count
/// claim (a seated drop's card and its hall).
async fn seated(
    state: &AppState,
    entry: &crate::catalog::Sku,
    sku: &SkuId,
    user: &str,
    body: &[u8],
    idempotency_key: Option<String>,
) -> Result<Response<Body>> {
    let started = std::time::Instant::now();
    let answer = super::seats::claim(state, entry, sku, user, body, idempotency_key).await;
    let outcome = match &answer {
        Ok(r) if r.headers().contains_key("idempotency-replayed") => "replayed",
        Ok(_) => "won",
        Err(e) => e.code(),
    };
    state.live.stats.record(sku, outcome, started.elapsed());
    answer
}

/// One DEBUG line per decided claim, fields first, so an operator can follow a claim id from
/// the buyer's answer to the writer's and reprocessor's lines. Only claims that carry an id to
/// the buyer (won, replayed, outcome unknown) log it: a lost claim's id is never shown to
/// anyone. A claim that meets a SKU failing closed tells [`crate::observe::FailClosed`],
/// which logs the transition the first time.
/// The answer is also counted for the live page ([`crate::live::ClaimStats`]).
fn log_decision(
    state: &AppState,
    sku: &SkuId,
    quantity: i64,
    decided: &Result<Outcome>,
    took: std::time::Duration,
) {
    let (claim_id, outcome) = match decided {
        Ok(o @ (Outcome::Won(w) | Outcome::Replayed(w))) => (Some(w.claim_id), o.label()),
        Ok(o) => (None, o.label()),
        Err(ApiError::Unavailable(StoreError::OutcomeUnknown(id))) => {
            (Some(*id), "outcome_unknown")
        }
        Err(e) => (None, e.code()),
    };
    tracing::debug!(
        claim_id = claim_id.map(tracing::field::display),
        sku = sku.as_str(),
        outcome,
        quantity,
        "claim decided"
    );
    state.live.stats.record(sku, outcome, took);
    match decided {
        Err(ApiError::Unavailable(StoreError::SkuLost)) => state.closed.close(sku, Closed::Lost),
        Err(ApiError::Unavailable(StoreError::Stale)) => state.closed.close(sku, Closed::Stale),
        _ => {}
    }
}

/// The `Idempotency-Key`, judged on its raw bytes: a key that is not visible ASCII must be
/// refused, not read as "no key", or every retry of that request would claim afresh.
fn idempotency_key(req: &Request<Incoming>) -> Result<Option<String>> {
    let mut values = req.headers().get_all("idempotency-key").iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    let bytes = value.as_bytes();
    let valid = (1..=255).contains(&bytes.len()) && bytes.iter().all(u8::is_ascii_graphic);
    match value.to_str() {
        // Two keys on one request leave no single request to replay.
        Ok(key) if valid && values.next().is_none() => Ok(Some(key.to_string())),
        _ => Err(ApiError::BadRequest(
            "Idempotency-Key must be one value of 1-255 visible ASCII characters".into(),
        )),
    }
}

/// Decodes a claim body: no body at all means one unit. A body of whitespace is not JSON and
/// is refused like any other (it once claimed a unit: schemathesis, tests/api/findings.rs).
/// The range check against the SKU's limit comes after the catalog lookup.
///
/// # Errors
/// [`ApiError::BadRequest`] for anything but `{"quantity": <integer>}` (or an empty body).
pub fn claim_quantity(body: &[u8]) -> Result<i64> {
    if body.is_empty() {
        return Ok(1);
    }
    Ok(parse::<ClaimBody>(body)?.quantity.unwrap_or(1))
}

fn won_response(sku: &SkuId, user: &str, won: &WonClaim, replayed: bool) -> Response<Body> {
    let mut resp = json(
        StatusCode::CREATED,
        &ClaimResponse {
            claim_id: won.claim_id,
            sku,
            user,
            quantity: won.quantity,
            status: if won.expires_ms.is_some() {
                ClaimStatus::Held
            } else {
                ClaimStatus::Issued
            },
            expires_at: won
                .expires_ms
                .and_then(chrono::DateTime::from_timestamp_millis)
                .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
            remaining: won.remaining,
        },
    );
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&format!("/v1/claims/{}", won.claim_id)) {
        h.insert(LOCATION, v);
    }
    if replayed {
        h.insert("idempotency-replayed", HeaderValue::from_static("true"));
    }
    resp
}

pub(super) async fn get_claim(
    state: &AppState,
    id: &str,
    req: &Request<Incoming>,
) -> Result<Response<Body>> {
    let caller = super::lifecycle::caller(state, req)?;
    // Whether the claim is the caller's: the admin's every one; a buyer's own, of the SKU
    // the token is for (another SKU's claim is as a stranger's).
    let owns = |owner: &str, sku: &str| {
        caller
            .as_ref()
            .is_none_or(|b| b.user == owner && b.may_act_on(sku))
    };
    let id = Uuid::parse_str(id).map_err(|_| ApiError::UnknownClaim)?;
    if !super::lifecycle::in_scope(state, caller.as_ref(), &id).await? {
        return Err(ApiError::UnknownClaim);
    }
    // A claim this gateway still settles stays unknown here, whatever Redis's record says: a
    // win there that no replica acknowledged yet could still be taken back by a failover.
    if let Some(c) = state.claims.settler().lookup(&id) {
        if c.state == Settled::Pending && owns(&c.user, c.name.sku().as_str()) {
            return Err(ApiError::OutcomeUnknown(id));
        }
    }
    let claim = match holds::find_claim(&state.store, &state.catalog, id).await? {
        Some(c) => c,
        None => unsettled_claim(state, id, &owns)?,
    };
    // Someone else's claim is indistinguishable from a missing one.
    if !owns(&claim.user, &claim.sku) {
        return Err(ApiError::UnknownClaim);
    }
    Ok(json(StatusCode::OK, &claim))
}

/// A claim the ledger does not hold (yet), as this gateway's settler knows it: still unknown
/// (503 `outcome_unknown` again), won and not yet written, or fenced (404).
/// `owns` tells whether a claim of (user, SKU) is the caller's.
fn unsettled_claim(
    state: &AppState,
    id: Uuid,
    owns: &dyn Fn(&str, &str) -> bool,
) -> Result<ClaimRow> {
    let c = state
        .claims
        .settler()
        .lookup(&id)
        .filter(|c| owns(&c.user, c.name.sku().as_str()))
        .ok_or(ApiError::UnknownClaim)?;
    match c.state {
        Settled::Pending => Err(ApiError::OutcomeUnknown(id)),
        Settled::Fenced => Err(ApiError::UnknownClaim),
        // A hold is told as its first answer had it: Redis holds its current status, and
        // the ledger will (find_claim reads both first).
        Settled::Won { expires_ms, .. } => Ok(ClaimRow {
            claim_id: id,
            sku: c.name.sku().as_str().to_string(),
            user: c.user,
            quantity: c.quantity as i32,
            status: if expires_ms.is_some() {
                ClaimStatus::Held
            } else {
                ClaimStatus::Issued
            },
            expires_at: expires_ms.and_then(chrono::DateTime::from_timestamp_millis),
            created_at: crate::ids::created_at(&id),
            seats: None,
        }),
    }
}

// === operations ===

#[derive(Serialize)]
pub(super) struct Status {
    pub(super) status: &'static str,
}

#[derive(Serialize)]
struct Readiness {
    redis: &'static str,
    postgres: &'static str,
    draining: bool,
    /// The claim events' backlog and NATS state: shown, never a reason for 503 (claims go on
    /// while NATS is down; the events wait in PostgreSQL).
    outbox: crate::outbox::OutboxReport,
}

/// Each of /readyz's probes answers within this, or counts as failed: a backend that hangs
/// (a dropped database, a partition) makes the gateway unready at once, never a /readyz
/// that does not answer (issue 37.6).
const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(1000);

pub(super) async fn readyz(state: &AppState) -> Response<Body> {
    let (ping, policy, pg) = tokio::join!(
        tokio::time::timeout(PROBE_TIMEOUT, state.store.ping()),
        tokio::time::timeout(PROBE_TIMEOUT, state.store.eviction_policy()),
        tokio::time::timeout(
            PROBE_TIMEOUT,
            sqlx::query("SELECT 1").execute(state.catalog.db())
        )
    );
    let ping = ping.map_err(drop).and_then(|r| r.map_err(drop));
    let policy = policy.map_err(drop).and_then(|r| r.map_err(drop));
    let pg = pg.map_err(drop).and_then(|r| r.map(drop).map_err(drop));
    // A scrape between two observer rounds sees what the last probe found.
    m::backends_up(Some(ping.is_ok()), Some(pg.is_ok()));
    let draining = state.is_draining();
    let redis = match (ping, policy) {
        (Err(_), _) => "unreachable",
        (Ok(()), Ok(Some(p))) if p != "noeviction" => "evicting",
        _ => "ok",
    };
    let ok = redis == "ok" && pg.is_ok() && !draining;
    let body = Readiness {
        redis,
        postgres: if pg.is_ok() { "ok" } else { "unreachable" },
        draining,
        outbox: state.outbox.report(),
    };
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let mut resp = json(status, &body);
    if !ok {
        resp.headers_mut()
            .insert(hyper::header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    resp
}

pub(super) fn metrics(state: &AppState) -> Response<Body> {
    let mut resp = Response::new(full(Bytes::from(crate::metrics::render(&state.metrics))));
    resp.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    resp
}
