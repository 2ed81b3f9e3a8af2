//! Each [`ApiError`]'s status, `code` and title, and the details that never vary: the one
//! table API.md's codes are answered from (`problems.rs` serves the same codes' pages).

use hyper::StatusCode;

use super::ApiError;
use crate::error::StoreError;

impl ApiError {
    pub(in crate::http) fn parts(&self) -> (StatusCode, &'static str, &'static str) {
        use ApiError::*;
        match self {
            BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request", "Bad request"),
            Unauthorized(_) => (StatusCode::UNAUTHORIZED, "unauthorized", "Unauthorized"),
            NotFound => (StatusCode::NOT_FOUND, "not_found", "Not found"),
            UnknownSku => (StatusCode::NOT_FOUND, "unknown_sku", "Unknown SKU"),
            UnknownClaim => (StatusCode::NOT_FOUND, "unknown_claim", "Unknown claim"),
            MethodNotAllowed(_) => (
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "Method not allowed",
            ),
            PayloadTooLarge => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                "Payload too large",
            ),
            UnsupportedMediaType => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "Unsupported media type",
            ),
            SoldOut => (StatusCode::CONFLICT, "sold_out", "Sold out"),
            LimitReached => (
                StatusCode::CONFLICT,
                "limit_reached",
                "Per-user limit reached",
            ),
            KeyReused => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency_key_reused",
                "Idempotency key reused with another request",
            ),
            SkuExists => (
                StatusCode::CONFLICT,
                "sku_exists",
                "SKU exists with another total",
            ),
            InsufficientStock => (
                StatusCode::CONFLICT,
                "insufficient_stock",
                "Remaining stock would go below 0",
            ),
            StatePresent(_) => (
                StatusCode::CONFLICT,
                "state_present",
                "Redis still holds this SKU's state",
            ),
            NotOpen => (StatusCode::CONFLICT, "not_open", "The sale has not opened"),
            Closed => (StatusCode::CONFLICT, "closed", "The sale has closed"),
            HoldExpired => (StatusCode::CONFLICT, "hold_expired", "The hold has expired"),
            ClaimCancelled => (
                StatusCode::CONFLICT,
                "claim_cancelled",
                "The claim was cancelled",
            ),
            ClaimConfirmed => (
                StatusCode::CONFLICT,
                "claim_confirmed",
                "The claim was confirmed",
            ),
            ClaimCompensated => (
                StatusCode::CONFLICT,
                "claim_compensated",
                "The claim could not be recorded and its units were given back",
            ),
            InStock => (
                StatusCode::CONFLICT,
                "in_stock",
                "Units remain: claim them instead",
            ),
            UnknownEntry => (
                StatusCode::NOT_FOUND,
                "unknown_entry",
                "Unknown waitlist entry",
            ),
            Overloaded => (
                StatusCode::TOO_MANY_REQUESTS,
                "overloaded",
                "Too many claims waiting",
            ),
            NotAdmitted => (
                StatusCode::FORBIDDEN,
                "not_admitted",
                "Not admitted by the waiting room",
            ),
            NotQueued => (StatusCode::CONFLICT, "not_queued", "The SKU has no queue"),
            NotSeated => (StatusCode::CONFLICT, "not_seated", "The SKU has no seats"),
            UnknownTicket => (
                StatusCode::NOT_FOUND,
                "unknown_ticket",
                "Unknown waiting-room ticket",
            ),
            JoinRate => (
                StatusCode::TOO_MANY_REQUESTS,
                "overloaded",
                "Too many joins from this visitor",
            ),
            SeatsTaken(_) => (StatusCode::CONFLICT, "seats_taken", "Seats taken"),
            SeatedSku => (
                StatusCode::CONFLICT,
                "seated_sku",
                "Not done on a seated SKU",
            ),
            NoAdjacentSeats(_) => (
                StatusCode::CONFLICT,
                "no_adjacent_seats",
                "No row has that many adjacent free seats",
            ),
            OutcomeUnknown(_)
            | Unavailable(StoreError::Timeout | StoreError::OutcomeUnknown(_)) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "outcome_unknown",
                "Outcome not known yet",
            ),

            RequestTimeout => (
                StatusCode::REQUEST_TIMEOUT,
                "request_timeout",
                "Request body too slow",
            ),
            Unavailable(_) | Database(_) | TooManyConnections | OperatorBusy | BooksMoving => (
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "Temporarily unavailable",
            ),
        }
    }

    /// The detail of a refusal that says the same every time: what the client can do.
    pub(super) fn fixed_detail(&self) -> Option<&'static str> {
        use ApiError::*;
        Some(match self {
            UnknownSku => "no SKU of this id is declared (PUT /admin/skus/{sku} declares one)",
            UnknownClaim => "no claim of this id is the caller's",
            UnknownEntry => "no waitlist entry of this id is the caller's",
            UnknownTicket => "no waiting-room ticket of this id is the caller's",
            NotFound => "no route has this path; GET /openapi.json lists every route",
            PayloadTooLarge => {
                "a request body may hold at most 16 KiB (1 MiB on the /admin routes)"
            }
            SoldOut => {
                "no units remain for this quantity; the waitlist offers units that come back"
            }
            LimitReached => "you already hold what the per-user limit allows",
            UnsupportedMediaType => "send the body as application/json",
            KeyReused => {
                "this Idempotency-Key was used with another request; a retry must send the same \
                 request, a new request a new key"
            }
            InsufficientStock => {
                "the restock's delta would take the remaining stock below 0; GET the SKU view \
                 for the remaining units"
            }
            NotAdmitted => {
                "this SKU sells only to the admission tokens its waiting room minted \
                 (POST /v1/skus/{sku}/queue)"
            }
            NotQueued => "the SKU has no waiting room: claim it directly",
            NotSeated => "the SKU is sold by count (general admission): it has no seat map",
            InStock => "units remain: claim them instead of joining the waitlist",
            SeatedSku => {
                "a seated SKU's total is its seat plan: grow it by declaring longer rows or more \
                 rows and sections (PUT /admin/skus/{sku})"
            }
            SeatsTaken(_) => {
                "these seats (taken) are not free: choose others, or ask for best available"
            }
            NoAdjacentSeats(_) => {
                "no row has that many adjacent free seats (largest_block is the most any row has): \
                 ask for fewer, or for seats apart (\"adjacent\": false)"
            }
            _ => return None,
        })
    }
}
