//! `GET /openapi.json` cannot drift from the gateway: its paths and methods are the route
//! table's, both ways; every entry of the table is served (and every other method is 405);
//! every problem code the gateway can answer is described, and nothing else.

use std::collections::BTreeSet;

use dropgate::http::ROUTES;
use serde_json::Value;

use crate::helpers::spawn_app;

const METHODS: [&str; 7] = ["GET", "PUT", "POST", "DELETE", "PATCH", "HEAD", "OPTIONS"];

async fn document(app: &crate::helpers::TestApp) -> Value {
    let r = app.get("/openapi.json").await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/json");
    r.json().await.unwrap()
}

fn described_operations(doc: &Value) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in METHODS {
            if item.get(method.to_lowercase()).is_some() {
                out.insert((path.clone(), method.to_string()));
            }
        }
    }
    out
}

#[tokio::test]
async fn the_description_has_exactly_the_routes_of_the_router() {
    let app = spawn_app().await;
    let doc = document(&app).await;
    assert_eq!(doc["openapi"], "3.1.0");

    let routed: BTreeSet<(String, String)> = ROUTES
        .iter()
        .flat_map(|r| r.methods().map(|m| (r.path.to_string(), m.to_string())))
        .collect();
    let described = described_operations(&doc);
    let undescribed: Vec<_> = routed.difference(&described).collect();
    let unrouted: Vec<_> = described.difference(&routed).collect();
    assert!(
        undescribed.is_empty(),
        "routes missing from openapi.json: {undescribed:?}"
    );
    assert!(
        unrouted.is_empty(),
        "openapi.json describes routes the router lacks: {unrouted:?}"
    );
}

#[tokio::test]
async fn every_route_is_served_and_every_other_method_is_405() {
    let app = spawn_app().await;
    for route in ROUTES {
        // Parameters that pass the router: a valid SKU id, a UUID.
        let path = route
            .path
            .replace("{sku}", "probe-1")
            .replace("{claim_id}", "0193a1b2-0000-7000-8000-000000000000")
            .replace("{problem}", "sold-out");
        for method in METHODS {
            // No credentials: nothing a probe sends can change anything.
            let r = app
                .http
                .request(method.parse().unwrap(), format!("{}{path}", app.base))
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let allow = r
                .headers()
                .get("allow")
                .map(|v| v.to_str().unwrap().to_string());
            let body: Value = r.json().await.unwrap_or(Value::Null);
            if route.methods().any(|m| m == method) {
                assert!(
                    status != 405 && body["code"] != "not_found",
                    "{method} {path} is in the route table but not served: {status} {body}"
                );
            } else {
                assert_eq!(status, 405, "{method} {path}: {body}");
                if method != "HEAD" {
                    assert_eq!(body["code"], "method_not_allowed");
                }
                assert_eq!(allow.as_deref(), Some(route.allow), "{method} {path}");
            }
        }
    }
    let r = app.get("/v1/nothing-here").await;
    assert_eq!(r.status(), 404);
    assert_eq!(r.json::<Value>().await.unwrap()["code"], "not_found");
}

/// The codes `ApiError::parts` can answer, read from its source: its only snake_case string
/// literals are the codes (titles are sentences).
fn emitted_codes() -> BTreeSet<String> {
    let src = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/src/http/problem/table.rs"
    ))
    .unwrap();
    let start = src.find("fn parts(").expect("ApiError::parts exists");
    let end = start + src[start..].find("\n    }\n").unwrap();
    src[start..end]
        .split('"')
        .skip(1)
        .step_by(2)
        .filter(|s| !s.is_empty() && s.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
        .map(str::to_string)
        .collect()
}

/// Every code named by a problem response of an operation (following `$ref`s to
/// `components.responses`).
fn codes_of_operations(doc: &Value) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for item in doc["paths"].as_object().unwrap().values() {
        for op in item.as_object().unwrap().values() {
            for resp in op["responses"].as_object().unwrap().values() {
                let resp = match resp["$ref"].as_str() {
                    Some(r) => &doc["components"]["responses"][r.rsplit('/').next().unwrap()],
                    None => resp,
                };
                let schema = &resp["content"]["application/problem+json"]["schema"];
                for part in schema["allOf"].as_array().into_iter().flatten() {
                    for code in part["properties"]["code"]["enum"]
                        .as_array()
                        .into_iter()
                        .flatten()
                    {
                        out.insert(code.as_str().unwrap().to_string());
                    }
                }
            }
        }
    }
    out
}

#[tokio::test]
async fn every_problem_code_the_gateway_can_answer_is_described() {
    let app = spawn_app().await;
    let doc = document(&app).await;
    let emitted = emitted_codes();
    assert!(
        emitted.contains("sold_out") && emitted.contains("unavailable"),
        "{emitted:?}"
    );

    let listed: BTreeSet<String> = doc["components"]["schemas"]["Problem"]["properties"]["code"]
        ["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        listed, emitted,
        "Problem.code must list exactly the codes of ApiError::parts"
    );

    // Each code belongs to some operation's answers, except the two any path can get.
    let by_operation = codes_of_operations(&doc);
    for code in &emitted {
        if code == "not_found" || code == "method_not_allowed" {
            continue;
        }
        assert!(by_operation.contains(code), "no operation answers `{code}`");
    }
    assert!(
        by_operation.is_subset(&emitted),
        "{:?}",
        by_operation.difference(&emitted)
    );
}

#[tokio::test]
async fn the_description_names_both_security_schemes_and_the_claim_events() {
    let app = spawn_app().await;
    let doc = document(&app).await;
    let schemes = &doc["components"]["securitySchemes"];
    assert_eq!(schemes["admissionToken"]["bearerFormat"], "JWT");
    assert_eq!(schemes["adminToken"]["scheme"], "bearer");
    // Every operation says who may call it (an empty list: anyone).
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            assert!(op["security"].is_array(), "{method} {path} has no security");
        }
    }
    let kinds: BTreeSet<&str> = doc["components"]["schemas"]["ClaimEvent"]["properties"]["type"]
        ["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap())
        .collect();
    let built: BTreeSet<&str> = dropgate::outbox::EventKind::ALL
        .iter()
        .map(|k| k.as_str())
        .collect();
    assert_eq!(kinds, built);
    let events: BTreeSet<&str> = doc["x-events"]["events"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(events, built);
}
