//! The waitlist: FIFO offers of units that come back, never passing through open stock.

use std::time::Duration;

use serde_json::{json, Value};

use crate::helpers::*;
use crate::lifecycle::{claim_id, claim_one, declare_with, delete_as, get_as, post_as, settled};
use crate::services::GatewayProcess;

async fn join(api: &Api, sku: &str, user: &str) -> (u16, Value) {
    post_as(api, &format!("/v1/skus/{sku}/waitlist"), &token(user)).await
}

async fn entry(api: &Api, id: &str, user: &str) -> Value {
    let (s, body) = get_as(api, &format!("/v1/waitlist/{id}"), &token(user)).await;
    assert_eq!(s, 200, "{body}");
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joining_needs_a_sold_out_sku_and_gives_one_entry_per_user() {
    let app = spawn_app().await;
    declare_with(&app, "w", json!({"total": 1, "hold_seconds": 600})).await;
    let (s, body) = join(&app, "w", "early").await;
    assert_eq!((s, code(&body)), (409, "in_stock"));
    claim_one(&app, "w", "winner").await;

    let (s, first) = join(&app, "w", "ann").await;
    assert_eq!(s, 201, "{first}");
    assert_eq!(first["position"], 1);
    let (s, again) = join(&app, "w", "ann").await;
    assert_eq!(s, 200);
    assert_eq!(again["entry_id"], first["entry_id"]);
    let (s, second) = join(&app, "w", "bob").await;
    assert_eq!((s, second["position"].as_i64()), (201, Some(2)));
    let (s, body) = join(&app, "w", "winner").await;
    assert_eq!((s, code(&body)), (409, "limit_reached"));

    let ann = first["entry_id"].as_str().unwrap();
    let (s, _) = get_as(&app, &format!("/v1/waitlist/{ann}"), &token("bob")).await;
    assert_eq!(s, 404, "another user's entry is not found");
    // Leaving moves bob up.
    let (s, body) = delete_as(&app, &format!("/v1/waitlist/{ann}"), &token("ann")).await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(entry(&app, ann, "ann").await["status"], "left");
    let bob = second["entry_id"].as_str().unwrap();
    assert_eq!(entry(&app, bob, "bob").await["position"], 1);
    wait_for(Duration::from_secs(10), || async {
        app.view("w").await["waiting"] == 1
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_joins_keep_one_order_in_redis_and_postgres() {
    let app = spawn_app().await;
    declare_with(&app, "line", json!({"total": 1, "hold_seconds": 600})).await;
    claim_one(&app, "line", "winner").await;
    let buyers = users("q", 500);
    let answers = all_at_once(buyers.len(), |i| {
        let (api, user) = (app.api.clone(), buyers[i].clone());
        async move { join(&api, "line", &user).await }
    })
    .await;
    let mut positions: Vec<i64> = answers
        .iter()
        .map(|(s, b)| {
            assert_eq!(*s, 201, "{b}");
            b["position"].as_i64().unwrap()
        })
        .collect();
    positions.sort();
    assert_eq!(positions, (1..=500).collect::<Vec<_>>());
    wait_for(Duration::from_secs(20), || async {
        app.view("line").await["waiting"] == 500
    })
    .await;
    // The written order is the order of the answers.
    let written: Vec<(String, i64)> = sqlx::query_as(
        "SELECT user_id, row_number() OVER (ORDER BY position) FROM waitlist WHERE sku = 'line'",
    )
    .fetch_all(&app.db)
    .await
    .unwrap();
    for (user, place) in written {
        let i: usize = user.trim_start_matches("q-").parse().unwrap();
        assert_eq!(answers[i].1["position"].as_i64(), Some(place), "{user}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_returned_unit_passes_down_the_line_through_lapsed_offers_and_never_to_outsiders() {
    let app = spawn_app().await;
    declare_with(
        &app,
        "chain",
        json!({"total": 1, "hold_seconds": 600, "offer_seconds": 1}),
    )
    .await;
    let (_, won) = claim_one(&app, "chain", "first").await;
    let mut entries = Vec::new();
    for u in ["w1", "w2", "w3", "w4"] {
        let (s, b) = join(&app, "chain", u).await;
        assert_eq!(s, 201);
        entries.push((u, b["entry_id"].as_str().unwrap().to_string()));
    }
    // The winner walks away: the unit goes to w1 as an offer, not to the open stock.
    let (s, _) = post_as(
        &app,
        &format!("/v1/claims/{}/cancel", claim_id(&won)),
        &token("first"),
    )
    .await;
    assert_eq!(s, 200);
    assert_eq!(app.stock("chain").await, Some(0));
    let (s, b) = claim_one(&app, "chain", "outsider").await;
    assert_eq!((s, code(&b)), (409, "sold_out"));
    let first_offer = entry(&app, &entries[0].1, "w1").await;
    assert_eq!(first_offer["status"], "offered", "{first_offer}");

    // w1, w2, w3 let their offers lapse, in order; w4 takes it.
    for (i, (user, id)) in entries.iter().enumerate().take(3) {
        wait_for(Duration::from_secs(10), || async {
            entry(&app, id, user).await["status"] == "expired"
        })
        .await;
        let (next_user, next_id) = &entries[i + 1];
        wait_for(Duration::from_secs(10), || async {
            entry(&app, next_id, next_user).await["status"] == "offered"
        })
        .await;
        let (s, b) = claim_one(&app, "chain", "outsider").await;
        assert_eq!(
            (s, code(&b)),
            (409, "sold_out"),
            "nobody outside the line buys"
        );
    }
    let (user, id) = &entries[3];
    let offer = entry(&app, id, user).await;
    let claim = offer["claim_id"].as_str().unwrap();
    let (s, b) = post_as(&app, &format!("/v1/claims/{claim}/confirm"), &token(user)).await;
    assert_eq!((s, b["status"].as_str()), (200, Some("confirmed")));
    assert_eq!(entry(&app, id, user).await["status"], "claimed");

    let v = settled(&app, &app.probe, "chain").await;
    assert_eq!(v["consistent"], true, "{v}");
    assert_eq!(
        (v["remaining"].as_i64(), v["confirmed"].as_i64()),
        (Some(0), Some(1))
    );
    let offers: Vec<String> = sqlx::query_scalar(
        "SELECT user_id FROM claim_events WHERE event = 'waitlist.offered' ORDER BY occurred_at",
    )
    .fetch_all(&app.db)
    .await
    .unwrap();
    assert_eq!(offers, vec!["w1", "w2", "w3", "w4"]);
    // With nobody left waiting, a returned unit goes back to open stock.
    app.restock("chain", 1).await;
    assert_eq!(app.stock("chain").await, Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_brings_back_holds_and_the_line_in_order() {
    let app = spawn_app().await;
    declare_with(&app, "lost", json!({"total": 2, "hold_seconds": 600})).await;
    let (_, a) = claim_one(&app, "lost", "a").await;
    claim_one(&app, "lost", "b").await;
    let mut line = Vec::new();
    for u in ["x", "y", "z"] {
        line.push(
            join(&app, "lost", u).await.1["entry_id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    settled(&app, &app.probe, "lost").await;
    wait_for(Duration::from_secs(10), || async {
        app.view("lost").await["waiting"] == 3
    })
    .await;
    // Redis loses every key of the SKU.
    app.probe.lose_sku("lost").await;

    assert_eq!(app.restore("lost", false).await.status(), 200);
    assert_eq!(app.stock("lost").await, Some(0));
    for (i, (id, u)) in line.iter().zip(["x", "y", "z"]).enumerate() {
        assert_eq!(entry(&app, id, u).await["position"], i as i64 + 1);
    }
    // The restored hold is still a hold: cancelling it offers its unit to x, the head.
    let (s, _) = post_as(
        &app,
        &format!("/v1/claims/{}/cancel", claim_id(&a)),
        &token("a"),
    )
    .await;
    assert_eq!(s, 200);
    assert_eq!(entry(&app, &line[0], "x").await["status"], "offered");
    assert_eq!(entry(&app, &line[1], "y").await["position"], 1);
    let v = settled(&app, &app.probe, "lost").await;
    assert_eq!(v["consistent"], true, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_sigkilled_during_expiry_and_offers_loses_and_doubles_nothing() {
    let iso = Isolation::new();
    let mut gw1 = GatewayProcess::start(&iso, REDIS_URL, &[]).await;
    let api1 = Api::new(gw1.base.clone());
    let probe = Probe::new(&iso.database_url, REDIS_URL, &iso.prefix).await;
    let units = 200;
    declare_with(
        &api1,
        "crash",
        json!({"total": units, "hold_seconds": 3, "offer_seconds": 600}),
    )
    .await;
    let winners = release_buyers(&api1, "crash", users("h", units as usize)).await;
    assert_eq!(won_ids(&winners).len(), units as usize);
    // Waiters line up while the stock is 0; once the first hold expires, its unit is offered
    // to the head of the line, or goes to open stock when nobody waits (and joins are then
    // refused in_stock): each waiter who joined gets one offer.
    let waiters = users("q", units as usize);
    let joined_answers = all_at_once(waiters.len(), |i| {
        let (api, user) = (api1.clone(), waiters[i].clone());
        async move { join(&api, "crash", &user).await.0 }
    })
    .await;
    let joined: Vec<&String> = (waiters.iter().zip(&joined_answers))
        .filter(|(_, s)| **s == 201)
        .map(|(u, _)| u)
        .collect();
    assert!(
        joined_answers.iter().all(|s| *s == 201 || *s == 409),
        "{joined_answers:?}"
    );
    let n = joined.len() as i64;
    assert!(n > 0, "nobody joined before the holds expired");

    // The holds come due; the gateway dies while its worker expires them and hands them on.
    wait_for(Duration::from_secs(20), || async {
        let mut con = probe.redis.clone();
        let left: i64 = redis::cmd("ZCARD")
            .arg(format!("{}:{{crash}}:wl", iso.prefix))
            .query_async(&mut con)
            .await
            .unwrap();
        left < n
    })
    .await;
    gw1.sigkill().await;
    let gw2 = GatewayProcess::start(&iso, REDIS_URL, &[]).await;
    let api2 = Api::new(gw2.base.clone());

    // The successor finishes the expiry and writes what the dead writer left.
    let v = settled_after(&api2, &probe, "crash", |v| {
        v["offered"] == n && v["held"] == n
    })
    .await;
    assert_eq!(v["consistent"], true, "{v}");
    assert_eq!(
        v["remaining"],
        units - n,
        "a unit reached open stock only when nobody waited"
    );
    let (expired, offered, distinct): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM issuances WHERE status = 'expired'),
                (SELECT count(*) FROM claim_events WHERE event = 'waitlist.offered'),
                (SELECT count(DISTINCT user_id) FROM issuances WHERE status = 'held')",
    )
    .fetch_one(&probe.db)
    .await
    .unwrap();
    assert_eq!((expired, offered, distinct), (units, n, n));
    for u in joined.iter().step_by(17) {
        assert_eq!(probe.held("crash", u).await, 1, "{u} holds its one offer");
    }
}

/// The SKU view once `done` holds of it and the journal is empty.
async fn settled_after(
    api: &Api,
    probe: &Probe,
    sku: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    wait_for(Duration::from_secs(60), || async {
        done(&api.view(sku).await)
    })
    .await;
    settled(api, probe, sku).await
}
