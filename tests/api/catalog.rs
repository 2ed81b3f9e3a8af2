//! The in-process catalog cache.

use std::time::Duration;

use dropgate::catalog::Catalog;

use crate::helpers::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_cached_sku_is_refreshed_without_blocking_readers() {
    let app = spawn_app().await;
    app.declare("stale", 5, 1).await;
    let catalog = Catalog::with_refresh_after(app.db.clone(), Duration::from_millis(1));
    assert!(catalog.get("stale").await.unwrap().is_some());
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
                let sku = catalog.get("stale").await.unwrap().unwrap();
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
