//! The HTTP edge: what a hostile or careless client can hold or smuggle in before a handler
//! decides anything (header values, token subjects, slow bodies, idle and surplus connections).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use dropgate::config::Secret;
use reqwest::header::HeaderValue;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::*;

/// Sends `request` on a fresh connection and reads until the server closes it (bounded).
async fn exchange(addr: SocketAddr, request: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request).await.unwrap();
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut buf))
        .await
        .expect("the server closes the connection")
        .unwrap();
    String::from_utf8_lossy(&buf).into_owned()
}

const HEALTHZ_CLOSE: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_key_that_is_not_visible_ascii_is_refused_and_changes_nothing() {
    let app = spawn_app().await;
    app.declare("ik", 5, 2).await;
    for key in [&b"order-\xe9"[..], b"", b"a b", &[b'k'; 256][..]] {
        for _ in 0..2 {
            let r = app
                .http
                .post(format!("{}/v1/skus/ik/claims", app.base))
                .bearer_auth(token("buyer"))
                .header("idempotency-key", HeaderValue::from_bytes(key).unwrap())
                .json(&serde_json::json!({"quantity": 1}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 400, "key {key:?}");
            assert_eq!(r.headers()["content-type"], "application/problem+json");
            assert_eq!(code(&r.json().await.unwrap()), "bad_request");
        }
    }
    // Two keys on one request are ambiguous: refused too.
    let r = app
        .http
        .post(format!("{}/v1/skus/ik/claims", app.base))
        .bearer_auth(token("buyer"))
        .header("idempotency-key", "one")
        .header("idempotency-key", "two")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(app.stock("ik").await, Some(5));
    assert_eq!(app.held("ik", "buyer").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_whose_user_id_is_empty_too_long_or_holds_control_characters_is_refused() {
    let app = spawn_app().await;
    app.declare("sub", 5, 1).await;
    let long = "u".repeat(129);
    for sub in [
        "a\u{0}b",
        "tab\there",
        "del\u{7f}",
        "c1\u{85}",
        "",
        long.as_str(),
    ] {
        let t = dropgate::auth::mint(&Secret::new(SECRET), sub, None, 600).unwrap();
        let r = app
            .http
            .post(format!("{}/v1/skus/sub/claims", app.base))
            .bearer_auth(&t)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "sub {sub:?}");
        assert_eq!(code(&r.json().await.unwrap()), "unauthorized");
    }
    assert_eq!(app.stock("sub").await, Some(5));
    // The longest allowed id, in characters rather than bytes, still buys.
    let widest = "é".repeat(128);
    let t = dropgate::auth::mint(&Secret::new(SECRET), &widest, None, 600).unwrap();
    let r = app
        .http
        .post(format!("{}/v1/skus/sub/claims", app.base))
        .bearer_auth(&t)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickled_body_is_cut_off_by_its_read_deadline() {
    let app = spawn_app().await;
    app.declare("slow", 5, 1).await;
    let s = TcpStream::connect(app.addr).await.unwrap();
    let (mut rd, mut wr) = s.into_split();
    let head = format!(
        "POST /v1/skus/slow/claims HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Length: 100\r\n\r\n",
        token("trickler")
    );
    wr.write_all(head.as_bytes()).await.unwrap();
    // One byte every 300 ms: the whole body would take 30 s, and every byte is progress.
    let trickle = tokio::spawn(async move {
        for _ in 0..100 {
            if wr.write_all(b" ").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });
    let started = Instant::now();
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), rd.read_to_end(&mut buf)).await;
    trickle.abort();
    assert!(
        read.is_ok(),
        "a trickled body held the connection for 10 s: {:?}",
        String::from_utf8_lossy(&buf)
    );
    let answer = String::from_utf8_lossy(&buf);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("\"code\":\"request_timeout\""), "{answer}");
    assert!(
        started.elapsed() >= Duration::from_secs(3),
        "cut off too early"
    );
    assert_eq!(app.stock("slow").await, Some(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keep_alive_connection_is_closed() {
    let app = spawn_app().await;
    let mut s = TcpStream::connect(app.addr).await.unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut first = vec![0u8; 1024];
    let n = s.read(&mut first).await.unwrap();
    let answer = String::from_utf8_lossy(&first[..n]);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(!answer.to_ascii_lowercase().contains("connection: close"));
    // Kept alive, then left idle: the server closes it (EOF) well before 15 s.
    let idle_since = Instant::now();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(15), s.read_to_end(&mut rest)).await;
    assert!(read.is_ok(), "an idle keep-alive connection stayed open");
    assert!(rest.is_empty(), "{:?}", String::from_utf8_lossy(&rest));
    assert!(
        idle_since.elapsed() >= Duration::from_secs(3),
        "closed too early"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_over_16_kib_are_refused_with_431() {
    let app = spawn_app().await;
    let request = format!(
        "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Filler: {}\r\nConnection: close\r\n\r\n",
        "f".repeat(17 * 1024)
    );
    let answer = exchange(app.addr, request.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    // Modest headers still pass.
    let answer = exchange(app.addr, HEALTHZ_CLOSE).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_bound_are_refused_at_once_until_some_close() {
    let app = spawn_app_with(|c| c.max_connections = "8".into()).await;
    let mut idle = Vec::new();
    for _ in 0..8 {
        idle.push(TcpStream::connect(app.addr).await.unwrap());
    }
    // The ninth is answered at once (well inside the 5 s the idle eight may live).
    let started = Instant::now();
    let answer = exchange(app.addr, HEALTHZ_CLOSE).await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("retry-after: 1"),
        "{answer}"
    );
    let body: Value = serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(code(&body), "unavailable");
    assert!(started.elapsed() < Duration::from_secs(2));

    // Two leave; once the server has seen them go, newcomers are served again.
    idle.truncate(6);
    wait_for(Duration::from_secs(4), || async {
        exchange(app.addr, HEALTHZ_CLOSE)
            .await
            .starts_with("HTTP/1.1 200")
    })
    .await;
}
