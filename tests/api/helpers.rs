//! Test harness: each test gets the real application on port 0, its own PostgreSQL database
//! and its own Redis key prefix. A missing service fails the test; nothing is skipped.

use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use dropgate::app::Application;
use dropgate::config::{RawConfig, Secret};
use redis::aio::MultiplexedConnection;
use serde_json::{json, Value};
use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

pub const REDIS_URL: &str = "redis://127.0.0.1:6379";
pub const PG_BASE: &str = "postgres://postgres@127.0.0.1:5432";
pub const SECRET: &str = "test-admission-secret-0123456789";
pub const ADMIN: &str = "test-admin-token-0123456789";

pub struct TestApp {
    pub addr: SocketAddr,
    pub base: String,
    pub http: reqwest::Client,
    pub db: PgPool,
    pub database_url: String,
    pub redis: MultiplexedConnection,
    pub prefix: String,
    shutdown: CancellationToken,
    server: Option<JoinHandle<()>>,
}

/// A fresh database name and key prefix, shared by a test's gateways.
pub struct Isolation {
    pub database_url: String,
    pub prefix: String,
}

impl Isolation {
    pub fn new() -> Self {
        let id = Uuid::new_v4().simple().to_string();
        Isolation {
            database_url: format!("{PG_BASE}/dg_test_{}", &id[..16]),
            prefix: format!("t{}", &id[..16]),
        }
    }

    pub fn raw_config(&self, redis_url: &str) -> RawConfig {
        RawConfig {
            listen: "127.0.0.1:0".into(),
            redis_url: redis_url.into(),
            database_url: self.database_url.clone(),
            key_prefix: self.prefix.clone(),
            admission_secret: Some(SECRET.into()),
            admin_token: Some(ADMIN.into()),
            // Generous: tests share two cores with the compiler and each other.
            redis_timeout_ms: "2000".into(),
            reprocess_backoff_ms: "50".into(),
            journal_claim_idle_ms: "1000".into(),
            shutdown_grace_ms: "5000".into(),
            ..RawConfig::default()
        }
    }
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

pub async fn spawn_app_with(tweak: impl FnOnce(&mut RawConfig)) -> TestApp {
    let iso = Isolation::new();
    let mut raw = iso.raw_config(REDIS_URL);
    tweak(&mut raw);
    spawn_with_config(raw).await
}

pub async fn spawn_with_config(raw: RawConfig) -> TestApp {
    let config = raw.validate().expect("test configuration is valid");
    let redis_url = config.redis_url.clone();
    let app = Application::build(config.clone())
        .await
        .expect("the gateway starts: are PostgreSQL and Redis running?");
    let addr = app.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(app.run_until_stopped(shutdown.clone()));
    let db = PgPool::connect(&config.database_url).await.unwrap();
    let redis = redis::Client::open(redis_url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    TestApp {
        addr,
        base: format!("http://{addr}"),
        http: reqwest::Client::builder()
            .pool_max_idle_per_host(2000)
            .build()
            .unwrap(),
        db,
        database_url: config.database_url,
        redis,
        prefix: config.key_prefix,
        shutdown,
        server: Some(server),
    }
}

pub fn token(user: &str) -> String {
    dropgate::auth::mint(&Secret::new(SECRET), user, None, 600).unwrap()
}

pub fn token_for(user: &str, sku: &str) -> String {
    dropgate::auth::mint(&Secret::new(SECRET), user, Some(sku), 600).unwrap()
}

impl TestApp {
    pub async fn declare(&self, sku: &str, total: i64, limit: i64) -> reqwest::Response {
        self.http
            .put(format!("{}/admin/skus/{sku}", self.base))
            .bearer_auth(ADMIN)
            .json(&json!({"total": total, "per_user_limit": limit}))
            .send()
            .await
            .unwrap()
    }

    pub async fn restock(&self, sku: &str, delta: i64) -> reqwest::Response {
        self.http
            .post(format!("{}/admin/skus/{sku}/restock", self.base))
            .bearer_auth(ADMIN)
            .json(&json!({ "delta": delta }))
            .send()
            .await
            .unwrap()
    }

    pub async fn restore(&self, sku: &str, force: bool) -> reqwest::Response {
        let q = if force { "?force=true" } else { "" };
        self.http
            .post(format!("{}/admin/skus/{sku}/restore{q}", self.base))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap()
    }

    pub async fn claim(
        &self,
        sku: &str,
        user: &str,
        quantity: i64,
        key: Option<&str>,
    ) -> reqwest::Response {
        let mut req = self
            .http
            .post(format!("{}/v1/skus/{sku}/claims", self.base))
            .bearer_auth(token(user))
            .json(&json!({ "quantity": quantity }));
        if let Some(k) = key {
            req = req.header("idempotency-key", k);
        }
        req.send().await.unwrap()
    }

    pub async fn view(&self, sku: &str) -> Value {
        let r = self
            .http
            .get(format!("{}/admin/skus/{sku}", self.base))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "SKU view of {sku}");
        r.json().await.unwrap()
    }

    /// Remaining stock straight from Redis.
    pub async fn stock(&self, sku: &str) -> Option<i64> {
        let mut con = self.redis.clone();
        redis::cmd("HGET")
            .arg(format!("{}:{{{sku}}}:state", self.prefix))
            .arg("stock")
            .query_async(&mut con)
            .await
            .unwrap()
    }

    /// Units a user holds according to Redis.
    pub async fn held(&self, sku: &str, user: &str) -> i64 {
        let mut con = self.redis.clone();
        let v: Option<i64> = redis::cmd("HGET")
            .arg(format!("{}:{{{sku}}}:users", self.prefix))
            .arg(user)
            .query_async(&mut con)
            .await
            .unwrap();
        v.unwrap_or(0)
    }

    /// Claim ids in `issuances` for a SKU.
    pub async fn issued_ids(&self, sku: &str) -> Vec<Uuid> {
        sqlx::query_scalar("SELECT claim_id FROM issuances WHERE sku = $1 ORDER BY claim_id")
            .bind(sku)
            .fetch_all(&self.db)
            .await
            .unwrap()
    }

    /// Waits until the writer recorded every winner of `sku` (nothing in flight).
    pub async fn drained(&self, sku: &str) -> Value {
        let mut last = Value::Null;
        wait_for(Duration::from_secs(30), || async {
            last = self.view(sku).await;
            last["in_flight"] == 0 && last["pending"] == 0
        })
        .await;
        last
    }

    /// Stops the gateway the way SIGTERM does and waits for it.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(s) = self.server.take() {
            s.await.unwrap();
        }
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Polls `cond` until it holds; panics after `limit`. Conditions, not sleeps, synchronise.
pub async fn wait_for<F, Fut>(limit: Duration, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !cond().await {
        assert!(Instant::now() < deadline, "condition not met within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Releases `n` tasks at once (a barrier) and collects their results in order.
pub async fn all_at_once<T, F, Fut>(n: usize, f: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(usize) -> Fut,
    Fut: Future<Output = T> + Send + 'static,
{
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(n));
    let mut handles = Vec::with_capacity(n);
    for i in 0..n {
        let b = barrier.clone();
        let fut = f(i);
        handles.push(tokio::spawn(async move {
            b.wait().await;
            fut.await
        }));
    }
    let mut out = Vec::with_capacity(n);
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

pub fn code(body: &Value) -> &str {
    body["code"].as_str().unwrap_or("")
}
