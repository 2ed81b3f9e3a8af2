//! Tokens as identity providers and front ends issue them (API.md "Conventions"; issue 37.3;
//! docs/tokens.md): OAuth scope lists, `iat`/`jti`/unknown claims, `nbf`, `aud`/`iss` when
//! configured, a visitor token's `sku`, several secrets by `kid`. Public keys of a JWKS file
//! are in [`jwks`].

mod jwks;

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};

use crate::helpers::*;
use crate::queue::{declare_queued, join};

/// HS256 over `claims` with `secret`, the header naming `kid` when given.
pub fn hs256(claims: &Value, secret: &str, kid: Option<&str>) -> String {
    let mut header = Header::new(Algorithm::HS256);
    header.kid = kid.map(str::to_string);
    jsonwebtoken::encode(
        &header,
        claims,
        &EncodingKey::from_secret(secret.as_bytes()).unwrap(),
    )
    .unwrap()
}

pub fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// POSTs a claim of one unit with `bearer`: status and body.
pub async fn claim_with(api: &Api, sku: &str, bearer: &str) -> (u16, Value) {
    let r = api
        .http
        .post(format!("{}/v1/skus/{sku}/claims", api.base))
        .bearer_auth(bearer)
        .json(&json!({"quantity": 1}))
        .send()
        .await
        .unwrap();
    let s = r.status().as_u16();
    (s, r.json().await.unwrap_or(Value::Null))
}

/// Asserts a 401 whose detail says `says`.
pub fn refused(answer: &(u16, Value), says: &str, case: &str) {
    assert_eq!(answer.0, 401, "{case}: {}", answer.1);
    assert_eq!(code(&answer.1), "unauthorized", "{case}");
    let detail = answer.1["detail"].as_str().unwrap_or_default();
    assert!(detail.contains(says), "{case}: {detail}");
}

/// The users Redis counts a unit for on `sku`.
async fn holders(app: &TestApp, sku: &str, users: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for u in users {
        if app.held(sku, u).await > 0 {
            out.push((*u).to_string());
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identity_providers_access_token_with_scope_iat_jti_and_aud_claims() {
    let app = spawn_app().await;
    app.declare("idp-1", 10, 1).await;
    let t = now();
    let cases = [
        (
            "openid",
            json!({"sub": "ann", "exp": t + 600, "scope": "openid profile"}),
        ),
        (
            "iat jti",
            json!({"sub": "bob", "exp": t + 600, "iat": t, "jti": "j-1", "azp": "web"}),
        ),
        (
            "aud",
            json!({"sub": "cat", "exp": t + 600, "aud": ["shop", "dropgate"]}),
        ),
        (
            "aud string",
            json!({"sub": "dan", "exp": t + 600, "aud": "shop", "iss": "https://idp"}),
        ),
        (
            "nbf past",
            json!({"sub": "eve", "exp": t + 600, "nbf": t - 5}),
        ),
    ];
    for (case, claims) in &cases {
        let (s, b) = claim_with(&app, "idp-1", &hs256(claims, SECRET, None)).await;
        assert_eq!(s, 201, "{case}: {b}");
    }
    let all = ["ann", "bob", "cat", "dan", "eve"];
    assert_eq!(holders(&app, "idp-1", &all).await, all.to_vec());
    assert_eq!(app.stock("idp-1").await, Some(5));
    app.drained("idp-1").await;
    assert_eq!(
        app.issued_ids("idp-1").await.len(),
        5,
        "five rows in issuances"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_before_its_nbf_is_refused_and_takes_nothing() {
    let app = spawn_app().await;
    app.declare("nbf-1", 5, 1).await;
    let early = json!({"sub": "ann", "exp": now() + 600, "nbf": now() + 300});
    let answer = claim_with(&app, "nbf-1", &hs256(&early, SECRET, None)).await;
    refused(&answer, "not valid yet", "nbf ahead");
    assert_eq!(app.stock("nbf-1").await, Some(5));
    assert_eq!(app.held("nbf-1", "ann").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configured_audience_and_issuer_are_required_and_matched() {
    let app = spawn_app_with(|c| {
        c.token_audience = Some("dropgate".into());
        c.token_issuer = Some("https://idp.example".into());
    })
    .await;
    app.declare("aud-1", 10, 1).await;
    let exp = now() + 600;
    let iss = "https://idp.example";
    let bad = [
        (
            "no aud",
            json!({"sub": "a1", "exp": exp, "iss": iss}),
            "aud",
        ),
        (
            "other aud",
            json!({"sub": "a2", "exp": exp, "iss": iss, "aud": "shop"}),
            "aud",
        ),
        (
            "no iss",
            json!({"sub": "a3", "exp": exp, "aud": "dropgate"}),
            "iss",
        ),
        (
            "other iss",
            json!({"sub": "a4", "exp": exp, "aud": "dropgate", "iss": "https://evil"}),
            "iss",
        ),
    ];
    for (case, claims, says) in &bad {
        let answer = claim_with(&app, "aud-1", &hs256(claims, SECRET, None)).await;
        refused(&answer, says, case);
    }
    let good = json!({"sub": "ok", "exp": exp, "iss": iss, "aud": ["shop", "dropgate"]});
    let (s, b) = claim_with(&app, "aud-1", &hs256(&good, SECRET, None)).await;
    assert_eq!(s, 201, "{b}");
    let everyone = ["a1", "a2", "a3", "a4", "ok"];
    assert_eq!(holders(&app, "aud-1", &everyone).await, vec!["ok"]);
    assert_eq!(app.stock("aud-1").await, Some(9));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scope_list_holding_queue_is_a_visitor_token_and_any_other_buys() {
    let app = spawn_app().await;
    let r = declare_queued(&app, "vq-1", 5, json!({"admit_per_second": 1}), json!({})).await;
    assert_eq!(r.status(), 201);
    app.declare("plain-1", 5, 1).await;
    let exp = now() + 600;
    let visitor = hs256(
        &json!({"sub": "vic", "exp": exp, "scope": "openid queue"}),
        SECRET,
        None,
    );
    let (s, b) = join(&app, "vq-1", &visitor).await;
    assert_eq!(s, 201, "a scope list with queue joins: {b}");
    // ...and buys nothing, on any SKU.
    refused(
        &claim_with(&app, "plain-1", &visitor).await,
        "visitor token",
        "visitor claims",
    );
    // A list without `queue` (`queues` is another scope) is an admission token.
    let buyer = hs256(
        &json!({"sub": "bea", "exp": exp, "scope": "openid queues"}),
        SECRET,
        None,
    );
    let (s, b) = join(&app, "vq-1", &buyer).await;
    refused(&(s, b), "visitor token", "admission token joins");
    assert_eq!(claim_with(&app, "plain-1", &buyer).await.0, 201);
    assert_eq!(holders(&app, "plain-1", &["vic", "bea"]).await, vec!["bea"]);
    assert_eq!(app.view("vq-1").await["queue"]["waiting"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_visitor_token_carrying_a_sku_joins_only_that_skus_queue() {
    let app = spawn_app().await;
    for sku in ["vs-a", "vs-b"] {
        let r = declare_queued(&app, sku, 5, json!({"admit_per_second": 1}), json!({})).await;
        assert_eq!(r.status(), 201);
    }
    let t = hs256(
        &json!({"sub": "val", "exp": now() + 600, "scope": "queue", "sku": "vs-a"}),
        SECRET,
        None,
    );
    let answer = join(&app, "vs-b", &t).await;
    refused(&answer, "another SKU", "join elsewhere");
    let (s, b) = join(&app, "vs-a", &t).await;
    assert_eq!(s, 201, "{b}");
    let ticket = b["ticket_id"].as_str().unwrap().to_string();
    let (s, _) = crate::queue::ticket(&app, &ticket, &t).await;
    assert_eq!(s, 200, "its own ticket reads");
    assert_eq!(
        app.view("vs-b").await["queue"]["waiting"],
        0,
        "no ticket on vs-b"
    );
    assert_eq!(app.view("vs-a").await["queue"]["waiting"], 1);
}

const OLD: &str = "old-secret-0123456789";
const NEW: &str = "new-secret-9876543210";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_secrets_check_a_named_kid_with_its_key_and_an_unnamed_one_with_each() {
    let app = spawn_app_with(|c| c.admission_secret = Some(format!("k2={NEW},k1={OLD}"))).await;
    app.declare("rot-1", 10, 1).await;
    let c = |sub: &str| json!({"sub": sub, "exp": now() + 600});
    let ok = [
        ("new by kid", hs256(&c("r1"), NEW, Some("k2"))),
        ("old by kid", hs256(&c("r2"), OLD, Some("k1"))),
        ("old, no kid", hs256(&c("r3"), OLD, None)),
        ("new, no kid", hs256(&c("r4"), NEW, None)),
    ];
    for (case, t) in &ok {
        let (s, b) = claim_with(&app, "rot-1", t).await;
        assert_eq!(s, 201, "{case}: {b}");
    }
    // A named key is the only one tried: the other secret does not stand in for it.
    refused(
        &claim_with(&app, "rot-1", &hs256(&c("x1"), OLD, Some("k2"))).await,
        "signature",
        "old secret under the new kid",
    );
    refused(
        &claim_with(&app, "rot-1", &hs256(&c("x2"), NEW, Some("k9"))).await,
        "kid",
        "unknown kid",
    );
    refused(
        &claim_with(&app, "rot-1", &hs256(&c("x3"), SECRET, None)).await,
        "signature",
        "a secret not configured",
    );
    let all = ["r1", "r2", "r3", "r4", "x1", "x2", "x3"];
    assert_eq!(holders(&app, "rot-1", &all).await, ["r1", "r2", "r3", "r4"]);
    assert_eq!(app.stock("rot-1").await, Some(6));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_gateway_signs_carries_the_first_secret_and_its_kid() {
    let app = spawn_app_with(|c| {
        c.admission_secret = Some(format!("k2={NEW},k1={OLD}"));
    })
    .await;
    let r = declare_queued(
        &app,
        "rotq-1",
        5,
        json!({"admit_per_second": 50}),
        json!({}),
    )
    .await;
    assert_eq!(r.status(), 201);
    let visitor = hs256(
        &json!({"sub": "vi", "exp": now() + 600, "scope": "queue"}),
        OLD,
        None,
    );
    let (s, b) = join(&app, "rotq-1", &visitor).await;
    assert_eq!(s, 201, "{b}");
    let ticket = b["ticket_id"].as_str().unwrap().to_string();
    // Admission runs at 50 a second: the ticket reads admitted within seconds.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let admission = loop {
        let (_, b) = crate::queue::ticket(&app, &ticket, &visitor).await;
        if let Some(t) = b["admission_token"].as_str() {
            break Some(t.to_string());
        }
        assert!(std::time::Instant::now() < deadline, "never admitted: {b}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let token = admission.unwrap();
    let header = jsonwebtoken::decode_header(&token).unwrap();
    assert_eq!(header.kid.as_deref(), Some("k2"));
    let mut v = jsonwebtoken::Validation::new(Algorithm::HS256);
    v.validate_aud = false;
    let key = jsonwebtoken::DecodingKey::from_secret(NEW.as_bytes()).unwrap();
    assert!(jsonwebtoken::decode::<Value>(&token, &key, &v).is_ok());
    let (s, b) = claim_with(&app, "rotq-1", &token).await;
    assert_eq!(s, 201, "{b}");
    assert_eq!(app.held("rotq-1", "vi").await, 1);
}

/// A visitor token buys nothing where no waiting room sent its visitor, and its `sku` binds it
/// on every route (found from outside: a visitor token, scoped to another SKU or not, joined
/// a plain SKU's waitlist and confirmed the offer it got; scoped to SKU A, it read and
/// confirmed its user's claim on SKU B). Now: 401 on a plain SKU's waitlist and on its claims,
/// 404 (as a stranger) on another SKU's; nothing changed in Redis or PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_visitor_token_buys_nothing_outside_a_waiting_room_and_its_sku_binds_it_everywhere() {
    let app = spawn_app().await;
    app.declare("plain", 1, 1).await;
    let visitor_of = |sku: Option<&str>| {
        let mut c = json!({"sub": "vv", "exp": now() + 600, "scope": "queue"});
        if let Some(s) = sku {
            c["sku"] = json!(s);
        }
        hs256(&c, SECRET, None)
    };
    let won = app.claim("plain", "vv", 1, None).await;
    assert_eq!(won.status(), 201);
    let id = won.json::<Value>().await.unwrap()["claim_id"]
        .as_str()
        .unwrap()
        .to_string();
    for bearer in [
        visitor_of(None),
        visitor_of(Some("elsewhere")),
        visitor_of(Some("plain")),
    ] {
        let asks = [
            (
                "joined a plain waitlist",
                reqwest::Method::POST,
                "v1/skus/plain/waitlist".to_string(),
            ),
            (
                "read a plain claim",
                reqwest::Method::GET,
                format!("v1/claims/{id}"),
            ),
            (
                "cancelled a plain claim",
                reqwest::Method::POST,
                format!("v1/claims/{id}/cancel"),
            ),
        ];
        for (what, method, path) in asks {
            let mut req = app
                .http
                .request(method.clone(), format!("{}/{path}", app.base))
                .bearer_auth(&bearer);
            if method == reqwest::Method::POST {
                req = req.json(&json!({}));
            }
            let status = req.send().await.unwrap().status().as_u16();
            assert!(status == 401 || status == 404, "a visitor {what}: {status}");
        }
    }
    let waiting: i64 = sqlx::query_scalar("SELECT count(*) FROM waitlist")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(waiting, 0);
    let status: String =
        sqlx::query_scalar("SELECT status FROM issuances WHERE claim_id = $1::uuid")
            .bind(&id)
            .fetch_one(&app.db)
            .await
            .unwrap_or_else(|_| "unwritten".into());
    assert_ne!(status, "cancelled");
    assert_eq!(app.probe.stock("plain").await, Some(0));
}
