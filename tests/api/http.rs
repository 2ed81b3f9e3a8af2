//! The HTTP surface: unknown routes and methods, health, readiness, slow clients.

use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::helpers::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_routes_and_methods_answer_problem_json() {
    let app = spawn_app().await;
    let r = app
        .http
        .get(format!("{}/nowhere", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    assert_eq!(code(&r.json().await.unwrap()), "not_found");

    let r = app
        .http
        .delete(format!("{}/v1/skus/a/claims", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(r.headers()["allow"], "POST");
    assert_eq!(code(&r.json().await.unwrap()), "method_not_allowed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_readiness_and_metrics_answer() {
    let app = spawn_app().await;
    let r = app
        .http
        .get(format!("{}/healthz", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = app
        .http
        .get(format!("{}/readyz", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["redis"], "ok");
    assert_eq!(body["postgres"], "ok");

    app.declare("m", 1, 1).await;
    app.claim("m", "a", 1, None).await;
    let text = app
        .http
        .get(format!("{}/metrics", app.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.contains("dropgate_claims_total"), "{text}");
    assert!(
        text.contains("dropgate_claim_latency_seconds_bucket"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_finishes_its_headers_is_disconnected() {
    let app = spawn_app().await;
    let mut s = tokio::net::TcpStream::connect(app.addr).await.unwrap();
    s.write_all(b"POST /v1/skus/a/claims HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    // The server closes the connection after its header-read timeout (5 s); a server without
    // the timer would keep it open forever and this read would hit the 20 s bound instead.
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut buf)).await;
    assert!(read.is_ok(), "the slow client was never disconnected");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_oversized_body_is_refused_before_it_is_read() {
    let app = spawn_app().await;
    let mut s = tokio::net::TcpStream::connect(app.addr).await.unwrap();
    s.write_all(
        b"PUT /admin/skus/big HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\nAuthorization: Bearer test-admin-token-0123456789\r\n\r\n",
    )
    .await
    .unwrap();
    let mut buf = vec![0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    let head = String::from_utf8_lossy(&buf[..n]);
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
}
