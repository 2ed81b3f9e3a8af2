//! The drop lifecycle: the sale window, holds (confirm, cancel, expiry) and a claim being its
//! owner's the moment it is answered.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{json, Value};
use uuid::Uuid;

use crate::helpers::*;
use crate::services::GatewayProcess;

/// Declares `sku` with a full body (terms beyond total and limit).
pub async fn declare_with(api: &Api, sku: &str, body: Value) -> reqwest::Response {
    api.http
        .put(format!("{}/admin/skus/{sku}", api.base))
        .bearer_auth(ADMIN)
        .json(&body)
        .send()
        .await
        .unwrap()
}

/// POST `path` with `auth` as bearer; returns status and body.
pub async fn post_as(api: &Api, path: &str, auth: &str) -> (u16, Value) {
    send_as(api.http.post(format!("{}{path}", api.base)), auth).await
}

pub async fn get_as(api: &Api, path: &str, auth: &str) -> (u16, Value) {
    send_as(api.http.get(format!("{}{path}", api.base)), auth).await
}

pub async fn delete_as(api: &Api, path: &str, auth: &str) -> (u16, Value) {
    send_as(api.http.delete(format!("{}{path}", api.base)), auth).await
}

async fn send_as(req: reqwest::RequestBuilder, auth: &str) -> (u16, Value) {
    let r = req.bearer_auth(auth).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// The SKU view once the writer has written every journal entry: with holds, `in_flight`
/// nets winners against returned units, so it alone cannot tell.
pub async fn settled(api: &Api, probe: &Probe, sku: &str) -> Value {
    let journal = format!("{}:{{{sku}}}:journal", probe.prefix);
    wait_for(Duration::from_secs(30), || async {
        let mut con = probe.redis.clone();
        let len: i64 = redis::cmd("XLEN")
            .arg(&journal)
            .query_async(&mut con)
            .await
            .unwrap();
        len == 0
    })
    .await;
    api.drained(sku).await
}

/// One claim of one unit by `user`: status and body.
pub async fn claim_one(api: &Api, sku: &str, user: &str) -> (u16, Value) {
    let r = api.claim(sku, user, 1, None).await;
    (r.status().as_u16(), r.json().await.unwrap())
}

pub fn claim_id(body: &Value) -> String {
    body["claim_id"].as_str().expect("a claim id").to_string()
}

/// Claim statuses in `issuances`, by claim id.
pub async fn ledger_statuses(probe: &Probe, sku: &str) -> HashMap<Uuid, String> {
    sqlx::query_as::<_, (Uuid, String)>("SELECT claim_id, status FROM issuances WHERE sku = $1")
        .bind(sku)
        .fetch_all(&probe.db)
        .await
        .unwrap()
        .into_iter()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_outside_the_sale_window_are_refused_and_move_nothing() {
    let app = spawn_app().await;
    let soon = chrono::Utc::now() + chrono::Duration::hours(1);
    let past = chrono::Utc::now() - chrono::Duration::hours(1);
    let r = declare_with(
        &app,
        "later",
        json!({"total": 5, "opens_at": soon.to_rfc3339()}),
    )
    .await;
    assert_eq!(r.status(), 201);
    let r = declare_with(
        &app,
        "over",
        json!({"total": 5, "opens_at": (past - chrono::Duration::hours(1)).to_rfc3339(),
               "closes_at": past.to_rfc3339()}),
    )
    .await;
    assert_eq!(r.status(), 201);

    let (s, b) = claim_one(&app, "later", "early-bird").await;
    assert_eq!((s, code(&b)), (409, "not_open"));
    let (s, b) = claim_one(&app, "over", "late-comer").await;
    assert_eq!((s, code(&b)), (409, "closed"));
    assert_eq!(app.stock("later").await, Some(5));
    assert_eq!(app.stock("over").await, Some(5));
    assert_eq!(app.held("later", "early-bird").await, 0);

    // Opening the window (a re-declare may move it) lets the same buyer in.
    let r = declare_with(
        &app,
        "later",
        json!({"total": 5, "opens_at": past.to_rfc3339()}),
    )
    .await;
    assert_eq!(r.status(), 200);
    let (s, _) = claim_one(&app, "later", "early-bird").await;
    assert_eq!(s, 201);
    assert_eq!(app.stock("later").await, Some(4));

    let r = declare_with(
        &app,
        "bad",
        json!({"total": 5, "opens_at": soon.to_rfc3339(), "closes_at": past.to_rfc3339()}),
    )
    .await;
    assert_eq!(r.status(), 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_is_its_owners_the_moment_it_is_answered() {
    let app = spawn_app().await;
    declare_with(&app, "fresh", json!({"total": 200, "hold_seconds": 600})).await;
    declare_with(&app, "final", json!({"total": 200})).await;
    for sku in ["fresh", "final"] {
        for i in 0..100 {
            let user = format!("{sku}-{i}");
            let (s, b) = claim_one(&app, sku, &user).await;
            assert_eq!(s, 201);
            let id = claim_id(&b);
            // Sent right after the 201: the writer has not written most of these yet.
            let (s, got) = get_as(&app, &format!("/v1/claims/{id}"), &token(&user)).await;
            assert_eq!(s, 200, "GET right after the 201 of {id}: {got}");
            assert_eq!(got["user"], user.as_str());
            assert_eq!(got["status"], b["status"]);
            let (s, _) = get_as(&app, &format!("/v1/claims/{id}"), &token("someone-else")).await;
            assert_eq!(s, 404);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirm_and_cancel_are_idempotent_owner_only_and_give_units_back_once() {
    let app = spawn_app().await;
    declare_with(
        &app,
        "h",
        json!({"total": 3, "per_user_limit": 2, "hold_seconds": 600}),
    )
    .await;
    let (s, a) = claim_one(&app, "h", "ann").await;
    assert_eq!(s, 201);
    assert_eq!(a["status"], "held");
    assert!(a["expires_at"].is_string(), "{a}");
    let (_, b) = claim_one(&app, "h", "ann").await;
    let (a, b) = (claim_id(&a), claim_id(&b));
    let ann = token("ann");

    // Another buyer's token sees nothing; the admin may act on any claim.
    for op in ["confirm", "cancel"] {
        let (s, body) = post_as(&app, &format!("/v1/claims/{a}/{op}"), &token("bob")).await;
        assert_eq!((s, code(&body)), (404, "unknown_claim"));
    }
    let (s, body) = post_as(&app, &format!("/v1/claims/{a}/confirm"), &ann).await;
    assert_eq!((s, body["status"].as_str()), (200, Some("confirmed")));
    let (s, _) = post_as(&app, &format!("/v1/claims/{a}/confirm"), &ann).await;
    assert_eq!(s, 200, "confirm is idempotent");
    let (s, body) = post_as(&app, &format!("/v1/claims/{a}/cancel"), &ann).await;
    assert_eq!((s, code(&body)), (409, "claim_confirmed"));

    let (s, body) = post_as(&app, &format!("/v1/claims/{b}/cancel"), ADMIN).await;
    assert_eq!((s, body["status"].as_str()), (200, Some("cancelled")));
    let (s, _) = post_as(&app, &format!("/v1/claims/{b}/cancel"), &ann).await;
    assert_eq!(s, 200, "cancel is idempotent");
    let (s, body) = post_as(&app, &format!("/v1/claims/{b}/confirm"), &ann).await;
    assert_eq!((s, code(&body)), (409, "claim_cancelled"));
    let (s, body) = post_as(
        &app,
        &format!("/v1/claims/{}/confirm", Uuid::now_v7()),
        &ann,
    )
    .await;
    assert_eq!((s, code(&body)), (404, "unknown_claim"));

    // The cancelled unit came back once, and ann's count with it: she may claim again.
    assert_eq!(app.stock("h").await, Some(2));
    assert_eq!(app.held("h", "ann").await, 1);
    let (s, _) = claim_one(&app, "h", "ann").await;
    assert_eq!(s, 201);
    let v = settled(&app, &app.probe, "h").await;
    assert_eq!(v["consistent"], true, "{v}");
    assert_eq!(
        (v["held"].as_i64(), v["confirmed"].as_i64()),
        (Some(1), Some(1))
    );
    assert_eq!(v["recorded"], 2);
    let statuses = ledger_statuses(&app.probe, "h").await;
    assert_eq!(statuses[&a.parse().unwrap()], "confirmed");
    assert_eq!(statuses[&b.parse().unwrap()], "cancelled");
    // Written statuses answer from PostgreSQL the same way.
    let (s, body) = post_as(&app, &format!("/v1/claims/{b}/confirm"), &ann).await;
    assert_eq!((s, code(&body)), (409, "claim_cancelled"));
    let events: Vec<String> =
        sqlx::query_scalar("SELECT event FROM claim_events WHERE claim_id = $1 ORDER BY seq")
            .bind(b.parse::<Uuid>().unwrap())
            .fetch_all(&app.db)
            .await
            .unwrap();
    assert_eq!(events, vec!["claim.won", "claim.cancelled"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_hold_gives_its_units_back_and_refuses_a_late_confirm() {
    let app = spawn_app().await;
    declare_with(&app, "short", json!({"total": 2, "hold_seconds": 1})).await;
    let (_, b) = claim_one(&app, "short", "slow").await;
    let id = claim_id(&b);
    assert_eq!(app.stock("short").await, Some(1));
    let slow = token("slow");
    wait_for(Duration::from_secs(10), || async {
        get_as(&app, &format!("/v1/claims/{id}"), &slow).await.1["status"] == "expired"
    })
    .await;
    assert_eq!(app.stock("short").await, Some(2));
    assert_eq!(app.held("short", "slow").await, 0);
    let (s, body) = post_as(&app, &format!("/v1/claims/{id}/confirm"), &slow).await;
    assert_eq!((s, code(&body)), (409, "hold_expired"));
    let (s, body) = post_as(&app, &format!("/v1/claims/{id}/cancel"), &slow).await;
    assert_eq!((s, code(&body)), (409, "hold_expired"));
    let v = settled(&app, &app.probe, "short").await;
    assert_eq!(
        (v["recorded"].as_i64(), v["consistent"].as_bool()),
        (Some(0), Some(true))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirm_racing_the_expiry_has_exactly_one_winner_per_hold() {
    let app = spawn_app().await;
    let n = 60;
    declare_with(&app, "race", json!({"total": n, "hold_seconds": 1})).await;
    let mut holds = Vec::new();
    for i in 0..n {
        let user = format!("r-{i}");
        let (s, b) = claim_one(&app, "race", &user).await;
        assert_eq!(s, 201);
        holds.push((
            user,
            claim_id(&b),
            b["expires_at"].as_str().unwrap().to_string(),
        ));
    }
    // Each confirm is sent around its hold's expiry: some before, some after.
    let answers = all_at_once(holds.len(), |i| {
        let (api, (user, id, expires)) = (app.api.clone(), holds[i].clone());
        async move {
            let at: chrono::DateTime<chrono::Utc> = expires.parse().unwrap();
            let offset = chrono::Duration::milliseconds((i as i64 % 7) * 10 - 30);
            let wait = (at + offset - chrono::Utc::now())
                .to_std()
                .unwrap_or_default();
            tokio::time::sleep(wait).await;
            post_as(&api, &format!("/v1/claims/{id}/confirm"), &token(&user)).await
        }
    })
    .await;
    let v = settled(&app, &app.probe, "race").await;
    let statuses = ledger_statuses(&app.probe, "race").await;
    let mut confirmed = 0;
    for ((_, id, _), (s, body)) in holds.iter().zip(&answers) {
        let written = &statuses[&id.parse::<Uuid>().unwrap()];
        match *s {
            200 => {
                confirmed += 1;
                assert_eq!(written, "confirmed", "{id}");
            }
            409 => {
                assert_eq!(code(body), "hold_expired");
                assert_eq!(written, "expired", "{id}");
            }
            other => panic!("confirm of {id}: {other} {body}"),
        }
    }
    assert_eq!(v["confirmed"].as_i64(), Some(confirmed));
    assert_eq!(v["remaining"].as_i64(), Some(n - confirmed));
    assert_eq!(v["consistent"], true, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_holds_expire_once_with_two_gateways() {
    let _heavy = crate::helpers::heavy().await;
    let iso = Isolation::new();
    let gw1 = GatewayProcess::start(&iso, REDIS_URL, &[]).await;
    let gw2 = GatewayProcess::start(&iso, REDIS_URL, &[]).await;
    let (api1, api2) = (Api::new(gw1.base.clone()), Api::new(gw2.base.clone()));
    let probe = Probe::new(&iso.database_url, REDIS_URL, &iso.prefix).await;
    declare_with(&api1, "mass", json!({"total": 1000, "hold_seconds": 2})).await;
    let buyers = users("m", 1000);
    let (a, b) = tokio::join!(
        release_buyers(&api1, "mass", buyers[..500].to_vec()),
        release_buyers(&api2, "mass", buyers[500..].to_vec())
    );
    // Every buyer wins (as many buyers as units), whatever expired meanwhile.
    assert_eq!(won_ids(&a).len() + won_ids(&b).len(), 1000);

    wait_for(Duration::from_secs(30), || async {
        probe.stock("mass").await == Some(1000)
    })
    .await;
    let v = settled(&api1, &probe, "mass").await;
    assert_eq!(v["remaining"], 1000);
    assert_eq!(v["recorded"], 0);
    assert_eq!(v["consistent"], true, "{v}");
    let (expired, events): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM issuances WHERE status = 'expired'),
                (SELECT count(*) FROM outbox WHERE event = 'claim.expired')",
    )
    .fetch_one(&probe.db)
    .await
    .unwrap();
    assert_eq!((expired, events), (1000, 1000));
    for u in buyers.iter().step_by(97) {
        assert_eq!(probe.held("mass", u).await, 0);
    }
}
