//! After the load: the invariants, read through the admin API once the writer has drained.
//!
//! Per SKU: it sold out (`remaining == 0`), the units won equal the units stocked
//! (`recorded + in_flight + pending == total`), and the ledger is consistent with nothing left
//! in flight. Per scenario: the wins buyers saw equal the units that left stock, and no buyer
//! saw a broken promise (see `tally`).

use std::time::{Duration, Instant};

use crate::admin::{Admin, SkuView};
use crate::scenarios::Drop;
use crate::tally::Tally;

/// The outcome of one scenario's checks.
pub struct Verdict {
    pub failures: Vec<String>,
}

/// Checks one scenario and prints what it found.
pub async fn check(admin: &Admin, drop: &Drop, drain: Duration) -> Verdict {
    let mut failures = Vec::new();
    let t = &drop.tally;
    let won = Tally::count(&t.won);
    let transport = Tally::count(&t.transport);
    println!(
        "\n== {}: {} SKU(s) x {} units, {} buyers",
        drop.kind.name(),
        drop.skus.len(),
        drop.stock,
        drop.buyers
    );
    println!(
        "   answers: {won} won, {} replayed, {} sold_out, {} limit_reached, {transport} without answer, other {:?}",
        Tally::count(&t.replayed),
        Tally::count(&t.sold_out),
        Tally::count(&t.limit_reached),
        t.others()
    );

    // One deadline for the scenario's SKUs: the writer drains them all at once.
    let deadline = Instant::now() + drain;
    let mut sold = 0i64;
    let mut all_read = true;
    let mut shown = 0;
    for (i, sku) in drop.skus.iter().enumerate() {
        let left = deadline.saturating_duration_since(Instant::now());
        let (view, drained) = match admin.wait_drained(sku, left).await {
            Ok(v) => v,
            Err(e) => {
                // A gateway that stops answering would make every further read wait too.
                failures.push(format!("{sku}: could not read the SKU view: {e:#}"));
                if i + 1 < drop.skus.len() {
                    failures.push(format!(
                        "{} more SKUs not checked: the gateway does not answer",
                        drop.skus.len() - i - 1
                    ));
                }
                shown = drop.skus.len();
                all_read = false;
                break;
            }
        };
        let before = failures.len();
        sku_invariants(&view, drained, drain, &mut failures);
        sold += view.total - view.remaining.unwrap_or(view.total);
        // Print every SKU of a small scenario, and any SKU that failed.
        if drop.skus.len() <= 5 || failures.len() > before {
            print_view(&view, failures.len() == before);
            shown += 1;
        }
    }
    if shown < drop.skus.len() {
        println!(
            "   ({} more SKUs passed every check)",
            drop.skus.len() - shown
        );
    }

    // The wins buyers saw against the units that left stock. A request without an answer may
    // have won unseen, so then only seeing more than was sold is a failure.
    let won = won as i64;
    if all_read {
        println!(
            "   units sold {sold}, fresh wins seen by buyers {won}, buyer-SKU pairs that won {}",
            t.winners()
        );
    }
    if all_read && (won > sold || (won < sold && transport == 0)) {
        failures.push(format!(
            "buyers saw {won} fresh wins but {sold} units left stock"
        ));
    }
    let (count, examples) = t.violations();
    if count > 0 {
        failures.push(format!("{count} broken promise(s) seen by buyers, e.g.:"));
        failures.extend(examples.into_iter().map(|e| format!("  {e}")));
    }
    for f in &failures {
        println!("   FAIL {f}");
    }
    if failures.is_empty() {
        println!("   OK: every invariant holds");
    }
    Verdict { failures }
}

/// The invariants of one SKU that the load was sized to sell out.
pub fn sku_invariants(view: &SkuView, drained: bool, drain: Duration, failures: &mut Vec<String>) {
    let sku = &view.sku;
    if !drained {
        failures.push(format!(
            "{sku}: the writer did not drain within {drain:?} (in_flight {:?}, consistent {})",
            view.in_flight, view.consistent
        ));
    }
    if !view.consistent {
        failures.push(format!(
            "{sku}: ledger inconsistent: total {} != remaining {:?} + recorded {} + in_flight {:?} + pending {}",
            view.total, view.remaining, view.recorded, view.in_flight, view.pending
        ));
    }
    match view.remaining {
        Some(0) => {
            let accounted = view.recorded + view.in_flight.unwrap_or(0) + view.pending;
            if accounted != view.total {
                failures.push(format!(
                    "{sku}: sold out but units won {accounted} (recorded {} + in_flight {:?} + pending {}) != units stocked {}",
                    view.recorded, view.in_flight, view.pending, view.total
                ));
            }
        }
        Some(r) => failures.push(format!(
            "{sku}: not sold out ({r} of {} left): the load did not reach the state this run checks",
            view.total
        )),
        None => failures.push(format!("{sku}: Redis cannot tell the remaining stock")),
    }
}

fn print_view(v: &SkuView, ok: bool) {
    println!(
        "   {} total {} limit {} remaining {} recorded {} in_flight {} pending {} compensated {} consistent {} -> {}",
        v.sku,
        v.total,
        v.per_user_limit,
        opt(v.remaining),
        v.recorded,
        opt(v.in_flight),
        v.pending,
        v.compensated,
        v.consistent,
        if ok { "ok" } else { "FAIL" }
    );
}

fn opt(v: Option<i64>) -> String {
    v.map_or_else(|| "null".into(), |n| n.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(total: i64, remaining: i64, recorded: i64, in_flight: i64, pending: i64) -> SkuView {
        SkuView {
            sku: "s".into(),
            total,
            per_user_limit: 1,
            remaining: Some(remaining),
            recorded,
            in_flight: Some(in_flight),
            pending,
            compensated: 0,
            hold_seconds: 0,
            held: 0,
            confirmed: recorded,
            waiting: 0,
            offered: 0,
            consistent: total == remaining + recorded + in_flight + pending,
        }
    }

    #[test]
    fn a_sold_out_drained_sku_passes() {
        let mut f = Vec::new();
        sku_invariants(&view(10, 0, 9, 0, 1), true, Duration::from_secs(1), &mut f);
        assert!(f.is_empty(), "{f:?}");
    }

    #[test]
    fn a_sku_with_stock_left_or_units_missing_fails() {
        let mut f = Vec::new();
        sku_invariants(&view(10, 2, 8, 0, 0), true, Duration::from_secs(1), &mut f);
        assert_eq!(f.len(), 1, "{f:?}");
        let mut f = Vec::new();
        sku_invariants(&view(10, 0, 7, 0, 0), false, Duration::from_secs(1), &mut f);
        assert_eq!(f.len(), 3, "undrained, inconsistent, units missing: {f:?}");
    }
}
