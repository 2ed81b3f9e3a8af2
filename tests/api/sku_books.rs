//! The ledger's per-SKU sums (`sku_books`, migration 0019): kept by triggers in the
//! transaction of every `issuances` change, checked by `reconcile` against a full recount, and
//! what makes the SKU view's ledger side one row whatever the SKU's history (issue 37).

use std::time::Duration;

use crate::cli::dropgate;
use crate::helpers::*;

/// SKUs whose kept sums differ from a recount.
async fn drift(db: &sqlx::PgPool) -> Vec<String> {
    sqlx::query_scalar("SELECT sku FROM sku_books_drift")
        .fetch_all(db)
        .await
        .unwrap()
}

/// `count` ended claims of `sku` in one statement (the rows of a long-running drop).
async fn ended_history(db: &sqlx::PgPool, sku: &str, count: i64) {
    sqlx::query(
        "INSERT INTO issuances (claim_id, sku, user_id, quantity, status, created_at, seq)
         SELECT gen_random_uuid(), $1, 'old-' || g, 1,
                CASE WHEN g % 2 = 0 THEN 'expired' ELSE 'cancelled' END, now(), NULL
           FROM generate_series(1, $2) g",
    )
    .bind(sku)
    .bind(count)
    .execute(db)
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kept_sums_follow_every_ledger_change_and_reconcile_flags_one_bypassed() {
    let app = spawn_app().await;
    app.declare("bk", 20, 1).await;
    ended_history(&app.db, "bk", 1_000).await;
    let results = release_buyers(&app.api, "bk", users("b", 30)).await;
    assert_eq!(won_ids(&results).len(), 20);
    app.drained("bk").await;
    let kept: (i64, i64) =
        sqlx::query_as("SELECT recorded, held FROM sku_books_kept WHERE sku = 'bk'")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(
        kept,
        (20, 0),
        "20 live units, the 1,000 ended rows in no sum"
    );
    // Changes by hand go through the triggers too.
    sqlx::query("UPDATE issuances SET status = 'held' WHERE sku = 'bk' AND status = 'issued'")
        .execute(&app.db)
        .await
        .unwrap();
    sqlx::query("DELETE FROM issuances WHERE sku = 'bk' AND status = 'cancelled'")
        .execute(&app.db)
        .await
        .unwrap();
    assert!(drift(&app.db).await.is_empty());

    let run = || {
        dropgate()
            .arg("reconcile")
            .env("DATABASE_URL", &app.probe.database_url)
            .env("DROPGATE_KEY_PREFIX", &app.probe.prefix)
            .output()
            .unwrap()
    };
    // A writer that bypassed the trigger (here: the sums changed alone).
    sqlx::query("UPDATE sku_books SET recorded = recorded + 1 WHERE sku = 'bk'")
        .execute(&app.db)
        .await
        .unwrap();
    assert_eq!(drift(&app.db).await, vec!["bk".to_string()]);
    let out = run();
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{table}");
    assert!(table.contains("bk: sku_books differs"), "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sku_with_a_long_history_reads_balanced_while_buyers_claim() {
    let _heavy = heavy().await;
    let app = spawn_app().await;
    app.declare("hist", 400, 1).await;
    ended_history(&app.db, "hist", 100_000).await;
    sqlx::query("ANALYZE issuances")
        .execute(&app.db)
        .await
        .unwrap();
    // `LONG_HISTORY_VIEWS` views at least (2,000 by default; the check is 10,000),
    // buyers claiming and the operator restocking throughout.
    let want: usize = std::env::var("LONG_HISTORY_VIEWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let buyers = {
        let (api, done) = (app.api.clone(), done.clone());
        tokio::spawn(async move {
            let mut round = 0;
            while round < 8 || !done.load(std::sync::atomic::Ordering::Relaxed) {
                release_buyers(&api, "hist", users(&format!("h{round}-"), 80)).await;
                if round >= 4 {
                    // Units back, so the buyers keep moving Redis until the views are done.
                    api.restock("hist", 80).await;
                }
                round += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let (mut views, mut unbalanced) = (0, Vec::new());
    while views < want {
        let v = app.view("hist").await;
        views += 1;
        if v["consistent"] == false {
            unbalanced.push(v);
        }
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    buyers.await.unwrap();
    assert!(
        unbalanced.is_empty(),
        "{} of {views}: {:?}",
        unbalanced.len(),
        unbalanced.first()
    );
    let v = app.drained("hist").await;
    assert_eq!(
        v["recorded"].as_i64().unwrap() + v["remaining"].as_i64().unwrap(),
        v["total"].as_i64().unwrap()
    );
    assert!(drift(&app.db).await.is_empty());
}
