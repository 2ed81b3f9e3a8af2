//! A hold keeps the `expires_at` it was given (issue 19, scenario 3): an operator who changes
//! `hold_seconds` to 0, or re-declares the SKU without it, changes new claims only; the holds
//! already made still expire on time and give their units back, on one shard and on every
//! shard of a sharded SKU.

use std::time::Duration;

use dropgate::shards::{shard_of_user, split_total};
use serde_json::{json, Value};

use crate::helpers::*;
use crate::lifecycle::{declare_with, ledger_statuses};
use crate::shards::shard_remaining;

/// Claims one unit for each of `buyers` and returns their held claims' ids.
async fn hold_each(app: &TestApp, sku: &str, buyers: &[String]) -> Vec<String> {
    let mut ids = Vec::new();
    for u in buyers {
        let r = app.claim(sku, u, 1, None).await;
        assert_eq!(r.status(), 201, "{u} holds a unit of {sku}");
        let b: Value = r.json().await.unwrap();
        assert_eq!(b["status"], "held", "{b}");
        assert!(b["expires_at"].is_string(), "{b}");
        ids.push(b["claim_id"].as_str().unwrap().to_string());
    }
    ids
}

/// Waits until every claim of `sku` is `expired` in the ledger and the stock Redis holds
/// (summed over the shards) is back to `total`.
async fn all_expired_and_back(app: &TestApp, sku: &str, holds: usize, total: i64) {
    let limit = Duration::from_secs(60);
    let deadline = std::time::Instant::now() + limit;
    loop {
        let statuses = ledger_statuses(&app.probe, sku).await;
        let v = app.view(sku).await;
        let stock = match v.get("shards") {
            Some(_) => shard_remaining(&v).iter().sum::<i64>(),
            None => app.stock(sku).await.unwrap_or(-1),
        };
        let expired = statuses.values().filter(|s| *s == "expired").count();
        if statuses.len() == holds && expired == holds && stock == total {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{sku}: holds made under hold_seconds 2 did not expire within {limit:?} after the \
             terms changed: ledger {statuses:?}, Redis stock {stock} of {total}, view {v}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_expire_on_time_after_hold_seconds_is_set_to_0_or_left_out() {
    let app = spawn_app().await;
    // Set to 0, and left out of the re-declare (its default is 0): one shard each.
    let to_zero = "terms-zero";
    let left_out = "terms-omitted";
    for sku in [to_zero, left_out] {
        let r = declare_with(&app.api, sku, json!({"total": 3, "hold_seconds": 2})).await;
        assert_eq!(r.status(), 201);
    }
    // A sharded SKU with a hold on every shard.
    let sharded = "terms-sharded";
    let r = declare_with(
        &app.api,
        sharded,
        json!({"total": 8, "hold_seconds": 2, "shards": 4}),
    )
    .await;
    assert_eq!(r.status(), 201);

    let buyers = users("h", 2);
    hold_each(&app, to_zero, &buyers).await;
    hold_each(&app, left_out, &buyers).await;
    let per_shard: Vec<String> = (0..4u16)
        .map(|i| {
            users("hs", 200)
                .into_iter()
                .find(|u| shard_of_user(u, 4) == i)
                .unwrap()
        })
        .collect();
    hold_each(&app, sharded, &per_shard).await;
    assert_eq!(
        shard_remaining(&app.view(sharded).await),
        split_total(8, 4).iter().map(|n| n - 1).collect::<Vec<_>>()
    );

    // The operator changes the terms while the holds are live.
    let r = declare_with(&app.api, to_zero, json!({"total": 3, "hold_seconds": 0})).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["hold_seconds"], 0);
    let r = declare_with(&app.api, left_out, json!({"total": 3})).await;
    assert_eq!(r.status(), 200);
    let r = declare_with(
        &app.api,
        sharded,
        json!({"total": 8, "hold_seconds": 0, "shards": 4}),
    )
    .await;
    assert_eq!(r.status(), 200);

    all_expired_and_back(&app, to_zero, 2, 3).await;
    all_expired_and_back(&app, left_out, 2, 3).await;
    all_expired_and_back(&app, sharded, 4, 8).await;
    assert_eq!(shard_remaining(&app.view(sharded).await), split_total(8, 4));
    for sku in [to_zero, left_out, sharded] {
        let v = app.drained(sku).await;
        assert_eq!(
            (v["recorded"].as_i64(), v["consistent"].as_bool()),
            (Some(0), Some(true)),
            "{v}"
        );
    }
}
