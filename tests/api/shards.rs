//! A hot SKU spread over several Redis shards (src/shards/): exact sell-out with borrowing,
//! the per-user limit across shards, a transfer interrupted between its steps, the view's sums,
//! restock and restore, reconcile; on one Redis and on a private cluster of three masters.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use dropgate::shards::recovery::Recovery;
use dropgate::shards::transfer::{self, Taken};
use dropgate::shards::{shard_of_user, split_total, Layout};
use dropgate::store::Store;
use serde_json::{json, Value};
use sqlx::PgPool;
use uuid::Uuid;

use crate::cluster_support::{sku_key, ClusterProbe, PrivateCluster};
use crate::helpers::*;
use crate::lifecycle::{claim_id, get_as, ledger_statuses, post_as};
use crate::services::GatewayProcess;

/// The Redis name of shard `i` of `sku` on a single Redis, where no shard carries a placement
/// salt (src/shards/placement.rs): on a cluster, read the names from the SKU view
/// ([`shard_names`]).
pub(crate) fn shard_name(sku: &str, i: u16) -> String {
    dropgate::keys::shard_name(sku_id(sku), i, 0)
}

/// Each shard's Redis name, as the SKU view gives it (from the catalog row's layout).
pub(crate) fn shard_names(view: &Value) -> Vec<String> {
    view["shards"]
        .as_array()
        .expect("a sharded SKU's view lists its shards")
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_string())
        .collect()
}

async fn declare_sharded(api: &Api, sku: &str, body: Value) -> reqwest::Response {
    api.http
        .put(format!("{}/admin/skus/{sku}", api.base))
        .bearer_auth(ADMIN)
        .json(&body)
        .send()
        .await
        .unwrap()
}

/// A store of the test's own on the gateway's prefix, for calling the transfer steps directly.
pub(crate) async fn store_of(app: &TestApp) -> Store {
    Store::connect(REDIS_URL, &app.probe.prefix, Duration::from_secs(2))
        .await
        .unwrap()
}

/// Keys left by transfers applied on `sku`'s shards: one record per transfer's second step.
async fn applied_transfers(app: &TestApp, sku: &str) -> usize {
    let mut con = app.probe.redis.clone();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}:{{{sku}*}}:xfer:in:*", app.probe.prefix))
        .query_async(&mut con)
        .await
        .unwrap();
    keys.len()
}

/// Runs `dropgate reconcile` on the test's database and prefix; panics on a mismatch.
pub(crate) fn reconcile(redis_url: &str, database_url: &str, prefix: &str) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dropgate"))
        .arg("reconcile")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("REDIS_URL", redis_url)
        .env("DATABASE_URL", database_url)
        .env("DROPGATE_KEY_PREFIX", prefix)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{table}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    table
}

pub(crate) fn shard_remaining(view: &Value) -> Vec<i64> {
    view["shards"]
        .as_array()
        .expect("a sharded SKU's view lists its shards")
        .iter()
        .map(|s| s["remaining"].as_i64().unwrap())
        .collect()
}

/// Every buyer in `buyers` claims one unit of `sku` at once (a barrier), through the gateways
/// `apis` in turn. The answers, and how many of each (status, code).
pub(crate) async fn drop_through(
    apis: &[Api],
    sku: &str,
    buyers: Vec<String>,
) -> (Vec<(u16, Value)>, HashMap<(u16, String), usize>) {
    let n = buyers.len();
    let buyers = std::sync::Arc::new(buyers);
    let results = all_at_once(n, |i| {
        let (api, buyers) = (apis[i % apis.len()].clone(), buyers.clone());
        let sku = sku.to_string();
        async move {
            let r = api.claim(&sku, &buyers[i], 1, None).await;
            let s = r.status().as_u16();
            (s, r.json::<Value>().await.unwrap_or(Value::Null))
        }
    })
    .await;
    let mut by_status: HashMap<(u16, String), usize> = HashMap::new();
    for (s, b) in &results {
        *by_status.entry((*s, code(b).to_string())).or_default() += 1;
    }
    (results, by_status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_are_declared_once_split_evenly_and_refuse_the_waitlist_while_in_stock() {
    let app = spawn_app().await;
    let sku = format!("sh-decl-{}", Uuid::new_v4().simple());
    for bad in [
        json!({"total": 10, "shards": 0}),
        json!({"total": 10, "shards": 17}),
    ] {
        let r = declare_sharded(&app.api, &sku, bad).await;
        assert_eq!(r.status(), 400);
    }
    assert_eq!(
        declare_sharded(&app.api, &sku, json!({"total": 10, "shards": 3}))
            .await
            .status(),
        201
    );
    // A re-declare with the same count is the same SKU; another count is another SKU.
    assert_eq!(
        declare_sharded(&app.api, &sku, json!({"total": 10, "shards": 3}))
            .await
            .status(),
        200
    );
    let r = declare_sharded(&app.api, &sku, json!({"total": 10, "shards": 2})).await;
    assert_eq!(r.status(), 409);
    assert_eq!(code(&r.json().await.unwrap()), "sku_exists");
    let r = declare_sharded(&app.api, &sku, json!({"total": 10})).await;
    assert_eq!(r.status(), 409, "the default of 1 shard is another count");

    let v = app.view(&sku).await;
    assert_eq!(shard_remaining(&v), split_total(10, 3));
    assert_eq!(shard_remaining(&v), vec![4, 3, 3]);
    // On a single Redis the shards keep their plain names, and no slot is shown.
    assert_eq!(
        shard_names(&v),
        vec![sku.clone(), format!("{sku}#1"), format!("{sku}#2")]
    );
    assert!(v["shards"][0].get("slot").is_none(), "{v}");
    assert_eq!(
        (v["remaining"].as_i64(), v["consistent"].as_bool()),
        (Some(10), Some(true))
    );
    assert_eq!(app.stock(&sku).await, Some(4));
    assert_eq!(app.stock(&format!("{sku}#2")).await, Some(3));
    let shards: i32 = sqlx::query_scalar("SELECT shards FROM skus WHERE sku = $1")
        .bind(&sku)
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(shards, 3);

    // Units remain on every shard: no line to join (tests/api/shards_waitlist.rs).
    let r = app
        .http
        .post(format!("{}/v1/skus/{sku}/waitlist", app.base))
        .bearer_auth(token("w-1"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 409);
    assert_eq!(code(&r.json().await.unwrap()), "in_stock");

    // A SKU of one shard shows no shard lines: its view is unchanged.
    let one = format!("sh-one-{}", Uuid::new_v4().simple());
    assert_eq!(app.declare(&one, 5, 1).await.status(), 201);
    let v = app.view(&one).await;
    assert!(
        v.get("shards").is_none() && v.get("in_transit").is_none(),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_drop_sells_exactly_its_units_borrowing_the_last_ones() {
    let _heavy = heavy().await;
    let app = spawn_app().await;
    let sku = format!("sh-drop-{}", Uuid::new_v4().simple());
    let r = declare_sharded(
        &app.api,
        &sku,
        json!({"total": 10, "per_user_limit": 1, "shards": 3}),
    )
    .await;
    assert_eq!(r.status(), 201);

    // 1,000 buyers, none of them routed to shard 2: its 3 units sell only by borrowing.
    let buyers: Vec<String> = users("sd", 1600)
        .into_iter()
        .filter(|u| shard_of_user(u, 3) != 2)
        .take(1000)
        .collect();
    assert_eq!(buyers.len(), 1000);
    let results = release_buyers(&app.api, &sku, buyers).await;

    let won = won_ids(&results);
    assert_eq!(won.len(), 10, "exactly the declared units sell");
    let others: Vec<&(u16, Value)> = results.iter().filter(|(s, _)| *s != 201).collect();
    assert!(
        others
            .iter()
            .all(|(s, b)| *s == 409 && code(b) == "sold_out"),
        "every other buyer is told sold out: {:?}",
        others
            .iter()
            .find(|(s, b)| *s != 409 || code(b) != "sold_out")
    );
    let v = app.drained(&sku).await;
    assert_eq!(v["recorded"], 10);
    assert_eq!(v["remaining"], 0);
    assert_eq!(v["in_transit"], 0);
    assert_eq!(v["consistent"], true, "{v}");
    assert_eq!(shard_remaining(&v), vec![0, 0, 0]);
    // The rows name the catalog's SKU, one per winner, and each winner is counted in its own
    // shard only.
    let rows: Vec<(String, String)> =
        sqlx::query_as("SELECT sku, user_id FROM issuances WHERE claim_id = ANY($1)")
            .bind(&won)
            .fetch_all(&app.db)
            .await
            .unwrap();
    assert_eq!(rows.len(), 10);
    assert!(rows.iter().all(|(s, _)| *s == sku));
    let winners: HashSet<&str> = rows.iter().map(|(_, u)| u.as_str()).collect();
    assert_eq!(winners.len(), 10);
    for w in &winners {
        let name = shard_name(&sku, shard_of_user(w, 3));
        assert_eq!(app.held(&name, w).await, 1, "{w} counted in its shard");
    }
    // Shard 2's units went to the others' buyers through transfers.
    let mut per_shard = [0usize; 3];
    for w in &winners {
        per_shard[usize::from(shard_of_user(w, 3))] += 1;
    }
    assert_eq!(per_shard[2], 0);
    assert!(applied_transfers(&app, &sku).await > 0);
    // After the sell-out, a late buyer is refused from memory or by a dry refill alike.
    let late = app.claim(&sku, "late-1", 1, None).await;
    assert_eq!(late.status(), 409);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_buyer_sending_many_requests_at_once_gets_its_limit_on_a_sharded_sku() {
    let app = spawn_app().await;
    let sku = format!("sh-limit-{}", Uuid::new_v4().simple());
    let r = declare_sharded(
        &app.api,
        &sku,
        json!({"total": 300, "per_user_limit": 2, "shards": 3}),
    )
    .await;
    assert_eq!(r.status(), 201);

    let results = release_buyers(&app.api, &sku, vec!["greedy".to_string(); 200]).await;

    assert_eq!(
        won_ids(&results).len(),
        2,
        "the limit holds across 200 requests"
    );
    assert!(results
        .iter()
        .filter(|(s, _)| *s != 201)
        .all(|(s, b)| *s == 409 && code(b) == "limit_reached"));
    let home = shard_name(&sku, shard_of_user("greedy", 3));
    assert_eq!(app.held(&home, "greedy").await, 2);
    for shard in 0..3u16 {
        let name = shard_name(&sku, shard);
        if name != home {
            assert_eq!(app.held(&name, "greedy").await, 0, "no count on {name}");
        }
    }
    let v = app.drained(&sku).await;
    assert_eq!(
        (v["recorded"].as_i64(), v["remaining"].as_i64()),
        (Some(2), Some(298))
    );
    assert_eq!(v["consistent"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transfer_interrupted_between_its_steps_is_finished_once_and_creates_no_unit() {
    let app = spawn_app().await;
    let sku = format!("sh-xfer-{}", Uuid::new_v4().simple());
    let r = declare_sharded(&app.api, &sku, json!({"total": 9, "shards": 3})).await;
    assert_eq!(r.status(), 201);
    let store = store_of(&app).await;
    // On a single Redis no shard carries a placement salt.
    let layout = Layout::unsalted(3);

    // Step 1 only, as a gateway that died right after it would leave it.
    let id = Uuid::now_v7();
    let shard_1 = shard_name(&sku, 1);
    let taken = transfer::take(&store, &shard_1, &id, 0, 2, 2, transfer::Source::Stock)
        .await
        .unwrap();
    assert_eq!(taken, Taken::Units(2, String::new()));
    // A resend of step 1 takes nothing more.
    let again = transfer::take(&store, &shard_1, &id, 0, 2, 2, transfer::Source::Stock)
        .await
        .unwrap();
    assert_eq!(again, Taken::Units(2, String::new()));
    let v = app.view(&sku).await;
    assert_eq!(shard_remaining(&v), vec![3, 1, 3]);
    assert_eq!(
        (v["remaining"].as_i64(), v["in_transit"].as_i64()),
        (Some(7), Some(2))
    );
    assert_eq!(v["consistent"], true, "units in transit are counted: {v}");
    assert_eq!(v["shards"][1]["transfer_out"], 2);

    // The gateway's own recovery task finishes it (after its few seconds' grace).
    wait_for(Duration::from_secs(20), || async {
        transfer::pending(&store, sku_id(&sku), layout, 1)
            .await
            .unwrap()
            .is_empty()
    })
    .await;
    let v = app.view(&sku).await;
    assert_eq!(shard_remaining(&v), vec![5, 1, 3]);
    assert_eq!(
        (v["remaining"].as_i64(), v["in_transit"].as_i64()),
        (Some(9), Some(0))
    );
    assert_eq!(v["shards"][1]["transfer_out"], 0);
    assert_eq!(v["consistent"], true);

    // Step 1 only, then two gateways' recovery rounds and a borrowing claim's completion all
    // finishing it at once: its units land once.
    let id = Uuid::now_v7();
    transfer::take(
        &store,
        &shard_name(&sku, 2),
        &id,
        1,
        1,
        1,
        transfer::Source::Stock,
    )
    .await
    .unwrap();
    let p = transfer::pending(&store, sku_id(&sku), layout, 2)
        .await
        .unwrap()
        .remove(0);
    let recovery = |store: Store| Recovery {
        store,
        db: app.db.clone(),
    };
    let (first, second) = (recovery(store.clone()), recovery(store.clone()));
    let (a, b, c) = tokio::join!(
        first.round(Duration::ZERO),
        second.round(Duration::ZERO),
        transfer::complete(&store, sku_id(&sku), layout, &p)
    );
    a.unwrap();
    b.unwrap();
    assert!(c.unwrap());
    assert!(
        transfer::complete(&store, sku_id(&sku), layout, &p)
            .await
            .unwrap(),
        "idempotent"
    );
    assert!(transfer::pending(&store, sku_id(&sku), layout, 2)
        .await
        .unwrap()
        .is_empty());
    let v = app.view(&sku).await;
    assert_eq!(shard_remaining(&v), vec![5, 2, 2]);
    assert_eq!(
        (v["remaining"].as_i64(), v["in_transit"].as_i64()),
        (Some(9), Some(0))
    );
    assert_eq!(v["consistent"], true);
    // Every unit still sells exactly once.
    let results = release_buyers(&app.api, &sku, users("xf", 60)).await;
    assert_eq!(won_ids(&results).len(), 9);
    let v = app.drained(&sku).await;
    assert_eq!(
        (v["recorded"].as_i64(), v["remaining"].as_i64()),
        (Some(9), Some(0))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restock_and_restore_of_a_sharded_sku_keep_the_books_and_reconcile_agrees() {
    let app = spawn_app().await;
    let sku = format!("sh-ops-{}", Uuid::new_v4().simple());
    let r = declare_sharded(
        &app.api,
        &sku,
        json!({"total": 9, "per_user_limit": 1, "shards": 3}),
    )
    .await;
    assert_eq!(r.status(), 201);
    // Four buyers, one of them routed to shard 1 for the loss below.
    let buyers = users("op", 40);
    let on_1: Vec<String> = buyers
        .iter()
        .filter(|u| shard_of_user(u, 3) == 1)
        .take(2)
        .cloned()
        .collect();
    let mut four: Vec<String> = buyers
        .iter()
        .filter(|u| shard_of_user(u, 3) != 1)
        .take(3)
        .cloned()
        .collect();
    four.push(on_1[0].clone());
    for u in &four {
        assert_eq!(
            app.claim(&sku, u, 1, Some(&format!("k-{u}")))
                .await
                .status(),
            201
        );
    }
    app.drained(&sku).await;

    // Restock goes to shard 0; a negative delta takes the other shards' units too, as far as
    // the SKU's whole stock goes, and never further.
    let before = shard_remaining(&app.view(&sku).await);
    let r = app.restock(&sku, 5).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["total"], 14);
    let after = shard_remaining(&v);
    assert_eq!(after[0], before[0] + 5);
    assert_eq!(after[1..], before[1..]);
    let left: i64 = after.iter().sum();
    let r = app.restock(&sku, -(left + 1)).await;
    assert_eq!(r.status(), 409);
    assert_eq!(code(&r.json().await.unwrap()), "insufficient_stock");
    assert_eq!(
        shard_remaining(&app.view(&sku).await).iter().sum::<i64>(),
        left
    );
    // More than shard 0 holds: the other shards' units are gathered to it first.
    let r = app.restock(&sku, -(after[0] + 2)).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        (v["total"].as_i64(), v["remaining"].as_i64()),
        (Some(14 - after[0] - 2), Some(left - after[0] - 2))
    );
    assert_eq!(shard_remaining(&v).iter().sum::<i64>(), left - after[0] - 2);
    let v = app.view(&sku).await;
    assert_eq!(
        (v["in_transit"].as_i64(), v["consistent"].as_bool()),
        (Some(0), Some(true)),
        "{v}"
    );
    // Back up to a total of 12 (8 remaining) for what follows.
    let r = app.restock(&sku, after[0]).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        (v["total"].as_i64(), v["remaining"].as_i64()),
        (Some(12), Some(8))
    );

    // Redis loses shard 1: the SKU fails closed for its buyers, restore rebuilds every shard.
    let mut con = app.probe.redis.clone();
    let lost: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}:{{{sku}#1}}:*", app.probe.prefix))
        .query_async(&mut con)
        .await
        .unwrap();
    let _: i64 = redis::cmd("DEL")
        .arg(&lost)
        .query_async(&mut con)
        .await
        .unwrap();
    let r = app.claim(&sku, &on_1[1], 1, None).await;
    assert_eq!(r.status(), 503, "a lost shard fails closed");
    assert_eq!(app.restore(&sku, false).await.status(), 200);
    let v = app.view(&sku).await;
    assert_eq!(
        shard_remaining(&v),
        vec![8, 0, 0],
        "the remaining stock all on shard 0"
    );
    assert_eq!(
        (v["recorded"].as_i64(), v["consistent"].as_bool()),
        (Some(4), Some(true))
    );
    // Each winner's count and idempotency record are back in its own shard.
    for u in &four {
        let name = shard_name(&sku, shard_of_user(u, 3));
        assert_eq!(app.held(&name, u).await, 1, "{u}");
        let r = app.claim(&sku, u, 1, Some(&format!("k-{u}"))).await;
        assert_eq!(r.status(), 201, "a replay after restore");
        assert_eq!(r.headers()["idempotency-replayed"], "true");
        assert_eq!(app.claim(&sku, u, 1, None).await.status(), 409);
    }
    // Shard 1's buyer borrows from shard 0 now.
    assert_eq!(app.claim(&sku, &on_1[1], 1, None).await.status(), 201);
    let v = app.drained(&sku).await;
    assert_eq!(
        (v["recorded"].as_i64(), v["remaining"].as_i64()),
        (Some(5), Some(7))
    );
    assert_eq!(v["consistent"], true, "{v}");
    let table = reconcile(REDIS_URL, &app.probe.database_url, &app.probe.prefix);
    assert!(table.contains(&sku), "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_drop_sells_exactly_its_units_on_a_cluster_of_three_masters() {
    let _heavy = heavy().await;
    let cluster = PrivateCluster::start(3, 0).await;
    let iso = Isolation::new();
    let mut gateways = vec![GatewayProcess::start(&iso, &cluster.urls(), &[]).await];
    gateways.push(GatewayProcess::start(&iso, &cluster.urls(), &[]).await);
    let apis: Vec<Api> = gateways.iter().map(|g| Api::new(g.base.clone())).collect();
    let probe = ClusterProbe::new(&cluster, &iso.prefix).await;
    // A SKU whose three shards' plain names already live on three different masters: placement
    // leaves them as they are (the SKU below this one is the case it moves).
    let mut sku = String::new();
    for n in 0..1000 {
        let candidate = format!("sh-cl-{n}");
        let mut masters = HashSet::new();
        for shard in 0..3 {
            let name = shard_name(&candidate, shard);
            masters.insert(cluster.master_of(&sku_key(&name)).await);
        }
        if masters.len() == 3 {
            sku = candidate;
            break;
        }
    }
    assert!(!sku.is_empty());
    let r = declare_sharded(&apis[0], &sku, json!({"total": 10, "shards": 3})).await;
    assert_eq!(r.status(), 201);
    let names = shard_names(&apis[1].view(&sku).await);
    assert_eq!(
        names,
        (0..3).map(|i| shard_name(&sku, i)).collect::<Vec<_>>()
    );

    // None routed to shard 2: its units reach buyers only through transfers across masters.
    let buyers: Vec<String> = users("cl", 1600)
        .into_iter()
        .filter(|u| shard_of_user(u, 3) != 2)
        .take(1000)
        .collect();
    let (results, by_status) = drop_through(&apis, &sku, buyers).await;
    assert_eq!(won_ids(&results).len(), 10, "{by_status:?}");
    assert_eq!(
        by_status.get(&(409, "sold_out".into())),
        Some(&990),
        "{by_status:?}"
    );
    let v = apis[1].drained(&sku).await;
    assert_eq!(
        (v["recorded"].as_i64(), v["remaining"].as_i64()),
        (Some(10), Some(0))
    );
    assert_eq!(v["consistent"], true, "{v}");
    for name in &names {
        assert_eq!(probe.stock(name).await, Some(0), "{name}");
    }
    // Counted before shard 1 is lost below: the records of transfers it received go with it.
    let mut applied = 0;
    for port in cluster.masters().await {
        let keys: Vec<String> = crate::cluster_support::node_cmd(
            port,
            redis::cmd("KEYS").arg(format!("{}:{{{sku}*}}:xfer:in:*", iso.prefix)),
        )
        .await
        .unwrap();
        applied += keys.len();
    }
    assert!(applied > 0, "shard 2's units were borrowed");
    // Redis loses shard 1 (every key of its slot on its master): restore rebuilds every
    // shard, each buyer's count on the buyer's shard's own master.
    let lost = names[1].clone();
    let master = cluster.master_of(&sku_key(&lost)).await;
    let slot = cluster.slot_of(&sku_key(&lost)).await;
    let mut con = cluster.connection().await;
    for key in PrivateCluster::keys_in_slot(master, slot, 10_000).await {
        let _: i64 = redis::cmd("DEL")
            .arg(&key)
            .query_async(&mut con)
            .await
            .unwrap();
    }
    assert_eq!(probe.stock(&lost).await, None);
    assert_eq!(apis[0].restore(&sku, false).await.status(), 200);
    let v = apis[1].view(&sku).await;
    assert_eq!(
        (v["recorded"].as_i64(), v["remaining"].as_i64()),
        (Some(10), Some(0))
    );
    assert_eq!(v["consistent"], true, "{v}");
    let winners: Vec<String> = sqlx::query_scalar("SELECT user_id FROM issuances WHERE sku = $1")
        .bind(&sku)
        .fetch_all(&PgPool::connect(&iso.database_url).await.unwrap())
        .await
        .unwrap();
    for w in &winners {
        let home = &names[usize::from(shard_of_user(w, 3))];
        assert_eq!(probe.held(home, w).await, 1, "{w} on {home}");
    }
    let db_url = iso.database_url.clone();
    let table = reconcile(&cluster.urls(), &db_url, &iso.prefix);
    assert!(table.contains(&sku), "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_sku_known_sold_out_sells_again_when_units_come_back_on_any_shard() {
    let app = spawn_app().await;
    let sku = format!("sh-back-{}", Uuid::new_v4().simple());
    let r = declare_sharded(&app.api, &sku, json!({"total": 3, "shards": 3})).await;
    assert_eq!(r.status(), 201);
    let buyers = users("bk", 40);
    let results = release_buyers(&app.api, &sku, buyers.clone()).await;
    assert_eq!(won_ids(&results).len(), 3);
    // Known sold out only once every shard is dry: later buyers are refused from memory, on
    // whichever shard they are routed to.
    let late: Vec<String> = users("bk-late", 12);
    for u in &late {
        let r = app.claim(&sku, u, 1, None).await;
        assert_eq!(r.status(), 409);
        assert_eq!(code(&r.json().await.unwrap()), "sold_out");
    }
    // One unit comes back, on shard 0 (a restock goes there): a buyer of another shard
    // borrows it at once.
    assert_eq!(app.restock(&sku, 1).await.status(), 200);
    let far = users("bk-far", 40)
        .into_iter()
        .find(|u| shard_of_user(u, 3) == 2)
        .unwrap();
    // Within the fast path's staleness bound (100 ms) at the latest; the notification makes
    // it sooner.
    let won = std::sync::atomic::AtomicBool::new(false);
    wait_for(Duration::from_secs(5), || async {
        if app.claim(&sku, &far, 1, None).await.status() == 201 {
            won.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        won.load(std::sync::atomic::Ordering::Relaxed)
    })
    .await;
    let v = app.drained(&sku).await;
    assert_eq!(
        (v["recorded"].as_i64(), v["remaining"].as_i64()),
        (Some(4), Some(0))
    );
    assert_eq!(v["consistent"], true);
}

/// The view once every shard's journal is written (with holds, `in_flight` nets winners
/// against units given back, so it alone cannot tell).
pub(crate) async fn settled_shards(app: &TestApp, sku: &str, shards: u16) -> Value {
    for shard in 0..shards {
        let journal = format!(
            "{}:{{{}}}:journal",
            app.probe.prefix,
            shard_name(sku, shard)
        );
        wait_for(Duration::from_secs(30), || async {
            let mut con = app.probe.redis.clone();
            let len: i64 = redis::cmd("XLEN")
                .arg(&journal)
                .query_async(&mut con)
                .await
                .unwrap();
            len == 0
        })
        .await;
    }
    app.drained(sku).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_on_a_sharded_sku_live_in_their_buyers_shard() {
    let app = spawn_app().await;
    let sku = format!("sh-hold-{}", Uuid::new_v4().simple());
    let r = declare_sharded(
        &app.api,
        &sku,
        json!({"total": 6, "shards": 3, "hold_seconds": 600}),
    )
    .await;
    assert_eq!(r.status(), 201);
    // One buyer per shard.
    let pool = users("hd", 60);
    let buyers: Vec<String> = (0..3u16)
        .map(|i| {
            pool.iter()
                .find(|u| shard_of_user(u, 3) == i)
                .unwrap()
                .clone()
        })
        .collect();
    let mut ids = Vec::new();
    for u in &buyers {
        let r = app.claim(&sku, u, 1, None).await;
        assert_eq!(r.status(), 201);
        let b: Value = r.json().await.unwrap();
        assert_eq!(b["status"], "held");
        assert!(b["expires_at"].is_string(), "{b}");
        ids.push(claim_id(&b));
    }
    // The owner confirms (routed to its shard by its user id); the admin cancels (found by
    // trying each shard); another buyer finds nothing.
    let path = |id: &str, op: &str| format!("/v1/claims/{id}/{op}");
    let (s, b) = post_as(&app.api, &path(&ids[0], "confirm"), &token(&buyers[0])).await;
    assert_eq!((s, b["status"].as_str()), (200, Some("confirmed")));
    let (s, b) = post_as(&app.api, &path(&ids[1], "cancel"), ADMIN).await;
    assert_eq!((s, b["status"].as_str()), (200, Some("cancelled")));
    let (s, _) = post_as(&app.api, &path(&ids[2], "cancel"), &token(&buyers[0])).await;
    assert_eq!(s, 404);
    let (s, b) = get_as(
        &app.api,
        &format!("/v1/claims/{}", ids[2]),
        &token(&buyers[2]),
    )
    .await;
    assert_eq!((s, b["status"].as_str()), (200, Some("held")));
    // The cancelled unit came back to its own shard, and its buyer's count with it.
    let v = settled_shards(&app, &sku, 3).await;
    assert_eq!(shard_remaining(&v), vec![1, 2, 1]);
    let home = shard_name(&sku, 1);
    assert_eq!(app.held(&home, &buyers[1]).await, 0);
    assert_eq!(
        (
            v["recorded"].as_i64(),
            v["held"].as_i64(),
            v["confirmed"].as_i64()
        ),
        (Some(2), Some(1), Some(1))
    );
    assert_eq!(v["consistent"], true, "{v}");
    let statuses = ledger_statuses(&app.probe, &sku).await;
    assert_eq!(statuses[&ids[1].parse().unwrap()], "cancelled");

    // A short hold expires on its shard (the expiry worker serves every shard).
    let short = format!("sh-short-{}", Uuid::new_v4().simple());
    let r = declare_sharded(
        &app.api,
        &short,
        json!({"total": 3, "shards": 3, "hold_seconds": 1}),
    )
    .await;
    assert_eq!(r.status(), 201);
    let far = buyers[2].clone();
    let r = app.claim(&short, &far, 1, None).await;
    assert_eq!(r.status(), 201);
    let id = claim_id(&r.json::<Value>().await.unwrap());
    wait_for(Duration::from_secs(10), || async {
        get_as(&app.api, &format!("/v1/claims/{id}"), &token(&far))
            .await
            .1["status"]
            == "expired"
    })
    .await;
    let v = settled_shards(&app, &short, 3).await;
    assert_eq!(shard_remaining(&v), vec![1, 1, 1]);
    assert_eq!(
        (v["recorded"].as_i64(), v["consistent"].as_bool()),
        (Some(0), Some(true))
    );
}
