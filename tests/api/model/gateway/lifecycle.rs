//! The lifecycle checks after a run: every reading a client got of a claim (a 201's status,
//! lookups, confirms and cancels and their refusals, an entry's `claimed`) fits the claim's
//! one life (`held` first, then one end; `compensated` may follow anything) and its final
//! status in the ledger; every claim's GET now tells its ledger status; the waitlist table
//! keeps one live entry per buyer, and `claimed` entries own a confirmed claim (or one
//! compensated after its confirm); and the event
//! stream, folded per claim, is the ledger: each event once, in sequence, created by
//! `claim.won` or `waitlist.offered`, its last status the claim's status in `issuances`.

use std::collections::HashMap;

use uuid::Uuid;

use super::checker::Row;
use super::history::{History, Reading};
use crate::helpers::{Api, Probe, ADMIN};
use crate::services::PrivateNats;

/// Whether a claim read as `a` may later read as `b`. `final` is a refused cancel's
/// `claim_confirmed`: confirmed, or issued (final at once).
fn may_follow(a: &str, b: &str) -> bool {
    let finalish = |s: &str| matches!(s, "issued" | "confirmed" | "final");
    a == b
        || a == "held"
        || b == "compensated"
        || (a == "final" && finalish(b))
        || (b == "final" && finalish(a))
}

pub async fn check_lifecycle(
    api: &Api,
    probe: &Probe,
    h: &History,
    rows: &[Row],
) -> Result<(), String> {
    let status: HashMap<Uuid, &str> = rows
        .iter()
        .map(|r| (r.claim_id, r.status.as_str()))
        .collect();
    let mut per_claim: HashMap<Uuid, Vec<&Reading>> = HashMap::new();
    for r in &h.readings {
        per_claim.entry(r.claim).or_default().push(r);
    }
    for (claim, list) in &per_claim {
        let Some(end) = status.get(claim) else {
            return Err(format!(
                "claim {claim} was read ({list:?}) but is not in the ledger"
            ));
        };
        for a in list {
            if !may_follow(&a.status, end) {
                return Err(format!(
                    "claim {claim} read {} (by {}) but ends {end} in the ledger; readings: {}",
                    a.status,
                    a.via,
                    show(list)
                ));
            }
            for b in list.iter().filter(|b| b.asked > a.answered) {
                if !may_follow(&a.status, &b.status) {
                    return Err(format!(
                        "claim {claim} read {} (by {}), then {} (by {}); ledger {end}; \
                         readings: {}",
                        a.status,
                        a.via,
                        b.status,
                        b.via,
                        show(list)
                    ));
                }
            }
        }
    }
    // Every claim a client holds an id of reads as the ledger has it.
    for o in h.owned.iter().filter(|o| o.answered) {
        let r = api
            .http
            .get(format!("{}/v1/claims/{}", api.base, o.claim))
            .bearer_auth(ADMIN)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let code = r.status().as_u16();
        let body: serde_json::Value = r.json().await.unwrap_or_default();
        let want = status.get(&o.claim).copied().unwrap_or("(absent)");
        if code != 200 || body["status"] != want {
            return Err(format!(
                "GET of claim {} once quiet: {code} {body}; the ledger says {want}",
                o.claim
            ));
        }
    }
    // The waitlist table.
    let entries: Vec<(Uuid, String, String, String, Option<Uuid>)> =
        sqlx::query_as("SELECT entry_id, sku, user_id, status, claim_id FROM waitlist")
            .fetch_all(&probe.db)
            .await
            .map_err(|e| e.to_string())?;
    // The status a compensated claim's hold had when its units went back (the reprocessor
    // keeps it in its parked row: `mark_compensated` in src/reprocess/rows.rs, from
    // compensate.lua's answer).
    let compensated_from: HashMap<Uuid, String> = sqlx::query_as(
        "SELECT claim_id, claim_status FROM persistence_pending WHERE claim_id = ANY($1)",
    )
    .bind(
        rows.iter()
            .filter(|r| r.status == "compensated")
            .map(|r| r.claim_id)
            .collect::<Vec<_>>(),
    )
    .fetch_all(&probe.db)
    .await
    .map_err(|e| e.to_string())?
    .into_iter()
    .collect();
    let mut live: HashMap<(&str, &str), usize> = HashMap::new();
    for (entry, sku, user, s, claim) in &entries {
        if matches!(s.as_str(), "waiting" | "offered") {
            *live.entry((sku.as_str(), user.as_str())).or_default() += 1;
        }
        if s == "offered" {
            return Err(format!(
                "entry {entry} still offered once quiet (offers last 3 s)"
            ));
        }
        // Only an offer names a claim, and that claim is in the ledger (an entry whose leave
        // was written before its join once named a claim that never was).
        if let Some(c) = claim.filter(|c| !status.contains_key(c)) {
            return Err(format!(
                "entry {entry} ({s}) names claim {c}, which the ledger does not hold"
            ));
        }
        // An entry is `claimed` once its offer is confirmed, and `claimed` is final (ENTRY_STEPS
        // has no step out of it: `EntryStatus::rank`); the claim may still be compensated after
        // the confirm (CLAIM_STEPS: `confirmed` -> `compensated`; docs/lifecycle.md, "Claim
        // steps" and "Entry steps"), and end_hold ends only an entry still `offered`
        // (lua/lib/lifecycle.lua). So a claimed entry's claim is confirmed, or compensated from
        // confirmed; a compensation of a hold never confirmed is still caught.
        let claim_ok = match claim.and_then(|c| status.get(&c).copied()) {
            Some("confirmed") => true,
            Some("compensated") => claim
                .and_then(|c| compensated_from.get(&c))
                .is_some_and(|s| s == "confirmed"),
            _ => false,
        };
        if s == "claimed" && !claim_ok {
            return Err(format!(
                "entry {entry} is claimed but its claim {claim:?} is {:?} (compensated from {:?})",
                claim.and_then(|c| status.get(&c).copied()),
                claim.and_then(|c| compensated_from.get(&c))
            ));
        }
    }
    if let Some((k, n)) = live.iter().find(|(_, n)| **n > 1) {
        return Err(format!("{n} live waitlist entries for {k:?}"));
    }
    Ok(())
}

fn show(list: &[&Reading]) -> String {
    let t0 = list.iter().map(|r| r.asked).min().expect("one reading");
    list.iter()
        .map(|r| {
            format!(
                "{} by {} in {}..{} ms",
                r.status,
                r.via,
                (r.asked - t0).as_millis(),
                (r.answered - t0).as_millis()
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The event stream folded per claim against the ledger (the relay must have caught up:
/// the caller waits for `outbox` to have nothing unsent).
pub async fn check_events(nats: &PrivateNats, rows: &[Row]) -> Result<usize, String> {
    let events = if crate::outbox::stream_len(nats).await == 0 {
        Vec::new()
    } else {
        crate::outbox::stream_events(nats).await
    };
    let mut seen = std::collections::HashSet::new();
    let mut per_claim: HashMap<Uuid, Vec<&serde_json::Value>> = HashMap::new();
    for e in &events {
        let b = &e.body;
        let id = b["id"].as_str().unwrap_or("").to_string();
        if !seen.insert(id.clone()) {
            return Err(format!("event {id} delivered twice"));
        }
        let claim: Uuid = b["claim_id"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .ok_or(format!("event without a claim: {b}"))?;
        if id != format!("{claim}:{}", b["seq"]) {
            return Err(format!("event id {id} is not <claim>:<seq>: {b}"));
        }
        per_claim.entry(claim).or_default().push(b);
    }
    let by_id: HashMap<Uuid, &Row> = rows.iter().map(|r| (r.claim_id, r)).collect();
    for (claim, list) in &per_claim {
        let seqs: Vec<i64> = list
            .iter()
            .map(|b| b["seq"].as_i64().unwrap_or(0))
            .collect();
        let expected: Vec<i64> = (1..=seqs.len() as i64).collect();
        if seqs != expected {
            return Err(format!(
                "claim {claim}: events out of order or missing: {seqs:?}"
            ));
        }
        if !matches!(
            list[0]["type"].as_str(),
            Some("claim.won" | "waitlist.offered")
        ) {
            return Err(format!("claim {claim}: its first event is {}", list[0]));
        }
        let Some(row) = by_id.get(claim) else {
            return Err(format!("claim {claim} has events but no row: {list:?}"));
        };
        let last = list.last().expect("one event");
        if last["status"] != row.status.as_str()
            || last["quantity"] != row.quantity
            || last["user"] != row.user_id.as_str()
            || last["sku"] != row.sku.as_str()
        {
            return Err(format!(
                "claim {claim}: the stream ends {last} but the ledger has {row:?}; events {list:?}"
            ));
        }
    }
    // Every claim the ledger holds was announced (a parked row still pending is not).
    let unannounced: Vec<&Row> = rows
        .iter()
        .filter(|r| !matches!(r.status.as_str(), "pending" | "reprocessing"))
        .filter(|r| !per_claim.contains_key(&r.claim_id))
        .collect();
    if let Some(r) = unannounced.first() {
        return Err(format!(
            "{} claims of the ledger have no event, e.g. {r:?}",
            unannounced.len()
        ));
    }
    Ok(events.len())
}
