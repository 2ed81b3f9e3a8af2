//! Issue 19, scenario 1: Redis back from a snapshot taken before holds were confirmed and
//! cancelled and a waitlist moved, with every gateway restarted (or not). No operation may act
//! on the older state: claims, confirms, cancels and waitlist moves are refused 503 until a
//! restore, the ledger never holds more live units than the stock, no waiter is offered a
//! unit confirmed to someone else, and a restore brings back the ledger's truth.

use std::time::Duration;

use serde_json::{json, Value};

use crate::helpers::*;
use crate::lifecycle::{claim_id, claim_one, declare_with, get_as, post_as, settled};
use crate::services::{GatewayProcess, PrivateRedis};

const SKU: &str = "snap";

/// What was decided after the snapshot: `a` confirmed, `b` cancelled (its unit offered to
/// `w1`, who confirmed it), `w2` still waiting.
struct History {
    a: String,
    b: String,
    w1: String,
    w2: String,
    /// The state's incarnation right after the snapshot was copied (at least the copy's).
    inc: Option<String>,
}

async fn join(api: &Api, user: &str) -> (u16, Value) {
    post_as(api, &format!("/v1/skus/{SKU}/waitlist"), &token(user)).await
}

async fn leave(api: &Api, entry: &str, user: &str) -> (u16, Value) {
    let r = api
        .http
        .delete(format!("{}/v1/waitlist/{entry}", api.base))
        .bearer_auth(token(user))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// Declares the SKU (2 units, holds), lets `a` and `b` hold them and `w1`, `w2` join the
/// line, and returns the snapshot of Redis as it is then, and what happens after it.
async fn drop_with_history(
    api: &Api,
    probe: &Probe,
    redis: &PrivateRedis,
) -> (std::path::PathBuf, History) {
    let r = declare_with(
        api,
        SKU,
        json!({"total": 2, "per_user_limit": 1, "hold_seconds": 600, "offer_seconds": 600}),
    )
    .await;
    assert_eq!(r.status(), 201);
    let (s, a) = claim_one(api, SKU, "a").await;
    assert_eq!(s, 201, "{a}");
    let (s, b) = claim_one(api, SKU, "b").await;
    assert_eq!(s, 201, "{b}");
    let (s, w1) = join(api, "w1").await;
    assert_eq!(s, 201, "{w1}");
    let (s, w2) = join(api, "w2").await;
    assert_eq!(s, 201, "{w2}");
    settled(api, probe, SKU).await;
    let snapshot = redis.snapshot();
    let inc: Option<String> = redis::cmd("HGET")
        .arg(format!("{}:{{{SKU}}}:state", probe.prefix))
        .arg("inc")
        .query_async(&mut probe.redis.clone())
        .await
        .unwrap();
    let h = History {
        inc,
        a: claim_id(&a),
        b: claim_id(&b),
        w1: w1["entry_id"].as_str().unwrap().to_string(),
        w2: w2["entry_id"].as_str().unwrap().to_string(),
    };
    // After the snapshot: a confirms, b cancels (the unit is offered to w1), w1 confirms.
    let (s, v) = post_as(api, &format!("/v1/claims/{}/confirm", h.a), &token("a")).await;
    assert_eq!((s, v["status"].as_str()), (200, Some("confirmed")), "{v}");
    let (s, v) = post_as(api, &format!("/v1/claims/{}/cancel", h.b), &token("b")).await;
    assert_eq!((s, v["status"].as_str()), (200, Some("cancelled")), "{v}");
    let (s, e) = get_as(api, &format!("/v1/waitlist/{}", h.w1), &token("w1")).await;
    assert_eq!((s, e["status"].as_str()), (200, Some("offered")), "{e}");
    let offer = e["claim_id"].as_str().unwrap().to_string();
    let (s, v) = post_as(api, &format!("/v1/claims/{offer}/confirm"), &token("w1")).await;
    assert_eq!((s, v["status"].as_str()), (200, Some("confirmed")), "{v}");
    settled(api, probe, SKU).await;
    (snapshot, h)
}

/// The refusal of an operation on a state older than the ledger: 503 `unavailable`, its
/// detail naming the older state (not a lost one).
fn assert_stale_refusal(what: &str, status: u16, body: &Value) {
    assert_eq!(
        (status, code(body)),
        (503, "unavailable"),
        "{what} on the older state: {body}"
    );
    let detail = body["detail"].as_str().unwrap_or("");
    assert!(detail.contains("older state"), "{what}: {body}");
}

/// Every operation a buyer can send is refused on the older state, and nothing it would
/// have done reaches the ledger; then a restore brings back the ledger's truth.
async fn older_state_is_refused_until_restore(api: &Api, other: &Api, probe: &Probe, h: &History) {
    // b's hold is cancelled in the ledger, held in the old state: confirming it must not
    // answer 200 (least of all with `status: cancelled`).
    let (s, v) = post_as(api, &format!("/v1/claims/{}/confirm", h.b), &token("b")).await;
    assert_ne!(s, 200, "a confirm of a cancelled claim answered 200: {v}");
    if (s, code(&v)) == (409, "claim_cancelled") {
        // A gateway whose floor did not yet hold the newer mark (it learns the floors of SKUs
        // it has not moved in its refresher's rounds, and a loaded machine can delay one past
        // the restart) lets the older state decide, then finds the ledger's final status and
        // closes that state: the ledger's 409, and the state closed, never a 200
        // (src/http/lifecycle.rs). Seen once in a CI run with every test sharing two cores.
        assert!(
            stale_mark(probe).await.is_some(),
            "a confirm decided against the ledger left the older state open: {v}"
        );
    } else {
        assert_stale_refusal("confirm", s, &v);
    }
    // a's is confirmed in the ledger: cancelling it in the old state would offer its unit
    // to w1 (a unit confirmed to someone else).
    let (s, v) = post_as(other, &format!("/v1/claims/{}/cancel", h.a), &token("a")).await;
    assert_stale_refusal("cancel", s, &v);
    let (s, v) = leave(api, &h.w2, "w2").await;
    assert_stale_refusal("leave", s, &v);
    let (s, v) = join(other, "w3").await;
    assert_stale_refusal("join", s, &v);
    // New buyers, all at once, on both gateways: none may win from the older state.
    let buyers = users("new", 20);
    let (left, right) = buyers.split_at(10);
    let (l, r) = tokio::join!(
        release_buyers(api, SKU, left.to_vec()),
        release_buyers(other, SKU, right.to_vec())
    );
    for (s, body) in l.iter().chain(&r) {
        assert_stale_refusal("claim", *s, body);
    }
    // Every gateway closed the state; the ledger holds no more live units than the stock,
    // and w2 still waits (nobody was offered a unit confirmed elsewhere).
    assert!(
        stale_mark(probe).await.is_some(),
        "the older state is not marked stale"
    );
    assert_books(probe, h).await;

    let r = api.restore(SKU, false).await;
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    let (s, v) = claim_one(api, SKU, "after").await;
    assert_eq!((s, code(&v)), (409, "sold_out"), "{v}");
    let (s, v) = post_as(api, &format!("/v1/claims/{}/confirm", h.b), &token("b")).await;
    assert_eq!((s, code(&v)), (409, "claim_cancelled"), "{v}");
    let (s, v) = post_as(other, &format!("/v1/claims/{}/cancel", h.a), &token("a")).await;
    assert_eq!((s, code(&v)), (409, "claim_confirmed"), "{v}");
    let (s, e) = get_as(api, &format!("/v1/waitlist/{}", h.w2), &token("w2")).await;
    assert_eq!(
        (s, e["status"].as_str(), e["position"].as_i64()),
        (200, Some("waiting"), Some(1)),
        "{e}"
    );
    let v = settled(api, probe, SKU).await;
    assert_eq!(v["consistent"], true, "{v}");
    assert_eq!(v["remaining"], 0, "{v}");
    assert_books(probe, h).await;
}

/// The state's `stale` field (retried: the probe's first call after the Redis restart may
/// find its connection broken).
async fn stale_mark(probe: &Probe) -> Option<String> {
    let state = format!("{}:{{{SKU}}}:state", probe.prefix);
    for _ in 0..50 {
        if let Ok(v) = redis::cmd("HGET")
            .arg(&state)
            .arg("stale")
            .query_async::<Option<String>>(&mut probe.redis.clone())
            .await
        {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the probe's Redis does not answer");
}

/// The ledger after the history: 2 live units (a's and w1's), b cancelled, w2 waiting.
async fn assert_books(probe: &Probe, h: &History) {
    let (live, total): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT COALESCE(sum(quantity), 0)::int8 FROM issuances
                  WHERE sku = $1 AND status IN ('issued', 'held', 'confirmed')),
                (SELECT total FROM skus WHERE sku = $1)",
    )
    .bind(SKU)
    .fetch_one(&probe.db)
    .await
    .unwrap();
    assert!(live <= total, "{live} live units for a total of {total}");
    let statuses: Vec<(String, String)> = sqlx::query_as(
        "SELECT user_id, status FROM issuances WHERE sku = $1 ORDER BY user_id, claim_id",
    )
    .bind(SKU)
    .fetch_all(&probe.db)
    .await
    .unwrap();
    let want: Vec<(String, String)> = [("a", "confirmed"), ("b", "cancelled"), ("w1", "confirmed")]
        .iter()
        .map(|(u, s)| (u.to_string(), s.to_string()))
        .collect();
    assert_eq!(statuses, want, "the ledger's claims");
    let line: Vec<(String, String)> = sqlx::query_as(
        "SELECT entry_id::text, status FROM waitlist WHERE sku = $1 ORDER BY position",
    )
    .bind(SKU)
    .fetch_all(&probe.db)
    .await
    .unwrap();
    assert_eq!(
        line,
        vec![
            (h.w1.clone(), "claimed".to_string()),
            (h.w2.clone(), "waiting".to_string())
        ],
        "the ledger's line"
    );
}

/// Waits until the ledger recorded an incarnation of the state newer than the snapshot's: a
/// refresher round ran after the decisions, and the older copy is recognised by it, whatever
/// its sequence.
async fn recorded_after_snapshot(probe: &Probe, h: &History) {
    let state = format!("{}:{{{SKU}}}:state", probe.prefix);
    wait_for(Duration::from_secs(20), || async {
        let recorded: Option<String> =
            sqlx::query_scalar("SELECT to_jsonb(s) ->> 'redis_inc' FROM skus s WHERE sku = $1")
                .bind(SKU)
                .fetch_one(&probe.db)
                .await
                .unwrap();
        let live: Option<String> = redis::cmd("HGET")
            .arg(&state)
            .arg("inc")
            .query_async(&mut probe.redis.clone())
            .await
            .unwrap();
        live.is_some() && live != h.inc && recorded == live
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_back_from_an_older_snapshot_with_every_gateway_restarted_acts_on_nothing() {
    let mut redis = PrivateRedis::start().await;
    let iso = Isolation::new();
    let mut g1 = GatewayProcess::start(&iso, &redis.url(), &[]).await;
    let mut g2 = GatewayProcess::start(&iso, &redis.url(), &[]).await;
    let api1 = Api::new(g1.base.clone());
    let probe = Probe::new(&iso.database_url, &redis.url(), &iso.prefix).await;
    let (snapshot, h) = drop_with_history(&api1, &probe, &redis).await;

    g1.sigkill().await;
    g2.sigkill().await;
    redis.kill();
    redis.roll_back_to(&snapshot);
    redis.restart().await;
    let g3 = GatewayProcess::start(&iso, &redis.url(), &[]).await;
    let g4 = GatewayProcess::start(&iso, &redis.url(), &[]).await;
    let (api3, api4) = (Api::new(g3.base.clone()), Api::new(g4.base.clone()));
    // Nobody claims: the fresh gateways find the older state by themselves, though neither
    // has used the SKU.
    let state = format!("{}:{{{SKU}}}:state", iso.prefix);
    wait_for(Duration::from_secs(20), || async {
        let stale: Option<String> = redis::cmd("HGET")
            .arg(&state)
            .arg("stale")
            .query_async(&mut probe.redis.clone())
            .await
            .unwrap_or(None);
        stale.is_some()
    })
    .await;
    older_state_is_refused_until_restore(&api3, &api4, &probe, &h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_back_from_an_older_snapshot_under_running_gateways_acts_on_nothing() {
    let mut redis = PrivateRedis::start().await;
    let iso = Isolation::new();
    let g1 = GatewayProcess::start(&iso, &redis.url(), &[]).await;
    let g2 = GatewayProcess::start(&iso, &redis.url(), &[]).await;
    let (api1, api2) = (Api::new(g1.base.clone()), Api::new(g2.base.clone()));
    let probe = Probe::new(&iso.database_url, &redis.url(), &iso.prefix).await;
    let (snapshot, h) = drop_with_history(&api1, &probe, &redis).await;

    redis.kill();
    redis.roll_back_to(&snapshot);
    redis.restart().await;
    wait_for(Duration::from_secs(20), || async {
        api1.get("/readyz").await.status() == 200 && api2.get("/readyz").await.status() == 200
    })
    .await;
    // The first operations after the restart, before any periodic check had a chance.
    older_state_is_refused_until_restore(&api2, &api1, &probe, &h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_state_is_recognised_after_its_own_moves_pushed_its_sequence_past_the_mark() {
    let mut redis = PrivateRedis::start().await;
    let iso = Isolation::new();
    let mut g1 = GatewayProcess::start(&iso, &redis.url(), &[]).await;
    let api1 = Api::new(g1.base.clone());
    let probe = Probe::new(&iso.database_url, &redis.url(), &iso.prefix).await;
    let (snapshot, h) = drop_with_history(&api1, &probe, &redis).await;
    recorded_after_snapshot(&probe, &h).await;
    let state = format!("{}:{{{SKU}}}:state", iso.prefix);
    g1.sigkill().await;
    redis.kill();
    redis.roll_back_to(&snapshot);
    redis.restart().await;
    // The old state moves on (as a gateway that never learnt the mark would move it) until
    // its sequence is far past the ledger's mark.
    let mark: i64 = sqlx::query_scalar("SELECT redis_seq FROM skus WHERE sku = $1")
        .bind(SKU)
        .fetch_one(&probe.db)
        .await
        .unwrap();
    // (Retried: the probe's first call after the restart may find its old connection broken.)
    wait_for(Duration::from_secs(10), || async {
        redis::cmd("HSET")
            .arg(&state)
            .arg("seq")
            .arg(mark + 1000)
            .query_async::<()>(&mut probe.redis.clone())
            .await
            .is_ok()
    })
    .await;
    let g2 = GatewayProcess::start(&iso, &redis.url(), &[]).await;
    let g3 = GatewayProcess::start(&iso, &redis.url(), &[]).await;
    let (api2, api3) = (Api::new(g2.base.clone()), Api::new(g3.base.clone()));
    older_state_is_refused_until_restore(&api2, &api3, &probe, &h).await;
}

/// A script's invocation with the SKU's lifecycle keys (KEYS[1..8]).
fn lifecycle(
    keys: &dropgate::keys::SkuKeys,
    script: &'static redis::Script,
) -> redis::ScriptInvocation<'static> {
    let mut inv = script.prepare_invoke();
    for k in keys.lifecycle() {
        inv.key(k);
    }
    inv
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_script_that_moves_a_state_refuses_one_older_than_the_floor_and_closes_it() {
    use dropgate::scripts::Floor;
    use dropgate::scripts::SCRIPTS;
    // A state at sequence 5, incarnation 7: a floor ahead in either is an older copy.
    let ahead = [Floor { seq: 6, inc: 7 }, Floor { seq: 5, inc: 8 }];
    for floor in ahead {
        let mut calls: Vec<(&str, redis::ScriptInvocation<'static>)> = Vec::new();
        let (mut con, keys) = seeded_sku(3, 1).await;
        let _: () = redis::cmd("HSET")
            .arg(keys.state())
            .arg("seq")
            .arg(5)
            .arg("inc")
            .arg(7)
            .query_async(&mut con)
            .await
            .unwrap();
        let mut inv = lifecycle(&keys, &SCRIPTS.decide_hold);
        let _: () = redis::cmd("HSET")
            .arg(keys.holds())
            .arg("h1")
            .arg("held|1|99999999999999|0|1|u")
            .query_async(&mut con)
            .await
            .unwrap();
        inv.arg("confirm").arg("h1").arg("").arg(floor);
        calls.push(("decide_hold", inv));
        let mut inv = lifecycle(&keys, &SCRIPTS.join_waitlist);
        inv.arg(uuid::Uuid::now_v7().to_string())
            .arg("u")
            .arg("0")
            .arg("")
            .arg(floor);
        calls.push(("join_waitlist", inv));
        let mut inv = lifecycle(&keys, &SCRIPTS.leave_waitlist);
        inv.arg("no-such-entry").arg("").arg(floor);
        calls.push(("leave_waitlist", inv));
        let mut inv = lifecycle(&keys, &SCRIPTS.expire_holds);
        inv.key(keys.expiry_lease())
            .arg("me")
            .arg(1000)
            .arg(10)
            .arg(floor);
        calls.push(("expire_holds", inv));
        let mut inv = lifecycle(&keys, &SCRIPTS.release_pool);
        inv.arg(floor);
        calls.push(("release_pool", inv));
        for (name, inv) in calls {
            // Each call on a fresh state: the refusal is the script's own check.
            let _: () = redis::cmd("HDEL")
                .arg(keys.state())
                .arg("stale")
                .query_async(&mut con)
                .await
                .unwrap();
            let reply: redis::Value = inv.invoke_async(&mut con).await.unwrap();
            let first = match &reply {
                redis::Value::Array(v) => v.first().cloned(),
                other => Some(other.clone()),
            };
            let code: i64 = redis::from_redis_value(first.unwrap()).unwrap();
            assert!(
                code < 0,
                "{name} acted on a state older than {floor:?}: {reply:?}"
            );
            let (stale, stock, seq): (Option<String>, i64, i64) = redis::cmd("HMGET")
                .arg(keys.state())
                .arg("stale")
                .arg("stock")
                .arg("seq")
                .query_async(&mut con)
                .await
                .unwrap();
            assert!(stale.is_some(), "{name} did not close the older state");
            assert_eq!((stock, seq), (3, 5), "{name} moved the older state");
        }
        let r = dropgate::scripts::restock_at(
            &mut con,
            &keys,
            &uuid::Uuid::now_v7(),
            -1,
            dropgate::scripts::RestockMode::Apply,
            1,
            floor,
        )
        .await;
        assert!(
            matches!(r, Err(dropgate::error::StoreError::Stale)),
            "{r:?}"
        );
        assert_eq!(script_stock(&mut con, &keys).await, 3);
        queue_scripts_refuse(&mut con, &keys, floor).await;
    }
}

/// The waiting room's scripts on the same older state (seq 5, inc 7): a join, a read and a
/// round of admissions that would admit the line's head (the round's lease is the caller's
/// and its schedule owes a second's worth) each refuse, close the state, and move nothing.
async fn queue_scripts_refuse(
    con: &mut redis::aio::ConnectionManager,
    keys: &dropgate::keys::SkuKeys,
    floor: dropgate::scripts::Floor,
) {
    use dropgate::error::StoreError;
    use dropgate::queue::calls;
    let settings = dropgate::queue::RedisSettings {
        rate: 100,
        ttl_seconds: 60,
        prequeue_ms: 0,
        overbook_milli: 1500,
        version: 1,
    };
    assert!(calls::configure(con, keys, &settings).await.unwrap());
    let [q, line, admitted, ..] = keys.queue();
    let head = uuid::Uuid::now_v7();
    let _: () = redis::pipe()
        .cmd("ZADD")
        .arg(&line)
        .arg(1)
        .arg(head.as_bytes().as_slice())
        .cmd("HSET")
        .arg(&q)
        .arg("owner")
        .arg("me")
        .arg("fence")
        .arg(1)
        .arg("last_ms")
        .arg(1)
        .arg("credit")
        .arg(0)
        .query_async(con)
        .await
        .unwrap();
    let newcomer = uuid::Uuid::now_v7();
    for name in ["join_queue", "read_ticket", "admit_queue"] {
        let _: () = redis::cmd("HDEL")
            .arg(keys.state())
            .arg("stale")
            .query_async(con)
            .await
            .unwrap();
        let r = match name {
            "join_queue" => calls::join(con, keys, &newcomer, 5, "v", floor, 0)
                .await
                .map(|j| format!("{j:?}")),
            "read_ticket" => calls::read(con, keys, &head, "", floor, 0)
                .await
                .map(|t| format!("{t:?}")),
            _ => calls::admit(con, keys, "me", 2000, 100, false, floor, 0)
                .await
                .map(|r| format!("{r:?}")),
        };
        assert!(
            matches!(r, Err(StoreError::Stale)),
            "{name} acted on a state older than {floor:?}: {r:?}"
        );
        let (stale, stock, seq): (Option<String>, i64, i64) = redis::cmd("HMGET")
            .arg(keys.state())
            .arg("stale")
            .arg("stock")
            .arg("seq")
            .query_async(con)
            .await
            .unwrap();
        assert!(stale.is_some(), "{name} did not close the older state");
        assert_eq!((stock, seq), (3, 5), "{name} moved the older state");
        let (waiting, admitted): (i64, i64) = redis::pipe()
            .cmd("ZCARD")
            .arg(&line)
            .cmd("ZCARD")
            .arg(&admitted)
            .query_async(con)
            .await
            .unwrap();
        assert_eq!(
            (waiting, admitted),
            (1, 0),
            "{name} moved the older state's line"
        );
    }
}
