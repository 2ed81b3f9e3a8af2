//! Placement of a sharded SKU's shards on a Redis Cluster (src/shards/placement.rs): a SKU
//! whose plain shard names would crowd one master is declared with salts that put each shard
//! on a master of its own, every gateway names the shards from the catalog row, and a drop on
//! it sells exactly its units.

use std::collections::HashSet;

use dropgate::shards::shard_of_user;
use serde_json::{json, Value};
use sqlx::PgPool;
use uuid::Uuid;

use crate::cluster_support::{node_cmd, sku_key, ClusterProbe, PrivateCluster};
use crate::helpers::*;
use crate::services::GatewayProcess;
use crate::shards::{drop_through, reconcile, shard_name, shard_names};

const SHARDS: u16 = 3;

/// The first `<stem>-<n>` whose plain shard names (no salt) put two or more of its shards on
/// one master of `cluster`: the SKUs left to the luck of CRC16 that placement exists for.
async fn crowded_sku(cluster: &PrivateCluster, stem: &str) -> String {
    for n in 0..1000 {
        let candidate = format!("{stem}-{n}");
        let mut masters = HashSet::new();
        for shard in 0..SHARDS {
            masters.insert(
                cluster
                    .master_of(&sku_key(&shard_name(&candidate, shard)))
                    .await,
            );
        }
        if masters.len() < usize::from(SHARDS) {
            return candidate;
        }
    }
    panic!("no SKU name crowds its shards");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_that_would_crowd_one_master_are_placed_on_three_and_sell_exactly() {
    let _heavy = heavy().await;
    let cluster = PrivateCluster::start(3, 1).await;
    let iso = Isolation::new();
    let gateways = [
        GatewayProcess::start(&iso, &cluster.urls(), &[]).await,
        GatewayProcess::start(&iso, &cluster.urls(), &[]).await,
    ];
    let apis: Vec<Api> = gateways.iter().map(|g| Api::new(g.base.clone())).collect();
    let probe = ClusterProbe::new(&cluster, &iso.prefix).await;
    let db = PgPool::connect(&iso.database_url).await.unwrap();
    let sku = crowded_sku(&cluster, "sh-place").await;

    // Arrange: declared on one gateway; the other re-declares it with the same terms.
    let body = json!({"total": 10, "per_user_limit": 1, "shards": SHARDS});
    let r = apis[0]
        .http
        .put(format!("{}/admin/skus/{sku}", apis[0].base))
        .bearer_auth(ADMIN)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let first = shard_names(&r.json::<Value>().await.unwrap());
    let r = apis[1]
        .http
        .put(format!("{}/admin/skus/{sku}", apis[1].base))
        .bearer_auth(ADMIN)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // Every gateway names the shards from the catalog row, and a re-declare renames none.
    let view = apis[1].view(&sku).await;
    let names = shard_names(&view);
    assert_eq!(names, first);
    assert_eq!(names[0], sku, "shard 0 is the SKU itself");
    let plain: Vec<String> = (0..SHARDS).map(|i| shard_name(&sku, i)).collect();
    assert_ne!(names, plain, "some shard carries a placement salt");
    let salts: Vec<i32> = sqlx::query_scalar("SELECT shard_salts FROM skus WHERE sku = $1")
        .bind(&sku)
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(salts.len(), usize::from(SHARDS));

    // The three shards' keys are on three masters, in the slots the view shows.
    let mut masters = HashSet::new();
    for (i, name) in names.iter().enumerate() {
        let state = probe.key(name, "state");
        let master = cluster.master_of(&state).await;
        let on_master: i64 = node_cmd(master, redis::cmd("EXISTS").arg(&state))
            .await
            .unwrap();
        assert_eq!(on_master, 1, "{state} lives on {master}");
        assert_eq!(
            view["shards"][i]["slot"].as_u64(),
            Some(u64::from(cluster.slot_of(&state).await)),
            "{view}"
        );
        masters.insert(master);
    }
    assert_eq!(
        masters.len(),
        usize::from(SHARDS),
        "{names:?} on {masters:?}"
    );

    // Act: a drop through both gateways, buyers routed to every shard.
    let (results, by_status) = drop_through(&apis, &sku, users("pl", 400)).await;

    // Assert: exactly the declared units sell, every other buyer is told sold out, and every
    // winner is in `issuances`, counted on its own shard's master.
    let won = won_ids(&results);
    assert_eq!(won.len(), 10, "{by_status:?}");
    assert_eq!(
        by_status.get(&(409, "sold_out".into())),
        Some(&390),
        "{by_status:?}"
    );
    let v = apis[0].drained(&sku).await;
    assert_eq!(
        (v["recorded"].as_i64(), v["remaining"].as_i64()),
        (Some(10), Some(0))
    );
    assert_eq!(v["consistent"], true, "{v}");
    let rows: Vec<(Uuid, String)> =
        sqlx::query_as("SELECT claim_id, user_id FROM issuances WHERE sku = $1")
            .bind(&sku)
            .fetch_all(&db)
            .await
            .unwrap();
    let recorded: HashSet<Uuid> = rows.iter().map(|(id, _)| *id).collect();
    assert_eq!(recorded, won.iter().copied().collect::<HashSet<_>>());
    for (_, w) in &rows {
        let home = &names[usize::from(shard_of_user(w, i32::from(SHARDS)))];
        assert_eq!(probe.held(home, w).await, 1, "{w} on {home}");
    }
    for name in &names {
        assert_eq!(probe.stock(name).await, Some(0), "{name}");
    }
    let table = reconcile(&cluster.urls(), &iso.database_url, &iso.prefix);
    assert!(table.contains(&sku), "{table}");
}
