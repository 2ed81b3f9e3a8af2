//! The waitlist of a queued SKU: units that come back go to its head before the line, so it is
//! a way to a unit like the claim route, and takes the same tokens: only those the SKU's queue
//! minted (an admitted visitor whose unit was taken joins it; a token from elsewhere is 403
//! `not_admitted`, joins nothing, and is never offered a unit).

use serde_json::json;

use super::*;
use crate::helpers::{code, spawn_app, token, token_for, wait_for};

async fn join_waitlist(api: &Api, sku: &str, bearer: &str) -> (u16, Value) {
    let r = api
        .http
        .post(format!("{}/v1/skus/{sku}/waitlist", api.base))
        .bearer_auth(bearer)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// The visitor's admission token, once its ticket reads admitted.
async fn admission(api: &Api, sku: &str, who: &str) -> String {
    let (_, t) = join_retrying(api, sku, &visitor(who)).await;
    let id = t["ticket_id"].as_str().unwrap().to_string();
    until(LONG, || {
        let (api, id, v) = (api.clone(), id.clone(), visitor(who));
        async move {
            let (_, t) = ticket(&api, &id, &v).await;
            t["admission_token"].as_str().map(String::from)
        }
    })
    .await
}

#[tokio::test]
async fn a_queued_skus_waitlist_takes_only_the_tokens_its_queue_minted() {
    let app = spawn_app().await;
    let sku = "q-wl";
    let r = declare_queued(&app, sku, 2, json!({"admit_per_second": 50}), json!({})).await;
    assert_eq!(r.status(), 201);
    let a = admission(&app, sku, "a").await;
    let c = admission(&app, sku, "c").await;
    let (s, b) = claim_with(&app, sku, &a).await;
    assert_eq!(s, 201, "{b}");
    // The last unit leaves the stock; c, admitted, finds it gone and joins the waitlist.
    assert_eq!(app.restock(sku, -1).await.status(), 200);
    let (s, b) = join_waitlist(&app, sku, &c).await;
    assert_eq!(s, 201, "{b}");
    // Tokens the queue did not mint: refused like a claim, nothing joins.
    for t in [token("b"), token_for("b", sku)] {
        let (s, b) = join_waitlist(&app, sku, &t).await;
        assert_eq!((s, code(&b)), (403, "not_admitted"), "{b}");
    }
    let users: Vec<String> = sqlx::query_scalar("SELECT user_id FROM waitlist WHERE sku = $1")
        .bind(sku)
        .fetch_all(&app.probe.db)
        .await
        .unwrap();
    assert!(!users.contains(&"b".to_string()), "{users:?}");
    // A unit comes back: it is offered to c, the admitted visitor, and to nobody else.
    assert_eq!(app.restock(sku, 1).await.status(), 200);
    wait_for(LONG, || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM issuances WHERE sku = $1 AND status = 'held'",
        )
        .bind(sku)
        .fetch_one(&app.probe.db)
        .await
        .unwrap()
            == 1
    })
    .await;
    let holders: Vec<String> = sqlx::query_scalar(
        "SELECT user_id FROM issuances WHERE sku = $1 AND status IN ('issued', 'held')",
    )
    .bind(sku)
    .fetch_all(&app.probe.db)
    .await
    .unwrap();
    let mut holders = holders;
    holders.sort();
    assert_eq!(holders, ["a", "c"]);
}

async fn post_as(api: &Api, path: &str, bearer: &str) -> (u16, Value) {
    let r = api
        .http
        .post(format!("{}{path}", api.base))
        .bearer_auth(bearer)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Issue 37.2: a visitor told `sold_out` joins the waitlist with the visitor token the page
/// holds, and the offer a unit coming back makes is claimed with it like any other; a visitor
/// with no ticket on the SKU joins nothing.
#[tokio::test]
async fn a_sold_out_visitor_joins_the_waitlist_with_its_visitor_token_and_claims_the_offer() {
    let app = spawn_app().await;
    let sku = "q-wl-so";
    let r = declare_queued(
        &app,
        sku,
        1,
        json!({"admit_per_second": 50}),
        json!({"hold_seconds": 60}),
    )
    .await;
    assert_eq!(r.status(), 201);
    let a = admission(&app, sku, "a").await;
    let (s, b) = claim_with(&app, sku, &a).await;
    assert_eq!(s, 201, "{b}");
    let claim = b["claim_id"].as_str().unwrap().to_string();
    let (s, b) = post_as(&app, &format!("/v1/claims/{claim}/confirm"), &a).await;
    assert_eq!(s, 200, "{b}");
    let (_, t) = join_retrying(&app, sku, &visitor("v")).await;
    let id = t["ticket_id"].as_str().unwrap().to_string();
    until(LONG, || {
        let (api, id) = (app.clone(), id.clone());
        async move {
            let (_, t) = ticket(&api, &id, &visitor("v")).await;
            (t["state"] == "sold_out").then_some(())
        }
    })
    .await;
    // Nobody without a ticket on this SKU passes with a visitor token.
    let (s, b) = join_waitlist(&app, sku, &visitor("stranger")).await;
    assert_eq!((s, code(&b)), (403, "not_admitted"), "{b}");
    let (s, b) = join_waitlist(&app, sku, &visitor("v")).await;
    assert_eq!(s, 201, "{b}");
    let entry = b["entry_id"].as_str().unwrap().to_string();
    assert_eq!(app.restock(sku, 1).await.status(), 200);
    let offer = until(LONG, || {
        let (api, entry) = (app.clone(), entry.clone());
        async move {
            let r = api
                .http
                .get(format!("{}/v1/waitlist/{entry}", api.base))
                .bearer_auth(visitor("v"))
                .send()
                .await
                .unwrap();
            let v: Value = r.json().await.unwrap_or(Value::Null);
            (v["status"] == "offered").then(|| v["claim_id"].as_str().unwrap().to_string())
        }
    })
    .await;
    let (s, b) = post_as(&app, &format!("/v1/claims/{offer}/confirm"), &visitor("v")).await;
    assert_eq!(s, 200, "{b}");
    wait_for(LONG, || async {
        let rows: Vec<(String, String)> =
            sqlx::query_as("SELECT user_id, status FROM issuances WHERE sku = $1 ORDER BY user_id")
                .bind(sku)
                .fetch_all(&app.probe.db)
                .await
                .unwrap();
        rows == [
            ("a".into(), "confirmed".into()),
            ("v".into(), "confirmed".into()),
        ]
    })
    .await;
    // The entry's row is written in the writer's waitlist step, which may follow the claims'
    // rows by a batch: awaited, not read once.
    wait_for(LONG, || async {
        let users: Vec<String> = sqlx::query_scalar("SELECT user_id FROM waitlist WHERE sku = $1")
            .bind(sku)
            .fetch_all(&app.probe.db)
            .await
            .unwrap();
        users == ["v"]
    })
    .await;
}
