//! The route table and the dispatch. The table is the router's whole surface: a path that
//! matches no entry is 404, a method an entry does not list is 405 with its `Allow`, and only
//! then does [`route`] pick the handler. `GET /openapi.json` describes exactly this table;
//! `tests/api/openapi.rs` checks the two against each other and probes every entry on a live
//! gateway, so a route cannot be added, removed or given a method without the description.

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};

use super::handler::{json, Result};
use super::problem::{ApiError, Body};
use super::routes;
use super::AppState;
use super::{admin, lifecycle, live, openapi, problems, queue, seatmap};
use crate::lifecycle::holds::HoldOp;

/// One path of the API and the methods it answers.
#[derive(Debug, Clone, Copy)]
pub struct Route {
    /// OpenAPI path template: `{name}` matches one path segment (empty included).
    pub path: &'static str,
    /// The methods, as an `Allow` header lists them.
    pub allow: &'static str,
}

impl Route {
    /// The methods this route answers.
    pub fn methods(&self) -> impl Iterator<Item = &'static str> {
        self.allow.split(", ")
    }

    /// The path parameters of `segments` if they match this route's template.
    fn matches<'a>(&self, segments: &[&'a str]) -> Option<Vec<&'a str>> {
        let template = self.path.trim_start_matches('/').split('/');
        if template.clone().count() != segments.len() {
            return None;
        }
        let mut params = Vec::new();
        for (t, s) in template.zip(segments) {
            if t.starts_with('{') {
                params.push(*s);
            } else if t != *s {
                return None;
            }
        }
        Some(params)
    }
}

const fn r(path: &'static str, allow: &'static str) -> Route {
    Route { path, allow }
}

/// Every route of the gateway. Adding one: an entry here, an arm in [`route`], its operation
/// in `docs/openapi.json`.
pub const ROUTES: &[Route] = &[
    r("/v1/skus/{sku}/claims", "POST"),
    r("/v1/claims/{claim_id}", "GET"),
    r("/v1/claims/{claim_id}/confirm", "POST"),
    r("/v1/claims/{claim_id}/cancel", "POST"),
    r("/v1/skus/{sku}/waitlist", "POST"),
    r("/v1/waitlist/{entry_id}", "GET, DELETE"),
    r("/admin/skus/{sku}", "GET, PUT"),
    r("/admin/skus/{sku}/restock", "POST"),
    r("/admin/skus/{sku}/restore", "POST"),
    r("/admin/live", "GET"),
    r("/admin/live/stream", "GET"),
    r("/openapi.json", "GET"),
    r("/problems/{problem}", "GET"),
    r("/healthz", "GET"),
    r("/readyz", "GET"),
    r("/metrics", "GET"),
    r("/v1/skus/{sku}/queue", "POST"),
    r("/v1/queue/{ticket_id}", "GET"),
    r("/queue/{sku}", "GET"),
    r("/v1/skus/{sku}/seats", "GET"),
];

/// Most path segments a route has; a longer path matches none.
const MAX_SEGMENTS: usize = 4;

pub async fn handle(state: &Arc<AppState>, req: Request<Incoming>) -> Response<Body> {
    match route(state, req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn route(state: &Arc<AppState>, req: Request<Incoming>) -> Result<Response<Body>> {
    // A clone of the URI shares its bytes: the path is borrowed from it, not copied, and the
    // segments live on the stack.
    let uri = req.uri().clone();
    let mut segments = [""; MAX_SEGMENTS + 1];
    let mut n = 0;
    for seg in uri.path().trim_start_matches('/').split('/') {
        if n == segments.len() {
            return Err(ApiError::NotFound);
        }
        segments[n] = seg;
        n += 1;
    }
    let (found, params) = ROUTES
        .iter()
        .find_map(|r| r.matches(&segments[..n]).map(|p| (r, p)))
        .ok_or(ApiError::NotFound)?;
    let method = req.method().clone();
    if !found.methods().any(|m| m == method.as_str()) {
        return Err(ApiError::MethodNotAllowed(found.allow));
    }
    // Every route takes JSON or no body: one sent as another type is refused whatever the
    // route does with its body (a route that reads none would otherwise act on it).
    if super::limits::body_of_another_type(&req) {
        return Err(ApiError::UnsupportedMediaType);
    }
    let p = |i: usize| params.get(i).copied().unwrap_or_default();
    match (found.path, method.as_str()) {
        ("/v1/skus/{sku}/claims", "POST") => routes::claim(state, p(0), req).await,
        ("/v1/claims/{claim_id}", "GET") => routes::get_claim(state, p(0), &req).await,
        ("/v1/claims/{claim_id}/confirm", "POST") => {
            lifecycle::decide_hold(state, p(0), &req, HoldOp::Confirm).await
        }
        ("/v1/claims/{claim_id}/cancel", "POST") => {
            lifecycle::decide_hold(state, p(0), &req, HoldOp::Cancel).await
        }
        ("/v1/skus/{sku}/waitlist", "POST") => lifecycle::join_waitlist(state, p(0), req).await,
        ("/v1/waitlist/{entry_id}", "GET") => lifecycle::get_entry(state, p(0), &req).await,
        ("/v1/waitlist/{entry_id}", "DELETE") => lifecycle::leave_waitlist(state, p(0), &req).await,
        // The operators' routes are boxed: their futures are 10-12 KiB, twice a claim's (5.5 KiB),
        // and unboxed they set the size of every request's future (24.5 KiB in all), which
        // every request moves into place and every connection keeps a box of.
        ("/admin/skus/{sku}", "PUT") => Box::pin(admin::declare(state, p(0), req)).await,
        ("/admin/skus/{sku}", "GET") => Box::pin(admin::sku_view(state, p(0), &req)).await,
        ("/admin/skus/{sku}/restock", "POST") => Box::pin(admin::restock(state, p(0), req)).await,
        ("/admin/skus/{sku}/restore", "POST") => Box::pin(admin::restore(state, p(0), &req)).await,
        ("/admin/live", "GET") => Ok(live::page()),
        ("/admin/live/stream", "GET") => live::stream(state, &req),
        ("/openapi.json", "GET") => Ok(openapi::document()),
        ("/problems/{problem}", "GET") => problems::page(p(0)),
        ("/healthz", "GET") => Ok(json(StatusCode::OK, &routes::Status { status: "ok" })),
        ("/readyz", "GET") => Ok(routes::readyz(state).await),
        ("/metrics", "GET") => Ok(routes::metrics(state)),
        ("/v1/skus/{sku}/queue", "POST") => queue::join(state, p(0), &req).await,
        ("/v1/queue/{ticket_id}", "GET") => queue::get_ticket(state, p(0), &req).await,
        ("/queue/{sku}", "GET") => Box::pin(queue::page(state, p(0), &req)).await,
        ("/v1/skus/{sku}/seats", "GET") => seatmap::map(state, p(0), &req).await,
        // An entry of the table without its arm: tests/api/openapi.rs probes every entry.
        _ => Err(ApiError::NotFound),
    }
}
