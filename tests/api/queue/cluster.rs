//! The waiting room on a real Redis Cluster (tests/api/cluster_support/): queued SKUs whose
//! slots sit on different masters, two gateways sharing the admission leases, visitors
//! joining through both. The queue lives in its SKU's slot (every key carries the `{sku}` tag),
//! so each join, read and round is one script on one master.

use std::collections::HashSet;

use serde_json::json;

use super::*;
use crate::cluster_support::{sku_key, skus_on_every_master, ClusterProbe, PrivateCluster};
use crate::helpers::{code, Isolation};
use crate::services::GatewayProcess;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_skus_on_a_cluster_admit_once_sell_only_to_the_admitted_and_tell_the_line() {
    let _heavy = crate::helpers::heavy().await;
    let cluster = PrivateCluster::start(3, 1).await;
    let iso = Isolation::new();
    let env = [("DROPGATE_REDIS_WAIT_MS", "1000")];
    let g1 = GatewayProcess::start(&iso, &cluster.urls(), &env).await;
    let g2 = GatewayProcess::start(&iso, &cluster.urls(), &env).await;
    let apis = [Api::new(g1.base.clone()), Api::new(g2.base.clone())];
    let probe = ClusterProbe::new(&cluster, &iso.prefix).await;
    // One queued SKU on each of two masters.
    let skus: Vec<String> = skus_on_every_master(&cluster, "cq", 1).await;
    let skus = &skus[..2];
    assert_ne!(
        cluster.master_of(&sku_key(&skus[0])).await,
        cluster.master_of(&sku_key(&skus[1])).await
    );
    let (units, visitors) = (6, 30);
    for sku in skus {
        let r = declare_queued(
            &apis[0],
            sku,
            units,
            // Every visitor may be admitted before the sold out, even with one unit left
            // (100 × 1 ≥ 30): the visitors below poll (and buy) one after another in their
            // own order, not the line's, so under a tighter overbook bound the admitted ahead
            // of one of them, who never buy until their turn, would hold the line.
            json!({"admit_per_second": 2, "overbook": 100}),
            json!({}),
        )
        .await;
        assert_eq!(r.status(), 201, "{sku}");
    }
    for sku in skus {
        // Half the visitors join through each gateway; joining again finds the same ticket.
        let a = join_many(&apis[0], sku, &format!("{sku}-v"), visitors, 15).await;
        let b = join_many(&apis[1], sku, &format!("{sku}-v"), visitors, 15).await;
        assert_eq!(a, b, "{sku}: one ticket per visitor, whichever gateway");
        // Each visitor polls until admitted or sold out, and buys once admitted.
        let mut won = HashSet::new();
        let mut admitted_users = HashSet::new();
        for (i, id) in a.iter().enumerate() {
            let user = format!("{sku}-v-{i}");
            let api = &apis[i % 2];
            let t = until(LONG, || {
                let (api, id, v) = (api.clone(), id.clone(), visitor(&user));
                async move {
                    let (s, t) = ticket(&api, &id, &v).await;
                    (s == 200 && matches!(t["state"].as_str(), Some("admitted" | "sold_out")))
                        .then_some(t)
                }
            })
            .await;
            if t["state"] == "admitted" {
                admitted_users.insert(user.clone());
                let (s, b) = claim_with(api, sku, t["admission_token"].as_str().unwrap()).await;
                match (s, code(&b)) {
                    (201, _) => assert!(won.insert(user.clone())),
                    (409, "sold_out") => {}
                    other => panic!("{sku}: {user}'s admitted claim: {other:?} {b}"),
                }
            }
        }
        assert_eq!(won.len() as i64, units, "{sku}: every unit sold, once");
        assert_eq!(probe.stock(sku).await, Some(0), "{sku}");
        // A token the queue did not mint buys nothing, on either gateway.
        for api in &apis {
            let (s, b) = claim_with(api, sku, &crate::helpers::token_for("outsider", sku)).await;
            assert_eq!((s, code(&b)), (403, "not_admitted"), "{b}");
        }
        // Sold out reached the whole line: every ticket not admitted reads sold_out.
        for (i, id) in a.iter().enumerate() {
            let user = format!("{sku}-v-{i}");
            let (_, t) = ticket(&apis[(i + 1) % 2], id, &visitor(&user)).await;
            let want = if admitted_users.contains(&user) {
                "admitted"
            } else {
                "sold_out"
            };
            assert_eq!(t["state"], want, "{sku}: {user}: {t}");
        }
        // Admitted once each, in the SKU's slot: the admitted set, the counter and the line.
        let key = |s: &str| probe.key(sku, s);
        let mut con = probe.redis.clone();
        let (in_line, admitted, counted): (i64, i64, i64) = redis::pipe()
            .zcard(key("q:line"))
            .zcard(key("q:admitted"))
            .hget(key("q"), "admitted_total")
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(admitted, counted, "{sku}: one admission per ticket");
        assert_eq!(admitted as usize, admitted_users.len(), "{sku}");
        assert_eq!(in_line + admitted, visitors as i64, "{sku}");
        let slot = cluster.slot_of(&key("state")).await;
        for k in ["q", "q:line", "q:admitted"] {
            assert_eq!(
                cluster.slot_of(&key(k)).await,
                slot,
                "{k} in the SKU's slot"
            );
        }
        // The ledger: the units went to admitted visitors only.
        let v = apis[0].drained(sku).await;
        assert_eq!(v["recorded"], units, "{v}");
    }
}
