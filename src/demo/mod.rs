//! `dropgate demo`: a whole drop on this machine. Seeds a SKU, starts the real gateway in
//! process on port 0, releases every buyer at once over real HTTP, waits for the writer, and
//! prints the outcome and the ledger check.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::sync::Barrier;
use tokio_util::sync::CancellationToken;

use crate::cli::DemoArgs;
use crate::sku::SkuId;

mod checkout;
mod queue;

pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    // A gateway of its own: the stores given, every other setting at its default, and a
    // secret and admin token nobody else knows.
    let mut raw = args.stores.clone().into_raw();
    raw.admission_secret = Some(format!("demo-{}", uuid::Uuid::new_v4().simple()));
    raw.admin_token = Some(format!("admin-{}", uuid::Uuid::new_v4().simple()));
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
    let name = format!("demo-{}", chrono::Utc::now().format("%Y%m%d-%H%M%S-%3f"));
    let sku = SkuId::parse(&name).context("the demo's SKU id")?;
    let admin_auth = format!("Bearer {}", admin.expose());
    if args.queue {
        let room = queue::Room {
            http: &http,
            base: &base,
            admin_auth: &admin_auth,
            secret: &secret,
        };
        let done = room.run(&args, sku).await;
        shutdown.cancel();
        let _ = server.await;
        return done;
    }
    let resp = http
        .put(format!("{base}/admin/skus/{sku}"))
        .header("authorization", &admin_auth)
        .json(
            &serde_json::json!({"total": args.units, "per_user_limit": 1,
                                  "hold_seconds": args.hold_seconds}),
        )
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
    let mut tokens = std::collections::HashMap::new();
    for i in 0..args.buyers {
        let token = crate::auth::mint(&secret, &format!("buyer-{i}"), Some(sku.as_str()), 600)?;
        tokens.insert(format!("buyer-{i}"), token.clone());
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
            let took = t.elapsed();
            match r {
                Ok(r) => {
                    let status = r.status().as_u16();
                    let body: serde_json::Value = r.json().await.unwrap_or_default();
                    let id = body["claim_id"].as_str().map(str::to_string);
                    (status, took, id)
                }
                Err(_) => (0, took, None),
            }
        }));
    }
    let (mut won, mut sold_out, mut other) = (0, 0, 0);
    // Microseconds, 1 µs to 60 s, 3 significant digits (HdrHistogram's quantiles).
    let mut latencies = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)
        .expect("constant bounds hdrhistogram accepts");
    let (mut winners, mut losers) = (Vec::new(), Vec::new());
    for (i, t) in tasks.into_iter().enumerate() {
        let (status, took, id) = t.await?;
        latencies.saturating_record(u64::try_from(took.as_micros()).unwrap_or(u64::MAX).max(1));
        match (status, id) {
            (201, Some(id)) => {
                won += 1;
                winners.push((format!("buyer-{i}"), id));
            }
            (409, _) => {
                sold_out += 1;
                losers.push(format!("buyer-{i}"));
            }
            _ => other += 1,
        }
    }
    let wall = started.elapsed();
    let pct = |q: f64| latencies.value_at_quantile(q) as f64 / 1e3;

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
    let checkout = if args.hold_seconds > 0 {
        let c = checkout::Checkout {
            http: &http,
            base: &base,
            sku,
            admin_auth: &admin_auth,
            tokens: &tokens,
            hold_seconds: args.hold_seconds,
            confirm_percent: args.confirm_percent,
            cancel_percent: args.cancel_percent,
        };
        Some(c.run(&winners, &losers).await?)
    } else {
        None
    };
    let view = checkout.unwrap_or(view);
    shutdown.cancel();
    let _ = server.await;

    println!("won:        {won}");
    println!("sold out:   {sold_out}");
    println!("other:      {other}");
    println!("remaining:  {}", view["remaining"]);
    println!(
        "latency:    p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({} requests in {:.0} ms)",
        pct(0.50),
        pct(0.99),
        latencies.max() as f64 / 1e3,
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
    if args.hold_seconds > 0 {
        println!(
            "units:      {} confirmed, {} held, {} back in stock, {} offered, {} waiting (of {})",
            view["confirmed"],
            view["held"],
            view["remaining"],
            view["offered"],
            view["waiting"],
            args.units
        );
        return balanced(
            won == expected_won && view["consistent"] == true,
            won,
            expected_won,
        );
    }
    balanced(
        won == expected_won && view["recorded"] == expected_won && view["consistent"] == true,
        won,
        expected_won,
    )
}

/// The verdict: a drop that did not balance exits 1, like a reconcile that finds a mismatch.
fn balanced(ok: bool, won: i64, expected: i64) -> anyhow::Result<()> {
    use crate::startup::{Exit, Failure};
    if ok {
        return Ok(());
    }
    Err(Failure::new(
        Exit::Mismatch,
        format!("the drop did not balance: won {won}, expected {expected}"),
    )
    .into())
}
