//! `dropgate demo`: a whole drop on this machine. Seeds a SKU, starts the real gateway in
//! process on port 0, releases every buyer at once over real HTTP, waits for the writer, and
//! prints the outcome and the ledger check.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::sync::Barrier;
use tokio_util::sync::CancellationToken;

use crate::cli::DemoArgs;

pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    let mut raw = args.config;
    let secret = format!("demo-{}", uuid::Uuid::new_v4().simple());
    let admin = format!("admin-{}", uuid::Uuid::new_v4().simple());
    raw.admission_secret.get_or_insert(secret);
    raw.admin_token.get_or_insert(admin);
    raw.listen = "127.0.0.1:0".into();
    let config = raw.validate()?;
    let secret = config.admission_secret.clone();
    let admin = config
        .admin_token
        .clone()
        .context("an admin token was just set")?;
    let app = crate::app::Application::build(config).await?;
    let base = format!("http://{}", app.local_addr()?);
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(app.run_until_stopped(shutdown.clone()));

    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(args.buyers)
        .build()?;
    let sku = format!("demo-{}", chrono::Utc::now().format("%Y%m%d-%H%M%S-%3f"));
    let admin_auth = format!("Bearer {}", admin.expose());
    let resp = http
        .put(format!("{base}/admin/skus/{sku}"))
        .header("authorization", &admin_auth)
        .json(&serde_json::json!({"total": args.units, "per_user_limit": 1}))
        .send()
        .await?;
    anyhow::ensure!(resp.status() == 201, "declaring {sku}: {}", resp.status());
    println!(
        "declared {sku}: {} units, {} buyers released together",
        args.units, args.buyers
    );

    let barrier = Arc::new(Barrier::new(args.buyers));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(args.buyers);
    for i in 0..args.buyers {
        let token = crate::auth::mint(&secret, &format!("buyer-{i}"), Some(&sku), 600)?;
        let (http, barrier, url) = (
            http.clone(),
            barrier.clone(),
            format!("{base}/v1/skus/{sku}/claims"),
        );
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let t = Instant::now();
            let r = http
                .post(url)
                .header("authorization", format!("Bearer {token}"))
                .header("idempotency-key", format!("demo-{i}"))
                .json(&serde_json::json!({"quantity": 1}))
                .send()
                .await;
            (r.map(|r| r.status().as_u16()).unwrap_or(0), t.elapsed())
        }));
    }
    let (mut won, mut sold_out, mut other) = (0, 0, 0);
    let mut latencies = Vec::with_capacity(args.buyers);
    for t in tasks {
        let (status, took) = t.await?;
        latencies.push(took);
        match status {
            201 => won += 1,
            409 => sold_out += 1,
            _ => other += 1,
        }
    }
    let wall = started.elapsed();
    latencies.sort();
    let pct = |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];

    // Wait for the writer to record every winner, bounded.
    let deadline = Instant::now() + Duration::from_secs(30);
    let view = loop {
        let v: serde_json::Value = http
            .get(format!("{base}/admin/skus/{sku}"))
            .header("authorization", &admin_auth)
            .send()
            .await?
            .json()
            .await?;
        if v["in_flight"] == 0 || Instant::now() > deadline {
            break v;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    shutdown.cancel();
    let _ = server.await;

    println!("won:        {won}");
    println!("sold out:   {sold_out}");
    println!("other:      {other}");
    println!("remaining:  {}", view["remaining"]);
    println!(
        "latency:    p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({} requests in {:.0} ms)",
        pct(0.50).as_secs_f64() * 1e3,
        pct(0.99).as_secs_f64() * 1e3,
        latencies.last().map_or(0.0, |d| d.as_secs_f64() * 1e3),
        args.buyers,
        wall.as_secs_f64() * 1e3
    );
    println!(
        "ledger:     recorded {} in_flight {} pending {} compensated {} -> {}",
        view["recorded"],
        view["in_flight"],
        view["pending"],
        view["compensated"],
        if view["consistent"] == true {
            "consistent"
        } else {
            "MISMATCH"
        }
    );
    let expected_won = args.units.min(args.buyers as i64);
    anyhow::ensure!(
        won == expected_won && view["recorded"] == expected_won && view["consistent"] == true,
        "the drop did not balance: won {won}, expected {expected_won}"
    );
    Ok(())
}
