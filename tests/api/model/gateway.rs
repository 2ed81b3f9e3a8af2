//! The whole gateway under faults, against the model's rules: two `dropgate serve` processes
//! behind fault proxies to Redis and PostgreSQL, a seeded stream of claims (fresh keys,
//! retries of old keys, no keys), restocks, restores and lookups from concurrent clients, the
//! seeded nemesis of `nemesis.rs`, and rows refused by a trigger until compensated.
//!
//! Every answer is checked as it comes (only the contract's statuses and codes), the state
//! twice a second (no oversell, no stock below 0, no count over the limit), and the whole
//! history at the end: every 201 in the ledger, no unit moved by a request answered 503 `unavailable`, one
//! claim per key, replays of the first win, unknown outcomes settled, the ledger balanced.
//! `MODEL_SEED` replays the operation stream; `GATEWAY_MODEL_STEPS` (10,000) sets its length.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::helpers::*;
use crate::proxy::{FaultProxy, Mode};

use super::nemesis::Nemesis;
use crate::services::{GatewayProcess, PrivateRedis};

pub const SKUS: &[(&str, i64, i64)] = &[("m0", 300, 1), ("m1", 500, 3), ("m2", 200, 2)];
const USERS_PER_SKU: usize = 400;
const CLIENTS: usize = 8;

#[derive(Debug, Clone)]
struct Attempt {
    sku: String,
    user: String,
    key: Option<String>,
    qty: i64,
    status: u16,
    code: String,
    claim_id: Option<Uuid>,
    replayed: bool,
}

#[derive(Default)]
struct History {
    attempts: Vec<Attempt>,
    /// Keys used so far, per (sku, user), with their quantity, for retries.
    keys: HashMap<(String, String), Vec<(String, i64)>>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_keeps_every_invariant_under_seeded_faults() {
    let _heavy = crate::helpers::heavy().await;
    let (seed, _) = super::scripts::seed_and_steps();
    let steps: u64 = std::env::var("GATEWAY_MODEL_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000);
    eprintln!("gateway model: MODEL_SEED={seed} GATEWAY_MODEL_STEPS={steps}");
    let redis = PrivateRedis::start().await;
    let redis_proxy =
        Arc::new(FaultProxy::start(format!("127.0.0.1:{}", redis.port).parse().unwrap()).await);
    let pg_proxy = Arc::new(FaultProxy::start("127.0.0.1:5432".parse().unwrap()).await);
    let iso = Isolation::new();
    let db_name = iso.database_url.rsplit('/').next().unwrap().to_string();
    let env_owned = [
        (
            "DATABASE_URL",
            format!("postgres://postgres@{}/{db_name}", pg_proxy.addr),
        ),
        ("DROPGATE_REDIS_TIMEOUT_MS", "150".to_string()),
        ("DROPGATE_REPROCESS_MAX_ATTEMPTS", "3".to_string()),
    ];
    let env: Vec<(&str, &str)> = env_owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let redis_url = redis_proxy.url("redis");
    let gateways = vec![
        GatewayProcess::start(&iso, &redis_url, &env).await,
        GatewayProcess::start(&iso, &redis_url, &env).await,
    ];
    let bases = Arc::new(Mutex::new(
        gateways.iter().map(|g| g.base.clone()).collect::<Vec<_>>(),
    ));
    let probe = Probe::new(&iso.database_url, &redis.url(), &iso.prefix).await;
    sqlx::raw_sql(
        "CREATE OR REPLACE FUNCTION model_refuse() RETURNS trigger AS $$
         BEGIN
           IF NEW.user_id LIKE 'x%' AND NEW.status = 'issued' THEN
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
    let admin = Api::new(bases.lock()[0].clone());
    for (sku, total, limit) in SKUS {
        assert_eq!(admin.declare(sku, *total, *limit).await.status(), 201);
    }

    let history = Arc::new(Mutex::new(History::default()));
    let next = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    // Steps run under the read side; the nemesis takes the write side to quiesce the clients
    // (a rollback of Redis is staged on a drained ledger, so no winner is lost by design).
    let gate = Arc::new(tokio::sync::RwLock::new(()));
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let (bases, history, next, gate) =
            (bases.clone(), history.clone(), next.clone(), gate.clone());
        clients.push(tokio::spawn(async move {
            let http = reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap();
            loop {
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
                client_step(&http, &base, &mut rng, step, &history)
                    .await
                    .map_err(|e| format!("step {step}: {e}"))?;
            }
        }));
    }
    // The nemesis: a fault every few hundred milliseconds until the clients are done.
    let nemesis = Nemesis {
        redis,
        redis_proxy: redis_proxy.clone(),
        pg_proxy: pg_proxy.clone(),
        gateways,
        bases: bases.clone(),
        iso: Isolation {
            database_url: iso.database_url.clone(),
            prefix: iso.prefix.clone(),
        },
        env: env_owned.to_vec(),
        redis_url: redis_url.clone(),
        gate: gate.clone(),
        snapshot: None,
    };
    let nemesis = tokio::spawn(nemesis.run(seed, done.clone()));
    let monitor = tokio::spawn(monitor(probe.clone(), done.clone()));
    let mut failure = None;
    for c in clients {
        if let Err(e) = c.await.unwrap() {
            failure.get_or_insert(e);
        }
    }
    done.store(true, Ordering::Relaxed);
    let (faults, _nemesis) = nemesis.await.unwrap();
    if let Err(e) = monitor.await.unwrap() {
        failure.get_or_insert(e);
    }
    redis_proxy.set(Mode::Pass);
    pg_proxy.set(Mode::Pass);
    if let Some(e) = failure {
        panic!("gateway model failed (replay with MODEL_SEED={seed}): {e}");
    }
    let history = std::mem::take(&mut *history.lock());
    let mut answers: std::collections::BTreeMap<String, usize> = Default::default();
    for a in &history.attempts {
        *answers
            .entry(format!("{} {}", a.status, a.code))
            .or_default() += 1;
    }
    eprintln!(
        "gateway model: {} claims, {faults} faults, answers {answers:?}",
        history.attempts.len()
    );
    let api = Api::new(bases.lock()[0].clone());
    if let Err(e) = check_history(&api, &probe, &history).await {
        panic!("gateway model failed (replay with MODEL_SEED={seed}): {e}");
    }
}

async fn client_step(
    http: &reqwest::Client,
    base: &str,
    rng: &mut StdRng,
    step: u64,
    history: &Mutex<History>,
) -> Result<(), String> {
    let (sku, _, limit) = SKUS[rng.random_range(0..SKUS.len())];
    let roll = rng.random_range(0..100);
    if roll < 4 {
        let delta = if rng.random_bool(0.6) {
            rng.random_range(1..6)
        } else {
            -rng.random_range(1..4)
        };
        let r = http
            .post(format!("{base}/admin/skus/{sku}/restock"))
            .bearer_auth(ADMIN)
            .json(&json!({ "delta": delta }))
            .send()
            .await;
        return expect_one_of(r, &[(200, ""), (409, "insufficient_stock"), (503, "*")]).await;
    }
    if roll < 5 {
        let r = http
            .post(format!("{base}/admin/skus/{sku}/restore?force=true"))
            .bearer_auth(ADMIN)
            .send()
            .await;
        // Two restores whose locks overlapped (a connection cut): the later finds the state
        // the earlier rebuilt from the same ledger, and says so.
        return expect_one_of(r, &[(200, ""), (409, "state_present"), (503, "*")]).await;
    }
    // One buyer in twenty has every row refused by the trigger: those claims get compensated.
    let user = if rng.random_bool(0.05) {
        format!("x{}-{sku}", rng.random_range(0..USERS_PER_SKU))
    } else {
        format!("u{}-{sku}", rng.random_range(0..USERS_PER_SKU))
    };
    let prior = history
        .lock()
        .keys
        .get(&(sku.to_string(), user.clone()))
        .cloned()
        .unwrap_or_default();
    let (key, qty) = match rng.random_range(0..10) {
        0..=6 => (Some(format!("k{step}")), rng.random_range(1..=limit)),
        7 | 8 if !prior.is_empty() => {
            let (k, q) = prior[rng.random_range(0..prior.len())].clone();
            (Some(k), q)
        }
        _ => (None, rng.random_range(1..=limit)),
    };
    let mut req = http
        .post(format!("{base}/v1/skus/{sku}/claims"))
        .bearer_auth(token(&user))
        .json(&json!({ "quantity": qty }));
    if let Some(k) = &key {
        req = req.header("idempotency-key", k);
        history
            .lock()
            .keys
            .entry((sku.to_string(), user.clone()))
            .or_default()
            .push((k.clone(), qty));
    }
    let (status, body, replayed) = match req.send().await {
        Ok(r) => {
            let replayed = r.headers().contains_key("idempotency-replayed");
            let s = r.status().as_u16();
            (s, r.json::<Value>().await.unwrap_or(Value::Null), replayed)
        }
        // The gateway was killed mid-request: the outcome is unknown to the client.
        Err(_) => (0, Value::Null, false),
    };
    let code = code(&body).to_string();
    let allowed = matches!(
        (status, code.as_str()),
        (201, "")
            | (409, "sold_out" | "limit_reached")
            | (422, "idempotency_key_reused")
            | (429, "overloaded")
            | (503, "unavailable" | "outcome_unknown")
            | (0, "")
    );
    if !allowed {
        return Err(format!("claim answered {status} {body}"));
    }
    let claim_id = body["claim_id"].as_str().and_then(|s| s.parse().ok());
    if (status == 201 || code == "outcome_unknown") && claim_id.is_none() {
        return Err(format!("{status} {code} without a claim id: {body}"));
    }
    if status == 201
        && (body["user"] != user.as_str() || body["quantity"] != qty || body["sku"] != sku)
    {
        return Err(format!("201 for another request: {body}"));
    }
    history.lock().attempts.push(Attempt {
        sku: sku.into(),
        user,
        key,
        qty,
        status,
        code,
        claim_id,
        replayed,
    });
    Ok(())
}

/// A SKU's per-user counts and its stock, as Redis holds them.
type UsersAndStock = (Vec<(String, i64)>, Option<i64>);

/// Checks, twice a second while the clients run, what must hold at every instant: no Redis
/// stock below 0, no buyer's Redis count over the limit; and no SKU with more live units in the
/// ledger than its total in two reads in a row. One read over may be the ledger lagging Redis:
/// a writer's batch writes its winners before it applies its status changes (a status change
/// needs its claim's row, which may be in the same batch: src/writer/mod.rs), so a batch
/// holding a hold's expiry and the win of the unit it gave back shows both live between its
/// two statements; two writers of one journal can do the same across batches; and a parked
/// claim's row is closed after its units went back. An oversell stays over. Each such read is
/// printed, so a failing run shows whether it was one.
async fn monitor(probe: Probe, done: Arc<AtomicBool>) -> Result<(), String> {
    let mut over: std::collections::HashMap<String, (i64, i64)> = Default::default();
    while !done.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let rows: Vec<(String, i64, i64)> = match sqlx::query_as(
            "SELECT s.sku, s.total,
                    (SELECT COALESCE(SUM(quantity), 0)::bigint FROM issuances i
                      WHERE i.sku = s.sku AND i.status IN ('issued', 'held', 'confirmed'))
                  + (SELECT COALESCE(SUM(quantity), 0)::bigint FROM persistence_pending p
                      WHERE p.sku = s.sku AND p.status IN ('pending', 'reprocessing')
                        -- A claim with an issuances row is counted there, once: live unless
                        -- compensated (a compensation is recorded before its units go back
                        -- and the parked row is closed after), and a row parked by one
                        -- writer while another wrote the same entry is one unit, not two,
                        -- until the reprocessor resolves the parked row.
                        AND NOT EXISTS (SELECT 1 FROM issuances c
                                         WHERE c.claim_id = p.claim_id))
               FROM skus s",
        )
        .fetch_all(&probe.db)
        .await
        {
            Ok(r) => r,
            Err(_) => continue,
        };
        for (sku, total, live) in rows {
            if live > total {
                eprintln!("monitor: {sku}: {live} live units against a total of {total}");
                if let Some((was_live, was_total)) = over.insert(sku.clone(), (live, total)) {
                    return Err(format!(
                        "{sku}: {live} live units against a total of {total}, and \
                         {was_live} against {was_total} half a second before"
                    ));
                }
            } else {
                over.remove(&sku);
            }
            let limit = SKUS.iter().find(|s| s.0 == sku).map_or(i64::MAX, |s| s.2);
            let users = format!("{}:{{{sku}}}:users", probe.prefix);
            let state = format!("{}:{{{sku}}}:state", probe.prefix);
            let read: redis::RedisResult<UsersAndStock> = redis::pipe()
                .cmd("HGETALL")
                .arg(&users)
                .cmd("HGET")
                .arg(&state)
                .arg("stock")
                .query_async(&mut probe.redis.clone())
                .await;
            let Ok((counts, stock)) = read else { continue };
            if let Some((user, n)) = counts.iter().find(|(_, n)| *n > limit) {
                return Err(format!(
                    "redis counts {n} units of {sku} for {user}, limit {limit}"
                ));
            }
            if stock.is_some_and(|s| s < 0) {
                return Err(format!("{sku}: redis stock {stock:?}"));
            }
        }
    }
    Ok(())
}

async fn expect_one_of(
    r: reqwest::Result<reqwest::Response>,
    allowed: &[(u16, &str)],
) -> Result<(), String> {
    let Ok(r) = r else { return Ok(()) };
    let status = r.status().as_u16();
    let body: Value = r.json().await.unwrap_or(Value::Null);
    let c = code(&body);
    if allowed
        .iter()
        .any(|(s, k)| *s == status && (*k == "*" || *k == c))
    {
        Ok(())
    } else {
        Err(format!("admin answered {status} {body}"))
    }
}

#[derive(sqlx::FromRow)]
struct Row {
    claim_id: Uuid,
    sku: String,
    user_id: String,
    quantity: i32,
    status: String,
    idempotency_key: Option<String>,
}

async fn check_history(api: &Api, probe: &Probe, h: &History) -> Result<(), String> {
    // Let every fault heal and every winner land: the ledger balances and nothing is pending.
    for (sku, _, _) in SKUS {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let v = api.view(sku).await;
            if v["in_flight"] == 0 && v["pending"] == 0 && v["consistent"] == true {
                break;
            }
            // A state lost or left stale by a rollback is rebuilt from the ledger (a restore
            // of a live, current state is refused: 409, nothing changes).
            let _ = api.restore(sku, false).await;
            if std::time::Instant::now() > deadline {
                return Err(format!("{sku} never settled: {v}"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT claim_id, sku, user_id, quantity, status, idempotency_key FROM issuances
         UNION ALL
         SELECT claim_id, sku, user_id, quantity, status, idempotency_key FROM persistence_pending
          WHERE claim_id NOT IN (SELECT claim_id FROM issuances)",
    )
    .fetch_all(&probe.db)
    .await
    .map_err(|e| e.to_string())?;
    let by_id: HashMap<Uuid, &Row> = rows.iter().map(|r| (r.claim_id, r)).collect();
    let live = |r: &Row| {
        matches!(
            r.status.as_str(),
            "issued" | "held" | "confirmed" | "pending" | "reprocessing"
        )
    };
    // 1. Every 201 is in the ledger, as the request it answered; replays name the first win.
    let mut first_win: HashMap<(String, String, String), Uuid> = HashMap::new();
    for a in h.attempts.iter().filter(|a| a.status == 201) {
        let id = a.claim_id.expect("checked on arrival");
        let r = by_id
            .get(&id)
            .ok_or(format!("winner {id} ({a:?}) is not in the ledger"))?;
        if (r.sku.as_str(), r.user_id.as_str(), i64::from(r.quantity))
            != (a.sku.as_str(), a.user.as_str(), a.qty)
        {
            return Err(format!("winner {id} recorded as another claim"));
        }
        if let Some(k) = &a.key {
            let prev = first_win
                .entry((a.sku.clone(), a.user.clone(), k.clone()))
                .or_insert(id);
            if *prev != id && by_id.get(prev).is_none_or(|r| r.status != "compensated") {
                return Err(format!("key {k} of {} won twice: {prev} and {id}", a.user));
            }
        }
    }
    // 2. One live claim per key; per buyer no more than the limit; no SKU oversold.
    let mut per_key: HashMap<(String, String, String), usize> = HashMap::new();
    let mut per_user: HashMap<(String, String), i64> = HashMap::new();
    let mut per_sku: HashMap<String, i64> = HashMap::new();
    for r in rows.iter().filter(|r| live(r)) {
        if let Some(k) = &r.idempotency_key {
            *per_key
                .entry((r.sku.clone(), r.user_id.clone(), k.clone()))
                .or_default() += 1;
        }
        *per_user
            .entry((r.sku.clone(), r.user_id.clone()))
            .or_default() += i64::from(r.quantity);
        *per_sku.entry(r.sku.clone()).or_default() += i64::from(r.quantity);
    }
    if let Some((k, n)) = per_key.iter().find(|(_, n)| **n > 1) {
        return Err(format!("{n} live claims under one key {k:?}"));
    }
    for ((sku, user), n) in &per_user {
        let limit = SKUS.iter().find(|s| s.0 == sku).unwrap().2;
        if *n > limit {
            return Err(format!("{user} holds {n} of {sku}, limit {limit}"));
        }
    }
    for (sku, _, _) in SKUS {
        let v = api.view(sku).await;
        let total = v["total"].as_i64().unwrap();
        if per_sku.get(*sku).copied().unwrap_or(0) > total || v["consistent"] != true {
            return Err(format!("{sku} oversold or unbalanced: {v}"));
        }
    }
    // 3. A request answered 503 `unavailable` (or refused) moved nothing: every keyed row has
    //    an attempt under its key whose answer allowed a win.
    let mut could_win: HashSet<(String, String, String)> = HashSet::new();
    for a in &h.attempts {
        if matches!(a.status, 201 | 0) || a.code == "outcome_unknown" {
            if let Some(k) = &a.key {
                could_win.insert((a.sku.clone(), a.user.clone(), k.clone()));
            }
        }
    }
    for r in &rows {
        if let Some(k) = &r.idempotency_key {
            if !could_win.contains(&(r.sku.clone(), r.user_id.clone(), k.clone())) {
                return Err(format!(
                    "claim {} under key {k} won though every answer said it did not",
                    r.claim_id
                ));
            }
        }
    }
    // 4. Every unknown outcome settled: the ledger has it, or no gateway will ever sell it.
    for a in h.attempts.iter().filter(|a| a.code == "outcome_unknown") {
        let id = a.claim_id.expect("checked on arrival");
        let r = api
            .http
            .get(format!("{}/v1/claims/{id}", api.base))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap();
        if !matches!(r.status().as_u16(), 200 | 404) {
            return Err(format!(
                "unknown outcome {id} still unsettled: {}",
                r.status()
            ));
        }
    }
    // 5. Redis agrees with the ledger: its per-user counts are the live units.
    for ((sku, user), n) in &per_user {
        let held = probe.held(sku, user).await;
        if held != *n {
            return Err(format!(
                "redis says {user} holds {held} of {sku}, the ledger {n}"
            ));
        }
    }
    let _ = h.attempts.iter().filter(|a| a.replayed).count();
    Ok(())
}
