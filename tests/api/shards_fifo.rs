//! One first-come-first-served line across a sharded SKU's lines (src/shards/line.rs,
//! src/shards/feed.rs), under concurrency: joins at once take distinct places in the SKU's one
//! line, and units given back at once on every shard go to the earliest joiners of the whole
//! SKU, whichever shard each waits on, each unit once, whichever gateway feeds the lines.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::helpers::*;
use crate::shards::settled_shards;
use crate::shards_waitlist::{decide, declare, entry, hold, live_units, stocks};

/// Each waiter's entry as its owner reads it.
async fn entries(app: &TestApp, waiters: &[String], ids: &[String]) -> Vec<Value> {
    let mut out = Vec::with_capacity(ids.len());
    for (w, id) in waiters.iter().zip(ids) {
        out.push(entry(app, id, w).await);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn units_given_back_at_once_on_every_shard_go_to_the_earliest_joiners_of_the_whole_sku() {
    // Two gateways, so two gateways' feeds (a cancel's, a recovery round's) run at once.
    let iso = Isolation::new();
    let app = spawn_with_config(iso.raw_config(REDIS_URL)).await;
    let second = spawn_with_config(iso.raw_config(REDIS_URL)).await;
    let apis = [app.api.clone(), second.api.clone()];
    let sku = declare(&app, "swf", 24, 600).await;
    let holders = users("swf-h", 24);
    let mut holds = Vec::new();
    for h in &holders {
        holds.push(hold(&app, &sku, h).await);
    }
    assert_eq!(stocks(&app, &sku).await, vec![0, 0, 0]);

    // 36 buyers join at once, on every shard's line, through both gateways.
    let waiters = Arc::new(users("swf-w", 36));
    let joined = all_at_once(waiters.len(), |i| {
        let (api, waiters, sku) = (apis[i % 2].clone(), waiters.clone(), sku.clone());
        async move {
            let r = api
                .http
                .post(format!("{}/v1/skus/{sku}/waitlist", api.base))
                .bearer_auth(token(&waiters[i]))
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    })
    .await;
    assert!(joined.iter().all(|(s, _)| *s == 201), "{joined:?}");
    let ids: Vec<String> = joined
        .iter()
        .map(|(_, b)| b["entry_id"].as_str().unwrap().to_string())
        .collect();
    // Their places in the SKU's one line: each of 1..=36 once.
    let places: Vec<i64> = entries(&app, &waiters, &ids)
        .await
        .iter()
        .map(|e| e["position"].as_i64().unwrap())
        .collect();
    assert_eq!(
        places.iter().copied().collect::<BTreeSet<_>>(),
        (1..=36).collect::<BTreeSet<_>>()
    );

    // Every hold cancelled at once, on every shard, through both gateways.
    let holders = Arc::new(holders);
    let holds = Arc::new(holds);
    let cancels = all_at_once(holds.len(), |i| {
        let (api, holders, holds) = (apis[i % 2].clone(), holders.clone(), holds.clone());
        async move {
            let r = api
                .http
                .post(format!("{}/v1/claims/{}/cancel", api.base, holds[i]))
                .bearer_auth(token(&holders[i]))
                .send()
                .await
                .unwrap();
            r.status().as_u16()
        }
    })
    .await;
    assert!(cancels.iter().all(|s| *s == 200), "{cancels:?}");

    // The 24 units go to the 24 earliest places of the whole line, nobody else.
    wait_for(Duration::from_secs(30), || async {
        let now = entries(&app, &waiters, &ids).await;
        now.iter().filter(|e| e["status"] == "offered").count() == 24
    })
    .await;
    let now = entries(&app, &waiters, &ids).await;
    let offered: BTreeSet<usize> = (0..ids.len())
        .filter(|&i| now[i]["status"] == "offered")
        .collect();
    let earliest: BTreeSet<usize> = (0..ids.len()).filter(|&i| places[i] <= 24).collect();
    assert_eq!(offered, earliest, "places {places:?}");
    // The others keep their order, moved up by 24.
    for i in (0..ids.len()).filter(|i| !earliest.contains(i)) {
        assert_eq!(now[i]["position"].as_i64(), Some(places[i] - 24));
    }
    let outsider = users("swf-o", 3);
    for u in &outsider {
        let r = app.claim(&sku, u, 1, None).await;
        assert_eq!(r.status(), 409, "nobody outside the line buys");
    }
    // Every offer confirmed by its buyer: 24 units, each sold once.
    for &i in &offered {
        let (s, _) = decide(&app, &ids[i], "confirm", &waiters[i]).await;
        assert_eq!(s, 200);
    }
    let v = settled_shards(&app, &sku, 3).await;
    assert_eq!(stocks(&app, &sku).await, vec![0, 0, 0]);
    assert_eq!(live_units(&app, &sku).await, 24);
    assert_eq!(
        (
            v["confirmed"].as_i64(),
            v["waiting"].as_i64(),
            v["consistent"].as_bool()
        ),
        (Some(24), Some(12), Some(true)),
        "{v}"
    );
}
