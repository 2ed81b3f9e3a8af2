//! The waitlists of a sharded SKU (src/shards/line.rs): a line per shard, joined by the buyers
//! routed there only once every shard is dry, fed by units that come back on any shard before
//! open stock gets them (across shards, in the order of the joins' tickets), offers held,
//! confirmed and declined on their buyer's own shard. Lapsed, expired and restored offers, and
//! the per-user limit with an offer held: tests/api/shards_offers.rs.

use std::collections::BTreeMap;

use std::time::Duration;

use dropgate::shards::shard_of_user;
use dropgate::shards::transfer::{self, Taken};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::helpers::*;
use crate::lifecycle::{claim_id, declare_with, get_as, post_as};
use crate::shards::{reconcile, settled_shards, shard_name, shard_remaining};

pub(crate) const SHARDS: i32 = 3;

/// `n` users whose claims route to `shard` of a SKU of [`SHARDS`] shards.
pub(crate) fn on_shard(prefix: &str, shard: u16, n: usize) -> Vec<String> {
    users(prefix, 400)
        .into_iter()
        .filter(|u| shard_of_user(u, SHARDS) == shard)
        .take(n)
        .collect()
}

/// A SKU of [`SHARDS`] shards, `total` units, holds and offers of 600 s unless `offer_seconds`.
pub(crate) async fn declare(app: &TestApp, prefix: &str, total: i64, offer_seconds: i64) -> String {
    let sku = format!("{prefix}-{}", Uuid::new_v4().simple());
    let r = declare_with(
        app,
        &sku,
        json!({"total": total, "shards": SHARDS, "hold_seconds": 600,
               "offer_seconds": offer_seconds}),
    )
    .await;
    assert_eq!(r.status(), 201);
    sku
}

pub(crate) async fn join(app: &TestApp, sku: &str, user: &str) -> (u16, Value) {
    post_as(app, &format!("/v1/skus/{sku}/waitlist"), &token(user)).await
}

pub(crate) async fn entry(app: &TestApp, id: &str, user: &str) -> Value {
    let (s, body) = get_as(app, &format!("/v1/waitlist/{id}"), &token(user)).await;
    assert_eq!(s, 200, "{body}");
    body
}

/// One held unit for `user`; its claim id.
pub(crate) async fn hold(app: &TestApp, sku: &str, user: &str) -> String {
    let r = app.claim(sku, user, 1, None).await;
    assert_eq!(r.status(), 201);
    claim_id(&r.json().await.unwrap())
}

pub(crate) async fn decide(app: &TestApp, id: &str, op: &str, user: &str) -> (u16, Value) {
    post_as(app, &format!("/v1/claims/{id}/{op}"), &token(user)).await
}

/// Redis stock of every shard of `sku`, shard 0 first.
pub(crate) async fn stocks(app: &TestApp, sku: &str) -> Vec<i64> {
    let mut out = Vec::new();
    for i in 0..SHARDS as u16 {
        out.push(app.stock(&shard_name(sku, i)).await.unwrap());
    }
    out
}

/// user -> status of the SKU's `waitlist` rows (join orders are per shard, so no one order
/// of the SKU's rows means anything across shards).
pub(crate) async fn line_rows(app: &TestApp, sku: &str) -> BTreeMap<String, String> {
    let rows: Vec<(String, String)> =
        sqlx::query_as("SELECT user_id, status FROM waitlist WHERE sku = $1")
            .bind(sku)
            .fetch_all(&app.db)
            .await
            .unwrap();
    rows.into_iter().collect()
}

/// user -> status, for comparing with [`line_rows`].
pub(crate) fn statuses<const N: usize>(rows: [(&String, &str); N]) -> BTreeMap<String, String> {
    rows.into_iter()
        .map(|(u, s)| (u.clone(), s.to_string()))
        .collect()
}

/// Entries waiting in the line of shard `shard` of `sku`, as Redis has it.
pub(crate) async fn line_len(app: &TestApp, sku: &str, shard: u16) -> i64 {
    let line = format!("{}:{{{}}}:wl", app.probe.prefix, shard_name(sku, shard));
    let mut con = app.probe.redis.clone();
    redis::cmd("ZCARD")
        .arg(line)
        .query_async(&mut con)
        .await
        .unwrap()
}

/// Units of live claims (`issued`, `held`, `confirmed`) in `issuances`.
pub(crate) async fn live_units(app: &TestApp, sku: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT COALESCE(sum(quantity), 0)::bigint FROM issuances
          WHERE sku = $1 AND status IN ('issued', 'held', 'confirmed')",
    )
    .bind(sku)
    .fetch_one(&app.db)
    .await
    .unwrap()
}

/// Waits until `user`'s entry `id` has `status`.
pub(crate) async fn until_status(app: &TestApp, id: &str, user: &str, status: &str) {
    wait_for(Duration::from_secs(15), || async {
        entry(app, id, user).await["status"] == status
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_sku_takes_joins_only_once_every_shard_is_dry() {
    let app = spawn_app().await;
    let sku = declare(&app, "swj", 3, 600).await;
    assert_eq!(stocks(&app, &sku).await, vec![1, 1, 1]);
    let buyers: Vec<String> = (0..3).map(|i| on_shard("swj-b", i, 1).remove(0)).collect();
    let waiter = on_shard("swj-w", 0, 1).remove(0);
    let second = on_shard("swj-w", 1, 1).remove(0);
    // Shard by shard: while any shard has stock, the joiner's own being 0 does not matter.
    for b in &buyers {
        let (s, body) = join(&app, &sku, &waiter).await;
        assert_eq!(
            (s, code(&body)),
            (409, "in_stock"),
            "{:?}",
            stocks(&app, &sku).await
        );
        hold(&app, &sku, b).await;
    }
    assert_eq!(stocks(&app, &sku).await, vec![0, 0, 0]);
    let (s, first) = join(&app, &sku, &waiter).await;
    assert_eq!((s, first["position"].as_i64()), (201, Some(1)), "{first}");
    let (s, again) = join(&app, &sku, &waiter).await;
    assert_eq!((s, &again["entry_id"]), (200, &first["entry_id"]));
    // The next joiner, routed to shard 1, heads the line of its own shard and is second in
    // the SKU's (its ticket is the later).
    let (s, other) = join(&app, &sku, &second).await;
    assert_eq!((s, other["position"].as_i64()), (201, Some(2)), "{other}");
    // A buyer at its limit on its own shard (2) may not join that shard's line.
    let (s, body) = join(&app, &sku, &buyers[2]).await;
    assert_eq!((s, code(&body)), (409, "limit_reached"));
    // Each entry is in the line of its joiner's shard.
    for (i, want) in [(0u16, 1i64), (1, 1), (2, 0)] {
        assert_eq!(line_len(&app, &sku, i).await, want, "line on shard {i}");
    }
    // The owner reads its entry on its own shard; the admin finds it on any.
    let id = other["entry_id"].as_str().unwrap();
    assert_eq!(entry(&app, id, &second).await["position"], 2);
    let (s, body) = get_as(&app, &format!("/v1/waitlist/{id}"), ADMIN).await;
    assert_eq!((s, body["user"].as_str()), (200, Some(second.as_str())));
    let (s, _) = get_as(&app, &format!("/v1/waitlist/{id}"), &token(&waiter)).await;
    assert_eq!(s, 404, "not another buyer's");
    let v = settled_shards(&app, &sku, 3).await;
    assert_eq!(
        (v["waiting"].as_i64(), v["consistent"].as_bool()),
        (Some(2), Some(true))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_cancelled_on_a_shard_without_a_line_is_offered_once_to_the_earliest_head() {
    let app = spawn_app().await;
    let sku = declare(&app, "swo", 3, 600).await;
    let buyers: Vec<String> = (0..3).map(|i| on_shard("swo-b", i, 1).remove(0)).collect();
    let mut holds = Vec::new();
    for b in &buyers {
        holds.push(hold(&app, &sku, b).await);
    }
    // The first joiner routes to shard 1, the next to shard 0, the last to shard 1 again;
    // nobody waits on shard 2.
    let waiters: Vec<String> = [("swo-w0", 1), ("swo-w1", 0), ("swo-w2", 1)]
        .map(|(p, i)| on_shard(p, i, 1).remove(0))
        .to_vec();
    let mut ids = Vec::new();
    for w in &waiters {
        let (s, b) = join(&app, &sku, w).await;
        assert_eq!(s, 201, "{b}");
        ids.push(b["entry_id"].as_str().unwrap().to_string());
    }
    // The unit comes back on shard 2, where no line is: it is moved to the line whose head
    // joined first (shard 1's), not to shard 0's.
    let (s, _) = decide(&app, &holds[2], "cancel", &buyers[2]).await;
    assert_eq!(s, 200);
    until_status(&app, &ids[0], &waiters[0], "offered").await;
    assert_eq!(entry(&app, &ids[1], &waiters[1]).await["position"], 1);
    assert_eq!(entry(&app, &ids[2], &waiters[2]).await["position"], 2);
    assert_eq!(
        stocks(&app, &sku).await,
        vec![0, 0, 0],
        "the unit went to no open stock"
    );
    for u in (0..3).map(|i| on_shard("swo-out", i, 1).remove(0)) {
        let r = app.claim(&sku, &u, 1, None).await;
        assert_eq!(r.status(), 409, "nobody outside the line buys");
    }
    // The head confirms its offer, held on its own shard 1 with its count; the next in line
    // (routed to shard 0) leaves its line.
    let offer = entry(&app, &ids[0], &waiters[0]).await;
    let offer_id = offer["claim_id"].as_str().unwrap().to_string();
    let (s, b) = decide(&app, &offer_id, "confirm", &waiters[0]).await;
    assert_eq!((s, b["status"].as_str()), (200, Some("confirmed")), "{b}");
    assert_eq!(
        (
            app.held(&shard_name(&sku, 1), &waiters[0]).await,
            app.held(&sku, &waiters[0]).await
        ),
        (1, 0),
        "the offer counts on its buyer's shard"
    );
    let r = app
        .http
        .delete(format!("{}/v1/waitlist/{}", app.base, ids[1]))
        .bearer_auth(token(&waiters[1]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    let v = settled_shards(&app, &sku, 3).await;
    assert_eq!(stocks(&app, &sku).await, vec![0, 0, 0]);
    assert_eq!(shard_remaining(&v), vec![0, 0, 0]);
    assert_eq!(live_units(&app, &sku).await, 3, "3 units, each sold once");
    assert_eq!(
        line_rows(&app, &sku).await,
        statuses([
            (&waiters[0], "claimed"),
            (&waiters[1], "left"),
            (&waiters[2], "waiting"),
        ])
    );
    assert_eq!(
        (
            v["waiting"].as_i64(),
            v["offered"].as_i64(),
            v["confirmed"].as_i64()
        ),
        (Some(1), Some(0), Some(1))
    );
    assert_eq!(v["consistent"], true, "{v}");
    reconcile(REDIS_URL, &app.probe.database_url, &app.probe.prefix);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_buyers_on_every_shard_never_takes_an_offered_unit() {
    let app = spawn_app().await;
    let sku = declare(&app, "swb", 6, 600).await;
    let buyers: Vec<String> = (0..3).flat_map(|i| on_shard("swb-b", i, 2)).collect();
    let mut holds = Vec::new();
    for b in &buyers {
        holds.push(hold(&app, &sku, b).await);
    }
    // One waiter per shard, each in its own shard's line.
    let waiters: Vec<String> = (0..3).map(|i| on_shard("swb-w", i, 1).remove(0)).collect();
    let mut ids = Vec::new();
    for w in &waiters {
        ids.push(
            join(&app, &sku, w).await.1["entry_id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    // One hold cancelled on each shard: each offered to that shard's waiter. A fourth, on
    // shard 2, finds nobody waiting on any shard: open stock.
    for i in [0, 2, 4] {
        assert_eq!(decide(&app, &holds[i], "cancel", &buyers[i]).await.0, 200);
        let n = i / 2;
        until_status(&app, &ids[n], &waiters[n], "offered").await;
    }
    // Kept for the lines until the line lease of the last join lapses, then open stock.
    assert_eq!(decide(&app, &holds[5], "cancel", &buyers[5]).await.0, 200);
    wait_for(Duration::from_secs(15), || async {
        stocks(&app, &sku).await == vec![0, 0, 1]
    })
    .await;

    let crowd = users("swb-c", 300);
    let answers = release_buyers(&app, &sku, crowd).await;
    let won = won_ids(&answers);
    assert_eq!(won.len(), 1, "only the open unit sells");
    assert!(answers
        .iter()
        .all(|(s, b)| *s == 201 || (*s == 409 && code(b) == "sold_out")));
    for (w, id) in waiters.iter().zip(&ids) {
        assert_eq!(entry(&app, id, w).await["status"], "offered");
    }
    let v = settled_shards(&app, &sku, 3).await;
    assert_eq!(stocks(&app, &sku).await, vec![0, 0, 0]);
    // 6 holds (4 cancelled), 3 offers held, 1 won: 6 live units of 6.
    assert_eq!(live_units(&app, &sku).await, 6);
    assert_eq!(
        (v["offered"].as_i64(), v["consistent"].as_bool()),
        (Some(3), Some(true))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unit_given_back_on_a_shard_with_a_line_goes_first_to_an_earlier_joiner_on_another() {
    let app = spawn_app().await;
    let sku = declare(&app, "swt", 3, 600).await;
    let buyers: Vec<String> = (0..3).map(|i| on_shard("swt-b", i, 1).remove(0)).collect();
    let mut holds = Vec::new();
    for b in &buyers {
        holds.push(hold(&app, &sku, b).await);
    }
    // The first joiner waits on shard 1, the second on shard 2.
    let first = on_shard("swt-w0", 1, 1).remove(0);
    let second = on_shard("swt-w1", 2, 1).remove(0);
    let mut ids = Vec::new();
    for w in [&first, &second] {
        let (s, b) = join(&app, &sku, w).await;
        assert_eq!(s, 201, "{b}");
        ids.push(b["entry_id"].as_str().unwrap().to_string());
    }
    assert_eq!(entry(&app, &ids[1], &second).await["position"], 2);
    // The unit comes back on shard 2, whose own line has the second joiner: the first joiner
    // (shard 1) is served first, on its own shard.
    assert_eq!(decide(&app, &holds[2], "cancel", &buyers[2]).await.0, 200);
    until_status(&app, &ids[0], &first, "offered").await;
    assert_eq!(entry(&app, &ids[1], &second).await["position"], 1);
    assert_eq!(
        (
            app.held(&shard_name(&sku, 1), &first).await,
            app.held(&shard_name(&sku, 2), &second).await
        ),
        (1, 0),
        "the offer is held on the first joiner's shard"
    );
    for u in (0..3).map(|i| on_shard("swt-out", i, 1).remove(0)) {
        let r = app.claim(&sku, &u, 1, None).await;
        assert_eq!(r.status(), 409, "nobody outside the line buys");
    }
    // The next unit, back on shard 0 (no line there), goes to the second joiner.
    assert_eq!(decide(&app, &holds[0], "cancel", &buyers[0]).await.0, 200);
    until_status(&app, &ids[1], &second, "offered").await;
    assert_eq!(app.held(&shard_name(&sku, 2), &second).await, 1);

    let v = settled_shards(&app, &sku, 3).await;
    assert_eq!(stocks(&app, &sku).await, vec![0, 0, 0]);
    let pooled: Vec<i64> = v["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["for_waitlist"].as_i64().unwrap())
        .collect();
    assert_eq!(pooled, vec![0, 0, 0], "every pooled unit was offered");
    assert_eq!(live_units(&app, &sku).await, 3, "3 units, each sold once");
    assert_eq!(
        line_rows(&app, &sku).await,
        statuses([(&first, "offered"), (&second, "offered")])
    );
    assert_eq!(
        (v["offered"].as_i64(), v["consistent"].as_bool()),
        (Some(2), Some(true)),
        "{v}"
    );
    reconcile(REDIS_URL, &app.probe.database_url, &app.probe.prefix);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn units_pooled_for_the_lines_move_between_shards_once_and_reach_open_stock_when_nobody_waits(
) {
    let app = spawn_app().await;
    let sku = declare(&app, "swp", 3, 600).await;
    let b0 = on_shard("swp-b", 0, 1).remove(0);
    let held = hold(&app, &sku, &b0).await;
    // A join refused (shards 1 and 2 still hold stock) has leased every shard's line anyway.
    let (s, body) = join(&app, &sku, &on_shard("swp-w", 1, 1).remove(0)).await;
    assert_eq!((s, code(&body)), (409, "in_stock"));
    // So the unit given back on shard 0 is kept for the lines, not put on sale.
    assert_eq!(decide(&app, &held, "cancel", &b0).await.0, 200);
    let v = settled_shards(&app, &sku, 3).await;
    let pooled = |v: &Value| -> Vec<i64> {
        v["shards"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["for_waitlist"].as_i64().unwrap())
            .collect()
    };
    assert_eq!(
        (pooled(&v), shard_remaining(&v)),
        (vec![1, 0, 0], vec![0, 1, 1])
    );
    assert_eq!(
        (v["remaining"].as_i64(), v["consistent"].as_bool()),
        (Some(3), Some(true))
    );

    // Step 1 of a pool-to-pool transfer only, as a gateway that died right after it leaves it.
    let store = crate::shards::store_of(&app).await;
    let id = Uuid::now_v7();
    let taken = transfer::take(&store, &sku, &id, 2, 1, 1, transfer::Source::Pool)
        .await
        .unwrap();
    assert_eq!(taken, Taken::Units(1, String::new()));
    let v = app.view(&sku).await;
    assert_eq!(pooled(&v), vec![0, 0, 0]);
    assert_eq!(
        (v["in_transit"].as_i64(), v["consistent"].as_bool()),
        (Some(1), Some(true))
    );

    // The recovery task finishes it into shard 2's pool; nobody waits and the lease lapses,
    // so the pools are given back to open stock there: every unit once, on sale again.
    wait_for(Duration::from_secs(30), || async {
        stocks(&app, &sku).await == vec![0, 1, 2]
    })
    .await;
    let v = settled_shards(&app, &sku, 3).await;
    assert_eq!(pooled(&v), vec![0, 0, 0]);
    assert_eq!(
        (
            v["remaining"].as_i64(),
            v["in_transit"].as_i64(),
            v["consistent"].as_bool()
        ),
        (Some(3), Some(0), Some(true))
    );
    let crowd = users("swp-c", 60);
    let won = won_ids(&release_buyers(&app, &sku, crowd).await);
    assert_eq!(won.len(), 3, "the three units sell, each once");
    assert_eq!(stocks(&app, &sku).await, vec![0, 0, 0]);
    reconcile(REDIS_URL, &app.probe.database_url, &app.probe.prefix);
}
