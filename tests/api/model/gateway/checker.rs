//! The checks after every run, once every fault healed and every winner landed: the ledger
//! against what the clients were told (every 201 in it as its request, replays of the first
//! win, nothing moved by a request answered 503 `unavailable` or refused before a decision,
//! one live claim per key), the invariants (no oversell, the per-user limit), Redis against
//! the ledger (per-user counts on every shard), and the SKU view balanced on every reading.
//! The lifecycle and the event stream are checked in `lifecycle.rs`.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use uuid::Uuid;

use super::history::History;
use super::monitor::shard_names;
use super::skus::{max_limit, spec, SKUS};
use crate::helpers::{Api, Probe, ADMIN};

#[derive(sqlx::FromRow, Debug)]
pub struct Row {
    pub claim_id: Uuid,
    pub sku: String,
    pub user_id: String,
    pub quantity: i32,
    pub status: String,
    pub idempotency_key: Option<String>,
}

pub fn live(r: &Row) -> bool {
    matches!(
        r.status.as_str(),
        "issued" | "held" | "confirmed" | "pending" | "reprocessing"
    )
}

async fn journal_len(probe: &Probe, sku: &str) -> i64 {
    let mut n = 0;
    for name in shard_names(sku) {
        let key = format!("{}:{{{name}}}:journal", probe.prefix);
        let len: Option<i64> = redis::cmd("XLEN")
            .arg(&key)
            .query_async(&mut probe.redis.clone())
            .await
            .ok();
        n += len.unwrap_or(1);
    }
    n
}

/// Waits until every SKU is quiet: journals written, nothing in flight or pending, no hold
/// left (every hold and offer is at most 3 s), no parked row open, the view balanced; a state
/// lost or left stale by a rollback is rebuilt from the ledger (a restore of a live state is
/// refused: 409).
///
/// A parked row still open is waited for even when the view's `pending` leaves it out (a hold
/// that ended while parked: its units are back): until the reprocessor closes it, `issuances`
/// may hold only its compensation decided (a `compensated` row, src/reprocess/rows.rs) or
/// nothing, and its events are recorded by the transaction that closes it (docs/outbox.md,
/// "What a consumer can rely on"; docs/lifecycle-writer.md, "Events of a parked claim"). A
/// reprocessor whose attempt failed (a PostgreSQL fault, the SKU's state lost or stale until
/// its restore) takes the row again only once its lease (30 s) runs out.
pub async fn settle(api: &Api, probe: &Probe) -> Result<(), String> {
    for s in SKUS {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let v = api.view(s.name).await;
            let held: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM issuances WHERE sku = $1 AND status = 'held'",
            )
            .bind(s.name)
            .fetch_one(&probe.db)
            .await
            .unwrap_or(-1);
            let parked: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM persistence_pending
                  WHERE sku = $1 AND status IN ('pending', 'reprocessing')",
            )
            .bind(s.name)
            .fetch_one(&probe.db)
            .await
            .unwrap_or(-1);
            let quiet = v["in_flight"] == 0 && v["pending"] == 0 && v["consistent"] == true;
            if quiet && held == 0 && parked == 0 && journal_len(probe, s.name).await == 0 {
                break;
            }
            let _ = api.restore(s.name, false).await;
            if Instant::now() > deadline {
                return Err(format!(
                    "{} never settled within 120 s: {v}; {held} claims still held in the \
                     ledger (every hold ends within 3 s), {parked} parked rows open; redis: {}",
                    s.name,
                    redis_dump(probe, s.name).await
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(())
}

/// What Redis holds of a SKU's shards (the small keys whole, the big ones by size), for a
/// failure's message.
pub async fn redis_dump(probe: &Probe, sku: &str) -> String {
    let mut out = String::new();
    for name in shard_names(sku) {
        let pattern = format!("{}:{{{name}}}:*", probe.prefix);
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(&pattern)
            .query_async(&mut probe.redis.clone())
            .await
            .unwrap_or_default();
        for k in keys
            .iter()
            .filter(|k| !k.ends_with(":idem") && !k.contains(":claims:"))
        {
            let t: String = redis::cmd("TYPE")
                .arg(k)
                .query_async(&mut probe.redis.clone())
                .await
                .unwrap_or_default();
            let v = match t.as_str() {
                "hash" => redis::cmd("HGETALL")
                    .arg(k)
                    .query_async::<Vec<String>>(&mut probe.redis.clone())
                    .await
                    .map(|v| v.join(" "))
                    .unwrap_or_default(),
                "zset" => redis::cmd("ZRANGE")
                    .arg(k)
                    .arg(0)
                    .arg(-1)
                    .arg("WITHSCORES")
                    .query_async::<Vec<String>>(&mut probe.redis.clone())
                    .await
                    .map(|v| v.join(" "))
                    .unwrap_or_default(),
                "string" => redis::cmd("GET")
                    .arg(k)
                    .query_async::<Option<String>>(&mut probe.redis.clone())
                    .await
                    .ok()
                    .flatten()
                    .unwrap_or_default(),
                other => other.to_string(),
            };
            let v: String = v.chars().take(600).collect();
            out.push_str(&format!("\n  {k} = {v}"));
        }
    }
    out
}

pub async fn ledger(probe: &Probe) -> Result<Vec<Row>, String> {
    sqlx::query_as(
        "SELECT claim_id, sku, user_id, quantity, status, idempotency_key FROM issuances
         UNION ALL
         SELECT claim_id, sku, user_id, quantity, status, idempotency_key FROM persistence_pending
          WHERE claim_id NOT IN (SELECT claim_id FROM issuances)",
    )
    .fetch_all(&probe.db)
    .await
    .map_err(|e| e.to_string())
}

pub async fn check_ledger(
    api: &Api,
    probe: &Probe,
    h: &History,
    rows: &[Row],
) -> Result<(), String> {
    let by_id: HashMap<Uuid, &Row> = rows.iter().map(|r| (r.claim_id, r)).collect();
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
            return Err(format!("winner {id} recorded as another claim: {r:?}"));
        }
        if let Some(k) = &a.key {
            let prev = first_win
                .entry((a.sku.clone(), a.user.clone(), k.clone()))
                .or_insert(id);
            // A key wins once, whatever became of its claim and whatever a restore rebuilt
            // (it rebuilds the records of claims that ended too): only a compensated claim's
            // record is dropped (lua/compensate.lua), so a retry is decided afresh.
            if *prev != id && by_id.get(prev).is_none_or(|r| r.status != "compensated") {
                return Err(format!("key {k} of {} won twice: {prev} and {id}", a.user));
            }
        }
    }
    // 2. One live claim per key; per buyer no more than the limit; no SKU oversold (I1, I3).
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
        if *n > max_limit(sku) {
            return Err(format!(
                "{user} holds {n} of {sku}, limit {}",
                max_limit(sku)
            ));
        }
    }
    // The view balances on every reading once quiet (monitoring pages on `consistent`).
    for s in SKUS {
        for _ in 0..10 {
            let v = api.view(s.name).await;
            let total = v["total"].as_i64().unwrap_or(-1);
            if per_sku.get(s.name).copied().unwrap_or(0) > total || v["consistent"] != true {
                return Err(format!("{} oversold or unbalanced once quiet: {v}", s.name));
            }
            if v["recorded"] != per_sku.get(s.name).copied().unwrap_or(0) {
                return Err(format!(
                    "{}: the view's recorded units are not the ledger's ({} live in the rows \
                     read at the start of the final check): {v}",
                    s.name,
                    per_sku.get(s.name).copied().unwrap_or(0)
                ));
            }
        }
    }
    // 3. A request answered 503 `unavailable` (or refused) moved nothing: every keyed row has
    //    an attempt under its key whose answer allowed a win; no row carries a key of a claim
    //    refused for its token.
    let mut could_win: HashSet<(String, String, String)> = HashSet::new();
    for a in &h.attempts {
        if matches!(a.status, 201 | 0) || a.code == "outcome_unknown" {
            if let Some(k) = &a.key {
                could_win.insert((a.sku.clone(), a.user.clone(), k.clone()));
            }
        }
    }
    for r in rows {
        if let Some(k) = &r.idempotency_key {
            if !could_win.contains(&(r.sku.clone(), r.user_id.clone(), k.clone())) {
                return Err(format!(
                    "claim {} under key {k} won though every answer said it did not",
                    r.claim_id
                ));
            }
        }
    }
    if let Some(f) = h.refused.iter().find(|f| could_win.contains(*f)) {
        return Err(format!(
            "a claim refused for its token's SKU moved units: {f:?}"
        ));
    }
    // 4. Every unknown outcome settled: the ledger has it, or no gateway will ever sell it.
    //    The gateway that answered keeps settling it (API.md: "within seconds of Redis
    //    answering again"), so each is read for a few seconds before it counts as unsettled.
    for a in h.attempts.iter().filter(|a| a.code == "outcome_unknown") {
        let id = a.claim_id.expect("checked on arrival");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let r = api
                .http
                .get(format!("{}/v1/claims/{id}", api.base))
                .bearer_auth(ADMIN)
                .send()
                .await
                .map_err(|e| e.to_string())?;
            let status = r.status().as_u16();
            if matches!(status, 200 | 404) {
                break;
            }
            if Instant::now() > deadline {
                let body = r.text().await.unwrap_or_default();
                return Err(format!(
                    "unknown outcome {id} ({a:?}) still unsettled 10 s after the run was \
                     quiet: {status} {body}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // 5. Redis agrees with the ledger: each shard's per-user counts are the live units of the
    //    buyers routed there.
    for s in SKUS {
        for (i, name) in shard_names(s.name).iter().enumerate() {
            let key = format!("{}:{{{name}}}:users", probe.prefix);
            let counts: Vec<(String, i64)> = redis::cmd("HGETALL")
                .arg(&key)
                .query_async(&mut probe.redis.clone())
                .await
                .map_err(|e| e.to_string())?;
            let counts: HashMap<String, i64> = counts.into_iter().collect();
            let shards = spec(s.name).shards as i32;
            let want: HashMap<String, i64> = per_user
                .iter()
                .filter(|((sku, u), n)| {
                    sku == s.name
                        && **n > 0
                        && usize::from(dropgate::shards::shard_of_user(u, shards)) == i
                })
                .map(|((_, u), n)| (u.clone(), *n))
                .collect();
            let counted: HashMap<String, i64> =
                counts.into_iter().filter(|(_, n)| *n > 0).collect();
            if counted != want {
                let diff: Vec<_> = want
                    .iter()
                    .filter(|(u, n)| counted.get(*u) != Some(n))
                    .take(5)
                    .collect();
                return Err(format!(
                    "redis per-user counts of {name} are not the ledger's live units \
                     (ledger's side of the first differences: {diff:?})"
                ));
            }
        }
    }
    // 6. No seat in two live claims; Redis's seat map is the ledger's live seats.
    super::seats::check_final(probe).await?;
    Ok(())
}
