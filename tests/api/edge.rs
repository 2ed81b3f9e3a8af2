//! The HTTP edge: what a hostile or careless client can hold or smuggle in before a handler
//! decides anything (header values, token subjects, slow bodies, idle and surplus connections).

use dropgate::config::Secret;
use reqwest::header::HeaderValue;

use crate::helpers::*;

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
    for sub in ["a\u{0}b", "tab\there", "del\u{7f}", "c1\u{85}", "", long.as_str()] {
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
