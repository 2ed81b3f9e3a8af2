//! Holds and the waitlist: confirm, cancel, join, read and leave. Each takes the owner's
//! admission token or the admin token; anyone else's claim or entry answers 404.

use hyper::body::Incoming;
use hyper::header::AUTHORIZATION;
use hyper::{Request, Response, StatusCode};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::handler::{check_sku, header, json, known_sku, parse, Result};
use super::problem::{ApiError, Body};
use super::AppState;
use crate::auth::{AuthError, Buyer};
use crate::catalog::Sku;
use crate::lifecycle::holds::{self, HoldAnswer, HoldOp};
use crate::lifecycle::waitlist::{self, Joined, Left};
use crate::status::{ClaimStatus, EntryStatus};

/// The caller: `None` for the admin (who may act on any claim or entry), else the buyer and
/// the SKU the token is limited to (checked against the claim's or entry's by the handler).
/// A visitor token names its visitor here too: a sold-out visitor's waitlist entry and its
/// offer are acted on with the token the waiting page holds (API.md), and acting on one's own
/// claim or entry gets nobody past a queue (claims are made only by the claim route).
pub(super) fn caller(state: &AppState, req: &Request<Incoming>) -> Result<Option<Buyer>> {
    let auth = header(req, AUTHORIZATION.as_str());
    if state.verifier.is_admin(auth) {
        return Ok(None);
    }
    match state.verifier.identify(auth) {
        Ok(b) => Ok(Some(b)),
        Err(AuthError::VisitorToken) => state
            .verifier
            .visitor_caller(auth)
            .map(Some)
            .map_err(ApiError::Unauthorized),
        Err(e) => Err(ApiError::Unauthorized(e)),
    }
}

/// Whether a token limited to a SKU may act on the claim or entry `id`: its id carries its
/// SKU's tag ([`crate::ids`]), so the check comes before anything is read or changed. The
/// admin's and an unscoped buyer's token: always. A visitor token acts only on a SKU with a
/// waiting room (its sold-out visitors' entries and offers): elsewhere 401, as on every
/// buyer route.
pub(super) async fn in_scope(state: &AppState, caller: Option<&Buyer>, id: &Uuid) -> Result<bool> {
    let Some(b) = caller.filter(|b| b.sku.is_some() || b.visitor) else {
        return Ok(true);
    };
    let Some(sku) = crate::lifecycle::sku_of(&state.catalog, id).await? else {
        return Ok(false);
    };
    if b.visitor && sku.queue.0.is_none() {
        return Err(ApiError::Unauthorized(AuthError::VisitorToken));
    }
    Ok(b.may_act_on(&sku.sku))
}

pub(super) async fn decide_hold(
    state: &AppState,
    id: &str,
    req: &Request<Incoming>,
    op: HoldOp,
) -> Result<Response<Body>> {
    let caller = caller(state, req)?;
    let id = Uuid::parse_str(id).map_err(|_| ApiError::UnknownClaim)?;
    if !in_scope(state, caller.as_ref(), &id).await? {
        return Err(ApiError::UnknownClaim);
    }
    let user = caller.as_ref().map(|b| b.user.as_str());
    let answer = holds::decide(&state.store, &state.catalog, id, user, op).await?;
    match answer {
        HoldAnswer::NotFound => return Err(ApiError::UnknownClaim),
        HoldAnswer::Refused(status) => return Err(refusal(status)),
        HoldAnswer::Done => {}
    }
    let mut claim = holds::find_decided(&state.store, &state.catalog, id)
        .await?
        .ok_or(ApiError::UnknownClaim)?;
    // A 200 carries the status it asked for (API.md). Redis deciding one way while the ledger
    // holds the claim as ended another means Redis decided on an older state than the
    // ledger's: the ledger's status stands, and that state is closed until restore. Not so a
    // compensation: the ledger decides it before Redis hears of it (src/reprocess/rows.rs), so
    // Redis deciding the hold in between is no older state; the claim ends compensated.
    if claim.status == ClaimStatus::Compensated {
        return Err(refusal(claim.status));
    }
    let confirmed_final = op == HoldOp::Confirm && claim.status == ClaimStatus::Issued;
    if claim.status != op.target() && claim.status != ClaimStatus::Held && !confirmed_final {
        if let Some(sku) = crate::lifecycle::sku_of(&state.catalog, &id).await? {
            let name = sku.layout.name_for_user(sku.id(), &claim.user);
            crate::freshness::close_stale(&state.store, &name, "a hold decided against the ledger")
                .await;
        }
        return Err(refusal(claim.status));
    }
    // Redis decided it: a read that fell back to the ledger (Redis unreadable a moment later)
    // shows the row before the writer applied the decision.
    if claim.status == ClaimStatus::Held {
        claim.status = op.target();
    }
    Ok(json(StatusCode::OK, &claim))
}

/// The 409 of a hold that already ended otherwise.
fn refusal(status: ClaimStatus) -> ApiError {
    match status {
        ClaimStatus::Cancelled => ApiError::ClaimCancelled,
        ClaimStatus::Expired => ApiError::HoldExpired,
        ClaimStatus::Compensated => ApiError::ClaimCompensated,
        // Confirmed, or a claim that was final at once: neither can be cancelled.
        _ => ApiError::ClaimConfirmed,
    }
}

#[derive(Serialize)]
struct JoinResponse {
    entry_id: Uuid,
    /// The place in line (1: next to be offered); 0 when the entry holds an offer.
    position: i64,
    status: EntryStatus,
}

/// A join's body: `{"quantity": N}` on a seated SKU (the seats its offer holds, best
/// available); empty, or a quantity of 1, elsewhere (an offer there is one unit).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JoinBody {
    quantity: Option<i64>,
}

fn join_quantity(entry: &Sku, body: &[u8]) -> Result<u32> {
    let asked = if body.is_empty() {
        None
    } else {
        parse::<JoinBody>(body)?.quantity
    };
    let q = asked.unwrap_or(1);
    if entry.plan.is_none() {
        if q != 1 {
            return Err(ApiError::BadRequest(
                "quantity: a waitlist offer on a SKU without seats is one unit".into(),
            ));
        }
        return Ok(1);
    }
    let limit = i64::from(entry.per_user_limit);
    if !(1..=limit).contains(&q) {
        return Err(ApiError::BadRequest(format!(
            "quantity must be between 1 and {limit} (the per-user limit)"
        )));
    }
    Ok(q as u32)
}

pub(super) async fn join_waitlist(
    state: &AppState,
    sku: &str,
    req: Request<Incoming>,
) -> Result<Response<Body>> {
    let buyer = caller(state, &req)?.ok_or_else(|| {
        ApiError::BadRequest("joining a waitlist takes a buyer's admission token".into())
    })?;
    if !buyer.may_act_on(sku) {
        return Err(ApiError::Unauthorized(AuthError::WrongSku));
    }
    let sku = check_sku(sku)?;
    let entry = known_sku(state, sku).await?;
    let body = super::limits::read_body(req, crate::config::MAX_BODY_BYTES).await?;
    let quantity = join_quantity(&entry, &body)?;
    // The line's head is offered the units that come back before the queue admits anyone: on
    // a queued SKU it is a way to a unit like the claim route, and takes the same tokens.
    // A visitor token (no `tid`) is taken from a visitor with a ticket on this SKU: the one
    // the line told `sold_out` (the waitlist script refuses anyone while units remain).
    match (entry.queue.0.is_some(), buyer.visitor) {
        (true, true) => super::queue::has_ticket(state, &entry, &buyer.user).await?,
        (true, false) => super::queue::admitted_here(state, &entry, &buyer)?,
        // A visitor token buys nothing where no waiting room sent its visitor.
        (false, true) => return Err(ApiError::Unauthorized(AuthError::VisitorToken)),
        (false, false) => {}
    }
    let user = buyer.user;
    let (status, entry_id, position) =
        match waitlist::join(&state.store, &entry, &user, quantity).await? {
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
        status: if position == 0 {
            EntryStatus::Offered
        } else {
            EntryStatus::Waiting
        },
    };
    Ok(json(status, &resp))
}

pub(super) async fn get_entry(
    state: &AppState,
    id: &str,
    req: &Request<Incoming>,
) -> Result<Response<Body>> {
    let (caller, id) = entry_request(state, id, req).await?;
    entry_view(state, id, caller.as_ref()).await
}

pub(super) async fn leave_waitlist(
    state: &AppState,
    id: &str,
    req: &Request<Incoming>,
) -> Result<Response<Body>> {
    let (caller, id) = entry_request(state, id, req).await?;
    let user = caller.as_ref().map(|b| b.user.as_str());
    match waitlist::leave(&state.store, &state.catalog, id, user).await? {
        Left::NotFound => Err(ApiError::UnknownEntry),
        Left::Left | Left::Ended => entry_view(state, id, caller.as_ref()).await,
    }
}

/// The caller and the entry id of a request naming an entry (an id that is no UUID, or an
/// entry of a SKU the token is not for: 404).
async fn entry_request(
    state: &AppState,
    id: &str,
    req: &Request<Incoming>,
) -> Result<(Option<Buyer>, Uuid)> {
    let caller = caller(state, req)?;
    let id = Uuid::parse_str(id).map_err(|_| ApiError::UnknownEntry)?;
    if !in_scope(state, caller.as_ref(), &id).await? {
        return Err(ApiError::UnknownEntry);
    }
    Ok((caller, id))
}

/// The entry as its owner (or the admin) sees it; 404 for anyone else.
async fn entry_view(state: &AppState, id: Uuid, caller: Option<&Buyer>) -> Result<Response<Body>> {
    let user = caller.map(|b| b.user.as_str());
    let view = waitlist::find(&state.store, &state.catalog, id, user)
        .await?
        .filter(|v| caller.is_none_or(|b| b.may_act_on(&v.sku)))
        .ok_or(ApiError::UnknownEntry)?;
    Ok(json(StatusCode::OK, &view))
}
