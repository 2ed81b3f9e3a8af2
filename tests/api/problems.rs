//! What a refusal tells the client: 401s that say why (with RFC 6750's `WWW-Authenticate`),
//! problem `type`s that resolve to a page the gateway serves, and details that say what to do.

use std::collections::BTreeSet;

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};

use crate::helpers::*;

/// A token the gateway's secret signed, with `claims` as given.
fn signed(claims: Value, secret: &str) -> String {
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(secret.as_bytes()).unwrap(),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_401_says_why_and_challenges_with_bearer() {
    let app = spawn_app().await;
    app.declare("auth-1", 5, 1).await;
    let now = chrono::Utc::now().timestamp();
    let cases: [(&str, Option<String>, &str); 5] = [
        ("missing", None, "no bearer token"),
        ("malformed", Some("not-a-jwt".into()), "well-formed"),
        (
            "expired",
            Some(signed(json!({"sub": "u", "exp": now - 60}), SECRET)),
            "expired",
        ),
        (
            "wrongly signed",
            Some(signed(
                json!({"sub": "u", "exp": now + 600}),
                "another-secret-0123456789",
            )),
            "signature",
        ),
        (
            "for another SKU",
            Some(token_for("u", "auth-2")),
            "another SKU",
        ),
    ];
    let mut details = BTreeSet::new();
    for (case, bearer, says) in cases {
        let mut req = app.http.post(format!("{}/v1/skus/auth-1/claims", app.base));
        if let Some(t) = &bearer {
            req = req.bearer_auth(t);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), 401, "{case}");
        let challenge = r.headers()["www-authenticate"]
            .to_str()
            .unwrap()
            .to_string();
        let body: Value = r.json().await.unwrap();
        assert_eq!(code(&body), "unauthorized", "{case}");
        let detail = body["detail"].as_str().unwrap_or_default().to_string();
        assert!(detail.contains(says), "{case}: {detail}");
        assert!(
            challenge.starts_with(r#"Bearer realm="dropgate""#),
            "{case}: {challenge}"
        );
        if bearer.is_none() {
            assert!(!challenge.contains("error="), "RFC 6750 3.1: {challenge}");
        } else {
            assert!(
                challenge.contains(r#"error="invalid_token""#)
                    && challenge.contains(&format!(r#"error_description="{detail}""#)),
                "{case}: {challenge}"
            );
        }
        details.insert(detail);
    }
    assert_eq!(details.len(), 5, "five reasons, five details: {details:?}");
    // Nothing was claimed by any of them.
    assert_eq!(app.stock("auth-1").await, Some(5));

    let r = app
        .http
        .get(format!("{}/admin/skus/auth-1", app.base))
        .bearer_auth("not-the-admin-token")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.headers().contains_key("www-authenticate"));
    let body: Value = r.json().await.unwrap();
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("not the admin token"),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_problem_type_resolves_to_a_page_of_the_gateway() {
    let app = spawn_app().await;
    let doc: Value = app.get("/openapi.json").await.json().await.unwrap();
    let codes: Vec<String> = doc["components"]["schemas"]["Problem"]["properties"]["code"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_string())
        .collect();
    assert!(codes.len() > 20);
    for code in &codes {
        let r = app
            .get(&format!("/problems/{}", code.replace('_', "-")))
            .await;
        assert_eq!(r.status(), 200, "{code} has no page");
        assert_eq!(r.headers()["content-type"], "text/html; charset=utf-8");
        let page = r.text().await.unwrap();
        assert!(page.contains(&format!("<code>{code}</code>")), "{page}");
    }
    let r = app.get("/problems/no-such-thing").await;
    assert_eq!(r.status(), 404);

    // A real answer's `type`, resolved against the answer's URL as RFC 9457 says.
    app.declare("typed", 0, 1).await;
    let r = app.claim("typed", "u", 1, None).await;
    let url = r.url().clone();
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["type"], "/problems/sold-out");
    let page = url.join(body["type"].as_str().unwrap()).unwrap();
    let r = app.http.get(page).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains("waitlist"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_sku_asks_for_a_restore_and_a_restore_over_live_state_names_force() {
    let app = spawn_app().await;
    app.declare("ops-lost", 5, 1).await;
    let r = app.restore("ops-lost", false).await;
    assert_eq!(r.status(), 409);
    let body: Value = r.json().await.unwrap();
    assert_eq!(code(&body), "state_present");
    assert!(
        body["detail"].as_str().unwrap().contains("?force=true"),
        "{body}"
    );

    let mut con = app.probe.redis.clone();
    let _: () = redis::cmd("DEL")
        .arg(format!("{}:{{ops-lost}}:state", app.probe.prefix))
        .query_async(&mut con)
        .await
        .unwrap();
    let r = app.claim("ops-lost", "u", 1, None).await;
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    let body: Value = r.json().await.unwrap();
    assert_eq!(code(&body), "unavailable");
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.contains("restore") && !detail.contains("retry later"),
        "{detail}"
    );
}
