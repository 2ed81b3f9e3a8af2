//! Holds and the waitlist: confirm, cancel, join, read and leave. Each takes the owner's
//! admission token or the admin token; anyone else's claim or entry answers 404.

use hyper::body::Incoming;
use hyper::header::AUTHORIZATION;
use hyper::{Request, Response, StatusCode};
use serde::Serialize;
use uuid::Uuid;

use super::problem::{ApiError, Body};
use super::routes::{check_sku, header, json, Result};
use crate::app::AppState;
use crate::lifecycle::holds::{self, HoldAnswer, HoldOp};
use crate::lifecycle::waitlist::{self, Joined, Left};

/// The caller: `None` for the admin (who may act on any claim or entry), else the buyer.
/// `sku`: the SKU the request is about, when the path names it (a token for another SKU is
/// refused).
pub(super) fn caller(
    state: &AppState,
    req: &Request<Incoming>,
    sku: Option<&str>,
) -> Result<Option<String>> {
    let auth = header(req, AUTHORIZATION.as_str());
    if state.verifier.is_admin(auth) {
        return Ok(None);
    }
    state
        .verifier
        .buyer(auth, sku)
        .map(Some)
        .map_err(|_| ApiError::Unauthorized)
}

pub(super) async fn decide_hold(
    state: &AppState,
    id: &str,
    req: &Request<Incoming>,
    op: HoldOp,
) -> Result<Response<Body>> {
    let caller = caller(state, req, None)?;
    let id = Uuid::parse_str(id).map_err(|_| ApiError::UnknownClaim)?;
    let answer = holds::decide(&state.store, &state.catalog, id, caller.as_deref(), op).await?;
    match answer {
        HoldAnswer::NotFound => return Err(ApiError::UnknownClaim),
        HoldAnswer::Refused(status) => return Err(refusal(&status)),
        HoldAnswer::Done => {}
    }
    let claim = holds::find_claim(&state.store, &state.catalog, id)
        .await?
        .ok_or(ApiError::UnknownClaim)?;
    Ok(json(StatusCode::OK, &claim))
}

/// The 409 of a hold that already ended otherwise.
fn refusal(status: &str) -> ApiError {
    match status {
        "cancelled" => ApiError::ClaimCancelled,
        "expired" => ApiError::HoldExpired,
        "compensated" => ApiError::ClaimCompensated,
        // Confirmed, or a claim that was final at once: neither can be cancelled.
        _ => ApiError::ClaimConfirmed,
    }
}

#[derive(Serialize)]
struct JoinResponse {
    entry_id: Uuid,
    /// The place in line (1: next to be offered); 0 when the entry holds an offer.
    position: i64,
    status: &'static str,
}

pub(super) async fn join_waitlist(
    state: &AppState,
    sku: &str,
    req: &Request<Incoming>,
) -> Result<Response<Body>> {
    let user = caller(state, req, Some(sku))?.ok_or_else(|| {
        ApiError::BadRequest("joining a waitlist takes a buyer's admission token".into())
    })?;
    check_sku(sku)?;
    let entry = state
        .catalog
        .get(sku)
        .await
        .map_err(ApiError::from)?
        .ok_or(ApiError::UnknownSku)?;
    let (status, entry_id, position) = match waitlist::join(&state.store, &entry, &user).await? {
        Joined::New { entry_id, position } => (StatusCode::CREATED, entry_id, position),
        Joined::Existing { entry_id, position } => (StatusCode::OK, entry_id, position),
        Joined::InStock => return Err(ApiError::InStock),
        Joined::LimitReached => return Err(ApiError::LimitReached),
        Joined::NotOpen => return Err(ApiError::NotOpen),
        Joined::Closed => return Err(ApiError::Closed),
    };
    let resp = JoinResponse {
        entry_id,
        position,
        status: if position == 0 { "offered" } else { "waiting" },
    };
    Ok(json(status, &resp))
}

pub(super) async fn get_entry(
    state: &AppState,
    id: &str,
    req: &Request<Incoming>,
) -> Result<Response<Body>> {
    let (caller, id) = entry_request(state, id, req)?;
    entry_view(state, id, caller.as_deref()).await
}

pub(super) async fn leave_waitlist(
    state: &AppState,
    id: &str,
    req: &Request<Incoming>,
) -> Result<Response<Body>> {
    let (caller, id) = entry_request(state, id, req)?;
    match waitlist::leave(&state.store, &state.catalog, id, caller.as_deref()).await? {
        Left::NotFound => Err(ApiError::UnknownEntry),
        Left::Left | Left::Ended => entry_view(state, id, caller.as_deref()).await,
    }
}

/// The caller and the entry id of a request naming an entry (an id that is no UUID: 404).
fn entry_request(
    state: &AppState,
    id: &str,
    req: &Request<Incoming>,
) -> Result<(Option<String>, Uuid)> {
    let caller = caller(state, req, None)?;
    let id = Uuid::parse_str(id).map_err(|_| ApiError::UnknownEntry)?;
    Ok((caller, id))
}

/// The entry as its owner (or the admin) sees it; 404 for anyone else.
async fn entry_view(state: &AppState, id: Uuid, caller: Option<&str>) -> Result<Response<Body>> {
    let view = waitlist::find(&state.store, &state.catalog, id, caller)
        .await?
        .ok_or(ApiError::UnknownEntry)?;
    Ok(json(StatusCode::OK, &view))
}
