//! `GET /openapi.json`: the OpenAPI 3.1 description of the API, kept by hand in
//! `docs/openapi.json` (documentation, beside the pages that explain it) and served as it is.
//!
//! Kept by hand rather than generated: the router is a table ([`super::router::ROUTES`]) and
//! the handlers read raw bodies, so generating would mean annotating every handler and body
//! with a derive macro crate for a document that is mostly prose (problem codes, headers,
//! events). It cannot drift: `tests/api/openapi.rs` checks its paths and methods against the
//! route table both ways, probes every route on a live gateway, and checks its problem codes
//! against every code [`super::problem`] can emit; `tests/schemathesis.sh` checks live answers
//! against it.

use bytes::Bytes;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::Response;

use super::problem::{full, Body};

/// The document, as served.
pub const DOCUMENT: &str = include_str!("../../docs/openapi.json");

pub(super) fn document() -> Response<Body> {
    let mut resp = Response::new(full(Bytes::from_static(DOCUMENT.as_bytes())));
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}
