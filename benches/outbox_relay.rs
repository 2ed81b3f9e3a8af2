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
//!    throughput over the drop, and how long after the last winner every event was
//!    acknowledged. (The writer's `claim.won` is its `issuances` row, read past the relays'
//!    cursor: it keeps no time of its acknowledgement, so per-event lag percentiles are
//!    `dropgate_outbox_lag_seconds`' business, scraped here from `/metrics`.)
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
        // The relay's own backlog queries (index scans, stopping at the first event left), not
        // the view, which reads every row: polled every 20 ms, the view would be most of
        // PostgreSQL's CPU in the run.
        let (rows, _) = dropgate::outbox::store::backlog(db, 1)
            .await
            .expect("counting the backlog");
        let (won, _) = dropgate::outbox::cursor::backlog(db, 1)
            .await
            .expect("counting the backlog");
        if rows + won == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The events of `sku` acknowledged, and the relay's lag histogram (decision to acknowledgement
/// for the writer's `claim.won`): its mean and the bucket bound below which 99 % fall.
async fn report(db: &PgPool, base: &str, sku: &str, label: &str, drained: f64) {
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM claim_events WHERE sku = $1 AND sent")
        .bind(sku)
        .fetch_one(db)
        .await
        .expect("reading the events");
    let metrics = reqwest::get(format!("{base}/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics body");
    let value = |name: &str| -> Vec<(String, f64)> {
        metrics
            .lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| {
                let (k, v) = l.rsplit_once(' ')?;
                Some((k.to_string(), v.parse().ok()?))
            })
            .collect()
    };
    let count = value("dropgate_outbox_lag_seconds_count")
        .first()
        .map_or(0.0, |v| v.1);
    let sum = value("dropgate_outbox_lag_seconds_sum")
        .first()
        .map_or(0.0, |v| v.1);
    let p99 = value("dropgate_outbox_lag_seconds_bucket")
        .into_iter()
        .find(|(_, v)| *v >= 0.99 * count)
        .map(|(k, _)| k);
    println!(
        "{label}: {n} events acknowledged {drained:.2} s after the last answer; lag (all events so far) mean {:.1} ms, p99 bucket {}",
        1000.0 * sum / count.max(1.0),
        p99.unwrap_or_default()
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
        let ended = Instant::now();
        wait_sent(&db).await;
        let drained = ended.elapsed().as_secs_f64();
        report(&db, &base, "peak", "relay during the drop", drained).await;

        nats.stop();
        let (won, _) = drop_claims(&base, "backlog", "q", backlog, connections).await;
        // Every winner's event waits in the outbox before NATS comes back.
        loop {
            let n: i64 = sqlx::query_scalar("SELECT count(*) FROM issuances WHERE sku = 'backlog'")
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
        println!(
            "backlog drain: {won} events in {drained:.2} s from nats-server start (reconnect included) = {:.0} events/s",
            won as f64 / drained,
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
