//! Offers of a sharded SKU's waitlist over time: a lapsed offer passes on, a hold that expires
//! on another shard reaches the line through the recovery task, and restore brings the line
//! and its offers back on shard 0.

use dropgate::keys::shard_name;
use serde_json::json;
use uuid::Uuid;

use crate::helpers::*;
use crate::lifecycle::declare_with;
use crate::shards::settled_shards;
use crate::shards_waitlist::{
    decide, declare, entry, hold, join, line_rows, live_units, on_shard, stocks, until_status,
    SHARDS,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offer_that_lapses_on_a_sharded_sku_passes_to_the_next_entry() {
    let app = spawn_app().await;
    let sku = declare(&app, "swl", 3, 2).await;
    let buyers: Vec<String> = (0..3).map(|i| on_shard("swl-b", i, 1).remove(0)).collect();
    let mut holds = Vec::new();
    for b in &buyers {
        holds.push(hold(&app, &sku, b).await);
    }
    let waiters: Vec<String> = [1, 2].map(|i| on_shard("swl-w", i, 1).remove(0)).to_vec();
    let mut ids = Vec::new();
    for w in &waiters {
        ids.push(
            join(&app, &sku, w).await.1["entry_id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    assert_eq!(decide(&app, &holds[1], "cancel", &buyers[1]).await.0, 200);
    until_status(&app, &ids[0], &waiters[0], "offered").await;
    until_status(&app, &ids[0], &waiters[0], "expired").await;
    until_status(&app, &ids[1], &waiters[1], "offered").await;
    // Taken within its 2 s (the unsharded chain test in waitlist.rs does the same in 1 s).
    let offer = entry(&app, &ids[1], &waiters[1]).await;
    let (s, b) = decide(
        &app,
        offer["claim_id"].as_str().unwrap(),
        "confirm",
        &waiters[1],
    )
    .await;
    assert_eq!((s, b["status"].as_str()), (200, Some("confirmed")), "{b}");
    let outsider = on_shard("swl-o", 1, 1).remove(0);
    assert_eq!(app.claim(&sku, &outsider, 1, None).await.status(), 409);

    let v = settled_shards(&app, &sku, 3).await;
    assert_eq!(stocks(&app, &sku).await, vec![0, 0, 0]);
    assert_eq!(live_units(&app, &sku).await, 3);
    assert_eq!(
        line_rows(&app, &sku).await,
        vec![
            (waiters[0].clone(), "expired".into()),
            (waiters[1].clone(), "claimed".into()),
        ]
    );
    assert_eq!(v["consistent"], true, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_of_a_sharded_sku_brings_back_its_line_and_offers_on_shard_0() {
    let app = spawn_app().await;
    let sku = declare(&app, "swr", 3, 600).await;
    let buyers: Vec<String> = (0..3).map(|i| on_shard("swr-b", i, 1).remove(0)).collect();
    let mut holds = Vec::new();
    for b in &buyers {
        holds.push(hold(&app, &sku, b).await);
    }
    let waiters: Vec<String> = [2, 1, 0]
        .map(|i| on_shard("swr-w", i, 1).remove(0))
        .to_vec();
    let mut ids = Vec::new();
    for w in &waiters {
        ids.push(
            join(&app, &sku, w).await.1["entry_id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    assert_eq!(decide(&app, &holds[1], "cancel", &buyers[1]).await.0, 200);
    until_status(&app, &ids[0], &waiters[0], "offered").await;
    settled_shards(&app, &sku, 3).await;

    // Redis loses shard 0: the line, the offer and shard 0's hold with it.
    let mut con = app.probe.redis.clone();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}:{{{sku}}}:*", app.probe.prefix))
        .query_async(&mut con)
        .await
        .unwrap();
    let _: i64 = redis::cmd("DEL")
        .arg(&keys)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(app.restore(&sku, false).await.status(), 200);

    assert_eq!(stocks(&app, &sku).await, vec![0, 0, 0]);
    assert_eq!(entry(&app, &ids[0], &waiters[0]).await["status"], "offered");
    assert_eq!(entry(&app, &ids[1], &waiters[1]).await["position"], 1);
    assert_eq!(entry(&app, &ids[2], &waiters[2]).await["position"], 2);
    // The offer's hold and its buyer's count are back on shard 0, not on the buyer's shard 2.
    let home = shard_name(&sku, 2);
    assert_eq!(
        (
            app.held(&sku, &waiters[0]).await,
            app.held(&home, &waiters[0]).await
        ),
        (1, 0)
    );
    assert_eq!(
        app.held(&home, &buyers[2]).await,
        1,
        "a plain hold stays home"
    );
    // Declining the restored offer passes the unit to the next in line.
    let (s, _) = decide(&app, &ids[0], "cancel", &waiters[0]).await;
    assert_eq!(s, 200);
    until_status(&app, &ids[1], &waiters[1], "offered").await;
    assert_eq!(app.held(&sku, &waiters[0]).await, 0);
    let v = settled_shards(&app, &sku, 3).await;
    assert_eq!(live_units(&app, &sku).await, 3);
    assert_eq!(v["consistent"], true, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_that_expire_on_other_shards_reach_the_line_through_the_recovery_task() {
    let app = spawn_app().await;
    let sku = format!("swx-{}", Uuid::new_v4().simple());
    let r = declare_with(
        &app,
        &sku,
        json!({"total": 3, "shards": SHARDS, "hold_seconds": 4, "offer_seconds": 600}),
    )
    .await;
    assert_eq!(r.status(), 201);
    // One hold per shard; no buyer cancels, so nothing but the expiry worker (on the hold's
    // shard) and the recovery task (every second) moves the units of shards 1 and 2.
    for i in 0..SHARDS as u16 {
        hold(&app, &sku, &on_shard("swx-b", i, 1).remove(0)).await;
    }
    let waiters = users("swx-w", 3);
    let mut ids = Vec::new();
    for w in &waiters {
        let (s, b) = join(&app, &sku, w).await;
        assert_eq!(s, 201, "joined before the holds expired: {b}");
        ids.push(b["entry_id"].as_str().unwrap().to_string());
    }
    for (id, w) in ids.iter().zip(&waiters) {
        until_status(&app, id, w, "offered").await;
    }
    assert_eq!(stocks(&app, &sku).await, vec![0, 0, 0]);
    let v = settled_shards(&app, &sku, 3).await;
    // 3 expired holds, 3 offers held: each unit once, none in open stock.
    assert_eq!(live_units(&app, &sku).await, 3);
    assert_eq!(
        (v["offered"].as_i64(), v["consistent"].as_bool()),
        (Some(3), Some(true)),
        "{v}"
    );
    let expired: i64 =
        sqlx::query_scalar("SELECT count(*) FROM issuances WHERE sku = $1 AND status = 'expired'")
            .bind(&sku)
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(expired, 3);
}
