//! The SKU view while an operator restores the SKU (issue 37.4): the restore takes the state
//! out of Redis and puts it back under the SKU's operator lock, and a view read meanwhile
//! waits for it (or says so with a 503), never answering `remaining: null` (which means Redis
//! lost the SKU) nor `consistent: false` for books that balance.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use serde_json::Value;

use crate::helpers::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_view_read_during_forced_restores_is_never_null_nor_false() {
    let app = spawn_app().await;
    app.declare("vr", 400, 1).await;
    let done = Arc::new(AtomicBool::new(false));
    let read = Arc::new(AtomicUsize::new(0));
    // Restores one after another (buyers claiming between some) until the reader has read
    // the view 300 times.
    let operator = {
        let (api, done, read) = (app.api.clone(), done.clone(), read.clone());
        tokio::spawn(async move {
            let mut round = 0;
            while read.load(Ordering::SeqCst) < 300 {
                if round % 4 == 0 && round < 160 {
                    release_buyers(&api, "vr", users(&format!("r{round}-"), 10)).await;
                }
                let r = api.restore("vr", true).await;
                assert_eq!(r.status(), 200, "{:?}", r.text().await);
                round += 1;
            }
            done.store(true, Ordering::SeqCst);
            round
        })
    };
    let (mut views, mut said_busy, mut wrong) = (0, 0, Vec::<Value>::new());
    while !done.load(Ordering::SeqCst) {
        let r = app
            .http
            .get(format!("{}/admin/skus/vr", app.base))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let v: Value = r.json().await.unwrap();
        views += 1;
        read.store(views, Ordering::SeqCst);
        match status {
            200 if v["remaining"].is_null() || v["consistent"] == false => wrong.push(v),
            200 => {}
            503 if code(&v) == "unavailable"
                && v["detail"].as_str().unwrap_or("").contains("restore") =>
            {
                said_busy += 1
            }
            // The writers acknowledged under every reading (docs/ledger-view.md): said so.
            503 if code(&v) == "unavailable"
                && v["detail"]
                    .as_str()
                    .unwrap_or("")
                    .contains("read the view again") => {}
            _ => panic!("{status} {v}"),
        }
    }
    let restores = operator.await.unwrap();
    println!("{views} views during {restores} restores, {said_busy} said a restore was under way");
    assert!(
        wrong.is_empty(),
        "{} of {views}: {:?}",
        wrong.len(),
        wrong.first()
    );
    let v = app.drained("vr").await;
    assert_eq!(v["consistent"], true, "{v}");
    assert_eq!(
        v["recorded"].as_i64().unwrap() + v["remaining"].as_i64().unwrap(),
        400
    );
}
