//! The waiting page a shop can use (issue 41): it hands an admitted visitor back to the
//! shop's `return_url` with the token in the fragment (never a query string a proxy logs), in
//! the shop's name and colours, in the visitor's language, with times in the visitor's zone.

use std::sync::Arc;

use parking_lot::Mutex;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::page::drive;
use super::*;
use crate::helpers::spawn_app;

/// A shop on its own port: every page shows the fragment the browser arrived with (which
/// the browser never sends); the request lines it was sent are kept.
async fn shop() -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let kept = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let kept = kept.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let head = String::from_utf8_lossy(&buf[..n]).to_string();
                kept.lock()
                    .push(head.lines().next().unwrap_or("").to_string());
                let body = "<!doctype html><html><body><p id=\"shop\">shop</p><script>\
                    document.getElementById('shop').setAttribute('data-hash', \
                    location.hash.slice(1));</script></body></html>";
                let resp = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: {}\r\n\
                     connection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
            });
        }
    });
    (url, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admitted_visitor_is_handed_to_the_shop_with_a_token_that_buys() {
    let app = spawn_app().await;
    let (shop_url, requests) = shop().await;
    let r = declare_queued(
        &app,
        "q-shop",
        5,
        json!({"admit_per_second": 1, "page": {
            "return_url": format!("{shop_url}/checkout?from=queue"),
            "site_name": "Test Shop", "colour": "#c05", "background": "#fafafa",
            "logo": "data:image/png;base64,iVBORw0KGgo="}}),
        json!({}),
    )
    .await;
    assert_eq!(r.status(), 201);
    let page = app.get("/queue/q-shop").await.text().await.unwrap();
    assert!(page.contains("Test Shop") && page.contains("--accent: #c05"));
    assert!(page.contains(r#"<img id="logo" src="data:image/png;base64,"#));
    // One visitor ahead: the page's visitor waits, then is admitted and handed over.
    join_all(&app, "q-shop", "ahead", 1).await;
    let url = format!("{}/queue/q-shop#token={}", app.base, visitor("shopper"));
    let dom = drive(
        &url,
        &[
            r#"data-state="waiting""#,
            r#"id="shop""#,
            r#"data-hash="admission_token="#,
        ],
        &[],
        Some(&shop_url),
    )
    .await;
    let start = dom.find(r#"data-hash=""#).unwrap() + r#"data-hash=""#.len();
    let fragment = dom[start..start + dom[start..].find('"').unwrap()].replace("&amp;", "&");
    let pairs: std::collections::HashMap<String, String> = fragment
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), form_decoded(v)))
        .collect();
    assert_eq!(pairs["sku"], "q-shop");
    assert!(!pairs["expires_at"].is_empty(), "{pairs:?}");
    let token = &pairs["admission_token"];
    assert_eq!(super::core::decode(token)["sub"], "shopper");
    // The shop was asked for its page only: the token never travelled in a request.
    let seen = requests.lock().clone();
    assert!(
        seen.iter()
            .any(|l| l.starts_with("GET /checkout?from=queue ")),
        "{seen:?}"
    );
    assert!(
        !seen.iter().any(|l| l.contains("admission_token")),
        "{seen:?}"
    );
    let (s, b) = claim_with(&app, "q-shop", token).await;
    assert_eq!(s, 201, "{b}");
    assert_eq!(app.probe.stock("q-shop").await, Some(4));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_speaks_the_visitors_language_counts_down_in_local_time_and_tells_sold_out() {
    let app = spawn_app().await;
    let opens = chrono::Utc::now() + chrono::Duration::seconds(60);
    let r = declare_queued(
        &app,
        "q-de",
        3,
        json!({"admit_per_second": 5}),
        json!({"opens_at": opens.to_rfc3339()}),
    )
    .await;
    assert_eq!(r.status(), 201);
    let german = ["Accept-Language: de-DE,de;q=0.9,en;q=0.5"];
    let url = format!("{}/queue/q-de#token={}", app.base, visitor("früh"));
    // The machine's zone is the browser's: the opening as the visitor's clock shows it.
    let local = opens
        .with_timezone(&chrono::Local)
        .format("%d.%m.%Y")
        .to_string();
    let dom = drive(
        &url,
        &[
            r#"<html lang="de">"#,
            r#"aria-live="polite""#,
            r#"data-state="prequeue""#,
            "Sie sind in der Vorwarteschlange",
            &format!("Die Reihenfolge wird um {local}"),
        ],
        &german,
        None,
    )
    .await;
    assert!(dom.contains("<noscript>"), "a fallback without scripts");
    assert!(!dom.contains(&opens.to_rfc3339()), "no raw UTC time");

    // Sold out (no units, no hold): the page says so, in English by default.
    let r = declare_queued(&app, "q-none", 1, json!({"admit_per_second": 5}), json!({})).await;
    assert_eq!(r.status(), 201);
    assert_eq!(app.restock("q-none", -1).await.status(), 200);
    let url = format!("{}/queue/q-none#token={}", app.base, visitor("late"));
    drive(
        &url,
        &[r#"data-state="sold_out""#, "Every unit is taken"],
        &[],
        None,
    )
    .await;
}

#[tokio::test]
async fn page_settings_that_would_break_the_page_are_refused_and_change_nothing() {
    let app = spawn_app().await;
    for page in [
        json!({"return_url": "javascript:alert(1)"}),
        // Its fragment would be lost: the token takes the fragment.
        json!({"return_url": "https://shop.example/#/checkout"}),
        json!({"colour": "red;}</style><script>"}),
        json!({"logo": "https://cdn.example/logo.png"}),
        json!({"site_name": ""}),
        json!({"surprise": 1}),
    ] {
        let r = declare_queued(
            &app,
            "q-badpage",
            3,
            json!({"admit_per_second": 5, "page": page}),
            json!({}),
        )
        .await;
        assert_eq!(r.status(), 400, "{page}");
        let b: serde_json::Value = r.json().await.unwrap();
        assert_eq!(crate::helpers::code(&b), "bad_request", "{b}");
    }
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM skus WHERE sku = 'q-badpage'")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(rows, 0);
}

/// A value of `application/x-www-form-urlencoded` (what `URLSearchParams` writes), decoded.
fn form_decoded(v: &str) -> String {
    let bytes = v.replace('+', " ").into_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
            if let Ok(b) = u8::from_str_radix(hex, 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).to_string()
}
