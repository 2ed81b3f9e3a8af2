//! The model's seated SKU (API.md "Reserved seating"): claims of exact seats and of best
//! available (adjacent or not, in a section or anywhere), under fresh keys, replays and none,
//! held for 2 s and then confirmed, cancelled or left to expire by `holds.rs` like any hold;
//! restocks (409 `seated_sku`), waitlist joins for 1 to 4 seats and their offers (`holds.rs`:
//! each offer holds the best seats for its entry's quantity), restores and every fault of the
//! nemesis. Checked as answers come (a 201 carries as many
//! distinct seats of the plan as asked, exact seats are the ones asked, a replay the first
//! win's), twice a second (`stock` + taken seats = total, read in one step), and at the end
//! (no seat in two live claims in the ledger; Redis's map is the ledger's live seats).

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use rand::rngs::StdRng;
use rand::Rng;
use serde_json::{json, Value};
use uuid::Uuid;

use super::history::{Attempt, Owned};
use super::ops::{answer, buyer, own_token, Ctx};
use super::skus::spec;
use crate::helpers::{code, Probe};

/// The seated SKU of the model.
pub const SKU: &str = "t0";

/// Its plan: two sections, three rows of ten, best first.
pub fn plan() -> Value {
    json!({"sections": [{"name": "A", "rows": 2, "count": 10},
                        {"name": "B", "rows": 1, "count": 10}]})
}

/// Every seat id of the plan, in bit order.
pub fn seat_ids() -> Vec<String> {
    let mut out = Vec::new();
    for (s, rows) in [("A", 2), ("B", 1)] {
        for r in 1..=rows {
            for n in 1..=10 {
                out.push(format!("{s}-{r}-{n}"));
            }
        }
    }
    out
}

pub fn seated(sku: &str) -> bool {
    sku == SKU
}

/// Adds the plan to the SKU's declare (and to a change of its terms).
pub fn declare_extra(sku: &str, body: &mut Value) {
    if seated(sku) {
        body["seats"] = plan();
    }
}

/// One request's body: exact seats, or best available.
fn draw_body(rng: &mut StdRng) -> (Value, Option<Vec<String>>, i64) {
    let limit = spec(SKU).limit;
    let ids = seat_ids();
    match rng.random_range(0..10) {
        0..=3 => {
            let n = rng.random_range(1..=3usize);
            let mut picked: Vec<String> = Vec::new();
            // Neighbours most of the time: buyers pick seats together, and races on them.
            let start = rng.random_range(0..ids.len());
            for i in 0..n {
                let id = &ids[(start + i) % ids.len()];
                if !picked.contains(id) {
                    picked.push(id.clone());
                }
            }
            let n = picked.len() as i64;
            (json!({ "seats": picked }), Some(picked), n)
        }
        4..=7 => {
            let q = rng.random_range(1..=limit + 1);
            let body = match rng.random_range(0..3) {
                0 => json!({"quantity": q, "section": "A"}),
                1 => json!({"quantity": q, "section": "B"}),
                _ => json!({ "quantity": q }),
            };
            (body, None, q)
        }
        _ => {
            let q = rng.random_range(1..=limit);
            (json!({"quantity": q, "adjacent": false}), None, q)
        }
    }
}

/// A claim on the seated SKU.
pub async fn claim(cx: &Ctx<'_>, rng: &mut StdRng, step: u64) -> Result<(), String> {
    let user = buyer(rng, SKU);
    let token = own_token(rng, &user, SKU);
    let prior = cx
        .history
        .lock()
        .seat_keys
        .get(&user)
        .cloned()
        .unwrap_or_default();
    let ((body, exact, qty), key) = match rng.random_range(0..10) {
        7 | 8 if !prior.is_empty() => {
            let (k, b) = prior[rng.random_range(0..prior.len())].clone();
            let n = b["seats"]
                .as_array()
                .map_or_else(|| b["quantity"].as_i64().unwrap_or(1), |s| s.len() as i64);
            let exact = b["seats"].as_array().map(|s| {
                s.iter()
                    .filter_map(|x| x.as_str().map(str::to_string))
                    .collect()
            });
            ((b, exact, n), Some(k))
        }
        0..=5 => (draw_body(rng), Some(format!("t{step}"))),
        _ => (draw_body(rng), None),
    };
    let mut req = cx
        .http
        .post(format!("{}/v1/skus/{SKU}/claims", cx.base))
        .bearer_auth(token)
        .json(&body);
    if let Some(k) = &key {
        req = req.header("idempotency-key", k);
        let mut h = cx.history.lock();
        let used = h.seat_keys.entry(user.clone()).or_default();
        if !used.iter().any(|(u, _)| u == k) {
            used.push((k.clone(), body.clone()));
        }
    }
    let asked = Instant::now();
    let (status, answer_body, replayed) = answer(req.send().await).await;
    let c = code(&answer_body).to_string();
    let allowed = matches!(
        (status, c.as_str()),
        (201, "")
            | (
                409,
                "sold_out" | "limit_reached" | "seats_taken" | "no_adjacent_seats"
            )
            | (429, "overloaded")
            | (503, "unavailable" | "outcome_unknown")
            | (0, "")
    ) || (status, c.as_str()) == (400, "bad_request") && qty > spec(SKU).limit;
    if !allowed {
        let mut record = None;
        if let (Some(k), Some(probe)) = (&key, cx.probe) {
            let field = dropgate::keys::idempotency_field(&user, k);
            record = redis::cmd("HGET")
                .arg(format!("{}:{{{SKU}}}:idem", probe.prefix))
                .arg(&field[..])
                .query_async::<Option<String>>(&mut probe.redis.clone())
                .await
                .ok()
                .flatten();
        }
        return Err(format!(
            "seat claim {body} by {user} under {key:?} answered {status} {answer_body} (its \
             key's record in Redis: {record:?})"
        ));
    }
    let claim_id: Option<Uuid> = answer_body["claim_id"]
        .as_str()
        .and_then(|s| s.parse().ok());
    if (status == 201 || c == "outcome_unknown") && claim_id.is_none() {
        return Err(format!("{status} {c} without a claim id: {answer_body}"));
    }
    let mut h = cx.history.lock();
    h.count("seat-claim", status, &c);
    if let (201, Some(id)) = (status, claim_id) {
        let won: Vec<String> = answer_body["seats"]
            .as_array()
            .map(|s| {
                s.iter()
                    .filter_map(|x| x.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        let distinct: HashSet<&String> = won.iter().collect();
        let plan: HashSet<String> = seat_ids().into_iter().collect();
        if won.len() as i64 != qty
            || distinct.len() != won.len()
            || !won.iter().all(|s| plan.contains(s))
            || answer_body["quantity"] != qty
            || answer_body["user"] != user.as_str()
            || exact.as_ref().is_some_and(|e| *e != won)
        {
            return Err(format!("201 for {body} carries other seats: {answer_body}"));
        }
        if let Some(first) = h.seats_won.get(&id) {
            if *first != won {
                return Err(format!("claim {id} told {first:?} first and now {won:?}"));
            }
        }
        h.seats_won.insert(id, won);
        if !replayed {
            let s = answer_body["status"].as_str().unwrap_or("").to_string();
            if !matches!(s.as_str(), "issued" | "held") {
                return Err(format!("201 with status {s:?}: {answer_body}"));
            }
            h.read(id, "won", &s, asked);
        }
    }
    if let Some(id) = claim_id {
        h.owned.push(Owned {
            claim: id,
            sku: SKU.into(),
            user: user.clone(),
            answered: status == 201,
        });
    }
    h.attempts.push(Attempt {
        sku: SKU.into(),
        user,
        key,
        qty,
        status,
        code: c,
        claim_id,
        replayed,
    });
    Ok(())
}

/// The seat map's taken seats and the stock, read in one step: `None` while the SKU's state
/// is missing or marked stale (a restore is due; claims are closed).
pub async fn map_and_stock(probe: &Probe) -> Option<(HashSet<String>, i64)> {
    let state = format!("{}:{{{SKU}}}:state", probe.prefix);
    let (map, stock, stale): (Option<Vec<u8>>, Option<i64>, Option<String>) = redis::pipe()
        .atomic()
        .cmd("GET")
        .arg(format!("{}:{{{SKU}}}:seats", probe.prefix))
        .cmd("HGET")
        .arg(&state)
        .arg("stock")
        .cmd("HGET")
        .arg(&state)
        .arg("stale")
        .query_async(&mut probe.redis.clone())
        .await
        .ok()?;
    let stock = stock?;
    if stale.is_some() {
        return None;
    }
    let map = map.unwrap_or_default();
    let taken = seat_ids()
        .into_iter()
        .enumerate()
        .filter(|(b, _)| map.get(b / 8).is_some_and(|x| x & (0x80 >> (b % 8)) != 0))
        .map(|(_, id)| id)
        .collect();
    Some((taken, stock))
}

/// Twice a second: the map's free seats are the stock (they move in the same atomic step).
pub async fn monitor_once(probe: &Probe) -> Result<(), String> {
    let Some((taken, stock)) = map_and_stock(probe).await else {
        return Ok(());
    };
    let total = seat_ids().len() as i64;
    if taken.len() as i64 + stock != total {
        let holds: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
            .arg(format!("{}:{{{SKU}}}:holds", probe.prefix))
            .query_async(&mut probe.redis.clone())
            .await
            .unwrap_or_default();
        let seatless: Vec<&String> = holds
            .values()
            .filter(|h| h.matches('|').count() < 6)
            .collect();
        let rows: Vec<(Uuid, String, Option<Vec<String>>)> = sqlx::query_as(
            "SELECT claim_id, status, seats FROM issuances WHERE sku = $1 ORDER BY created_at",
        )
        .bind(SKU)
        .fetch_all(&probe.db)
        .await
        .unwrap_or_default();
        let no_seats = rows.iter().filter(|r| r.2.is_none()).count();
        let live: HashSet<String> = rows
            .iter()
            .filter(|r| matches!(r.1.as_str(), "issued" | "held" | "confirmed"))
            .flat_map(|r| r.2.clone().unwrap_or_default())
            .collect();
        let mut only_map: Vec<_> = taken.difference(&live).collect();
        only_map.sort();
        return Err(format!(
            "{SKU}: {} seats taken in the map and a stock of {stock}, of {total} seats (hold \
             records without seats: {seatless:?}; ledger rows without seats: {no_seats} of {}; \
             taken only in the map: {only_map:?}; holds: {holds:?})",
            taken.len(),
            rows.len()
        ));
    }
    Ok(())
}

/// Once quiet: no seat in two live claims of the ledger, and Redis's map is exactly the
/// ledger's live seats (written, or parked and not yet given back).
pub async fn check_final(probe: &Probe) -> Result<(), String> {
    let rows: Vec<(Uuid, Vec<String>)> = sqlx::query_as(
        "SELECT claim_id, seats FROM issuances
          WHERE sku = $1 AND seats IS NOT NULL AND status IN ('issued', 'held', 'confirmed')
         UNION ALL
         SELECT claim_id, seats FROM persistence_pending p
          WHERE sku = $1 AND seats IS NOT NULL AND status IN ('pending', 'reprocessing')
            AND NOT EXISTS (SELECT 1 FROM issuances i WHERE i.claim_id = p.claim_id)",
    )
    .bind(SKU)
    .fetch_all(&probe.db)
    .await
    .map_err(|e| e.to_string())?;
    let mut owner: HashMap<String, Uuid> = HashMap::new();
    for (id, seats) in &rows {
        for s in seats {
            if let Some(other) = owner.insert(s.clone(), *id) {
                return Err(format!(
                    "seat {s} is held by two live claims: {other} and {id}"
                ));
            }
        }
    }
    let Some((taken, stock)) = map_and_stock(probe).await else {
        return Err(format!("{SKU}: no readable state once quiet"));
    };
    let live: HashSet<String> = owner.into_keys().collect();
    if taken != live {
        let mut only_map: Vec<_> = taken.difference(&live).collect();
        let mut only_ledger: Vec<_> = live.difference(&taken).collect();
        only_map.sort();
        only_ledger.sort();
        return Err(format!(
            "{SKU}: Redis's seat map is not the ledger's live seats once quiet: taken only in \
             the map {only_map:?}, live only in the ledger {only_ledger:?}"
        ));
    }
    if stock != (seat_ids().len() - live.len()) as i64 {
        return Err(format!(
            "{SKU}: stock {stock} with {} live seats",
            live.len()
        ));
    }
    Ok(())
}
