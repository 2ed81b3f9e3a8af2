//! Measured run of the outbox relay (not criterion: one drop, numbers printed, nothing
//! asserted on time).
//!
//! Needs PostgreSQL and Redis on their local defaults and `nats-server` on the PATH; starts
//! its own nats-server on a free port, and a gateway in this process with its own database
//! and key prefix.
//!
//! ```text
//! cargo bench --bench outbox_relay                       # defaults below
//! UNITS=40000 CONNECTIONS=64 BACKLOG=40000 cargo bench --bench outbox_relay
//! ```
//!
//! 1. **Peak-rate drop**: `UNITS` units, `CONNECTIONS` clients claiming as fast as the gateway
//!    answers (distinct buyers) until sold out, NATS up. Prints the claim rate, the relay's
//!    throughput over the drop, and the lag of each event from its insert into `outbox` (its
//!    transaction commits right after) to its row being marked sent (right after JetStream's
//!    acknowledgement): p50, p99, max; and from the claim's decision in Redis to the same.
//! 2. **Backlog drain**: NATS stopped, `BACKLOG` more winners (their events wait in the
//!    outbox), NATS started again: the relay's throughput draining the backlog.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dropgate::app::Application;
use dropgate::config::{RawConfig, Secret};
use sqlx::PgPool;
use uuid::Uuid;

const SECRET: &str = "bench-admission-secret-0123456789";
const ADMIN: &str = "bench-admin-token-0123456789";

fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Nats {
    port: u16,
    dir: std::path::PathBuf,
    child: Option<std::process::Child>,
}

impl Nats {
    fn start(&mut self) {
        let child = std::process::Command::new("nats-server")
            .args(["-js", "-a", "127.0.0.1", "-p", &self.port.to_string()])
            .arg("-sd")
            .arg(&self.dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("nats-server is on the PATH");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "nats-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `buyers` distinct users claim one unit each over `connections` clients. Returns the winners
/// and the seconds it took.
async fn drop_claims(
    base: &str,
    sku: &str,
    tag: &str,
    buyers: usize,
    connections: usize,
) -> (usize, f64) {
    let tokens: Arc<Vec<String>> = Arc::new(
        (0..buyers)
            .map(|i| {
                dropgate::auth::mint(&Secret::new(SECRET), &format!("{tag}-{i}"), None, 3600)
                    .expect("minting a token")
            })
            .collect(),
    );
    let next = Arc::new(AtomicUsize::new(0));
    let won = Arc::new(AtomicUsize::new(0));
    let url = format!("{base}/v1/skus/{sku}/claims");
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..connections {
        let (tokens, next, won, url) = (tokens.clone(), next.clone(), won.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            let http = reqwest::Client::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= tokens.len() {
                    break;
                }
                let r = http
                    .post(&url)
                    .bearer_auth(&tokens[i])
                    .body("{}")
                    .send()
                    .await;
                if r.is_ok_and(|r| r.status() == 201) {
                    won.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("client task");
    }
    (won.load(Ordering::Relaxed), started.elapsed().as_secs_f64())
}

async fn wait_sent(db: &PgPool) {
    loop {
        let unsent: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox WHERE sent_at IS NULL")
            .fetch_one(db)
            .await
            .expect("counting the backlog");
        if unsent == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// events, events/s between the first row written and the last marked sent, and lag
/// percentiles in ms, for the events of `sku`.
async fn report(db: &PgPool, sku: &str, label: &str) {
    let (n, span, p50, p99, max, e2e_p99): (i64, f64, f64, f64, f64, f64) = sqlx::query_as(
        "SELECT count(*),
                EXTRACT(EPOCH FROM max(sent_at) - min(created_at))::float8,
                1000 * percentile_cont(0.5) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM sent_at - created_at)),
                1000 * percentile_cont(0.99) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM sent_at - created_at)),
                1000 * max(EXTRACT(EPOCH FROM sent_at - created_at))::float8,
                1000 * percentile_cont(0.99) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM sent_at - occurred_at))
           FROM outbox WHERE sku = $1",
    )
    .bind(sku)
    .fetch_one(db)
    .await
    .expect("reading the outbox");
    println!(
        "{label}: {n} events, {:.0} events/s (first insert to last ack); insert->ack lag p50 {p50:.1} ms, p99 {p99:.1} ms, max {max:.1} ms; claim decided->ack p99 {e2e_p99:.1} ms",
        n as f64 / span
    );
}

fn main() {
    let units = env_num("UNITS", 20_000);
    let connections = env_num("CONNECTIONS", 64);
    let backlog = env_num("BACKLOG", 20_000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async move {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let dir = std::env::temp_dir().join(format!("dropgate-bench-nats-{}", Uuid::new_v4().simple()));
        let mut nats = Nats { port, dir, child: None };
        nats.start();
        let id = Uuid::new_v4().simple().to_string();
        let raw = RawConfig {
            listen: "127.0.0.1:0".into(),
            database_url: format!("postgres://postgres@127.0.0.1:5432/dg_bench_outbox_{}", &id[..12]),
            key_prefix: format!("b{}", &id[..12]),
            admission_secret: Some(SECRET.into()),
            admin_token: Some(ADMIN.into()),
            nats_url: Some(format!("nats://127.0.0.1:{port}")),
            max_queue: "100000".into(),
            ..RawConfig::default()
        };
        let config = raw.validate().expect("bench configuration");
        let database_url = config.database_url.clone();
        let app = Application::build(config).await.expect("the gateway starts");
        let base = format!("http://{}", app.local_addr().expect("bound"));
        let shutdown = tokio_util::sync::CancellationToken::new();
        let server = tokio::spawn(app.run_until_stopped(shutdown.clone()));
        let db = PgPool::connect(&database_url).await.expect("PostgreSQL");
        let http = reqwest::Client::new();
        for (sku, total) in [("peak", units), ("backlog", backlog)] {
            let r = http
                .put(format!("{base}/admin/skus/{sku}"))
                .bearer_auth(ADMIN)
                .body(format!("{{\"total\": {total}, \"per_user_limit\": 1}}"))
                .send()
                .await
                .expect("declare");
            assert!(r.status().is_success(), "declare {sku}: {}", r.status());
        }

        let (won, secs) = drop_claims(&base, "peak", "p", units, connections).await;
        println!(
            "peak-rate drop: {won} winners of {units} units over {connections} connections in {secs:.2} s = {:.0} claims/s (gateway, load generator, Redis, PostgreSQL and NATS on one machine)",
            won as f64 / secs
        );
        wait_sent(&db).await;
        report(&db, "peak", "relay during the drop").await;

        nats.stop();
        let (won, _) = drop_claims(&base, "backlog", "q", backlog, connections).await;
        // Every winner's event waits in the outbox before NATS comes back.
        loop {
            let n: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox WHERE sku = 'backlog'")
                .fetch_one(&db)
                .await
                .expect("counting");
            if n as usize >= won {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let restarted = Instant::now();
        nats.start();
        wait_sent(&db).await;
        let drained = restarted.elapsed().as_secs_f64();
        let (first, last): (f64, f64) = sqlx::query_as(
            "SELECT EXTRACT(EPOCH FROM min(sent_at))::float8, EXTRACT(EPOCH FROM max(sent_at))::float8
               FROM outbox WHERE sku = 'backlog'",
        )
        .fetch_one(&db)
        .await
        .expect("reading the outbox");
        println!(
            "backlog drain: {won} events in {drained:.2} s from nats-server start (reconnect included) = {:.0} events/s; {:.0} events/s from first to last ack",
            won as f64 / drained,
            won as f64 / (last - first).max(1e-3)
        );
        shutdown.cancel();
        let _ = server.await;
        db.close().await;
        // Leave the shared Redis as it was.
        if let Ok(mut con) = redis::Client::open("redis://127.0.0.1:6379")
            .and_then(|c| c.get_connection())
        {
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(format!("b{}:*", &id[..12]))
                .query(&mut con)
                .unwrap_or_default();
            if !keys.is_empty() {
                let _: redis::RedisResult<()> = redis::cmd("DEL").arg(keys).query(&mut con);
            }
        }
        let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS \"dg_bench_outbox_{}\" WITH (FORCE)",
            &id[..12]
        )))
        .execute(&PgPool::connect("postgres://postgres@127.0.0.1:5432/postgres").await.expect("PostgreSQL"))
        .await;
    });
}
