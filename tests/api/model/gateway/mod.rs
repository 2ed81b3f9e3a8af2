//! The whole gateway under faults, against the model's rules: two `dropgate serve` processes,
//! each behind fault proxies of its own to Redis and PostgreSQL, one of them with its clock
//! 30 s off, relaying claim events to a nats-server with JetStream of the test's own; a seeded
//! stream of every operation (`ops.rs`: claims of one unit and several with fresh keys, replays
//! and none, tokens with and without `sku` and for another SKU; confirms, cancels and holds
//! left to expire; waitlist joins, reads, leaves, offers claimed or left to lapse; restocks up
//! and down, restores, changes of terms; a SKU of four shards; a seated SKU's exact and
//! best-available claims and holds, `seats.rs`) from concurrent clients; the
//! seeded nemesis (`../nemesis`); and rows refused by a trigger until compensated.
//!
//! Every answer is checked as it comes (only the contract's statuses and codes), the state
//! twice a second (`monitor.rs`), and the whole history at the end (`checker.rs`,
//! `lifecycle.rs`). `MODEL_SEED` replays the operation stream and the faults;
//! `GATEWAY_MODEL_STEPS` sets its length; docs/testing.md has every knob.

pub mod admin;
pub mod checker;
pub mod history;
pub mod holds;
pub mod lifecycle;
pub mod monitor;
pub mod ops;
pub mod queue;
pub mod seats;
pub mod skus;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use super::nemesis::Nemesis;
use crate::helpers::*;
use crate::proxy::FaultProxy;
use crate::services::{GatewayProcess, PrivateNats, PrivateRedis};
use history::History;
use skus::{Knobs, SKUS};

const CLIENTS: usize = 8;
const FAKETIME_LIB: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

/// The environment that runs a gateway with its wall clock `offset` off (libfaketime from
/// Debian's `faketime`, installed when missing; the monotonic clock stays real).
pub fn skewed_clock(offset: &str) -> Vec<(&'static str, String)> {
    crate::tools::require("faketime", "faketime");
    assert!(
        std::path::Path::new(FAKETIME_LIB).exists(),
        "faketime is installed but {FAKETIME_LIB} is missing"
    );
    vec![
        ("LD_PRELOAD", FAKETIME_LIB.to_string()),
        ("FAKETIME", offset.to_string()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_string()),
        ("FAKETIME_NO_CACHE", "1".to_string()),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_keeps_every_invariant_under_seeded_faults() {
    let _heavy = crate::helpers::heavy().await;
    let started = Instant::now();
    let (seed, _) = super::scripts::seed_and_steps();
    let knobs = Knobs::from_env();
    let steps = knobs.steps;
    eprintln!("gateway model: MODEL_SEED={seed} GATEWAY_MODEL_STEPS={steps} {knobs:?}");
    let redis = PrivateRedis::start().await;
    let nats = PrivateNats::start().await;
    let iso = Isolation::new();
    let db_name = iso.database_url.rsplit('/').next().unwrap().to_string();
    let mut redis_proxies = Vec::new();
    let mut pg_proxies = Vec::new();
    let mut envs = Vec::new();
    for _ in 0..2 {
        let rp = FaultProxy::start(format!("127.0.0.1:{}", redis.port).parse().unwrap()).await;
        let pp = FaultProxy::start("127.0.0.1:5432".parse().unwrap()).await;
        envs.push(vec![
            (
                "DATABASE_URL",
                format!("postgres://postgres@{}/{db_name}", pp.addr),
            ),
            ("DROPGATE_REDIS_TIMEOUT_MS", "150".to_string()),
            ("DROPGATE_REPROCESS_MAX_ATTEMPTS", "3".to_string()),
            ("DROPGATE_NATS_URL", nats.url()),
            // A rotation under way: tokens signed by either secret verify (ops::own_token).
            (
                "DROPGATE_ADMISSION_SECRET",
                format!("{}={},{SECRET}", ops::ROTATED_KID, ops::ROTATED),
            ),
        ]);
        redis_proxies.push(Arc::new(rp));
        pg_proxies.push(Arc::new(pp));
    }
    // The second gateway's clock starts 30 s ahead or behind; the nemesis changes it.
    let mut rng = StdRng::seed_from_u64(seed.rotate_left(7));
    let skews = vec![
        None,
        Some(if rng.random_bool(0.5) { "+30s" } else { "-30s" }),
    ];
    let mut gateways = Vec::new();
    let mut bases = Vec::new();
    for i in 0..2 {
        let env_owned = super::nemesis::env_with(&envs[i], skews[i]);
        let env: Vec<(&str, &str)> = env_owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let g = GatewayProcess::start(&iso, &redis_proxies[i].url("redis"), &env).await;
        bases.push(g.base.clone());
        gateways.push(g);
    }
    let probe = Probe::new(&iso.database_url, &redis.url(), &iso.prefix).await;
    let nemesis = Nemesis {
        redis,
        nats,
        redis_proxies,
        pg_proxies,
        gateways,
        bases: Arc::new(Mutex::new(bases)),
        iso: Isolation {
            database_url: iso.database_url.clone(),
            prefix: iso.prefix.clone(),
        },
        envs,
        skews,
        gate: Arc::new(tokio::sync::RwLock::new(())),
        snapshot: None,
        knobs: knobs.clone(),
        db: probe.db.clone(),
        lock: None,
        counts: Default::default(),
    };
    sqlx::raw_sql(
        "CREATE OR REPLACE FUNCTION model_refuse() RETURNS trigger AS $$
         BEGIN
           IF NEW.user_id LIKE 'x%' AND NEW.status IN ('issued', 'held') THEN
             RAISE EXCEPTION 'model trigger refuses %', NEW.user_id;
           END IF;
           RETURN NEW;
         END $$ LANGUAGE plpgsql;
         CREATE TRIGGER model_refuse BEFORE INSERT ON issuances
           FOR EACH ROW EXECUTE FUNCTION model_refuse();",
    )
    .execute(&probe.db)
    .await
    .unwrap();
    let admin = Api::new(nemesis.bases.lock()[0].clone());
    for s in SKUS {
        let mut body = json!({"total": s.total, "per_user_limit": s.limit, "hold_seconds": s.hold,
                          "offer_seconds": s.offer, "shards": s.shards});
        queue::declare_extra(s.name, &mut body);
        seats::declare_extra(s.name, &mut body);
        let r = crate::lifecycle::declare_with(&admin, s.name, body).await;
        assert_eq!(r.status(), 201, "declare {}", s.name);
    }

    let history = Arc::new(Mutex::new(History::default()));
    let next = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let (bases, gate) = (nemesis.bases.clone(), nemesis.gate.clone());
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let (bases, history, next, gate, knobs, probe) = (
            bases.clone(),
            history.clone(),
            next.clone(),
            gate.clone(),
            knobs.clone(),
            probe.clone(),
        );
        clients.push(tokio::spawn(async move {
            let http = reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap();
            loop {
                // Steps run under the read side; the nemesis takes the write side to quiesce
                // the clients.
                let _open = gate.read().await;
                let step = next.fetch_add(1, Ordering::Relaxed);
                if step >= steps {
                    return Ok::<(), String>(());
                }
                let mut rng =
                    StdRng::seed_from_u64(seed ^ step.wrapping_mul(0xA24B_AED4_963E_E407));
                let base = {
                    let b = bases.lock();
                    b[rng.random_range(0..b.len())].clone()
                };
                let cx = ops::Ctx {
                    http: &http,
                    base: &base,
                    history: &history,
                    knobs: &knobs,
                    probe: Some(&probe),
                };
                ops::step(&cx, &mut rng, step)
                    .await
                    .map_err(|e| format!("step {step}: {e}"))?;
            }
        }));
    }
    let nemesis_bases = nemesis.bases.clone();
    let nemesis = tokio::spawn(nemesis.run(seed, done.clone()));
    let monitor = tokio::spawn(monitor::monitor(
        probe.clone(),
        nemesis_bases.clone(),
        done.clone(),
    ));
    let mut failure = None;
    for c in clients {
        if let Err(e) = c.await.unwrap() {
            // Each client stops at its first failure; all of them are shown.
            eprintln!("gateway model: client failed: {e}");
            failure.get_or_insert(e);
        }
    }
    let ran = started.elapsed();
    done.store(true, Ordering::Relaxed);
    let nemesis = nemesis.await.unwrap();
    if let Err(e) = monitor.await.unwrap() {
        failure.get_or_insert(e);
    }
    let history = std::mem::take(&mut *history.lock());
    eprintln!(
        "gateway model: {steps} steps in {ran:?}; {} claims ({} replays); faults {:?}; \
         answers {:?}",
        history.attempts.len(),
        history.attempts.iter().filter(|a| a.replayed).count(),
        nemesis.counts,
        history.answers
    );
    let fail = |e: String| -> ! {
        panic!(
            "gateway model failed (replay with MODEL_SEED={seed} GATEWAY_MODEL_STEPS={steps}): {e}"
        )
    };
    if let Some(e) = failure {
        fail(e);
    }
    let api = Api::new(bases.lock()[0].clone());
    if let Err(e) = final_checks(&api, &probe, &nemesis.nats, &history).await {
        fail(e);
    }
    eprintln!("gateway model: passed in {:?}", started.elapsed());
}

async fn final_checks(
    api: &Api,
    probe: &Probe,
    nats: &PrivateNats,
    history: &History,
) -> Result<(), String> {
    checker::settle(api, probe).await?;
    let rows = checker::ledger(probe).await?;
    checker::check_ledger(api, probe, history, &rows).await?;
    lifecycle::check_lifecycle(api, probe, history, &rows).await?;
    let deadline = Instant::now() + Duration::from_secs(90);
    while crate::outbox::unsent(&probe.db).await > 0 {
        if Instant::now() > deadline {
            return Err("the relay left events unsent for 90 s after the run".into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let events = lifecycle::check_events(nats, &rows).await?;
    eprintln!(
        "gateway model: {} ledger rows, {events} events, all agree",
        rows.len()
    );
    // Last: it sells q0 out and back.
    queue::check(api, probe, history).await
}
