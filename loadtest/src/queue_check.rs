//! `queue_drop`'s checks after the load (see [`crate::queue_drop`]): the SKU sold out with
//! every unit accounted for, nobody claimed without admission (the ledger's buyers against
//! the visitors the queue admitted, every claim without admission refused), sold out reached
//! the whole line (every ticket not admitted reads `sold_out`), one admission per ticket, and
//! the admissions' pace against the set rate.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::Duration;

use sqlx::postgres::PgPoolOptions;

use crate::admin::Admin;
use crate::line::ADMISSION_TTL_SECS;
use crate::queue_drop::{read_ticket, visitor_name};
use crate::scenarios::Drop;
use crate::settings::Secret;
use crate::tally::Tally;
use crate::verify::{sku_invariants, Verdict};

/// Checks `queue_drop` and prints what it found.
pub async fn check(
    admin: &Admin,
    drop: &Drop,
    base: &str,
    database_url: Option<&Secret>,
    drain: Duration,
) -> Verdict {
    let mut failures = Vec::new();
    if let Err(e) = check_inner(admin, drop, base, database_url, drain, &mut failures).await {
        failures.push(format!("could not check: {e:#}"));
    }
    for f in &failures {
        println!("   FAIL {f}");
    }
    if failures.is_empty() {
        println!("   OK: every invariant holds");
    }
    Verdict { failures }
}

async fn check_inner(
    admin: &Admin,
    drop: &Drop,
    base: &str,
    database_url: Option<&Secret>,
    drain: Duration,
    failures: &mut Vec<String>,
) -> anyhow::Result<()> {
    let sku = &drop.skus[0];
    let line = &drop.line;
    let t = &drop.tally;
    println!(
        "\n== queue_drop: 1 SKU x {} units, {} visitors, admitted at {}/s from {} s after the declare",
        drop.stock, drop.buyers, drop.admit_per_second, drop.open_secs
    );
    let answers: Vec<String> = (line.answers().iter())
        .map(|(k, v)| format!("{k}: {v}"))
        .collect();
    println!("   answers: {}", answers.join(", "));

    // No oversell, no unit lost: as every drop.
    let (view, drained) = admin.wait_drained(sku, drain).await?;
    sku_invariants(&view, drained, drain, failures);
    let sold = view.total - view.remaining.unwrap_or(view.total);
    let won = Tally::count(&t.won) as i64;
    let transport = Tally::count(&t.transport);
    println!(
        "   {sku}: total {} remaining {:?} recorded {} in_flight {:?} pending {} consistent {}; wins seen {won}",
        view.total, view.remaining, view.recorded, view.in_flight, view.pending, view.consistent
    );
    if won > sold || (won < sold && transport == 0) {
        failures.push(format!(
            "visitors saw {won} wins but {sold} units left stock"
        ));
    }
    let (count, examples) = t.violations();
    if count > 0 {
        failures.push(format!("{count} broken promise(s), e.g.:"));
        failures.extend(examples.into_iter().map(|e| format!("  {e}")));
    }

    // Nobody claims without admission.
    let tickets = line.tickets();
    let admissions = line.admissions();
    let admitted_names: HashSet<String> = (tickets.iter())
        .filter(|(_, ticket)| admissions.contains_key(*ticket))
        .map(|(i, _)| visitor_name(&drop.run_id, *i))
        .collect();
    let cheats = line.cheats.load(Ordering::Relaxed);
    let let_in = line.cheats_let_in.load(Ordering::Relaxed);
    println!(
        "   claims without admission: {cheats}, refused 403 not_admitted: {}",
        cheats - let_in
    );
    if let_in > 0 {
        failures.push(format!(
            "{let_in} claims without admission were not refused"
        ));
    }
    match database_url {
        Some(url) => {
            let db = PgPoolOptions::new()
                .max_connections(2)
                .acquire_timeout(Duration::from_secs(10))
                .connect(url.expose())
                .await?;
            let buyers: Vec<(String, i64)> = sqlx::query_as(
                "SELECT user_id, SUM(quantity)::bigint FROM (
                   SELECT user_id, quantity FROM issuances WHERE sku = $1
                   UNION ALL SELECT user_id, quantity FROM persistence_pending p WHERE sku = $1
                     AND NOT EXISTS (SELECT 1 FROM issuances i WHERE i.claim_id = p.claim_id)
                 ) c GROUP BY user_id",
            )
            .bind(sku)
            .fetch_all(&db)
            .await?;
            let units: i64 = buyers.iter().map(|(_, n)| n).sum();
            let outsiders: Vec<&String> = (buyers.iter())
                .map(|(u, _)| u)
                .filter(|u| !admitted_names.contains(*u))
                .collect();
            println!(
                "   ledger: {units} units to {} buyers, {} of them not admitted by the queue",
                buyers.len(),
                outsiders.len()
            );
            if !outsiders.is_empty() {
                failures.push(format!(
                    "{} buyers in the ledger were never admitted, e.g. {:?}",
                    outsiders.len(),
                    outsiders.iter().take(3).collect::<Vec<_>>()
                ));
            }
            if units != sold {
                failures.push(format!("the ledger holds {units} units, {sold} left stock"));
            }
        }
        None => {
            println!("   ledger not read (no DATABASE_URL): buyers checked by their answers only")
        }
    }

    // Sold out reached the whole line; each ticket admitted once.
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()?;
    let mut states: BTreeMap<String, usize> = BTreeMap::new();
    let mut not_told = Vec::new();
    let mut twice = Vec::new();
    for (i, ticket) in &tickets {
        let name = visitor_name(&drop.run_id, *i);
        let (state, expires) = read_ticket(&http, base, &drop.secret, &name, ticket).await?;
        *states.entry(state.clone()).or_default() += 1;
        match admissions.get(ticket) {
            None if state != "sold_out" => not_told.push(format!("{name}: {state}")),
            Some(seen)
                if seen.len() != 1
                    || (state == "admitted"
                        && !seen.contains(&expires.clone().unwrap_or_default())) =>
            {
                twice.push(format!("{name}: {seen:?}, now {expires:?}"))
            }
            _ => {}
        }
    }
    println!(
        "   tickets: {} joined ({} in the pre-queue), now {states:?}",
        tickets.len(),
        line.prequeue.load(Ordering::Relaxed)
    );
    if !not_told.is_empty() {
        failures.push(format!(
            "{} tickets never admitted do not read sold_out, e.g. {:?}",
            not_told.len(),
            &not_told[..not_told.len().min(3)]
        ));
    }
    if !twice.is_empty() {
        failures.push(format!(
            "{} tickets admitted more than once, e.g. {:?}",
            twice.len(),
            &twice[..twice.len().min(3)]
        ));
    }
    if tickets.len() < drop.buyers / 2 {
        failures.push(format!(
            "only {} of {} visitors joined: the load did not form the line this run checks",
            tickets.len(),
            drop.buyers
        ));
    }

    // The waves: admissions per second of Redis's clock (from their expiries).
    let mut at: Vec<i64> = (admissions.values())
        .filter_map(|s| s.iter().next())
        .filter_map(|e| chrono::DateTime::parse_from_rfc3339(e).ok())
        .map(|t| t.timestamp_millis() - ADMISSION_TTL_SECS * 1000)
        .collect();
    at.sort_unstable();
    if let (Some(first), Some(last)) = (at.first(), at.last()) {
        let mut per_second: BTreeMap<i64, usize> = BTreeMap::new();
        for t in &at {
            *per_second.entry((t - first) / 1000).or_default() += 1;
        }
        let span = (last - first) as f64 / 1000.0;
        let rate = if span > 0.0 {
            (at.len() - 1) as f64 / span
        } else {
            0.0
        };
        println!(
            "   admissions: {} in {span:.2} s ({rate:.1}/s, set {}/s); per second from the first: {:?}",
            at.len(),
            drop.admit_per_second,
            per_second.values().collect::<Vec<_>>()
        );
    }
    Ok(())
}
