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

/// A refused operator action took the SKU's next operator epoch (a catalog write) before it
/// was refused: a restock below zero, a restore while Redis holds the state, a declare with
/// another total each moved `skus.op_epoch`.
#[tokio::test]
async fn refused_operator_actions_leave_the_catalog_row_as_it_was() {
    let app = spawn_app().await;
    assert_eq!(app.declare("ops", 3, 1).await.status(), 201);
    assert_eq!(app.claim("ops", "u-1", 1, None).await.status(), 201);
    app.drained("ops").await;
    let row = || async {
        sqlx::query_scalar::<_, String>("SELECT s::text FROM skus s WHERE sku = 'ops'")
            .fetch_one(&app.db)
            .await
            .unwrap()
    };
    let before = row().await;

    let r = app.restock("ops", -3).await;
    assert_eq!(r.status(), 409);
    assert_eq!(code(&r.json().await.unwrap()), "insufficient_stock");
    let r = app.restore("ops", false).await;
    assert_eq!(r.status(), 409);
    assert_eq!(code(&r.json().await.unwrap()), "state_present");
    let r = app.declare("ops", 4, 1).await;
    assert_eq!(r.status(), 409);
    assert_eq!(code(&r.json().await.unwrap()), "sku_exists");

    assert_eq!(row().await, before);
    let ops: i64 = sqlx::query_scalar("SELECT count(*) FROM restock_ops")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(ops, 0);
    // An action that goes ahead still takes its epoch.
    assert_eq!(app.restock("ops", 1).await.status(), 200);
    assert_ne!(row().await, before);
}
