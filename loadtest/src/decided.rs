//! Requests whose non-2xx answers can be decided outcomes (409 `sold_out`, `limit_reached`).
//!
//! goose's `request` counts every non-2xx answer in its ERRORS table as it arrives, and a later
//! `set_success` does not take it back: a passing hot_sku_drop run listed 221,037 "errors",
//! every one a decided 409. So these requests are sent with the goose user's own client (its
//! timeout and base URL), judged first, and recorded once with their verdict as a custom
//! request of the same method and name: the ERRORS table then holds only real errors.

use std::time::{Duration, Instant};

use goose::prelude::*;
use reqwest::header::HeaderMap;
use reqwest::RequestBuilder;

pub struct Answered {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

/// Sends the request; the time it took and its answer, or why there was none.
pub async fn send(builder: RequestBuilder) -> (Duration, Result<Answered, &'static str>) {
    let started = Instant::now();
    let answered = match builder.send().await {
        Err(_) => Err("no answer"),
        Ok(r) => {
            let status = r.status().as_u16();
            let headers = r.headers().clone();
            match r.bytes().await {
                Ok(body) => Ok(Answered {
                    status,
                    headers,
                    body: body.to_vec(),
                }),
                Err(_) => Err("body not read"),
            }
        }
    };
    (started.elapsed(), answered)
}

/// Records the request once: a success, or a failure saying why.
pub async fn record(
    user: &mut GooseUser,
    name: &str,
    elapsed: Duration,
    status: Option<u16>,
    failure: Option<&str>,
) -> TransactionResult {
    user.record_custom_request_duration("POST", name, elapsed, failure.is_none(), status, failure)
        .await
}
