//! The waiting page in headless Chromium: it joins with the visitor token of its URL's
//! fragment, polls the ticket, and shows position, then the admission, with nothing from
//! another host.

use serde_json::json;

use super::*;
use crate::helpers::spawn_app;

#[tokio::test]
async fn the_waiting_page_is_self_contained() {
    let app = spawn_app().await;
    let r = app.get("/queue/q-page").await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/html; charset=utf-8");
    let csp = r.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        csp.starts_with("default-src 'none'") && csp.contains("connect-src 'self'"),
        "{csp}"
    );
    let page = r.text().await.unwrap();
    for external in ["src=\"http", "href=\"http", "//cdn", "@import", "url(http"] {
        assert!(!page.contains(external), "the page loads {external}");
    }
    assert!(page.contains("/v1/queue/"), "it polls the JSON route");
    assert_eq!(app.get("/queue/not%20a%20sku").await.status(), 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_waiting_page_shows_the_line_then_the_admission_in_headless_chromium() {
    let app = spawn_app().await;
    let r = declare_queued(
        &app,
        "q-page",
        10,
        json!({"admit_per_second": 1}),
        json!({}),
    )
    .await;
    assert_eq!(r.status(), 201);
    // Three visitors ahead, so the page's visitor waits in line a few seconds.
    join_all(&app, "q-page", "ahead", 3).await;
    let token = visitor("page-visitor");
    let url = format!("{}/queue/q-page#token={token}", app.base);
    let dom = drive(
        &url,
        &[
            r#"data-state="waiting""#,
            "Position ",
            r#"data-state="admitted""#,
            r#"id="admission-token""#,
        ],
        &[],
        None,
    )
    .await;
    // The token the page shows is the one the queue minted for this visitor's ticket: it buys.
    let start = dom.find(r#"id="admission-token">"#).unwrap() + r#"id="admission-token">"#.len();
    let admission = &dom[start..start + dom[start..].find('<').unwrap()];
    let claims = super::core::decode(admission);
    assert_eq!(claims["sub"], "page-visitor");
    let (s, b) = claim_with(&app, "q-page", admission).await;
    assert_eq!(s, 201, "{b}");
}

/// Runs tests/queue/drive_queue_page.py on `url`: each of `expect` shows in turn; `headers`
/// go with every request; the page may hand over to `shop`. The last DOM.
pub(super) async fn drive(
    url: &str,
    expect: &[&str],
    headers: &[&str],
    shop: Option<&str>,
) -> String {
    let chromium = crate::tools::require("chromium", "chromium");
    let mut cmd = tokio::process::Command::new(crate::tools::require("python3", "python3"));
    cmd.arg(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/queue/drive_queue_page.py"
    ))
    .arg(url)
    .args(["--timeout", "90"]);
    for e in expect {
        cmd.args(["--expect", e]);
    }
    for h in headers {
        cmd.args(["--header", h]);
    }
    if let Some(s) = shop {
        cmd.args(["--shop", s]);
    }
    let out = cmd
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
        .expect("python3 runs tests/queue/drive_queue_page.py");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the page did not show {expect:?}: {stderr}"
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}
