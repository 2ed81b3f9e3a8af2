//! The one place that turns failures and refusals into HTTP: RFC 9457 problem+json with the
//! `code` of API.md. 5xx bodies are opaque; the cause goes to the log.

use std::collections::HashMap;
use std::sync::LazyLock;

use bytes::Bytes;
use std::convert::Infallible;

use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{Either, Full};
use hyper::header::{
    HeaderMap, HeaderValue, CONNECTION, CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE,
};
use hyper::{Response, StatusCode};
use parking_lot::RwLock;
use serde::Serialize;

use crate::auth::AuthError;
use crate::config::BODY_READ_TIMEOUT;
use crate::error::{DbError, StoreError};

mod convert;
mod table;

/// A response body: whole (every answer but one), or a stream (`/admin/live/stream`). The
/// `Either` keeps the hot path's bodies unboxed.
pub type Body = Either<Full<Bytes>, UnsyncBoxBody<Bytes, Infallible>>;

/// A whole body.
pub fn full(bytes: Bytes) -> Body {
    Either::Left(Full::new(bytes))
}

/// Every refusal the gateway answers.
#[derive(Debug)]
pub enum ApiError {
    BadRequest(String),
    /// 401 with `WWW-Authenticate: Bearer` and the reason as the detail.
    Unauthorized(AuthError),
    NotFound,
    UnknownSku,
    UnknownClaim,
    MethodNotAllowed(&'static str),
    PayloadTooLarge,
    /// A body sent as anything but JSON (`Content-Type` present and not `application/json`
    /// or `+json`).
    UnsupportedMediaType,
    SoldOut,
    LimitReached,
    KeyReused,
    SkuExists,
    InsufficientStock,
    /// Redis holds the SKU's state: the detail says what the operator can do about it, which
    /// differs between a declare and a restore.
    StatePresent(&'static str),
    /// The sale window has not opened / has closed.
    NotOpen,
    Closed,
    /// A confirm (or cancel) of a hold past its expiry.
    HoldExpired,
    /// A confirm of a cancelled hold.
    ClaimCancelled,
    /// A cancel of a confirmed hold.
    ClaimConfirmed,
    /// A confirm or cancel of a claim whose units were given back after PostgreSQL refused it.
    ClaimCompensated,
    /// A waitlist join while units remain.
    InStock,
    /// No such waitlist entry (or not the caller's).
    UnknownEntry,
    /// The gateway sheds load: 429 + Retry-After.
    Overloaded,
    /// A connection past `DROPGATE_MAX_CONNECTIONS`: 503 + Retry-After, then closed.
    TooManyConnections,
    /// The body did not arrive within its deadline: 408, then closed.
    RequestTimeout,
    /// Redis could not decide (or lost the SKU): fail closed.
    Unavailable(StoreError),
    /// A claim was sent to Redis and its outcome is not known yet; the settler goes on.
    OutcomeUnknown(uuid::Uuid),
    /// PostgreSQL could not answer an admin or lookup request.
    Database(DbError),
    /// The SKU view while a restore of the SKU is under way past the view's wait.
    OperatorBusy,
    /// A claim on a SKU with a waiting room with a token its queue did not mint.
    NotAdmitted,
    /// A queue join on a SKU without a waiting room.
    NotQueued,
    /// No waiting-room ticket of this id is the caller's.
    UnknownTicket,
    /// A visitor joined past the per-visitor join rate: 429 + Retry-After.
    JoinRate,
    /// Seated SKU: some of the exact seats asked for are not free (they are named).
    SeatsTaken(Vec<String>),
    /// Seated SKU: no row has the asked number of adjacent free seats; the largest block.
    NoAdjacentSeats(i64),
    /// What a seated SKU does not do: a restock (it grows by its plan, not by a count).
    SeatedSku,
    /// The seat map of a SKU sold by count.
    NotSeated,
    /// The SKU view while acknowledgements moved Redis under every reading it took.
    BooksMoving,
}

#[derive(Serialize)]
struct Problem<'a> {
    #[serde(rename = "type")]
    kind: String,
    title: &'a str,
    status: u16,
    code: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<String>,
    /// The claim whose outcome is unknown: `GET /v1/claims/{claim_id}` tells once it settles.
    #[serde(skip_serializing_if = "Option::is_none")]
    claim_id: Option<uuid::Uuid>,
    /// `seats_taken`: the asked seats that are not free.
    #[serde(skip_serializing_if = "Option::is_none")]
    taken: Option<Vec<String>>,
    /// `no_adjacent_seats`: the most adjacent free seats any row has.
    #[serde(skip_serializing_if = "Option::is_none")]
    largest_block: Option<i64>,
}

impl ApiError {
    pub fn into_response(self) -> Response<Body> {
        let (status, headers, body) = self.render();
        let mut resp = Response::new(full(body));
        *resp.status_mut() = status;
        *resp.headers_mut() = headers;
        resp
    }

    /// The same answer as raw HTTP/1.1 bytes that close the connection, for a refusal written
    /// before hyper is given the connection.
    pub fn into_http1_bytes(self) -> Vec<u8> {
        let (status, headers, body) = self.render();
        let mut out = format!(
            "HTTP/1.1 {} {}\r\n",
            status.as_str(),
            status.canonical_reason().unwrap_or("")
        )
        .into_bytes();
        for (name, value) in &headers {
            out.extend_from_slice(name.as_str().as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(
            format!(
                "content-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            )
            .as_bytes(),
        );
        out.extend_from_slice(&body);
        out
    }

    fn render(self) -> (StatusCode, HeaderMap, Bytes) {
        let (status, code, title) = self.parts();
        let detail = match &self {
            ApiError::BadRequest(d) => Some(d.clone()),
            ApiError::MethodNotAllowed(allow) => Some(format!("allowed: {allow}")),
            ApiError::SkuExists => Some("declare with the same total, or use restock".into()),
            ApiError::TooManyConnections => {
                Some("the gateway is at its connection limit; retry".into())
            }
            ApiError::RequestTimeout => Some(format!(
                "the body must arrive within {} s of the headers",
                BODY_READ_TIMEOUT.as_secs()
            )),
            ApiError::Unauthorized(why) => Some(why.to_string()),
            ApiError::OperatorBusy => Some(
                "an operator action on this SKU (a restore) has its state away from Redis right \
                 now; read the view again in a moment"
                    .into(),
            ),
            ApiError::StatePresent(what) => Some((*what).into()),
            ApiError::BooksMoving => Some(
                "the writers recorded winners under every reading of the books just taken, so \
                 none of them tells whether they balance; read the view again"
                    .into(),
            ),
            // Nothing comes back by waiting: an operator must rebuild the SKU from the ledger.
            ApiError::Unavailable(StoreError::SkuLost) => Some(
                "Redis holds no state for this SKU (it lost its data): claims fail closed until \
                 an operator restores it (POST /admin/skus/{sku}/restore)"
                    .into(),
            ),
            ApiError::Unavailable(StoreError::Stale) => Some(
                "redis holds an older state of this SKU than the ledger; closed until restore"
                    .into(),
            ),
            ApiError::OutcomeUnknown(_) | ApiError::Unavailable(StoreError::OutcomeUnknown(_)) => {
                Some("the claim was sent and its answer lost; GET /v1/claims/{claim_id} tells once it settles".into())
            }
            ApiError::Unavailable(StoreError::Timeout) => {
                Some("the operation's answer was lost; it is being settled, read the state before retrying".into())
            }
            ApiError::Unavailable(e) => {
                tracing::warn!(error = %e, "answering 503: redis could not decide");
                None
            }
            ApiError::Database(e) => {
                tracing::warn!(error = %e, "answering 503: postgres could not answer");
                None
            }
            _ => None,
        };
        let claim_id = match &self {
            ApiError::OutcomeUnknown(id)
            | ApiError::Unavailable(StoreError::OutcomeUnknown(id)) => Some(*id),
            _ => None,
        };
        let bytes = match (&self, detail, claim_id) {
            (ApiError::SeatsTaken(ids), ..) => {
                let detail = self.fixed_detail().map(str::to_string);
                seat_body(status, code, title, detail, None, (Some(ids.clone()), None))
            }
            (ApiError::NoAdjacentSeats(n), ..) => {
                let detail = self.fixed_detail().map(str::to_string);
                seat_body(status, code, title, detail, None, (None, Some(*n)))
            }
            // The hot refusals (sold_out above all) carry neither, or a fixed detail: rendered
            // once per title.
            (_, None, None) => plain_body(status, code, title, self.fixed_detail()),
            (_, detail, claim_id) => problem_body(status, code, title, detail, claim_id),
        };
        let mut h = HeaderMap::with_capacity(2);
        h.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if status == StatusCode::SERVICE_UNAVAILABLE || status == StatusCode::TOO_MANY_REQUESTS {
            h.insert(RETRY_AFTER, HeaderValue::from_static("1"));
        }
        match self {
            ApiError::MethodNotAllowed(allow) => {
                h.insert(hyper::header::ALLOW, HeaderValue::from_static(allow));
            }
            ApiError::Unauthorized(why) => {
                h.insert(WWW_AUTHENTICATE, challenge(why));
            }
            // The rest of the body is never read: the connection cannot carry another request.
            ApiError::RequestTimeout => {
                h.insert(CONNECTION, HeaderValue::from_static("close"));
            }
            _ => {}
        }
        (status, h, bytes)
    }

    /// The metric label of a refused claim.
    pub fn code(&self) -> &'static str {
        self.parts().1
    }
}

/// The RFC 6750 challenge of a 401: no error code when no token came, `invalid_token` with
/// the reason otherwise (every reason is plain ASCII without quotes, as the grammar needs).
fn challenge(why: AuthError) -> HeaderValue {
    let value = if why.had_credentials() {
        format!(r#"Bearer realm="dropgate", error="invalid_token", error_description="{why}""#)
    } else {
        r#"Bearer realm="dropgate""#.to_string()
    };
    HeaderValue::from_str(&value).unwrap_or(HeaderValue::from_static("Bearer"))
}

fn problem_body(
    status: StatusCode,
    code: &str,
    title: &str,
    detail: Option<String>,
    claim_id: Option<uuid::Uuid>,
) -> Bytes {
    seat_body(status, code, title, detail, claim_id, (None, None))
}

/// A problem with a seated claim's extras: the seats taken, or the largest block.
fn seat_body(
    status: StatusCode,
    code: &str,
    title: &str,
    detail: Option<String>,
    claim_id: Option<uuid::Uuid>,
    (taken, largest_block): (Option<Vec<String>>, Option<i64>),
) -> Bytes {
    let body = Problem {
        kind: type_uri(code),
        title,
        status: status.as_u16(),
        code,
        detail,
        claim_id,
        taken,
        largest_block,
    };
    Bytes::from(serde_json::to_vec(&body).unwrap_or_default())
}

/// The body of a problem with no claim id and a fixed detail or none: the same bytes every
/// time for a title, so rendered once and shared (a `Bytes` clone is a reference count). By
/// title, not code: two refusals share `overloaded` (claims waiting, a visitor's joins).
fn plain_body(
    status: StatusCode,
    code: &'static str,
    title: &'static str,
    detail: Option<&'static str>,
) -> Bytes {
    static PLAIN: LazyLock<RwLock<HashMap<&'static str, Bytes>>> = LazyLock::new(Default::default);
    if let Some(b) = PLAIN.read().get(title) {
        return b.clone();
    }
    let b = problem_body(status, code, title, detail.map(str::to_string), None);
    PLAIN.write().insert(title, b.clone());
    b
}

/// The problem's `type`: `/problems/<code with - for _>`, a page the gateway serves
/// ([`super::problems`]), so the reference resolves against the answer's own URL.
pub fn type_uri(code: &str) -> String {
    format!("/problems/{}", code.replace('_', "-"))
}
