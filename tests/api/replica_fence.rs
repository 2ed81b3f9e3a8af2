//! A read-back's fence is a write like a win: "nothing moved" (503 `unavailable`) is told only
//! once the replicas hold it. A master that dies before its replica has the fence leaves the
//! call free to run on the promoted replica (a cluster connection resends it there), so the
//! buyer told "nothing moved" would hold a unit (seen in
//! `cluster::a_master_killed_on_a_one_replica_cluster_...`: `s5-10 was promised nothing`).

use std::time::Duration;

use serde_json::json;

use crate::helpers::*;
use crate::lifecycle::claim_one;
use crate::proxy::{FaultProxy, Mode};
use crate::services::PrivateRedis;

/// Fences ("void" call records) in the SKU's record buckets on the Redis at `url`.
async fn fences(url: &str, prefix: &str, sku: &str) -> usize {
    let mut con = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let buckets: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:{{{sku}}}:claims:*"))
        .query_async(&mut con)
        .await
        .unwrap();
    let mut n = 0;
    for b in buckets {
        let values: Vec<String> = redis::cmd("HVALS")
            .arg(&b)
            .query_async(&mut con)
            .await
            .unwrap();
        n += values.iter().filter(|v| *v == "void").count();
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_the_replica_does_not_hold_yet_is_told_as_an_unknown_outcome_not_as_nothing_moved()
{
    let master = PrivateRedis::start().await;
    let replica = PrivateRedis::start().await;
    replica.replicate(&master).await;
    let proxy = FaultProxy::start(([127, 0, 0, 1], master.port).into()).await;
    let app = spawn_app_with(|c| {
        c.redis_url = proxy.url("redis");
        c.redis_timeout_ms = "250".into();
        c.redis_wait_replicas = "1".into();
    })
    .await;
    assert_eq!(app.declare("fence", 10, 1).await.status(), 201);
    // From now on the replica acknowledges nothing (its link stays open).
    replica.signal("STOP");
    // The claim's call is thrown away; then its connection breaks: its outcome is uncertain,
    // and the read-back (on a new connection) finds no record and fences the call.
    proxy.set(Mode::BlackHole);
    let user = "fence-buyer-1";
    let claim = {
        let api = app.api.clone();
        tokio::spawn(async move { claim_one(&api, "fence", user).await })
    };
    wait_for(Duration::from_secs(10), || async {
        proxy.swallowed(user.as_bytes())
    })
    .await;
    proxy.set(Mode::Pass);
    proxy.cut_all();
    let (status, body) = claim.await.unwrap();
    assert_eq!(
        fences(&master.url(), &app.probe.prefix, "fence").await,
        1,
        "the read-back fenced the call on the master: {body}"
    );
    assert_eq!(
        (status, code(&body)),
        (503, "outcome_unknown"),
        "the replica does not hold the fence: {body}"
    );

    // Once the replica holds the fence, the claim settles: it did not win and never will.
    replica.signal("CONT");
    let id = body["claim_id"].as_str().unwrap().to_string();
    wait_for(Duration::from_secs(20), || async {
        app.http
            .get(format!("{}/v1/claims/{id}", app.base))
            .bearer_auth(token(user))
            .send()
            .await
            .unwrap()
            .status()
            == 404
    })
    .await;
    assert_eq!(app.held("fence", user).await, 0);
    assert_eq!(app.stock("fence").await, Some(10));
}

/// A restock is a write the catalog's total follows: said applied (or fenced) only once the
/// replicas hold it, or a failover could leave Redis's stock and the total apart (a negative
/// restock lost with its master: more units on sale than the total).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restock_the_replica_does_not_hold_yet_is_answered_unknown_and_settles_once_it_does() {
    let master = PrivateRedis::start().await;
    let replica = PrivateRedis::start().await;
    replica.replicate(&master).await;
    let app = spawn_app_with(|c| {
        c.redis_url = master.url();
        c.redis_timeout_ms = "250".into();
        c.redis_wait_replicas = "1".into();
    })
    .await;
    assert_eq!(app.declare("rs", 10, 1).await.status(), 201);
    replica.signal("STOP");
    let r = app.restock("rs", -3).await;
    let status = r.status().as_u16();
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(
        (status, code(&body)),
        (503, "outcome_unknown"),
        "the replica does not hold the restock: {body}"
    );
    // Applied on the master, not on the replica; the total waits for the read-back.
    assert_eq!(app.stock("rs").await, Some(7));
    replica.signal("CONT");
    // The sweep (or the next restock) reads it back, now held by the replica: applied, once.
    let ops = || async {
        sqlx::query_scalar::<_, String>("SELECT status FROM restock_ops WHERE sku = 'rs'")
            .fetch_all(&app.db)
            .await
            .unwrap()
    };
    wait_for(Duration::from_secs(60), || async {
        ops().await != ["pending"]
    })
    .await;
    assert_eq!(ops().await, ["applied"]);
    let v = app.view("rs").await;
    assert_eq!(
        (v["total"].clone(), v["consistent"].clone()),
        (json!(7), json!(true)),
        "{v}"
    );
    assert_eq!(app.stock("rs").await, Some(7));
}
