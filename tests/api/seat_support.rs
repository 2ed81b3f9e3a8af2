//! What the seat tests share: a one-row hall of eight seats, claims and hold actions over
//! HTTP, and the state they leave (Redis's map, PostgreSQL's live seats and claim statuses).

use serde_json::{json, Value};

use crate::helpers::{token, TestApp, ADMIN};

/// Declares `sku`: section A, one row of eight seats, at most four a buyer; claims held
/// `hold_seconds` (0: final at once).
pub async fn declare_hall(app: &TestApp, sku: &str, hold_seconds: i64) {
    let r = app
        .http
        .put(format!("{}/admin/skus/{sku}", app.base))
        .bearer_auth(ADMIN)
        .json(
            &json!({"seats": {"sections": [{"name": "A", "rows": 1, "count": 8}]},
                      "per_user_limit": 4, "hold_seconds": hold_seconds}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{:?}", r.text().await);
}

/// A claim on `sku` by `user` with `body`: its status and body.
pub async fn take(app: &TestApp, sku: &str, user: &str, body: Value) -> (u16, Value) {
    post(app, &format!("/v1/skus/{sku}/claims"), user, Some(body)).await
}

/// `what` (`confirm`, `cancel`) on `claim` by `user`.
pub async fn act(app: &TestApp, claim: &str, user: &str, what: &str) -> (u16, Value) {
    post(app, &format!("/v1/claims/{claim}/{what}"), user, None).await
}

/// A waitlist join of `sku` by `user` with `body`.
pub async fn join(app: &TestApp, sku: &str, user: &str, body: Value) -> (u16, Value) {
    post(app, &format!("/v1/skus/{sku}/waitlist"), user, Some(body)).await
}

/// `GET path` as `user`.
pub async fn read(app: &TestApp, path: &str, user: &str) -> (u16, Value) {
    let r = app
        .http
        .get(format!("{}{path}", app.base))
        .bearer_auth(token(user))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

async fn post(app: &TestApp, path: &str, user: &str, body: Option<Value>) -> (u16, Value) {
    let mut req = app
        .http
        .post(format!("{}{path}", app.base))
        .bearer_auth(token(user));
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// Redis's map of a one-row hall of eight seats as `x` (taken) and `.` (free), seat 1 first.
pub async fn map(app: &TestApp, sku: &str) -> String {
    let mut con = app.probe.redis.clone();
    let bits: Vec<u8> = redis::cmd("GET")
        .arg(format!("{}:{{{sku}}}:seats", app.probe.prefix))
        .query_async(&mut con)
        .await
        .unwrap();
    (0..8)
        .map(
            |b| match bits.first().is_some_and(|x| x & (0x80 >> b) != 0) {
                true => 'x',
                false => '.',
            },
        )
        .collect()
}

/// PostgreSQL's live seats of `sku` (the unique `issuance_seats`), sorted.
pub async fn live_seats(app: &TestApp, sku: &str) -> Vec<String> {
    sqlx::query_scalar("SELECT seat FROM issuance_seats WHERE sku = $1 ORDER BY seat")
        .bind(sku)
        .fetch_all(&app.db)
        .await
        .unwrap()
}

/// The ledger's status of `claim`, once written.
pub async fn ledger_status(app: &TestApp, claim: &str) -> Option<String> {
    sqlx::query_scalar("SELECT status FROM issuances WHERE claim_id = $1::uuid")
        .bind(claim)
        .fetch_optional(&app.db)
        .await
        .unwrap()
}
