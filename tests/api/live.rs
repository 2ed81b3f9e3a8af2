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

/// A seated SKU's frame carries its hall (free, held and sold seats, from the seat-map copy
/// and the live holds), then nothing while it stays the same, then the hall again once a hold
/// ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seated_skus_frames_draw_its_hall_as_seats_are_held_sold_and_freed() {
    use crate::seat_support::{act, declare_hall, take};
    use serde_json::json;
    let app = spawn_app().await;
    declare_hall(&app, "lvhall", 300).await;
    let (s, held) = take(&app, "lvhall", "u-held", json!({"seats": ["A-1-2"]})).await;
    assert_eq!(s, 201, "{held}");
    let (s, sold) = take(
        &app,
        "lvhall",
        "u-sold",
        json!({"seats": ["A-1-4", "A-1-5"]}),
    )
    .await;
    assert_eq!(s, 201, "{sold}");
    let (s, body) = act(
        &app,
        sold["claim_id"].as_str().unwrap(),
        "u-sold",
        "confirm",
    )
    .await;
    assert_eq!(s, 200, "{body}");

    let mut r = stream(&app, Some(ADMIN)).send().await.unwrap();
    let mut buf = Vec::new();
    let hall_of = |frame: &Value| {
        frame["skus"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["sku"] == "lvhall")
            .map(|s| s["hall"].clone())
            .unwrap()
    };
    let first = hall_of(&next_line(&mut r, &mut buf).await);
    assert_eq!(
        first["sections"][0]["rows"][0]["seats"], ".h.xx...",
        "{first}"
    );
    assert_eq!(
        (&first["free"], &first["held"], &first["sold"]),
        (&json!(5), &json!(1), &json!(2)),
        "{first}"
    );
    assert_eq!(hall_of(&next_line(&mut r, &mut buf).await), Value::Null);
    let (s, body) = act(&app, held["claim_id"].as_str().unwrap(), "u-held", "cancel").await;
    assert_eq!(s, 200, "{body}");
    let mut seen = None;
    for _ in 0..6 {
        let h = hall_of(&next_line(&mut r, &mut buf).await);
        if !h.is_null() {
            seen = Some(h);
            break;
        }
    }
    let after = seen.expect("the hall is sent again once a hold ends");
    assert_eq!(
        after["sections"][0]["rows"][0]["seats"], "...xx...",
        "{after}"
    );
    assert_eq!((&after["held"], &after["sold"]), (&json!(0), &json!(2)));
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

/// Where the screenshot of the page is kept (a test artifact, not committed; CI keeps the
/// target dir's tmp/).
fn screenshot_path() -> String {
    format!("{}/live-page.png", env!("CARGO_TARGET_TMPDIR"))
}

/// Buyers arriving at `sku` every `every` until aborted (new users each time: `prefix-i`).
fn arriving(
    api: &crate::helpers::Api,
    sku: &'static str,
    prefix: &'static str,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    let api = api.clone();
    tokio::spawn(async move {
        for i in 0.. {
            let _ = api
                .http
                .post(format!("{}/v1/skus/{sku}/claims", api.base))
                .bearer_auth(token(&format!("{prefix}-{i}")))
                .send()
                .await;
            tokio::time::sleep(every).await;
        }
    })
}

/// Where `needle` first occurs in `dom` (panics when it does not).
fn at(dom: &str, needle: &str) -> usize {
    dom.find(needle)
        .unwrap_or_else(|| panic!("{needle} is not on the page"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_page_charts_a_running_drop_in_headless_chromium() {
    let chromium = crate::tools::require("chromium", "chromium");
    let app = spawn_app().await;
    // An idle SKU that sorts first by name, a drop that sells out, and a large one with holds.
    assert_eq!(app.declare("aaa-idle", 10, 1).await.status(), 201);
    assert_eq!(app.declare("live-drop", 20, 1).await.status(), 201);
    let big = crate::lifecycle::declare_with(
        &app.api,
        "big-drop",
        serde_json::json!({"total": 250_000, "hold_seconds": 600}),
    )
    .await;
    assert_eq!(big.status(), 201);
    let buyers = users("buyer", 25);
    let answers = release_buyers(&app.api, "live-drop", buyers.clone()).await;
    assert_eq!(answers.iter().filter(|(s, _)| *s == 201).count(), 20);
    // Two of those sold out line up for units that come back.
    let sold_out: Vec<&String> = buyers
        .iter()
        .zip(&answers)
        .filter(|(_, (s, _))| *s == 409)
        .map(|(u, _)| u)
        .take(2)
        .collect();
    for user in sold_out {
        let (status, body) =
            crate::lifecycle::post_as(&app.api, "/v1/skus/live-drop/waitlist", &token(user)).await;
        assert!(status == 201 || status == 200, "{status} {body}");
    }
    let held = release_buyers(&app.api, "big-drop", users("holder", 30)).await;
    assert_eq!(held.iter().filter(|(s, _)| *s == 201).count(), 30);
    app.drained("live-drop").await;
    // A waiting room admitting a line of 40 at 2/s while the page is open: nobody has
    // claimed yet, so only its line makes it a card.
    let r = crate::queue::declare_queued(
        &app.api,
        "queue-drop",
        5,
        serde_json::json!({"admit_per_second": 2}),
        serde_json::json!({}),
    )
    .await;
    assert_eq!(r.status(), 201);
    crate::queue::join_many(&app.api, "queue-drop", "visitor", 40, 20).await;
    // A seated hall with a seat held and one sold: its card draws the hall.
    crate::seat_support::declare_hall(&app, "seat-drop", 300).await;
    let one = serde_json::json!({"seats": ["A-1-1"]});
    let (s, _) = crate::seat_support::take(&app, "seat-drop", "seat-a", one).await;
    assert_eq!(s, 201);
    let eight = serde_json::json!({"seats": ["A-1-8"]});
    let (s, sold) = crate::seat_support::take(&app, "seat-drop", "seat-b", eight).await;
    assert_eq!(s, 201);
    let sold = sold["claim_id"].as_str().unwrap().to_string();
    let (s, _) = crate::seat_support::act(&app, &sold, "seat-b", "confirm").await;
    assert_eq!(s, 200);

    // Buyers keep arriving while the page is open, far more of them at live-drop: it is the
    // most active SKU and comes first; the idle one comes last, whatever its name.
    let late = [
        arriving(&app.api, "live-drop", "late", Duration::from_millis(40)),
        arriving(&app.api, "big-drop", "later", Duration::from_millis(400)),
    ];

    let shot = screenshot_path();
    // Installed from Debian's packages when missing (README: the tests need nothing else).
    crate::tools::require("chromium", "chromium");
    let out = tokio::process::Command::new(crate::tools::require("python3", "python3"))
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/live/drive_page.py"
        ))
        .arg(format!("{}/admin/live", app.base))
        .args(["--screenshot", &shot, "--timeout", "90"])
        .args(["--expect", r#"data-sku="live-drop""#])
        .args(["--expect", r#"data-sku="big-drop""#])
        .args(["--expect", r#"<tr data-sku="aaa-idle">"#])
        .args(["--expect", r#"<span data-field="remaining">0</span>"#])
        .args([
            "--expect",
            r#"<small data-field="total"> left of 20</small>"#,
        ])
        // Thousands separators.
        .args([
            "--expect",
            r#"<small data-field="total"> left of 250,000</small>"#,
        ])
        // 20 won, then every buyer sold out (5, then the late ones).
        .args([
            "--expect",
            "claims answered by this gateway: won 20 · sold_out ",
        ])
        .args(["--expect", r#"<dd data-field="waitlist">2 · 0</dd>"#])
        .args(["--expect", "ledger balances"])
        .args(["--expect", r#"<dd data-field="recorded">20</dd>"#])
        .args(["--expect", r#"<dd data-field="pending">0</dd>"#])
        // Every chart of a SKU with claims has drawn eight seconds of history.
        .args(["--expect", r#"data-chart="claims" data-points="8""#])
        .args(["--expect", r#"data-chart="p99" data-points="8""#])
        .args(["--expect", r#"data-chart="remaining" data-points="8""#])
        .args(["--expect", r#"data-chart="lag" data-points="8""#])
        // The waiting room's panel: its line, its admissions against the set rate.
        .args(["--expect", r#"data-sku="queue-drop""#])
        .args(["--expect", r#"<dd data-field="queue_told">admitting</dd>"#])
        .args(["--expect", " · set 2/s</dd>"])
        .args(["--expect", r#"data-chart="queue" data-points="8""#])
        .args(["--expect", r#"data-chart="admitted" data-points="7""#])
        // The seated hall, drawn.
        .args(["--expect", r#"data-sku="seat-drop""#])
        .args([
            "--expect",
            r#"data-field="hall">seats: 6 free · 1 held · 1 sold</div>"#,
        ])
        .args(["--expect", r#"data-field="hall-canvas""#])
        .env("DROPGATE_LIVE_TOKEN", ADMIN)
        .env(
            "PATH",
            format!(
                "{}:{}",
                std::path::Path::new(&chromium).parent().unwrap().display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .output()
        .await
        .expect("python3 runs tests/live/drive_page.py");
    for task in late {
        task.abort();
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the page did not render the drop: {stderr}"
    );
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(
        at(&dom, r#"data-sku="live-drop""#) < at(&dom, r#"data-sku="big-drop""#)
            && at(&dom, r#"data-sku="big-drop""#) < at(&dom, r#"data-sku="aaa-idle""#),
        "SKUs most active first"
    );
    assert!(
        at(
            &dom,
            r#"<section class="sku balanced" data-sku="queue-drop""#
        ) < at(&dom, r#"data-sku="aaa-idle""#),
        "a waiting room with a line is a card, though nobody claimed"
    );
    let queue = &dom[at(&dom, r#"data-sku="queue-drop""#)..];
    let figure = |field: &str| -> i64 {
        let from = &queue[at(queue, &format!(r#"<dd data-field="{field}">"#))..];
        from[from.find('>').unwrap() + 1..from.find("</dd>").unwrap()]
            .replace(',', "")
            .parse()
            .unwrap()
    };
    let (waiting, admitted) = (figure("queue_waiting"), figure("queue_admitted"));
    assert!(
        admitted >= 1 && (40..=41).contains(&(waiting + admitted)),
        "the line of 40: {waiting} in line, {admitted} admitted"
    );
    let drop = &dom[at(&dom, r#"data-sku="live-drop""#)..at(&dom, r#"data-sku="big-drop""#)];
    assert!(
        !drop.contains(r#"data-field="p99">–"#),
        "the p99 of the late buyers shows"
    );
    // The large drop's holds: 30 held at least (late buyers win more).
    let big = &dom[at(&dom, r#"data-sku="big-drop""#)..];
    let holds = &big[at(big, r#"<dd data-field="holds">"#)..];
    let held: u64 = holds[holds.find('>').unwrap() + 1..]
        .split(' ')
        .next()
        .unwrap()
        .replace(',', "")
        .parse()
        .unwrap();
    assert!(held >= 30, "{held} held");
    assert!(std::fs::metadata(&shot).unwrap().len() > 20_000);
    println!("live page screenshot (taken during the drop): {shot}");
}
