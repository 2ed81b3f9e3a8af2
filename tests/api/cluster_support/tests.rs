//! The harness's own tests.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_cluster_serves_every_slot_and_moves_a_slot_with_its_keys() {
    let _heavy = crate::helpers::heavy().await;
    let cluster = PrivateCluster::start(3, 1).await;
    assert_eq!(cluster.urls().split(',').count(), 6);
    let mut con = cluster.connection().await;
    let probe = ClusterProbe::new(&cluster, "h").await;

    // A SKU's state on every master, written through the cluster connection.
    let skus = skus_on_every_master(&cluster, "harness", 2).await;
    for sku in &skus {
        redis::pipe()
            .hset(probe.key(sku, "state"), "stock", sku.len())
            .hset(probe.key(sku, "users"), "u-1", 1)
            .query_async::<()>(&mut con)
            .await
            .unwrap();
    }
    assert_eq!(cluster.masters().await.len(), 3);

    // A SKU's slot with many keys, moved half, then the rest, while it stays readable.
    let hot = &sku_key(&skus[0]);
    for i in 0..250 {
        redis::cmd("SET")
            .arg(format!("{hot}:{i}"))
            .arg(i)
            .query_async::<()>(&mut con)
            .await
            .unwrap();
    }
    let from = cluster.master_of(hot).await;
    let to = cluster.other_master(hot).await;
    let mut m = cluster.begin_migration(hot, to).await;
    let total = m.keys_left().await;
    assert_eq!(total, 252, "250 keys and the SKU's two");
    assert_eq!(m.move_keys(120).await, 120);
    assert_eq!(
        m.keys_left().await,
        132,
        "the slot is split between two nodes"
    );
    assert_eq!(probe.stock(&skus[0]).await, Some(skus[0].len() as i64));
    // Split: a key still on the old owner and one already moved are both read (ASK followed).
    let left = PrivateCluster::keys_in_slot(from, m.slot, 1).await;
    let moved = PrivateCluster::keys_in_slot(to, m.slot, 1).await;
    for k in left.iter().chain(&moved) {
        let v: Option<i64> = redis::cmd("GET")
            .arg(k)
            .query_async(&mut con)
            .await
            .unwrap();
        assert!(
            v.is_some(),
            "{k} is readable while its slot is half-migrated"
        );
    }
    m.finish().await;
    assert_eq!(cluster.master_of(hot).await, to);
    assert!(
        PrivateCluster::keys_in_slot(from, cluster.slot_of(hot).await, 10)
            .await
            .is_empty()
    );
    for i in 0..250 {
        let v: i64 = redis::cmd("GET")
            .arg(format!("{hot}:{i}"))
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(v, i);
    }
    // The one-call migration moves a slot back, and the earlier keys are all where they were.
    cluster.migrate_slot_of(hot, from).await;
    assert_eq!(cluster.master_of(hot).await, from);
    let n: usize = node_cmd(
        from,
        redis::cmd("CLUSTER")
            .arg("COUNTKEYSINSLOT")
            .arg(cluster.slot_of(hot).await),
    )
    .await
    .unwrap();
    assert_eq!(n, total);
    for sku in &skus {
        assert_eq!(probe.stock(sku).await, Some(sku.len() as i64));
        assert_eq!(probe.held(sku, "u-1").await, 1);
        assert_eq!(probe.counts(sku).await.len(), 1);
    }
    cluster.wait_ready().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_is_replaced_by_its_replica() {
    let _heavy = crate::helpers::heavy().await;
    let mut cluster = PrivateCluster::start(3, 1).await;
    let key = "{victim}:state";
    let master = cluster.master_of(key).await;
    // Written on the master and acknowledged by its replica before the kill.
    let mut direct = connect(master).await.unwrap();
    redis::cmd("SET")
        .arg(key)
        .arg("kept")
        .query_async::<()>(&mut direct)
        .await
        .unwrap();
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(5000)
        .query_async(&mut direct)
        .await
        .unwrap();
    assert_eq!(acked, 1, "the replica acknowledged the write");

    let killed = cluster.kill_master_of(key).await;
    assert_eq!(killed, master);
    let promoted = cluster.wait_promoted(key).await;
    assert_ne!(promoted, master);
    assert_eq!(cluster.master_of(key).await, promoted);

    let v: String = node_cmd(promoted, redis::cmd("GET").arg(key))
        .await
        .unwrap();
    assert_eq!(v, "kept");
    // And through a cluster connection opened on every URL, the dead one included.
    let mut con = cluster.connection().await;
    let v: String = redis::cmd("GET")
        .arg(key)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(v, "kept");

    // The dead node comes back as the new master's replica, with the key.
    cluster.restart(killed).await;
    let view = cluster.view().await;
    let back = view.iter().find(|n| n.port == killed).unwrap();
    assert!(!back.is_master(), "{back:?}");
    assert_eq!(
        back.master.as_deref(),
        Some(cluster.id_of(promoted).await.as_str())
    );
    let mut replica = connect(killed).await.unwrap();
    redis::cmd("READONLY")
        .query_async::<()>(&mut replica)
        .await
        .unwrap();
    let v: String = redis::cmd("GET")
        .arg(key)
        .query_async(&mut replica)
        .await
        .unwrap();
    assert_eq!(v, "kept");
}
