//! The HTTP surface: unknown routes and methods, health, readiness, slow clients.

use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::helpers::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_routes_and_methods_answer_problem_json() {
    let app = spawn_app().await;
    let r = app.get("/nowhere").await;
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
    let r = app.get("/healthz").await;
    assert_eq!(r.status(), 200);
    let r = app.get("/readyz").await;
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["redis"], "ok");
    assert_eq!(body["postgres"], "ok");

    app.declare("m", 1, 1).await;
    app.claim("m", "a", 1, None).await;
    let text = app.get("/metrics").await.text().await.unwrap();
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

/// A head that arrives in pieces waits outside hyper (src/http/head.rs) and is served once its
/// last piece comes: the wait wakes on every new piece, not only on the first byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_sent_in_pieces_is_served_once_it_is_whole() {
    let app = spawn_app().await;
    let mut s = tokio::net::TcpStream::connect(app.addr).await.unwrap();
    let since = std::time::Instant::now();
    for piece in [
        &b"GET /heal"[..],
        b"thz HTTP/1.1\r\nHost: x\r\n",
        b"Connection: close\r\n",
        b"\r\n",
    ] {
        s.write_all(piece).await.unwrap();
        // The pieces must reach the server apart, each one a new wake-up of the wait.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "the whole head was never answered");
    assert!(
        answer.starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&answer)
    );
    // Answered as soon as it was whole, well inside the 5 s header-read timeout.
    assert!(
        since.elapsed() < Duration::from_secs(4),
        "{:?}",
        since.elapsed()
    );
}

/// A connection that sends nothing waits for its first byte outside hyper (so it holds no read
/// buffer), bounded by the same header-read timeout: it is closed, not kept forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_connects_and_sends_nothing_is_disconnected() {
    let app = spawn_app().await;
    let mut s = tokio::net::TcpStream::connect(app.addr).await.unwrap();
    let since = std::time::Instant::now();
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut buf)).await;
    assert!(read.is_ok(), "a silent client was never disconnected");
    assert!(buf.is_empty(), "{:?}", String::from_utf8_lossy(&buf));
    assert!(
        since.elapsed() >= Duration::from_secs(3),
        "closed too early"
    );
    // The next client is served as ever.
    let mut s = tokio::net::TcpStream::connect(app.addr).await.unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).await.unwrap();
    assert!(
        answer.starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&answer)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_oversized_body_is_refused_before_it_is_read() {
    let app = spawn_app().await;
    let mut s = tokio::net::TcpStream::connect(app.addr).await.unwrap();
    s.write_all(
        b"PUT /admin/skus/big HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000\r\nAuthorization: Bearer test-admin-token-0123456789\r\n\r\n",
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_input_gets_a_problem_answer_and_changes_nothing() {
    let app = spawn_app().await;
    app.declare("h", 3, 2).await;
    let bodies: Vec<Vec<u8>> = vec![
        br#"{"quantity": 1e400}"#.to_vec(),
        br#"{"quantity": 18446744073709551616}"#.to_vec(),
        br#"{"quantity": -9223372036854775808}"#.to_vec(),
        br#"{"quantity": 3}"#.to_vec(),
        br#"{"quantity": null, "quantity": 1}"#.to_vec(),
        br#"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]"#
            .to_vec(),
        vec![0xff, 0xfe, 0x00, 0x7b],
        "{\"quantity\": \"\u{1F600}\"}".as_bytes().to_vec(),
    ];
    // A small deterministic generator adds noise bodies to the hand-picked ones.
    let mut seed: u64 = 0x9e3779b97f4a7c15;
    let mut noise = Vec::new();
    for _ in 0..40 {
        let len = (seed % 64) as usize;
        let mut b = Vec::with_capacity(len);
        for _ in 0..len {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            b.push(b"{}[]\":,0123456789quantity -.e\\"[(seed % 30) as usize]);
        }
        noise.push(b);
    }
    for body in bodies.into_iter().chain(noise) {
        let r = app
            .http
            .post(format!("{}/v1/skus/h/claims", app.base))
            .bearer_auth(token("fuzzer"))
            .body(body.clone())
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        assert!(
            status == 400 || status == 201 || status == 409,
            "{status} for {body:?}"
        );
        if status != 201 {
            assert_eq!(r.headers()["content-type"], "application/problem+json");
        }
    }
    for path in [
        "/v1/skus/%ZZ/claims",
        "/v1/skus//claims",
        "/v1/skus/a/b/claims",
        "/admin/skus/../../etc/passwd",
        "/v1/claims/not-a-uuid",
        &format!("/v1/skus/{}/claims", "x".repeat(5000)),
    ] {
        let r = app
            .http
            .post(format!("{}{path}", app.base))
            .bearer_auth(token("f"))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_client_error(), "{path}: {}", r.status());
    }
    let r = app
        .http
        .post(format!("{}/v1/skus/h/claims", app.base))
        .header("authorization", "Bearer \u{00e9}t\u{00e9}".as_bytes())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    // Still serving, and at most the per-user limit moved.
    assert_eq!(app.get("/healthz").await.status(), 200);
    assert!(app.held("h", "fuzzer").await <= 2);
    assert_eq!(
        app.stock("h").await.unwrap() + app.held("h", "fuzzer").await,
        3
    );
}
