//! The live drop page: its stream is the admin's alone and sends a frame a second; the page
//! renders a running drop's numbers in headless Chromium with the token typed into it.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::helpers::{release_buyers, spawn_app, token, users, TestApp, ADMIN};

async fn next_line(resp: &mut reqwest::Response, buf: &mut Vec<u8>) -> Value {
    loop {
        if let Some(nl) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=nl).collect();
            return serde_json::from_slice(&line).unwrap();
        }
        let chunk = tokio::time::timeout(Duration::from_secs(5), resp.chunk())
            .await
            .expect("a frame within 5 s")
            .unwrap()
            .expect("the stream goes on");
        buf.extend_from_slice(&chunk);
    }
}

fn stream(app: &TestApp, bearer: Option<&str>) -> reqwest::RequestBuilder {
    let req = app.http.get(format!("{}/admin/live/stream", app.base));
    match bearer {
        Some(t) => req.bearer_auth(t),
        None => req,
    }
}

#[tokio::test]
async fn the_live_stream_is_the_admins_and_sends_a_frame_a_second() {
    let app = spawn_app().await;
    assert_eq!(app.declare("lv", 10, 1).await.status(), 201);
    for bearer in [
        None,
        Some(token("u-1").as_str()),
        Some("not-the-admin-token"),
    ] {
        let r = stream(&app, bearer).send().await.unwrap();
        assert_eq!(r.status(), 401);
    }
    let won = release_buyers(&app.api, "lv", users("lv", 4)).await;
    assert!(won.iter().all(|(s, _)| *s == 201));

    let mut r = stream(&app, Some(ADMIN)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/x-ndjson");
    let mut buf = Vec::new();
    let first = next_line(&mut r, &mut buf).await;
    let started = Instant::now();
    let second = next_line(&mut r, &mut buf).await;
    let gap = started.elapsed();
    assert!(gap < Duration::from_millis(2500), "frames {gap:?} apart");

    let sku = &second["skus"].as_array().unwrap()[0];
    assert_eq!(sku["sku"], "lv");
    assert_eq!(sku["claims_total"]["won"], 4);
    assert_eq!(sku["view"]["total"], 10);
    assert_eq!(sku["view"]["consistent"], true);
    assert!(sku["journal_lag_seconds"].is_number());
    assert!(first["time"].is_string());
}

#[tokio::test]
async fn the_live_page_is_self_contained_and_holds_no_data() {
    let app = spawn_app().await;
    let r = app.get("/admin/live").await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/html; charset=utf-8");
    let csp = r.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(csp.starts_with("default-src 'none'"), "{csp}");
    let page = r.text().await.unwrap();
    // Nothing loaded from elsewhere: no CDN, works offline.
    for external in ["src=\"http", "href=\"http", "//cdn", "@import"] {
        assert!(!page.contains(external), "the page loads {external}");
    }
    assert!(page.contains("/admin/live/stream"));
}

/// Where the screenshot of the page is kept (a test artifact, not committed).
fn screenshot_path() -> String {
    format!("{}/live-page.png", env!("CARGO_TARGET_TMPDIR"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_page_renders_a_running_drop_in_headless_chromium() {
    let app = spawn_app().await;
    assert_eq!(app.declare("live-drop", 20, 1).await.status(), 201);
    let answers = release_buyers(&app.api, "live-drop", users("buyer", 25)).await;
    assert_eq!(answers.iter().filter(|(s, _)| *s == 201).count(), 20);
    app.drained("live-drop").await;

    // Buyers keep arriving while the page is open: the rates move.
    let api = app.api.clone();
    let arriving = tokio::spawn(async move {
        for i in 0.. {
            let _ = api
                .http
                .post(format!("{}/v1/skus/live-drop/claims", api.base))
                .bearer_auth(token(&format!("late-{i}")))
                .send()
                .await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });

    let shot = screenshot_path();
    // Installed from Debian's packages when missing (README: the tests need nothing else).
    crate::tools::require("chromium", "chromium");
    let out = tokio::process::Command::new(crate::tools::require("python3", "python3"))
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/live/drive_page.py"
        ))
        .arg(format!("{}/admin/live", app.base))
        .args(["--screenshot", &shot, "--timeout", "60"])
        .args(["--expect", r#"data-sku="live-drop""#])
        .args(["--expect", r#"<span data-field="remaining">0</span>"#])
        .args([
            "--expect",
            r#"<small data-field="total"> / 20 left</small>"#,
        ])
        // 20 won, then every buyer sold out (5, then the late ones).
        .args([
            "--expect",
            r#"<dd data-field="claims_total">won 20 · sold_out "#,
        ])
        // A frame with a baseline: the late buyers' rate and their latency.
        .args([
            "--expect",
            r#"<dd data-field="claims_per_second">won 0 · sold_out "#,
        ])
        .args(["--expect", "ledger balances"])
        .args(["--expect", r#"<dd data-field="recorded">20</dd>"#])
        .args(["--expect", r#"<dd data-field="pending">0</dd>"#])
        .env("DROPGATE_LIVE_TOKEN", ADMIN)
        .output()
        .await
        .expect("python3 runs tests/live/drive_page.py");
    arriving.abort();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the page did not render the drop (is Debian's chromium installed?): {stderr}"
    );
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(
        !dom.contains(r#"data-field="p99">–"#),
        "the p99 of the late buyers shows"
    );
    assert!(std::fs::metadata(&shot).unwrap().len() > 10_000);
    println!("live page screenshot: {shot}");
}
