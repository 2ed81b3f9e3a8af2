//! Operator routes: declare, view, restock, restore. All need the admin token.

use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use serde::Deserialize;

use super::handler::{admin, check_sku, json, parse, Result};
use super::limits::read_body;
use super::problem::{ApiError, Body};
use super::AppState;
use crate::{catalog, inventory, ledger};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeclareBody {
    /// Optional for a seated SKU (then the number of seats).
    total: Option<i64>,
    /// Reserved seating (API.md, "Reserved seating"; `crate::seating`).
    seats: Option<serde_json::Value>,
    per_user_limit: Option<i64>,
    hold_seconds: Option<i64>,
    offer_seconds: Option<i64>,
    opens_at: Option<chrono::DateTime<chrono::FixedOffset>>,
    closes_at: Option<chrono::DateTime<chrono::FixedOffset>>,
    /// Redis shards of the SKU (1..=16, default 1; see `crate::shards`).
    shards: Option<i64>,
    /// The SKU's waiting room (API.md, "Waiting room"; `crate::queue`).
    queue: Option<QueueBody>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct QueueBody {
    admit_per_second: i64,
    admission_ttl_seconds: Option<i64>,
    prequeue_from: Option<chrono::DateTime<chrono::FixedOffset>>,
    /// Admitted tickets not yet used or expired stay within this many times the units that
    /// can still be sold (default 1.5).
    overbook: Option<f64>,
    /// The waiting page's look and where it hands an admitted visitor back.
    page: Option<crate::queue::page::PageSettings>,
}

/// Longest hold or offer accepted: a week (a checkout, not a reservation system).
const MAX_HOLD_SECS: i64 = 7 * 24 * 3600;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RestockBody {
    delta: i64,
}

/// Largest total (and restock delta) accepted: far above any drop, and far below 2^53, past
/// which Lua's doubles stop counting units exactly.
const MAX_UNITS: i64 = 1_000_000_000_000;

pub(super) async fn declare(
    state: &AppState,
    sku: &str,
    req: Request<Incoming>,
) -> Result<Response<Body>> {
    admin(state, &req)?;
    let sku = check_sku(sku)?;
    let body: DeclareBody = parse(&read_body(req, crate::config::MAX_ADMIN_BODY_BYTES).await?)?;
    let limit = body.per_user_limit.unwrap_or(1);
    let hold = body.hold_seconds.unwrap_or(0);
    let plan = seat_plan(&body)?;
    let total = match (&plan, body.total) {
        (Some(p), _) => i64::from(p.seats()),
        (None, Some(t)) => t,
        (None, None) => return Err(ApiError::BadRequest("total is required".into())),
    };
    if !(0..=MAX_UNITS).contains(&total) {
        return Err(ApiError::BadRequest(format!(
            "total must be in 0..={MAX_UNITS}"
        )));
    }
    if !(1..=1_000_000).contains(&limit) {
        return Err(ApiError::BadRequest(
            "per_user_limit must be in 1..=1000000".into(),
        ));
    }
    let offer = body.offer_seconds.unwrap_or(0);
    for (name, v) in [("hold_seconds", hold), ("offer_seconds", offer)] {
        if !(0..=MAX_HOLD_SECS).contains(&v) {
            return Err(ApiError::BadRequest(format!(
                "{name} must be in 0..={MAX_HOLD_SECS}"
            )));
        }
    }
    let shards = body.shards.unwrap_or(1);
    if !(1..=i64::from(crate::layout::MAX_SHARDS)).contains(&shards) {
        return Err(ApiError::BadRequest(format!(
            "shards must be in 1..={}",
            crate::layout::MAX_SHARDS
        )));
    }
    let opens_at = body.opens_at.map(|t| t.to_utc());
    let closes_at = body.closes_at.map(|t| t.to_utc());
    if let (Some(o), Some(c)) = (opens_at, closes_at) {
        if c <= o {
            return Err(ApiError::BadRequest(
                "closes_at must be later than opens_at".into(),
            ));
        }
    }
    let queue = body
        .queue
        .as_ref()
        .map(|q| queue_terms(q, opens_at, shards))
        .transpose()?;
    let terms = inventory::SkuTerms {
        per_user_limit: limit as i32,
        hold_seconds: hold as i32,
        offer_seconds: offer as i32,
        opens_at,
        closes_at,
        shards: shards as i32,
        queue,
        seats: plan,
    };
    let d = inventory::declare(&state.store, &state.catalog, sku, total, &terms).await?;
    let status = if d.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(json(status, &d.view))
}

/// A declare's `seats`, checked before anything is stored: `total`, when given too, must be
/// the number of seats. Shards and queues on a seated SKU are not built yet (docs/seats.md,
/// "Not built yet"): refused rather than half served.
fn seat_plan(body: &DeclareBody) -> Result<Option<std::sync::Arc<crate::seating::SeatPlan>>> {
    let Some(v) = &body.seats else {
        return Ok(None);
    };
    let plan = crate::seating::SeatPlan::parse(v).map_err(|e| ApiError::BadRequest(e.0))?;
    if body.total.is_some_and(|t| t != i64::from(plan.seats())) {
        return Err(ApiError::BadRequest(format!(
            "total must equal the number of seats ({})",
            plan.seats()
        )));
    }
    if body.shards.unwrap_or(1) != 1 || body.queue.is_some() {
        return Err(ApiError::BadRequest(
            "a seated SKU has one shard and no queue".into(),
        ));
    }
    Ok(Some(std::sync::Arc::new(plan)))
}

/// A declare's `queue`, checked before anything is stored.
fn queue_terms(
    q: &QueueBody,
    opens_at: Option<chrono::DateTime<chrono::Utc>>,
    shards: i64,
) -> Result<inventory::QueueTerms> {
    use crate::queue::{
        DEFAULT_ADMISSION_TTL, MAX_ADMISSION_TTL, MAX_ADMIT_PER_SECOND, MIN_ADMISSION_TTL,
    };
    if !(1..=MAX_ADMIT_PER_SECOND).contains(&q.admit_per_second) {
        return Err(ApiError::BadRequest(format!(
            "queue.admit_per_second must be in 1..={MAX_ADMIT_PER_SECOND}"
        )));
    }
    let ttl = q.admission_ttl_seconds.unwrap_or(DEFAULT_ADMISSION_TTL);
    if !(MIN_ADMISSION_TTL..=MAX_ADMISSION_TTL).contains(&ttl) {
        return Err(ApiError::BadRequest(format!(
            "queue.admission_ttl_seconds must be in {MIN_ADMISSION_TTL}..={MAX_ADMISSION_TTL}"
        )));
    }
    let overbook = q.overbook.unwrap_or(crate::queue::DEFAULT_OVERBOOK);
    if !(1.0..=crate::queue::MAX_OVERBOOK).contains(&overbook) {
        return Err(ApiError::BadRequest(format!(
            "queue.overbook must be in 1..={} (admitted tickets per unit that can still be sold)",
            crate::queue::MAX_OVERBOOK
        )));
    }
    if let Some(page) = &q.page {
        page.check().map_err(ApiError::BadRequest)?;
    }
    let prequeue_from = q.prequeue_from.map(|t| t.to_utc());
    if let Some(from) = prequeue_from {
        match opens_at {
            Some(o) if from < o => {}
            Some(_) => {
                return Err(ApiError::BadRequest(
                    "queue.prequeue_from must be earlier than opens_at".into(),
                ))
            }
            None => {
                return Err(ApiError::BadRequest(
                    "queue.prequeue_from needs opens_at (the pre-queue is shuffled at the opening)"
                        .into(),
                ))
            }
        }
    }
    if shards != 1 {
        return Err(ApiError::BadRequest(
            "a SKU with a queue has one shard: its line lives in the SKU's slot".into(),
        ));
    }
    Ok(inventory::QueueTerms {
        admit_per_second: q.admit_per_second as i32,
        admission_ttl_seconds: ttl as i32,
        prequeue_from,
        overbook_milli: (overbook * 1000.0).round() as i32,
        page: q.page.clone(),
    })
}

pub(super) async fn sku_view(
    state: &AppState,
    sku: &str,
    req: &Request<Incoming>,
) -> Result<Response<Body>> {
    admin(state, req)?;
    let sku = check_sku(sku)?;
    let v = ledger::view(&state.store, &state.catalog, sku).await?;
    // Never `consistent: false` for books that balance (monitoring pages on it): a reading
    // that cannot tell says so instead.
    if v.moving() {
        return Err(ApiError::BooksMoving);
    }
    let mut r = json(StatusCode::OK, &v);
    // Whether the numbers are one instant's (docs/ledger-view.md): an answer read while Redis
    // kept moving says so here, since the body's fields are the contract's.
    if let Ok(h) = hyper::header::HeaderValue::from_str(&v.reading.to_string()) {
        r.headers_mut().insert("dropgate-reading", h);
    }
    Ok(r)
}

pub(super) async fn restock(
    state: &AppState,
    sku: &str,
    req: Request<Incoming>,
) -> Result<Response<Body>> {
    admin(state, &req)?;
    let sku = check_sku(sku)?;
    let RestockBody { delta } = parse(&read_body(req, crate::config::MAX_ADMIN_BODY_BYTES).await?)?;
    // `unsigned_abs`: `abs` of i64::MIN overflows (a panic in a debug build, a negative
    // "absolute value" that passes the check in a release build).
    if delta == 0 || delta.unsigned_abs() > MAX_UNITS.unsigned_abs() {
        return Err(ApiError::BadRequest(format!(
            "delta must be a non-zero integer within ±{MAX_UNITS}"
        )));
    }
    // Checked before the restock rather than inside its transaction: two racing restocks can
    // each pass, which still leaves the total at a few times 10^12, far below 2^53.
    let sku_row = catalog::fetch(state.catalog.db(), sku)
        .await?
        .ok_or(ApiError::UnknownSku)?;
    if sku_row.seats.is_some() {
        // A seated SKU's total is its seat plan: a restock would add units no seat carries.
        return Err(ApiError::SeatedSku);
    }
    if sku_row.total.saturating_add(delta) > MAX_UNITS {
        return Err(ApiError::BadRequest(format!(
            "the total would pass {MAX_UNITS} (it is {})",
            sku_row.total
        )));
    }
    let v = inventory::restock(&state.store, &state.catalog, sku, delta).await?;
    Ok(json(StatusCode::OK, &v))
}

pub(super) async fn restore(
    state: &AppState,
    sku: &str,
    req: &Request<Incoming>,
) -> Result<Response<Body>> {
    admin(state, req)?;
    let sku = check_sku(sku)?;
    let force = match req.uri().query() {
        None | Some("") | Some("force=false") => false,
        Some("force=true") => true,
        Some(_) => {
            return Err(ApiError::BadRequest(
                "the only parameter is force=true".into(),
            ))
        }
    };
    let v = crate::restore::restore(&state.store, &state.catalog, sku, force)
        .await
        .map_err(|e| match ApiError::from(e) {
            // A restore's own case of the code: the state is live, and force replaces it.
            ApiError::StatePresent(_) => ApiError::StatePresent(
                "Redis still holds this SKU's state: a restore would replace its stock, \
                 per-user counts and holds with the ledger's. If that is what you want (a state \
                 known to be wrong), POST /admin/skus/{sku}/restore?force=true",
            ),
            other => other,
        })?;
    Ok(json(StatusCode::OK, &v))
}
