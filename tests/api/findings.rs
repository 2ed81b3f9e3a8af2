//! What schemathesis (tests/schemathesis.sh) found, one test per finding: each failed before
//! its fix.

use serde_json::Value;

use crate::helpers::{code, spawn_app, token};

/// A body of whitespace is not JSON: it was read as "no body" and claimed a unit.
#[tokio::test]
async fn a_claim_whose_body_is_only_whitespace_is_refused_and_moves_nothing() {
    let app = spawn_app().await;
    assert_eq!(app.declare("ws", 5, 1).await.status(), 201);

    for body in ["\n", " ", "\r\n\t "] {
        let r = app
            .http
            .post(format!("{}/v1/skus/ws/claims", app.base))
            .bearer_auth(token("u-ws"))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "body {body:?}");
        assert_eq!(code(&r.json::<Value>().await.unwrap()), "bad_request");
    }
    assert_eq!(app.stock("ws").await, Some(5));
    assert_eq!(app.held("ws", "u-ws").await, 0);

    // No body at all still means one unit.
    let r = app
        .http
        .post(format!("{}/v1/skus/ws/claims", app.base))
        .bearer_auth(token("u-ws"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
}
