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

mod buyer;
mod checkout;
mod queue;
mod seats;

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
        .pool_max_idle_per_host(args.buyers())
        .build()?;
    let name = format!("demo-{}", chrono::Utc::now().format("%Y%m%d-%H%M%S-%3f"));
    let sku = SkuId::parse(&name).context("the demo's SKU id")?;
    let admin_auth = format!("Bearer {}", admin.expose());
    if args.seats {
        let arena = seats::Arena {
            http: &http,
            base: &base,
            admin_auth: &admin_auth,
            secret: &secret,
        };
        let done = arena.run(&args, sku).await;
        shutdown.cancel();
        let _ = server.await;
        return done;
    }
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
        args.units,
        args.buyers()
    );

    let barrier = Arc::new(Barrier::new(args.buyers()));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(args.buyers());
    let mut tokens = std::collections::HashMap::new();
    for i in 0..args.buyers() {
        let token = crate::auth::mint(&secret, &format!("buyer-{i}"), Some(sku.as_str()), 600)?;
        tokens.insert(format!("buyer-{i}"), token.clone());
        let (http, barrier, url) = (
            http.clone(),
            barrier.clone(),
            format!("{base}/v1/skus/{sku}/claims"),
        );
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            buyer::buy(&http, &url, &token, &format!("demo-{i}")).await
        }));
    }
    let (mut won, mut sold_out) = (0, 0);
    // Answers that are neither, and the first answers tried again, by status and code.
    let (mut other, mut retried) = (
        std::collections::BTreeMap::<String, usize>::new(),
        std::collections::BTreeMap::<String, usize>::new(),
    );
    // Microseconds, 1 µs to 60 s, 3 significant digits (HdrHistogram's quantiles).
    let mut latencies = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)
        .expect("constant bounds hdrhistogram accepts");
    let (mut winners, mut losers) = (Vec::new(), Vec::new());
    for (i, t) in tasks.into_iter().enumerate() {
        let b = t.await?;
        let took = b.first_took;
        latencies.saturating_record(u64::try_from(took.as_micros()).unwrap_or(u64::MAX).max(1));
        if let Some(first) = b.retried {
            *retried.entry(first).or_default() += 1;
        }
        match (b.status, b.claim_id) {
            (201, Some(id)) => {
                won += 1;
                winners.push((format!("buyer-{i}"), id));
            }
            (409, _) if b.code == "sold_out" => {
                sold_out += 1;
                losers.push(format!("buyer-{i}"));
            }
            (status, _) => *other.entry(buyer::answer(status, &b.code)).or_default() += 1,
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
    println!("other:      {}", by_answer(&other));
    println!(
        "retried:    {} (a front end tries a 429 or 503 again with the same Idempotency-Key)",
        by_answer(&retried)
    );
    println!("remaining:  {}", view["remaining"]);
    println!(
        "latency:    p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms of first answers ({} buyers answered in {:.0} ms)",
        pct(0.50),
        pct(0.99),
        latencies.max() as f64 / 1e3,
        args.buyers(),
        wall.as_secs_f64() * 1e3
    );
    println!("{}", ledger_line(&view));
    let expected_won = args.units.min(args.buyers() as i64);
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

/// `n` answers in all, then each kind: "3 (503 outcome_unknown 2, 429 overloaded 1)".
fn by_answer(kinds: &std::collections::BTreeMap<String, usize>) -> String {
    let n: usize = kinds.values().sum();
    if n == 0 {
        return "0".into();
    }
    let each: Vec<String> = kinds.iter().map(|(k, v)| format!("{k} {v}")).collect();
    format!("{n} ({})", each.join(", "))
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

/// The summary's ledger line: the SKU view's books and whether they balance.
fn ledger_line(view: &serde_json::Value) -> String {
    format!(
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
    )
}
