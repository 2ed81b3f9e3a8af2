//! What must hold at every instant, checked twice a second while the clients run: no Redis
//! stock below 0 on any shard, no buyer's Redis count over the limit, no SKU with more live
//! units in the ledger than its total in two reads in a row (once its ledger caught up), and
//! no SKU view answering `consistent: false` three rounds in a row on a state neither stale nor
//! lost nor behind the ledger's mark (monitoring pages on that field: API.md; a state a
//! rollback brought back is a loss the view must page for).
//!
//! One read over may be the ledger lagging Redis: a writer's batch writes its winners before
//! it applies its status changes (a status change needs its claim's row, which may be in the
//! same batch: src/writer/mod.rs), so a batch holding a hold's expiry and the win of the unit
//! it gave back shows both live between its two statements; two writers of one journal can do
//! the same across batches; and a parked claim's row is closed after its units went back. An
//! oversell stays over. Each such read is printed, so a failing run shows whether it was one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::Value;

use super::skus::{max_limit, spec};
use crate::helpers::Probe;

/// A shard's per-user counts and its stock, as Redis holds them.
type UsersAndStock = (Vec<(String, i64)>, Option<i64>);

/// The Redis names of a model SKU's shards (one Redis: no placement salts).
pub fn shard_names(sku: &str) -> Vec<String> {
    (0..spec(sku).shards as u16)
        .map(|i| dropgate::keys::shard_name(crate::helpers::sku_id(sku), i, 0))
        .collect()
}

/// No journal entry of the SKU's shards is left unwritten (the ledger has caught up).
async fn journals_empty(probe: &Probe, sku: &str) -> bool {
    for name in shard_names(sku) {
        let key = format!("{}:{{{name}}}:journal", probe.prefix);
        let len: redis::RedisResult<i64> = redis::cmd("XLEN")
            .arg(&key)
            .query_async(&mut probe.redis.clone())
            .await;
        if len.map_or(true, |n| n > 0) {
            return false;
        }
    }
    true
}

/// A parked claim of the SKU: a hold parked while it ended in Redis counts as live here until
/// the reprocessor writes it with its final status.
async fn parked(probe: &Probe, sku: &str) -> bool {
    sqlx::query_scalar::<_, bool>(
        "SELECT EXISTS (SELECT 1 FROM persistence_pending
                         WHERE sku = $1 AND status IN ('pending', 'reprocessing'))",
    )
    .bind(sku)
    .fetch_one(&probe.db)
    .await
    .unwrap_or(true)
}

/// Consecutive rounds a SKU's view may read `consistent: false` (on a state that is present
/// and not stale) before the run fails: one such reading can be an action half done across the
/// stores that a fault holds up (the view then says so, API.md), a few in a row over 1.5 s is
/// an alarm an operator would be paged for.
const INCONSISTENT_ROUNDS: u32 = 3;

/// The view of `sku` through one of the gateways, if one answered it whole, with how it was
/// read (its `Dropgate-Reading` header: fenced or not, readings taken).
async fn view(
    http: &reqwest::Client,
    bases: &Mutex<Vec<String>>,
    sku: &str,
) -> Option<(Value, String)> {
    let base = bases.lock().first().cloned()?;
    let r = http
        .get(format!("{base}/admin/skus/{sku}"))
        .bearer_auth(crate::helpers::ADMIN)
        .send()
        .await
        .ok()?;
    if r.status() != 200 {
        return None;
    }
    let reading = r
        .headers()
        .get("dropgate-reading")
        .and_then(|h| h.to_str().ok())
        .unwrap_or("-")
        .to_string();
    Some((r.json().await.ok()?, reading))
}

/// A shard state's stock, `stale` flag, `seq` and `inc`.
type StateHead = (Option<i64>, Option<String>, Option<i64>, Option<i64>);

/// Whether a shard of the SKU is stale or missing in Redis, or behind the ledger's mark (an
/// older copy a rollback brought back, which no script has run on yet to mark it stale; the
/// restore takes it as stale: src/restore/mod.rs). Its view rightly does not balance: Redis
/// lost data, and an operator restores it.
async fn unfit(probe: &Probe, sku: &str) -> bool {
    let names = shard_names(sku);
    let Ok(floors) = dropgate::freshness::shard_marks::read_floors(&probe.db, &names).await else {
        return true;
    };
    for name in names {
        let state = format!("{}:{{{name}}}:state", probe.prefix);
        let read: redis::RedisResult<StateHead> = redis::cmd("HMGET")
            .arg(&state)
            .arg("stock")
            .arg("stale")
            .arg("seq")
            .arg("inc")
            .query_async(&mut probe.redis.clone())
            .await;
        let behind = |seq, inc| {
            floors
                .iter()
                .any(|(n, f)| *n == name && f.is_above(seq, inc))
        };
        match read {
            Ok((Some(_), None, seq, inc)) if !behind(seq, inc) => {}
            _ => return true,
        }
    }
    false
}

/// One row of [`explain`]'s ledger part: table, claim (or restock), status, units.
type LedgerLine = (String, Option<uuid::Uuid>, String, Option<i64>);

/// What a reading out of balance rests on, for its failure message: each shard's state hash
/// and unacknowledged journal entries (winners and changes), the ledger's rows of the claims
/// those entries carry, each shard's compensation markers, every parked row of the SKU (closed
/// ones too: a reading after a restore may rest on how one closed) with its `issuances` rows,
/// and the SKU's open quarantined and restock rows. Read after the
/// view, so it may have moved since; it says where the units are, not that they balanced.
async fn explain(probe: &Probe, sku: &str) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let mut claims: Vec<uuid::Uuid> = Vec::new();
    for name in shard_names(sku) {
        let head = format!("{}:{{{name}}}:", probe.prefix);
        let read: redis::RedisResult<(Vec<(String, String)>, redis::Value)> = redis::pipe()
            .cmd("HGETALL")
            .arg(format!("{head}state"))
            .cmd("XRANGE")
            .arg(format!("{head}journal"))
            .arg("-")
            .arg("+")
            .arg("COUNT")
            .arg(300)
            .query_async(&mut probe.redis.clone())
            .await;
        let Ok((state, entries)) = read else {
            let _ = write!(out, "\n  {name}: redis unreadable");
            continue;
        };
        let state: Vec<String> = state
            .into_iter()
            .filter(|(k, _)| !k.starts_with("pool:"))
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let _ = write!(out, "\n  {name} state: {}", state.join(" "));
        // Every compensation marker of the shard: which parked claims' units came back here
        // ("compensated"), were found ended ("ended"), or are fenced by a reprocessor (a token).
        let markers: redis::RedisResult<Vec<String>> = redis::cmd("KEYS")
            .arg(format!("{head}comp:*"))
            .query_async(&mut probe.redis.clone())
            .await;
        for key in markers.unwrap_or_default() {
            let value: redis::RedisResult<Option<String>> = redis::cmd("GET")
                .arg(&key)
                .query_async(&mut probe.redis.clone())
                .await;
            let claim = key.rsplit(':').next().unwrap_or_default();
            let Ok(id) = claim.parse::<uuid::Uuid>() else {
                continue;
            };
            let hold: redis::RedisResult<Option<String>> = redis::cmd("HGET")
                .arg(format!("{head}holds"))
                .arg(id.to_string())
                .query_async(&mut probe.redis.clone())
                .await;
            let _ = write!(
                out,
                "\n    marker {id} {:?} hold {:?}",
                value.ok().flatten(),
                hold.ok().flatten()
            );
            claims.push(id);
        }
        let redis::Value::Array(entries) = entries else {
            continue;
        };
        let shard = dropgate::keys::ShardName::parse(&name);
        for e in entries {
            let b = dropgate::journal::entry_batch(&shard, e);
            for w in &b.winners {
                claims.push(w.claim_id);
                let _ = write!(
                    out,
                    "\n    {} win {} q{} seq {} hold {:?}",
                    w.entry_id, w.claim_id, w.quantity, w.seq, w.expires_ms
                );
            }
            for c in &b.changes {
                claims.push(c.claim_id);
                let _ = write!(
                    out,
                    "\n    {} change {} {:?} q{} seq {}",
                    c.entry_id, c.claim_id, c.status, c.quantity, c.seq
                );
            }
            for w in &b.waits {
                let _ = write!(
                    out,
                    "\n    {} wait {} {:?}",
                    w.journal_entry, w.entry_id, w.status
                );
            }
            if !b.unreadable.is_empty() {
                let _ = write!(out, "\n    {} unreadable", b.unreadable.len());
            }
        }
    }
    let rows: Result<Vec<LedgerLine>, _> = sqlx::query_as(
        "SELECT 'issuances', claim_id, status, quantity::bigint FROM issuances
          WHERE claim_id = ANY($1)
             OR claim_id IN (SELECT claim_id FROM persistence_pending WHERE sku = $2)
         UNION ALL
         SELECT 'pending', claim_id, status || '/' || claim_status, quantity::bigint
           FROM persistence_pending
          WHERE claim_id = ANY($1) OR sku = $2
         UNION ALL
         SELECT 'quarantine', claim_id, COALESCE(resolved_at::text, 'open'), quantity::bigint
           FROM quarantine WHERE claim_id = ANY($1) OR (sku = $2 AND resolved_at IS NULL)
         UNION ALL
         SELECT 'restock', op_id, status, delta FROM restock_ops
          WHERE sku = $2 AND status = 'pending'",
    )
    .bind(&claims)
    .bind(sku)
    .fetch_all(&probe.db)
    .await;
    match rows {
        Ok(rows) => {
            for (table, id, status, q) in rows {
                let _ = write!(out, "\n  ledger {table} {id:?} {status} q{q:?}");
            }
        }
        Err(e) => {
            let _ = write!(out, "\n  ledger unreadable: {e}");
        }
    }
    out
}

pub async fn monitor(
    probe: Probe,
    bases: Arc<Mutex<Vec<String>>>,
    done: Arc<AtomicBool>,
) -> Result<(), String> {
    let mut over: std::collections::HashMap<String, (i64, i64)> = Default::default();
    let mut inconsistent: std::collections::HashMap<String, u32> = Default::default();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .map_err(|e| e.to_string())?;
    let mut seats_off = 0;
    while !done.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        // Twice in a row: a restore rewrites the map just before the state it reads with.
        match super::seats::monitor_once(&probe).await {
            Ok(()) => seats_off = 0,
            Err(e) if seats_off > 0 => return Err(e),
            Err(e) => {
                eprintln!("monitor: {e}");
                seats_off += 1;
            }
        }
        for s in super::skus::SKUS {
            let Some((v, reading)) = view(&http, &bases, s.name).await else {
                continue;
            };
            if v["consistent"] == false && !v["remaining"].is_null() && !unfit(&probe, s.name).await
            {
                eprintln!(
                    "monitor: {} reads consistent: false ({reading}): {v}",
                    s.name
                );
                eprintln!("monitor: {}", explain(&probe, s.name).await);
                let n = inconsistent.entry(s.name.to_string()).or_default();
                *n += 1;
                if *n >= INCONSISTENT_ROUNDS {
                    return Err(format!(
                        "{}: the view read consistent: false {n} rounds in a row on a state \
                         neither stale nor lost ({reading}): {v}",
                        s.name
                    ));
                }
            } else {
                inconsistent.remove(s.name);
            }
        }
        let rows: Vec<(String, i64, i64)> = match sqlx::query_as(
            "SELECT s.sku, s.total,
                    (SELECT COALESCE(SUM(quantity), 0)::bigint FROM issuances i
                      WHERE i.sku = s.sku AND i.status IN ('issued', 'held', 'confirmed'))
                  + (SELECT COALESCE(SUM(quantity), 0)::bigint FROM persistence_pending p
                      WHERE p.sku = s.sku AND p.status IN ('pending', 'reprocessing')
                        -- A claim with an issuances row is counted there, once.
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
            // Over the total while the SKU's journal still holds entries is the ledger behind
            // Redis (a hold that expired in Redis, its unit restocked away, its expiry not yet
            // written while PostgreSQL is down), not a unit sold twice: only a ledger that has
            // caught up is held to the total here; the final check holds every one.
            if live > total && journals_empty(&probe, &sku).await && !parked(&probe, &sku).await {
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
            let limit = max_limit(&sku);
            for name in shard_names(&sku) {
                let users = format!("{}:{{{name}}}:users", probe.prefix);
                let state = format!("{}:{{{name}}}:state", probe.prefix);
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
                        "redis counts {n} units of {name} for {user}, limit {limit}"
                    ));
                }
                if stock.is_some_and(|s| s < 0) {
                    return Err(format!("{name}: redis stock {stock:?}"));
                }
            }
        }
    }
    Ok(())
}
