//! `GET /problems/{problem}`: the page each problem `type` names. A problem's `type` is the
//! relative reference `/problems/<code with - for _>` (API.md's example, `/problems/sold-out`),
//! which RFC 9457 resolves against the answer's URL: so the gateway serves it, a short page
//! per code saying what it means and what the client or operator does about it.

use bytes::Bytes;
use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use hyper::{Response, StatusCode};

use super::problem::{full, ApiError, Body};

/// Every code: (code, status, what it means, what to do).
pub(super) const PROBLEMS: &[(&str, u16, &str, &str)] = &[
    ("bad_request", 400, "The request is malformed: a body that is not the JSON the route takes, a quantity outside 1..per_user_limit, an invalid SKU id or Idempotency-Key.", "Fix the request as the detail says; nothing changed."),
    ("unauthorized", 401, "The bearer token is missing, malformed, expired or not yet valid (nbf), not signed with this gateway's secrets or keys (or naming a kid or alg it has none of), without the configured aud or iss, the wrong kind (a visitor token on a buyer route, or the reverse), or for another SKU; on an admin route, not the admin token. The detail and the WWW-Authenticate header say which.", "Send a valid token: a fresh admission token from the waiting room, or DROPGATE_ADMIN_TOKEN on an admin route."),
    ("not_found", 404, "No route has this path.", "Check the path against GET /openapi.json."),
    ("unknown_sku", 404, "No SKU of this id was declared.", "Check the SKU id; an operator declares SKUs with PUT /admin/skus/{sku}."),
    ("unknown_claim", 404, "No claim of this id is yours (or the token is for another SKU): someone else's claim is indistinguishable from a missing one.", "Use the claim_id of your own 201 answer with the token that made it."),
    ("unknown_entry", 404, "No waitlist entry of this id is yours (or the token is for another SKU).", "Use the entry_id of your own join with the token that made it."),
    ("method_not_allowed", 405, "The path does not answer this method; the Allow header lists those it does.", "Use one of the methods in Allow."),
    ("request_timeout", 408, "The body did not arrive within its deadline after the headers; the connection is closed.", "Send the whole request promptly."),
    ("payload_too_large", 413, "The request body is over 16 KiB.", "Send a smaller body; no route needs more."),
    ("unsupported_media_type", 415, "The request body was sent with a Content-Type other than JSON.", "Send it as application/json (or without a Content-Type); nothing was changed."),
    ("sold_out", 409, "Not enough units remain for this quantity (there are no partial fills).", "Join the waitlist (POST /v1/skus/{sku}/waitlist) to be offered units that come back."),
    ("limit_reached", 409, "The claim would take you past the SKU's per-user limit.", "Nothing to retry: you already hold what the limit allows."),
    ("idempotency_key_reused", 422, "This Idempotency-Key was used before with a different request.", "Use a new key for a new request; the same key only replays the same request."),
    ("not_open", 409, "The sale window has not opened yet (opens_at).", "Claim again once the sale opens."),
    ("closed", 409, "The sale window has closed (closes_at).", "Nothing to retry."),
    ("hold_expired", 409, "The hold passed its expires_at before the confirm; its units went back to the stock or to the waitlist.", "Claim again if units remain."),
    ("claim_cancelled", 409, "The claim was cancelled, so it cannot be confirmed.", "Claim again if units remain."),
    ("claim_confirmed", 409, "The claim is confirmed (or was final at once), so it cannot be cancelled.", "Nothing to retry: the unit is yours."),
    ("claim_compensated", 409, "PostgreSQL never recorded this claim; after the last attempt its units were given back to the stock.", "Claim again if units remain."),
    ("seats_taken", 409, "Some of the seats asked for are not free; the problem's taken lists them. Nothing was claimed (all or none).", "Choose other seats (GET /v1/skus/{sku}/seats), or ask for best available with quantity."),
    ("no_adjacent_seats", 409, "No row has that many adjacent free seats; the problem's largest_block is the most any row has.", "Ask for at most largest_block seats, or for seats apart with \"adjacent\": false."),
    ("seated_sku", 409, "Not done on a seated SKU: a restock (its total is its seat plan, not a count).", "Grow the SKU by declaring it again with longer rows or more rows and sections (PUT /admin/skus/{sku})."),
    ("in_stock", 409, "Units remain, so there is no waitlist to join.", "Claim instead (POST /v1/skus/{sku}/claims)."),
    ("sku_exists", 409, "The SKU exists with another total.", "Declare it with the same total, or change the total with POST /admin/skus/{sku}/restock."),
    ("insufficient_stock", 409, "The restock would take the remaining stock below 0.", "Restock by at most minus the remaining stock."),
    ("state_present", 409, "Redis holds state for this SKU: on a declare, state this catalog never declared (it is never adopted); on a restore, the live state a restore would replace.", "On a restore, add ?force=true to replace Redis's state with the ledger's; on a declare, remove the foreign keys or use another SKU id."),
    ("not_admitted", 403, "The SKU sells through its waiting room, and this token was not minted by its queue.", "Join the queue (POST /v1/skus/{sku}/queue) and claim with the admission token it gives."),
    ("not_queued", 409, "The SKU has no waiting room.", "Claim directly."),
    ("not_seated", 409, "The SKU is sold by count (general admission): it has no seat map.", "Claim a quantity (POST /v1/skus/{sku}/claims); the SKU view says how many units remain."),
    ("unknown_ticket", 404, "No waiting-room ticket of this id is yours.", "Use the ticket_id of your own join with the visitor token that made it."),
    ("overloaded", 429, "The gateway sheds load: too many claims wait on this SKU.", "Retry after the Retry-After seconds."),
    ("unavailable", 503, "Redis (or PostgreSQL) could not decide, or Redis lost or holds a stale state of the SKU; the gateway fails closed: nothing changed.", "Retry after the Retry-After seconds; when the detail says the SKU needs a restore, an operator must run POST /admin/skus/{sku}/restore."),
    ("outcome_unknown", 503, "The claim was sent to Redis and its answer lost: it may have won. The body carries its claim_id.", "Read GET /v1/claims/{claim_id} (it tells within seconds), or retry with the same Idempotency-Key."),
];

/// The page of the problem named `slug` (`sold-out`), or 404.
pub(super) fn page(slug: &str) -> Result<Response<Body>, ApiError> {
    let (code, status, means, todo) = PROBLEMS
        .iter()
        .find(|(code, ..)| code.replace('_', "-") == slug)
        .ok_or(ApiError::NotFound)?;
    let reason = StatusCode::from_u16(*status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("");
    let html = format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>{code} · dropgate</title></head>\n<body>\n<h1><code>{code}</code></h1>\n\
         <p>HTTP {status} {reason}</p>\n<p>{means}</p>\n<p><strong>What to do:</strong> {todo}</p>\n\
         <p>Clients branch on the problem's <code>code</code>; its <code>detail</code> says more \
         about the case at hand. Every route and code: <a href=\"/openapi.json\">/openapi.json</a>.</p>\n\
         </body></html>\n"
    );
    let mut resp = Response::new(full(Bytes::from(html)));
    let h = resp.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(CACHE_CONTROL, HeaderValue::from_static("max-age=86400"));
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::StoreError;

    /// One answer of each code: its status and code are what the page says.
    #[tokio::test]
    async fn every_answer_has_a_page_with_its_status() {
        let answers = [
            ApiError::BadRequest(String::new()),
            ApiError::Unauthorized(crate::auth::AuthError::Missing),
            ApiError::NotFound,
            ApiError::UnknownSku,
            ApiError::UnknownClaim,
            ApiError::UnknownEntry,
            ApiError::MethodNotAllowed("GET"),
            ApiError::RequestTimeout,
            ApiError::PayloadTooLarge,
            ApiError::UnsupportedMediaType,
            ApiError::SoldOut,
            ApiError::LimitReached,
            ApiError::KeyReused,
            ApiError::NotOpen,
            ApiError::Closed,
            ApiError::HoldExpired,
            ApiError::ClaimCancelled,
            ApiError::ClaimConfirmed,
            ApiError::ClaimCompensated,
            ApiError::InStock,
            ApiError::SkuExists,
            ApiError::InsufficientStock,
            ApiError::StatePresent(""),
            ApiError::Overloaded,
            ApiError::TooManyConnections,
            ApiError::Unavailable(StoreError::SkuLost),
            ApiError::OutcomeUnknown(uuid::Uuid::nil()),
            ApiError::NotAdmitted,
            ApiError::NotQueued,
            ApiError::NotSeated,
            ApiError::UnknownTicket,
            ApiError::JoinRate,
            ApiError::OperatorBusy,
        ];
        for a in answers {
            let (status, code, _) = a.parts();
            let page = PROBLEMS.iter().find(|p| p.0 == code);
            assert_eq!(page.map(|p| p.1), Some(status.as_u16()), "{code}");
            assert!(page_of(code)
                .await
                .contains(&format!("HTTP {}", status.as_u16())));
        }
        assert!(page("no-such-problem").is_err());
    }

    async fn page_of(code: &str) -> String {
        use http_body_util::BodyExt;
        let resp = page(&code.replace('_', "-")).unwrap();
        let body = resp.into_body().collect().await.unwrap();
        String::from_utf8(body.to_bytes().to_vec()).unwrap()
    }
}
