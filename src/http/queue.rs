//! The waiting room's routes: join (`POST /v1/skus/{sku}/queue`, a visitor token), a ticket
//! (`GET /v1/queue/{ticket_id}`, its visitor's token or the admin token), the waiting page
//! (`GET /queue/{sku}`), and the claim route's check that a queued SKU's buyer was admitted.

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, AUTHORIZATION, CACHE_CONTROL, CONTENT_TYPE};
use hyper::{Request, Response, StatusCode};
use serde::Serialize;
use uuid::Uuid;

use super::handler::{check_sku, header, json, known_sku, Result};
use super::problem::{full, ApiError, Body};
use super::AppState;
use crate::auth::Buyer;
use crate::catalog::Sku;
use crate::error::StoreError;
use crate::queue::calls::{self, Joined, Report};
use crate::queue::tickets::RECORD_WAIT;
use crate::queue::{self as q, order};
use crate::sku::SkuId;
use crate::status::TicketState;

#[derive(Serialize)]
struct TicketView<'a> {
    ticket_id: Uuid,
    sku: &'a str,
    state: TicketState,
    /// From 1 while waiting; `null` otherwise.
    position: Option<i64>,
    eta_seconds: Option<i64>,
    poll_after_ms: u64,
    /// Once admitted (to the ticket's visitor only): the token the claim route takes.
    #[serde(skip_serializing_if = "Option::is_none")]
    admission_token: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    admission_expires_at: Option<String>,
    opens_at: Option<String>,
    /// Tickets in line now (the progress bar's scale).
    waiting: i64,
}

/// The claim route's check on a SKU with a queue: the token was minted by this SKU's queue
/// (`tid` is the visitor's ticket on this SKU, and the token is for this SKU). The token is
/// signed, so its ticket, SKU and expiry are the queue's own; nothing is read.
pub(super) fn admitted_here(state: &AppState, entry: &Sku, buyer: &Buyer) -> Result<()> {
    let ticket = order::ticket_id(&state.secret, entry.id(), entry.tag, &buyer.user);
    let minted = buyer.sku.as_deref() == Some(entry.sku.as_str())
        && buyer
            .ticket
            .as_deref()
            .and_then(|t| Uuid::parse_str(t).ok())
            == Some(ticket);
    if minted {
        Ok(())
    } else {
        Err(ApiError::NotAdmitted)
    }
}

/// The waitlist's check of a visitor token on a queued SKU: the visitor holds a ticket in
/// this SKU's line or admitted set (read on the same fenced script as a poll), else 403
/// `not_admitted` like any token the queue did not mint.
pub(super) async fn has_ticket(state: &AppState, entry: &Sku, visitor: &str) -> Result<()> {
    let ticket = order::ticket_id(&state.secret, entry.id(), entry.tag, visitor);
    let keys = state.store.keys(&entry.sku);
    let mut con = state.store.hot();
    let report = state
        .store
        .bounded(calls::read(
            &mut con,
            &keys,
            &ticket,
            visitor,
            state.store.floor(&entry.sku),
            state.store.line_floor(&entry.sku),
        ))
        .await
        .map_err(read_error)?;
    if report.state.is_some() {
        Ok(())
    } else {
        Err(ApiError::NotAdmitted)
    }
}

pub(super) async fn join(
    state: &AppState,
    sku: &str,
    req: &Request<Incoming>,
) -> Result<Response<Body>> {
    let visitor = state
        .verifier
        .visitor(header(req, AUTHORIZATION.as_str()), Some(sku))
        .map_err(ApiError::Unauthorized)?;
    let sku = check_sku(sku)?;
    let entry = known_sku(state, sku).await?;
    let Some(settings) = entry.queue.0.as_ref() else {
        return Err(ApiError::NotQueued);
    };
    let ticket = order::ticket_id(&state.secret, sku, entry.tag, &visitor);
    let key = order::shuffle_key(&order::seed_bytes(&settings.seed), &ticket);
    let keys = state.store.keys(sku.as_str());
    let mut con = state.store.hot();
    let joined = state
        .store
        .bounded(calls::join(
            &mut con,
            &keys,
            &ticket,
            key,
            &visitor,
            state.store.floor(sku.as_str()),
            state.store.line_floor(sku.as_str()),
        ))
        .await
        .map_err(read_error)?;
    match joined {
        Joined::Ticket { created, report } => {
            let report = recorded_report(state, sku.as_str(), &ticket, &visitor, report).await?;
            let status = if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            // A join's report is of the ticket it just found or added.
            let view = ticket_view(state, &entry, &ticket, Some(&visitor), &report)
                .ok_or_else(|| read_error(StoreError::Protocol("join: no ticket".into())))?;
            let mut resp = json(status, &view);
            if let Ok(v) = HeaderValue::from_str(&format!("/v1/queue/{ticket}")) {
                resp.headers_mut().insert(hyper::header::LOCATION, v);
            }
            Ok(resp)
        }
        Joined::Overloaded(_) => Err(ApiError::JoinRate),
        Joined::Closed => Err(ApiError::Closed),
        Joined::NotOpen(_) => Err(ApiError::NotOpen),
    }
}

pub(super) async fn get_ticket(
    state: &AppState,
    id: &str,
    req: &Request<Incoming>,
) -> Result<Response<Body>> {
    let auth = header(req, AUTHORIZATION.as_str());
    let visitor = if state.verifier.is_admin(auth) {
        None
    } else {
        Some(
            state
                .verifier
                .visitor(auth, None)
                .map_err(ApiError::Unauthorized)?,
        )
    };
    let ticket = Uuid::parse_str(id).map_err(|_| ApiError::UnknownTicket)?;
    let entry = sku_of_ticket(state, &ticket)
        .await?
        .filter(|e| e.queue.0.is_some())
        .ok_or(ApiError::UnknownTicket)?;
    // Another visitor's ticket is indistinguishable from a missing one.
    if let Some(v) = &visitor {
        // A visitor token of another SKU reads no ticket of this one.
        state
            .verifier
            .visitor(auth, Some(&entry.sku))
            .map_err(ApiError::Unauthorized)?;
        if order::ticket_id(&state.secret, entry.id(), entry.tag, v) != ticket {
            return Err(ApiError::UnknownTicket);
        }
    }
    let keys = state.store.keys(&entry.sku);
    let mut con = state.store.hot();
    let report = state
        .store
        .bounded(calls::read(
            &mut con,
            &keys,
            &ticket,
            visitor.as_deref().unwrap_or(""),
            state.store.floor(&entry.sku),
            state.store.line_floor(&entry.sku),
        ))
        .await
        .map_err(read_error)?;
    // The token goes out only with its admission in the ledger, and a place only with the
    // admissions ahead of it: a Redis rollback then never moves a visitor back (found from
    // outside: a place read 1 read 3 after a rollback undid two admissions the ledger did not
    // hold yet), nor hands out a second token.
    let report = match &visitor {
        Some(v) => recorded_report(state, &entry.sku, &ticket, v, report).await?,
        None => report,
    };
    let Some(view) = ticket_view(state, &entry, &ticket, visitor.as_deref(), &report) else {
        return Err(ApiError::UnknownTicket);
    };
    Ok(json(StatusCode::OK, &view))
}

/// The reading to answer a visitor with, once PostgreSQL holds the line as far as it read it
/// (a ticket, a place or a token answered is one no loss of Redis forgets) and every log entry
/// it rests on was trimmed: a recorder trims only entries it found consistent with the ledger,
/// so a line Redis brought back older and then moved (whose new entries reuse sequences the
/// ledger holds) is never answered from; its recorder closes it instead. 503 past
/// [`RECORD_WAIT`]: joining or reading again finds the same ticket.
async fn recorded_report(
    state: &AppState,
    sku: &str,
    ticket: &Uuid,
    visitor: &str,
    mut report: calls::Report,
) -> Result<calls::Report> {
    let deadline = tokio::time::Instant::now() + RECORD_WAIT;
    loop {
        if !report.log_behind() && state.store.line_floor(sku) >= report.line_seq {
            return Ok(report);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(ApiError::Unavailable(StoreError::Unavailable(
                "the waiting room's line is not recorded yet; join or read again".into(),
            )));
        }
        state.store.line_wake().notify_one();
        tokio::time::sleep(std::time::Duration::from_millis(3)).await;
        if report.log_behind() {
            let keys = state.store.keys(sku);
            let mut con = state.store.hot();
            report = state
                .store
                .bounded(calls::read(
                    &mut con,
                    &keys,
                    ticket,
                    visitor,
                    state.store.floor(sku),
                    state.store.line_floor(sku),
                ))
                .await
                .map_err(read_error)?;
        }
    }
}

/// The SKU a ticket's tag names. A SKU's tag never changes, so the tag's SKU id is kept once
/// found: a million visitors polling cost the catalog's cache, not a PostgreSQL query each.
async fn sku_of_ticket(state: &AppState, ticket: &Uuid) -> Result<Option<std::sync::Arc<Sku>>> {
    let tag = crate::ids::tag_of(ticket);
    let known = state.ticket_tags.get(&tag).map(|s| s.clone());
    if let Some(sku) = known {
        // A catalog row's id, kept by this gateway.
        return state
            .catalog
            .get(SkuId::trusted(&sku))
            .await
            .map_err(ApiError::from);
    }
    let found = crate::lifecycle::sku_of(&state.catalog, ticket)
        .await
        .map_err(ApiError::from)?;
    if let Some(e) = &found {
        state.ticket_tags.insert(tag, e.sku.clone());
    }
    Ok(found)
}

/// A read (or a join, which a retry answers the same) that got no answer moved nothing a
/// visitor could lose: plain 503 `unavailable`, never `outcome_unknown`.
fn read_error(e: StoreError) -> ApiError {
    ApiError::Unavailable(crate::lifecycle::read_error(e))
}

/// The ticket as the route answers it; `None` when the report found no such ticket.
fn ticket_view<'a>(
    state: &AppState,
    entry: &'a Sku,
    ticket: &Uuid,
    visitor: Option<&str>,
    r: &'a Report,
) -> Option<TicketView<'a>> {
    let ticket_state = r.state?;
    let waiting = ticket_state == TicketState::Waiting;
    let position =
        matches!(ticket_state, TicketState::Waiting | TicketState::SoldOut).then_some(r.position);
    let eta = if waiting {
        q::eta_seconds(r, r.position)
    } else {
        None
    };
    let (token, expires) = match (ticket_state, visitor) {
        (TicketState::Admitted, Some(v)) => (
            q::admission_token(&state.signing, entry.id(), v, ticket, r.expires_ms).ok(),
            chrono::DateTime::from_timestamp_millis(r.expires_ms).map(|t| q::rfc3339(&t)),
        ),
        _ => (None, None),
    };
    Some(TicketView {
        ticket_id: *ticket,
        sku: &entry.sku,
        state: ticket_state,
        position,
        eta_seconds: eta,
        poll_after_ms: q::poll_after_ms(ticket_state, r.position, eta),
        admission_token: token,
        admission_expires_at: expires,
        opens_at: entry.opens_at.map(|t| q::rfc3339(&t)),
        waiting: r.waiting,
    })
}

/// `GET /queue/{sku}`: the page a waiting buyer's browser shows. Everything it needs is in
/// the page itself (no asset from another host); it reads the visitor token from the URL's
/// fragment (never sent to a server), joins, then polls the ticket; with the shop's
/// `return_url` it hands an admitted visitor back with the token in that URL's fragment. In
/// the shop's colours and name, in the visitor's language (`Accept-Language`).
pub(super) async fn page(
    state: &AppState,
    sku: &str,
    req: &Request<Incoming>,
) -> Result<Response<Body>> {
    let sku = check_sku(sku)?;
    // The page of a SKU the catalog cannot tell (unknown, or PostgreSQL away) is the plain
    // one: it still joins and polls, and the JSON routes say what is wrong.
    let entry = state.catalog.get(sku).await.ok().flatten();
    let settings = entry
        .as_ref()
        .and_then(|e| e.queue.0.as_ref())
        .and_then(|q| q.page.as_ref());
    let lang = q::page::Lang::from_header(header(req, "accept-language"));
    let html = q::page::render(sku.as_str(), settings, lang);
    let mut resp = Response::new(full(Bytes::from(html)));
    let h = resp.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert("vary", HeaderValue::from_static("accept-language"));
    h.insert("content-language", HeaderValue::from_static(lang.code()));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        "content-security-policy",
        HeaderValue::from_static(
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:",
        ),
    );
    Ok(resp)
}
