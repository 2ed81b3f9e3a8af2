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

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpListener;

    use goose::metrics::GooseMetrics;

    use super::*;

    /// A server answering every request 409, as a sold-out SKU does.
    fn sold_out_server() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut s) = stream else { continue };
                std::thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    let body = r#"{"code":"sold_out"}"#;
                    while matches!(s.read(&mut buf), Ok(n) if n > 0) {
                        let reply = format!(
                            "HTTP/1.1 409 Conflict\r\ncontent-type: application/problem+json\r\n\
                             content-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if s.write_all(reply.as_bytes()).is_err() {
                            break;
                        }
                    }
                });
            }
        });
        format!("http://{addr}")
    }

    async fn judged(user: &mut GooseUser) -> TransactionResult {
        let builder = user.get_request_builder(&GooseMethod::Post, "/v1/skus/s/claims")?;
        let (elapsed, answered) = send(builder).await;
        let status = answered.ok().map(|a| a.status);
        let failure = (status != Some(409)).then_some("not the decided 409");
        tokio::time::sleep(Duration::from_millis(50)).await;
        record(user, "claim", elapsed, status, failure).await
    }

    /// What the scenarios did before: goose's `request`, then `set_success` on the 409.
    async fn through_goose(user: &mut GooseUser) -> TransactionResult {
        let mut r = user.post("/v1/skus/s/claims", "{}").await?;
        tokio::time::sleep(Duration::from_millis(50)).await;
        r.request.error.clear();
        user.set_success(&mut r.request)
    }

    fn run(host: &str, transaction: Transaction) -> GooseMetrics {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            GooseAttack::initialize_with_config(goose::config::GooseConfiguration::default())
                .unwrap()
                .register_scenario(scenario!("decided").register_transaction(transaction))
                .set_default(GooseDefault::Host, host)
                .unwrap()
                .set_default(GooseDefault::Users, 1)
                .unwrap()
                .set_default(GooseDefault::IncreaseRate, "1")
                .unwrap()
                .set_default(GooseDefault::RunTime, 1)
                .unwrap()
                .set_default(GooseDefault::NoTelnet, true)
                .unwrap()
                .set_default(GooseDefault::Quiet, 1)
                .unwrap()
                .execute()
                .await
                .unwrap()
        })
    }

    #[test]
    fn a_decided_409_is_not_in_gooses_errors_table() {
        let host = sold_out_server();
        let metrics = run(&host, transaction!(judged));
        let claims = metrics
            .requests
            .get("POST claim")
            .expect("the claims were recorded");
        assert!(claims.success_count > 0, "{claims:?}");
        assert_eq!(claims.fail_count, 0);
        assert!(metrics.errors.is_empty(), "{:?}", metrics.errors.keys());
        // goose's own request counted the same answers as errors on arrival.
        let before = run(&host, transaction!(through_goose));
        assert!(
            !before.errors.is_empty(),
            "the way this replaced listed them"
        );
    }
}
