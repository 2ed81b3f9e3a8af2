//! `GET /v1/skus/{sku}/seats[?section=A]` (API.md "Reserved seating"): the seat map for the
//! crowd, from this gateway's copy at most a second old ([`crate::seatmaps`]), with `ETag`
//! and 304 on `If-None-Match`, and no Redis call per request.

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, AUTHORIZATION, CACHE_CONTROL, ETAG, IF_NONE_MATCH};
use hyper::{Request, Response, StatusCode};
use serde::Serialize;

use super::handler::{check_sku, header, json, known_sku, Result};
use super::problem::{full, ApiError, Body};
use super::AppState;
use crate::seating::SeatPlan;
use crate::seatmaps::{plan_tag, Copy, REFRESH};

#[derive(Serialize)]
struct MapBody<'a> {
    sku: &'a str,
    as_of: String,
    sections: Vec<SectionBody<'a>>,
}

#[derive(Serialize)]
struct SectionBody<'a> {
    name: &'a str,
    rows: Vec<RowBody<'a>>,
}

#[derive(Serialize)]
struct RowBody<'a> {
    name: &'a str,
    seats: String,
}

/// The `section` of the query, if any (`?section=A`); other parameters are ignored. Section
/// names are `A-Za-z0-9._` (the plan's rule), so a name needs no decoding: one that does is
/// no section of the plan.
fn section_asked(req: &Request<Incoming>) -> Option<String> {
    req.uri()
        .query()?
        .split('&')
        .find_map(|kv| kv.strip_prefix("section="))
        .map(str::to_string)
}

pub(super) async fn map(
    state: &AppState,
    sku: &str,
    req: &Request<Incoming>,
) -> Result<Response<Body>> {
    // Any token the gateway verifies: an admission token or a visitor's (the crowd waiting
    // in line looks at the map too); one scoped to another SKU is refused.
    state
        .verifier
        .reader(header(req, AUTHORIZATION.as_str()), Some(sku))
        .map_err(ApiError::Unauthorized)?;
    let sku = check_sku(sku)?;
    let entry = known_sku(state, sku).await?;
    let plan = entry.plan.as_ref().ok_or(ApiError::NotSeated)?;
    let section = section_asked(req);
    if let Some(name) = &section {
        if plan.section(name).is_none() {
            return Err(ApiError::BadRequest(format!(
                "section {name:?} is not in this SKU's plan"
            )));
        }
    }
    let copy = state
        .seat_maps
        .copy(
            &state.store,
            sku.as_str(),
            &plan_tag(entry.tag, plan),
            REFRESH,
        )
        .await
        .map_err(|e| ApiError::Unavailable(crate::lifecycle::read_error(e)))?;
    let etag = format!(
        "W/\"{}{}\"",
        copy.tag,
        section
            .as_deref()
            .map_or(String::new(), |s| format!("-{s}"))
    );
    let unchanged = header(req, IF_NONE_MATCH.as_str())
        .is_some_and(|h| h.split(',').any(|t| t.trim() == etag || t.trim() == "*"));
    let mut resp = if unchanged {
        let mut r = Response::new(full(Bytes::new()));
        *r.status_mut() = StatusCode::NOT_MODIFIED;
        r
    } else {
        json(
            StatusCode::OK,
            &body(sku.as_str(), plan, &copy, section.as_deref()),
        )
    };
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&etag) {
        h.insert(ETAG, v);
    }
    // Shared caches may keep it as long as the gateway does.
    h.insert(CACHE_CONTROL, HeaderValue::from_static("public, max-age=1"));
    Ok(resp)
}

fn body<'a>(sku: &'a str, plan: &'a SeatPlan, copy: &Copy, section: Option<&str>) -> MapBody<'a> {
    let as_of = chrono::DateTime::from_timestamp_millis(copy.as_of_ms)
        .map(|t| crate::queue::rfc3339(&t))
        .unwrap_or_default();
    let sections = plan
        .sections()
        .iter()
        .filter(|s| section.is_none_or(|want| want == s.name))
        .map(|s| SectionBody {
            name: &s.name,
            rows: s
                .rows
                .iter()
                .map(|r| RowBody {
                    name: &r.name,
                    seats: copy.row(r.offset, r.count),
                })
                .collect(),
        })
        .collect();
    MapBody {
        sku,
        as_of,
        sections,
    }
}
