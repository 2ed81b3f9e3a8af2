//! The live drop page: `GET /admin/live` (the page, public: it holds no data) and
//! `GET /admin/live/stream` (the data, admin token only: one JSON line per second).
//!
//! The token travels only in the stream's `Authorization` header, sent by the page's
//! `fetch()`; EventSource cannot send headers, which is why the page reads a fetch stream of
//! newline-delimited JSON rather than SSE. The page keeps the token in `sessionStorage` (this
//! tab only) and never puts it in a URL, so it cannot reach access logs or the history.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Either, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use hyper::{Request, Response};

use super::handler::{admin, Result};
use super::problem::{full, ApiError, Body};
use super::AppState;
use crate::live::{Sources, Watch};

const PAGE: &str = include_str!("../live/page.html");
/// One frame per second, as the page promises.
const EVERY: Duration = Duration::from_secs(1);

pub(super) fn page() -> Response<Body> {
    let mut resp = Response::new(full(Bytes::from_static(PAGE.as_bytes())));
    let h = resp.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    // Nothing but the page itself may load or run: no CDN, no third party.
    h.insert(
        "content-security-policy",
        HeaderValue::from_static(
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'",
        ),
    );
    resp
}

/// Streams frames until the client goes away or the gateway drains. At most
/// [`crate::live::MAX_STREAMS`] at once: past that, 429.
pub(super) fn stream(state: &Arc<AppState>, req: &Request<Incoming>) -> Result<Response<Body>> {
    admin(state, req)?;
    let permit = state
        .live
        .streams
        .clone()
        .try_acquire_owned()
        .map_err(|_| ApiError::Overloaded)?;
    let frames = futures_util::stream::unfold(
        (state.clone(), Watch::default(), permit, true),
        |(state, mut watch, permit, first)| async move {
            if !first {
                tokio::time::sleep(EVERY).await;
            }
            // A drain ends the stream, so a graceful shutdown is not held for its grace.
            if state.is_draining() {
                return None;
            }
            let sources = Sources {
                live: &state.live,
                store: &state.store,
                catalog: &state.catalog,
                seat_maps: &state.seat_maps,
            };
            let frame = watch.frame(&sources).await;
            let mut line = serde_json::to_vec(&frame).unwrap_or_default();
            line.push(b'\n');
            Some((
                Ok::<_, Infallible>(Frame::data(Bytes::from(line))),
                (state, watch, permit, false),
            ))
        },
    );
    let mut resp = Response::new(Either::Right(StreamBody::new(frames).boxed_unsync()));
    let h = resp.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(resp)
}
