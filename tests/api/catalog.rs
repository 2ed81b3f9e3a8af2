//! The in-process catalog cache.

use std::time::Duration;

use dropgate::catalog::{Catalog, MAX_NEGATIVE_ENTRIES};

use crate::helpers::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_cached_sku_is_refreshed_without_blocking_readers() {
    let app = spawn_app().await;
    app.declare("stale", 5, 1).await;
    let catalog = Catalog::with_refresh_after(app.db.clone(), Duration::from_millis(1));
    assert!(catalog.get(sku_id("stale")).await.unwrap().is_some());
    sqlx::query("UPDATE skus SET per_user_limit = 3 WHERE sku = 'stale'")
        .execute(&app.db)
        .await
        .unwrap();
    // Every read now finds a stale entry; none may hang, and the refresh lands. The reads run
    // on a thread of their own, so a deadlock there fails this test instead of hanging it.
    let (done, finished) = std::sync::mpsc::channel();
    let runtime = tokio::runtime::Handle::current();
    std::thread::spawn(move || {
        runtime.block_on(async {
            loop {
                tokio::time::sleep(Duration::from_millis(5)).await;
                let sku = catalog.get(sku_id("stale")).await.unwrap().unwrap();
                if sku.per_user_limit == 3 {
                    break;
                }
            }
        });
        let _ = done.send(());
    });
    tokio::task::block_in_place(|| finished.recv_timeout(Duration::from_secs(10)))
        .expect("a stale entry must not block its reader");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_unknown_sku_ids_cannot_grow_the_negative_cache_without_bound() {
    let app = spawn_app().await;
    let catalog = Catalog::new(app.db.clone());
    // Remembering is what a lookup does with PostgreSQL's "no such row"; 150k distinct ids
    // stand for a flood of random ones without 150k queries.
    for i in 0..150_000 {
        catalog.remember(sku_id(&format!("ghost-{i}")), None);
    }
    assert!(
        catalog.cached_entries() <= MAX_NEGATIVE_ENTRIES,
        "{} negative entries cached",
        catalog.cached_entries()
    );
    assert_eq!(catalog.cached_unknown(), catalog.cached_entries());
    // A full cache makes room by sweeping the entries that have expired (after 1 s).
    wait_for(Duration::from_secs(5), || async {
        catalog.remember(sku_id("late-ghost"), None);
        catalog.cached_unknown() < MAX_NEGATIVE_ENTRIES
    })
    .await;
    // A real SKU is still cached whatever the negative side holds.
    app.declare("real", 1, 1).await;
    assert!(catalog.get(sku_id("real")).await.unwrap().is_some());
    assert!(catalog.get(sku_id("ghost-149999")).await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_unknown_skus_does_not_hold_up_a_drop_or_its_ledger() {
    let app = spawn_app().await;
    app.declare("drop", 100, 1).await;
    let flood = {
        let api = app.api.clone();
        tokio::spawn(async move {
            all_at_once(2000, |i| {
                let api = api.clone();
                async move {
                    let r = api
                        .http
                        .post(format!("{}/v1/skus/ghost-{i}/claims", api.base))
                        .bearer_auth(token(&format!("g-{i}")))
                        .send()
                        .await;
                    match r {
                        Ok(r) => {
                            let s = r.status().as_u16();
                            (s, r.json::<serde_json::Value>().await.unwrap_or_default())
                        }
                        Err(_) => (0, serde_json::Value::Null),
                    }
                }
            })
            .await
        })
    };
    let results = release_buyers(&app.api, "drop", users("buyer", 300)).await;
    let won = won_ids(&results);
    assert_eq!(won.len(), 100);
    assert!(results
        .iter()
        .all(|(s, b)| *s == 201 || (*s == 409 && code(b) == "sold_out")));
    let v = app.drained("drop").await;
    assert_eq!(v["recorded"], 100);
    assert_eq!(v["consistent"], true);
    assert_eq!(app.issued_ids("drop").await, won);
    for (status, body) in flood.await.unwrap() {
        // Unknown (404), or shed while too many lookups queue (429); never anything else.
        assert!(
            (status == 404 && code(&body) == "unknown_sku")
                || (status == 429 && code(&body) == "overloaded"),
            "{status} {body}"
        );
    }
}
