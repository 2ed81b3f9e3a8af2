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

/// The catalog's entry of `sku`: 404 `unknown_sku` for a SKU nobody declared, the catalog's
/// own refusal (429, 503) when it cannot tell.
pub(super) async fn known_sku(
    state: &AppState,
    sku: &SkuId,
) -> Result<std::sync::Arc<crate::catalog::Sku>> {
    state
        .catalog
        .get(sku)
        .await
        .map_err(ApiError::from)?
        .ok_or(ApiError::UnknownSku)
}

pub(super) fn header<'a>(req: &'a Request<Incoming>, name: &str) -> Option<&'a str> {
    req.headers().get(name).and_then(|v| v.to_str().ok())
}

pub(super) fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T> {
    // serde takes a struct from an array too (`[1]` was a claim of one unit): every body is
    // one JSON object.
    if body.trim_ascii_start().first() != Some(&b'{') {
        return Err(ApiError::BadRequest(
            "invalid JSON body: expected one JSON object".into(),
        ));
    }
    // The fast decode first (the hot path's claim bodies); only a refused body is decoded
    // again, tracking the path, so the detail names the field (`quantity: ...`).
    serde_json::from_slice(body).map_err(|e| {
        let mut de = serde_json::Deserializer::from_slice(body);
        let detail = match serde_path_to_error::deserialize::<_, T>(&mut de) {
            Err(pe) if pe.path().to_string() != "." => {
                format!("{}: {}", pe.path(), plain_types(&pe.inner().to_string()))
            }
            _ => plain_types(&e.to_string()),
        };
        ApiError::BadRequest(format!("invalid JSON body: {detail}"))
    })
}

/// serde's Rust type names as a client reads them: `expected i64` says nothing to a front end.
fn plain_types(message: &str) -> String {
    let mut s = message.to_string();
    for (rust, plain) in [
        ("expected i64", "expected an integer"),
        ("expected i32", "expected an integer"),
        ("expected u64", "expected a non-negative integer"),
        ("expected u32", "expected a non-negative integer"),
        ("expected u16", "expected a non-negative integer"),
        ("expected f64", "expected a number"),
    ] {
        s = s.replace(rust, plain);
    }
    // `expected struct QueueBody with 5 elements`: a Rust type's name says nothing either.
    if let Some(i) = s.find("expected struct ") {
        let tail = s[i..]
            .find(" at line ")
            .map_or(String::new(), |j| s[i + j..].to_string());
        s = format!("{}expected a JSON object{tail}", &s[..i]);
    }
    s
}

pub(super) fn json<T: Serialize>(status: StatusCode, body: &T) -> Response<Body> {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let mut resp = Response::new(full(Bytes::from(bytes)));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}
