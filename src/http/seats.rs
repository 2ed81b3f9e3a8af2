//! The claim route on a seated SKU (API.md "Reserved seating", docs/seats.md): exact seats
//! (`{"seats": [...]}`) or best available (`{"quantity": N, "section": "A", "adjacent": true}`),
//! each one atomic `claim_seats.lua` call. Everything is checked against the plan before Redis
//! is asked, so a bad body changes nothing.

use hyper::header::{HeaderValue, LOCATION};
use hyper::{Response, StatusCode};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::handler::{json, parse, Result};
use super::problem::{ApiError, Body};
use super::AppState;
use crate::catalog::Sku;
use crate::error::StoreError;
use crate::metrics as m;
use crate::scripts::seats::{claim_seats, SeatAsk, SeatOutcome};
use crate::sku::SkuId;
use crate::status::ClaimStatus;

#[derive(Deserialize)]
struct SeatBody {
    seats: Option<Vec<String>>,
    quantity: Option<i64>,
    section: Option<String>,
    adjacent: Option<bool>,
}

#[derive(Serialize)]
struct SeatClaimResponse<'a> {
    claim_id: Uuid,
    sku: &'a SkuId,
    user: &'a str,
    quantity: usize,
    status: ClaimStatus,
    expires_at: Option<String>,
    remaining: i64,
    seats: &'a [String],
}

/// What a seated claim's body asks for, checked against the plan and the per-user limit.
fn ask(entry: &Sku, body: &[u8]) -> Result<SeatAsk> {
    let plan = entry
        .plan
        .as_ref()
        .ok_or_else(|| ApiError::BadRequest("this SKU is not seated".into()))?;
    let b: SeatBody = if body.is_empty() {
        SeatBody {
            seats: None,
            quantity: None,
            section: None,
            adjacent: None,
        }
    } else {
        parse(body)?
    };
    let limit = i64::from(entry.per_user_limit);
    let asked = match b.seats {
        Some(ids) => {
            if b.section.is_some() || b.adjacent.is_some() {
                return Err(ApiError::BadRequest(
                    "seats names the seats: section and adjacent are for best available".into(),
                ));
            }
            if b.quantity.is_some_and(|q| q != ids.len() as i64) {
                return Err(ApiError::BadRequest(
                    "quantity, when given with seats, must be their number".into(),
                ));
            }
            if ids.len() as i64 > limit {
                return Err(ApiError::BadRequest(format!(
                    "at most {limit} seats (the per-user limit)"
                )));
            }
            SeatAsk::exact(plan, &ids)
        }
        None => {
            let n = b.quantity.unwrap_or(1);
            if n < 1 || n > limit {
                return Err(ApiError::BadRequest(format!(
                    "quantity must be between 1 and {limit} (the per-user limit)"
                )));
            }
            SeatAsk::best(
                plan,
                b.section.as_deref(),
                n as usize,
                b.adjacent.unwrap_or(true),
            )
        }
    };
    asked.map_err(|e| ApiError::BadRequest(e.to_string()))
}

/// Decides one seated claim and answers it.
pub(super) async fn claim(
    state: &AppState,
    entry: &Sku,
    sku: &SkuId,
    user: &str,
    body: &[u8],
    idempotency_key: Option<String>,
) -> Result<Response<Body>> {
    let ask = ask(entry, body)?;
    // The sold-out fast path, as for count claims: no Redis call once every seat is gone (a
    // keyed claim may be the replay of a win: it asks Redis).
    let sold_out = state.claims.sold_out();
    if idempotency_key.is_none() && sold_out.refuses(sku) {
        m::fast_refusal();
        m::claim_decided("sold_out", std::time::Duration::ZERO);
        return Err(ApiError::SoldOut);
    }
    let ticket = sold_out.ticket();
    let claim_id = crate::ids::mint_call(entry.tag);
    let keys = state.store.keys(sku.as_str());
    let mut con = state.store.hot();
    let started = std::time::Instant::now();
    let decided = state
        .store
        .bounded(claim_seats(
            &mut con,
            &keys,
            state.store.floor(sku.as_str()),
            &claim_id,
            user,
            &ask,
            idempotency_key.as_deref(),
            crate::clock::now_ms(),
        ))
        .await;
    let outcome = match decided {
        Ok(o) => o,
        // The call may have run: the buyer reads the claim back (I5), never a blind retry.
        Err(e) if state.store.may_have_run(&e) => {
            m::claim_failed("outcome_unknown");
            return Err(ApiError::OutcomeUnknown(claim_id));
        }
        Err(e) => {
            let e = ApiError::Unavailable(e);
            m::claim_failed(e.code());
            return Err(e);
        }
    };
    let (id, remaining, seats, expires_ms, replayed) = match outcome {
        SeatOutcome::Won {
            remaining,
            seats,
            expires_ms,
        } => (claim_id, remaining, seats, expires_ms, false),
        SeatOutcome::Replay {
            claim_id,
            remaining,
            seats,
            expires_ms,
        } => (claim_id, remaining, seats, expires_ms, true),
        // A section's sold-out says nothing of the other sections: learning it would refuse
        // every ask on the SKU for as long as the memory lasts (found from outside).
        SeatOutcome::SoldOut { free: 0 } if ask.spans_every_section() => {
            sold_out.learn(sku, entry.layout, ticket);
            return Err(refusal(state, sku, SeatOutcome::SoldOut { free: 0 }));
        }
        refused => return Err(refusal(state, sku, refused)),
    };
    state.claims.writer_won(sku.as_str());
    m::claim_decided(if replayed { "replayed" } else { "won" }, started.elapsed());
    let won = SeatClaimResponse {
        claim_id: id,
        sku,
        user,
        quantity: seats.len(),
        status: if expires_ms.is_some() {
            ClaimStatus::Held
        } else {
            ClaimStatus::Issued
        },
        expires_at: expires_ms
            .and_then(chrono::DateTime::from_timestamp_millis)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
        remaining,
        seats: &seats,
    };
    Ok(won_response(&won, replayed))
}

/// The 201 of a won or replayed seated claim, with its `Location`.
fn won_response(won: &SeatClaimResponse<'_>, replayed: bool) -> Response<Body> {
    let mut resp = json(StatusCode::CREATED, won);
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&format!("/v1/claims/{}", won.claim_id)) {
        h.insert(LOCATION, v);
    }
    if replayed {
        h.insert("idempotency-replayed", HeaderValue::from_static("true"));
    }
    resp
}

fn refusal(state: &AppState, sku: &SkuId, o: SeatOutcome) -> ApiError {
    let e = match o {
        SeatOutcome::Reused => ApiError::KeyReused,
        SeatOutcome::Limit { .. } => ApiError::LimitReached,
        SeatOutcome::NotOpen(_) => ApiError::NotOpen,
        SeatOutcome::Closed(_) => ApiError::Closed,
        SeatOutcome::SoldOut { .. } => ApiError::SoldOut,
        SeatOutcome::Taken(ids) => ApiError::SeatsTaken(ids),
        SeatOutcome::NoAdjacent { largest } => ApiError::NoAdjacentSeats(largest),
        SeatOutcome::Lost => {
            state.closed.close(sku, crate::observe::Closed::Lost);
            ApiError::Unavailable(StoreError::SkuLost)
        }
        SeatOutcome::Stale => {
            state.closed.close(sku, crate::observe::Closed::Stale);
            ApiError::Unavailable(StoreError::Stale)
        }
        SeatOutcome::Won { .. } | SeatOutcome::Replay { .. } => {
            ApiError::Unavailable(StoreError::Protocol("a win taken for a refusal".into()))
        }
    };
    m::claim_failed(e.code());
    e
}
