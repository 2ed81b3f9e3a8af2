//! Offers of a sharded SKU's waitlists over time: a lapsed offer passes on to another shard's
//! line, holds that expire on shards without a line reach the lines through the recovery task,
//! restore brings each line and offer back on its buyer's shard, and a buyer holding an offer
//! never holds more than its per-user limit (I3).

use std::time::Duration;

use serde_json::json;
use uuid::Uuid;

use crate::helpers::*;
use crate::lifecycle::declare_with;
use crate::shards::{settled_shards, shard_name};
use crate::shards_waitlist::{
    decide, declare, entry, hold, join, line_len, line_rows, live_units, on_shard, statuses,
    stocks, until_status, SHARDS,
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
    // Offered on shard 1 to its own line's head; once it lapses shard 1's line is empty and the
    // recovery task moves the unit to shard 2's.
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
        statuses([(&waiters[0], "expired"), (&waiters[1], "claimed")])
    );
    assert_eq!(v["consistent"], true, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_of_a_sharded_sku_brings_back_each_line_and_offer_on_its_buyers_shard() {
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
    assert_eq!(decide(&app, &holds[2], "cancel", &buyers[2]).await.0, 200);
    until_status(&app, &ids[0], &waiters[0], "offered").await;
    settled_shards(&app, &sku, 3).await;

    // Redis loses shard 0: its line and its hold with it.
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
    // Places in the SKU's one line, by join ticket across the shards' lines.
    assert_eq!(entry(&app, &ids[1], &waiters[1]).await["position"], 1);
    assert_eq!(entry(&app, &ids[2], &waiters[2]).await["position"], 2);
    for (i, want) in [(0u16, 1i64), (1, 1), (2, 0)] {
        assert_eq!(line_len(&app, &sku, i).await, want, "line on shard {i}");
    }
    // The offer's hold and its buyer's count are back on the buyer's shard 2, with the plain
    // holds of that shard.
    let home = shard_name(&sku, 2);
    assert_eq!(
        (
            app.held(&home, &waiters[0]).await,
            app.held(&sku, &waiters[0]).await
        ),
        (1, 0)
    );
    assert_eq!(
        app.held(&sku, &buyers[0]).await,
        1,
        "shard 0's hold is back"
    );
    // Declining the restored offer on shard 2 (no line left there) passes the unit to the
    // earliest head: the entry routed to shard 1, which joined before shard 0's.
    let (s, _) = decide(&app, &ids[0], "cancel", &waiters[0]).await;
    assert_eq!(s, 200);
    until_status(&app, &ids[1], &waiters[1], "offered").await;
    assert_eq!(app.held(&home, &waiters[0]).await, 0);
    assert_eq!(entry(&app, &ids[2], &waiters[2]).await["position"], 1);
    let v = settled_shards(&app, &sku, 3).await;
    assert_eq!(live_units(&app, &sku).await, 3);
    assert_eq!(v["consistent"], true, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_that_expire_on_shards_without_a_line_reach_the_lines_through_the_recovery_task() {
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
    // shard, offering to that shard's line) and the recovery task (every second, moving the
    // units of shards whose line is empty) reaches the waiters, wherever they are routed.
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buyer_holding_an_offer_on_a_sharded_sku_never_wins_a_unit_above_its_limit() {
    let app = spawn_app().await;
    let sku = format!("swi-{}", Uuid::new_v4().simple());
    let r = declare_with(
        &app,
        &sku,
        json!({"total": 3, "per_user_limit": 1, "shards": SHARDS, "hold_seconds": 600,
               "offer_seconds": 600}),
    )
    .await;
    assert_eq!(r.status(), 201);
    // Two holds on shard 1 (the second borrows from a sibling) and one on shard 2: sold out.
    let on_1 = on_shard("swi-b", 1, 2);
    let mut holds = Vec::new();
    for b in &on_1 {
        holds.push(hold(&app, &sku, b).await);
    }
    hold(&app, &sku, &on_shard("swi-c", 2, 1).remove(0)).await;
    assert_eq!(stocks(&app, &sku).await, vec![0, 0, 0]);
    let user = on_shard("swi-u", 1, 1).remove(0);
    let shard_1 = shard_name(&sku, 1);
    let (s, b) = join(&app, &sku, &user).await;
    assert_eq!(s, 201, "{b}");
    let id = b["entry_id"].as_str().unwrap().to_string();
    assert_eq!(decide(&app, &holds[0], "cancel", &on_1[0]).await.0, 200);
    until_status(&app, &id, &user, "offered").await;
    assert_eq!(
        app.held(&shard_1, &user).await,
        1,
        "the offer counts on shard 1"
    );

    // A second unit reaches the user's shard as open stock (nobody waits any more), once the
    // line lease of the last join has lapsed.
    assert_eq!(decide(&app, &holds[1], "cancel", &on_1[1]).await.0, 200);
    wait_for(Duration::from_secs(15), || async {
        stocks(&app, &sku).await == vec![0, 1, 0]
    })
    .await;
    let r = app.claim(&sku, &user, 1, None).await;
    assert_eq!(r.status(), 409);
    assert_eq!(code(&r.json().await.unwrap()), "limit_reached");
    // Nor after confirming the offer, nor through the line.
    let (s, _) = decide(&app, &id, "confirm", &user).await;
    assert_eq!(s, 200);
    assert_eq!(app.claim(&sku, &user, 1, None).await.status(), 409);
    assert_eq!(join(&app, &sku, &user).await.0, 409);
    // The unit is there for anyone else on shard 1.
    let other = on_shard("swi-o", 1, 1).remove(0);
    assert_eq!(app.claim(&sku, &other, 1, None).await.status(), 201);

    let v = settled_shards(&app, &sku, 3).await;
    for i in 0..SHARDS as u16 {
        let want = i64::from(i == 1);
        assert_eq!(
            app.held(&shard_name(&sku, i), &user).await,
            want,
            "shard {i}"
        );
    }
    let rows: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM issuances
          WHERE sku = $1 AND user_id = $2 AND status IN ('issued', 'held', 'confirmed')",
    )
    .bind(&sku)
    .bind(&user)
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(rows, 1, "one live unit of the user in the ledger");
    assert_eq!(live_units(&app, &sku).await, 3);
    assert_eq!(v["consistent"], true, "{v}");
}
