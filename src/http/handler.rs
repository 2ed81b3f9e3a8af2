//! What every handler uses: the result type, the admin check, a SKU id's check, a header, a
//! JSON body read and a JSON answer.

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use hyper::{Request, Response, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::problem::{full, ApiError, Body};
use super::AppState;
use crate::sku::SkuId;

/// A handler's answer: a response, or the error the one place ([`super::problem`]) turns into
/// problem+json.
pub(super) type Result<T> = std::result::Result<T, ApiError>;

pub(super) fn admin(state: &AppState, req: &Request<Incoming>) -> Result<()> {
    state
        .verifier
        .admin(header(req, AUTHORIZATION.as_str()))
        .map_err(ApiError::Unauthorized)
}

/// The path's SKU segment as a SKU id, checked once here: past this point a handler holds a
/// [`SkuId`], never the raw segment.
pub(super) fn check_sku(sku: &str) -> Result<&SkuId> {
    SkuId::parse(sku)
        .ok_or_else(|| ApiError::BadRequest("a SKU id matches ^[A-Za-z0-9._-]{1,64}$".into()))
}

pub(super) fn header<'a>(req: &'a Request<Incoming>, name: &str) -> Option<&'a str> {
    req.headers().get(name).and_then(|v| v.to_str().ok())
}

pub(super) fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::BadRequest(format!("invalid JSON body: {e}")))
}

pub(super) fn json<T: Serialize>(status: StatusCode, body: &T) -> Response<Body> {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let mut resp = Response::new(full(Bytes::from(bytes)));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}
