//! Test harness: each test gets the real application on port 0, its own PostgreSQL database
//! and its own Redis key prefix. A missing service fails the test; nothing is skipped.

use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use dropgate::app::Application;
use dropgate::config::{RawConfig, Secret};
use redis::aio::ConnectionManager;
use serde_json::{json, Value};
use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

pub const REDIS_URL: &str = "redis://127.0.0.1:6379";
pub const PG_BASE: &str = "postgres://postgres@127.0.0.1:5432";
pub const SECRET: &str = "test-admission-secret-0123456789";
pub const ADMIN: &str = "test-admin-token-0123456789";

/// A gateway's HTTP API, in process or in a child process.
#[derive(Clone)]
pub struct Api {
    pub base: String,
    pub http: reqwest::Client,
}

/// Direct reads of the state a test leaves behind, bypassing the gateway.
#[derive(Clone)]
pub struct Probe {
    pub db: PgPool,
    pub database_url: String,
    /// Reconnects by itself, so fault tests can keep using it across a Redis restart.
    pub redis: ConnectionManager,
    pub prefix: String,
}

pub struct TestApp {
    pub addr: SocketAddr,
    pub api: Api,
    pub probe: Probe,
    pub db: PgPool,
    shutdown: CancellationToken,
    server: Option<JoinHandle<()>>,
}

impl std::ops::Deref for TestApp {
    type Target = Api;
    fn deref(&self) -> &Api {
        &self.api
    }
}

impl Api {
    pub fn new(base: String) -> Self {
        Api {
            base,
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(2000)
                .build()
                .unwrap(),
        }
    }
}

impl Probe {
    pub async fn new(database_url: &str, redis_url: &str, prefix: &str) -> Self {
        Probe {
            db: PgPool::connect(database_url).await.unwrap(),
            database_url: database_url.to_string(),
            redis: ConnectionManager::new(redis::Client::open(redis_url).unwrap())
                .await
                .unwrap(),
            prefix: prefix.to_string(),
        }
    }
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

/// A gateway on a test's own Redis at `redis_url`, with the production call bound (250 ms), so
/// a stall of that Redis outlasts the call and its read-backs.
pub async fn spawn_app_on(redis_url: &str) -> TestApp {
    spawn_app_with(|c| {
        c.redis_url = redis_url.to_string();
        c.redis_timeout_ms = "250".into();
    })
    .await
}

pub async fn spawn_with_config(raw: RawConfig) -> TestApp {
    // The gateway's log goes to the test's captured output, shown when a test fails.
    let _ = tracing_subscriber::fmt()
        .with_env_filter("warn,dropgate=info")
        .with_test_writer()
        .try_init();
    let config = raw.validate().expect("test configuration is valid");
    let redis_url = config.redis_url.clone();
    let app = Application::build(config.clone())
        .await
        .expect("the gateway starts: are PostgreSQL and Redis running?");
    let addr = app.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(app.run_until_stopped(shutdown.clone()));
    let probe = Probe::new(&config.database_url, &redis_url, &config.key_prefix).await;
    TestApp {
        addr,
        api: Api::new(format!("http://{addr}")),
        db: probe.db.clone(),
        probe,
        shutdown,
        server: Some(server),
    }
}

/// `s` as a SKU id, for the library calls that take one (a test's ids are valid ones).
pub fn sku_id(s: &str) -> &dropgate::sku::SkuId {
    dropgate::sku::SkuId::parse(s).expect("a valid SKU id")
}

pub fn token(user: &str) -> String {
    dropgate::auth::mint(&Secret::new(SECRET), user, None, 600).unwrap()
}

pub fn token_for(user: &str, sku: &str) -> String {
    dropgate::auth::mint(&Secret::new(SECRET), user, Some(sku), 600).unwrap()
}

impl Api {
    /// GET `path` without credentials.
    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap()
    }

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

    /// The SKU view; a view that says it could not tell (the writers acknowledged under every
    /// reading it took: 503, "read the view again", docs/ledger-view.md) is read again, as a
    /// client does after Retry-After.
    pub async fn view(&self, sku: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let r = self
                .http
                .get(format!("{}/admin/skus/{sku}", self.base))
                .bearer_auth(ADMIN)
                .send()
                .await
                .unwrap();
            let status = r.status();
            let v: Value = r.json().await.unwrap();
            let again = status == 503
                && v["detail"]
                    .as_str()
                    .unwrap_or("")
                    .contains("read the view again")
                && Instant::now() < deadline;
            if again {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            assert_eq!(status, 200, "SKU view of {sku}: {v}");
            return v;
        }
    }

    pub async fn drained(&self, sku: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let v = self.view(sku).await;
            if v["in_flight"] == 0 && v["pending"] == 0 {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "the writer did not drain {sku}: {v}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
impl Probe {
    /// Redis loses every key of `sku` (a restart without persistence, for that SKU only).
    pub async fn lose_sku(&self, sku: &str) {
        let mut con = self.redis.clone();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}:{{{sku}}}:*", self.prefix))
            .query_async(&mut con)
            .await
            .unwrap();
        if !keys.is_empty() {
            let _: () = redis::cmd("DEL")
                .arg(&keys)
                .query_async(&mut con)
                .await
                .unwrap();
        }
    }

    /// HGET straight from Redis. Retried briefly: right after a Redis restart the first call
    /// on a reconnecting connection fails.
    async fn hget(&self, key: String, field: &str) -> Option<i64> {
        let mut last = None;
        for _ in 0..50 {
            let mut con = self.redis.clone();
            match redis::cmd("HGET")
                .arg(&key)
                .arg(field)
                .query_async(&mut con)
                .await
            {
                Ok(v) => return v,
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("redis unreachable: {last:?}");
    }

    /// Remaining stock straight from Redis.
    pub async fn stock(&self, sku: &str) -> Option<i64> {
        self.hget(format!("{}:{{{sku}}}:state", self.prefix), "stock")
            .await
    }

    /// Units a user holds according to Redis.
    pub async fn held(&self, sku: &str, user: &str) -> i64 {
        self.hget(format!("{}:{{{sku}}}:users", self.prefix), user)
            .await
            .unwrap_or(0)
    }

    /// Claim ids in `issuances` for a SKU.
    pub async fn issued_ids(&self, sku: &str) -> Vec<Uuid> {
        sqlx::query_scalar("SELECT claim_id FROM issuances WHERE sku = $1 ORDER BY claim_id")
            .bind(sku)
            .fetch_all(&self.db)
            .await
            .unwrap()
    }
}

impl TestApp {
    pub async fn stock(&self, sku: &str) -> Option<i64> {
        self.probe.stock(sku).await
    }

    pub async fn held(&self, sku: &str, user: &str) -> i64 {
        self.probe.held(sku, user).await
    }

    pub async fn issued_ids(&self, sku: &str) -> Vec<Uuid> {
        self.probe.issued_ids(sku).await
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
        assert!(
            Instant::now() < deadline,
            "condition not met within {limit:?}"
        );
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

/// Releases one buyer per user at once (a barrier), each claiming one unit; returns each
/// answer's status (0 when the connection failed) and body.
pub async fn release_buyers(api: &Api, sku: &str, users: Vec<String>) -> Vec<(u16, Value)> {
    let users = std::sync::Arc::new(users);
    all_at_once(users.len(), |i| {
        let (api, users, sku) = (api.clone(), users.clone(), sku.to_string());
        async move {
            let r = api
                .http
                .post(format!("{}/v1/skus/{sku}/claims", api.base))
                .bearer_auth(token(&users[i]))
                .json(&serde_json::json!({"quantity": 1}))
                .send()
                .await;
            match r {
                Ok(r) => {
                    let s = r.status().as_u16();
                    (s, r.json().await.unwrap_or(Value::Null))
                }
                Err(_) => (0, Value::Null),
            }
        }
    })
    .await
}

/// Claim ids of the 201 answers.
pub fn won_ids(results: &[(u16, Value)]) -> Vec<Uuid> {
    let mut ids: Vec<Uuid> = results
        .iter()
        .filter(|(s, _)| *s == 201)
        .map(|(_, b)| b["claim_id"].as_str().unwrap().parse().unwrap())
        .collect();
    ids.sort();
    ids
}

pub fn users(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

/// A Redis connection and the keys of a SKU under a fresh prefix, for script-level tests.
pub async fn script_sku(sku: &str) -> (ConnectionManager, dropgate::keys::SkuKeys) {
    let con = ConnectionManager::new(redis::Client::open(REDIS_URL).unwrap())
        .await
        .unwrap();
    let prefix = format!("t{}", &Uuid::new_v4().simple().to_string()[..16]);
    (con, dropgate::keys::SkuKeys::new(&prefix, sku))
}

/// As [`script_sku`], with the SKU declared (stock seeded).
pub async fn seeded_sku(total: i64, limit: i32) -> (ConnectionManager, dropgate::keys::SkuKeys) {
    let (mut con, keys) = script_sku("s").await;
    dropgate::scripts::declare_sku(
        &mut con,
        &keys,
        true,
        total,
        &dropgate::scripts::Terms::limit(limit),
        &Uuid::nil(),
    )
    .await
    .unwrap();
    (con, keys)
}

/// Remaining stock of a script-level test's SKU.
pub async fn script_stock(con: &mut ConnectionManager, keys: &dropgate::keys::SkuKeys) -> i64 {
    redis::cmd("HGET")
        .arg(keys.state())
        .arg("stock")
        .query_async(con)
        .await
        .unwrap()
}

/// Tests that load the whole machine (a Redis Cluster of their own, thousands of buyers at
/// once, the seeded models) take this first, so no two of them run together: on two cores a
/// pair of them starves the gateways they drive into timeouts no deployment would see. The
/// guard is held for the whole test.
pub async fn heavy() -> tokio::sync::MutexGuard<'static, ()> {
    static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    HEAVY.lock().await
}
