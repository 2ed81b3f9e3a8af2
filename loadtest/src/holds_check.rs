//! After `checkout`: the invariants of holds and the waitlist, read from the SKU view and from
//! PostgreSQL (`issuances`, `waitlist`, `outbox`) once the run has settled.
//!
//! Settled: the writer has written everything Redis decided (`in_flight == 0`, nothing
//! `pending`, the ledger `consistent`), and no hold is still `held` past its `expires_at`
//! (the expiry worker caught up). Offers made after the load keep passing down the line
//! while this runs, so the figures are read in one snapshot: the view, then every table in
//! one REPEATABLE READ transaction, then the view again, retried until both views agree.
//!
//! Checked:
//! - units: every unit is confirmed, still held (and not past its time), back in stock, or
//!   was given back by a cancelled or expired hold (to the line or the stock):
//!   `total == remaining + held + confirmed`, `recorded == held + confirmed`, the view's
//!   `held` / `confirmed` equal the ledger's, and `remaining == total − fresh claims +
//!   given back − offers` (units leave the stock by claims and come back by cancels and
//!   expiries, except those handed to the line);
//! - statuses: every claim of the SKU is `held`, `confirmed`, `cancelled` or `expired`;
//! - per user: at most `per_user_limit` units held or confirmed;
//! - per claim a buyer saw: its status fits what the buyer did (a 200 to a confirm is
//!   `confirmed`, a walk-away `expired`, ...; see [`crate::book::status_fits`]), and the
//!   ledger has no claim won outside the line that no buyer saw (unless a request went
//!   unanswered);
//! - the line: offers of `waitlist.offered` events, in the order Redis decided them (the SKU's
//!   state sequence their claims carry, `issuances.seq`), went to strictly increasing
//!   `position`s, and no entry still waiting has a position before the last one offered (it
//!   would have been passed over). The `outbox` id order is not that order: one writer
//!   statement inserts a batch's events in no set order (an expiry call that made offers to
//!   positions 23..28 in one millisecond got ids in the order 23, 28, 24, 25, 26, 27), so
//!   its inversions are printed, not failed.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use anyhow::Context;
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgPool, Row};

use crate::admin::{Admin, SkuView};
use crate::book::{status_fits, Seen};
use crate::scenarios::Drop;
use crate::settings::Secret;
use crate::tally::Tally;
use crate::verify::Verdict;

/// Holds past their time by less than this are the expiry worker's lag, not ghosts.
const EXPIRY_GRACE_SECS: f64 = 2.0;
const POLL: Duration = Duration::from_millis(250);
/// Attempts at reading the view and the ledger while nothing moves.
const SNAPSHOT_TRIES: usize = 20;

/// One claim of the SKU, from `issuances`.
#[derive(Debug, Clone)]
pub struct ClaimRow {
    pub claim_id: String,
    pub user_id: String,
    pub status: String,
    pub quantity: i64,
    /// Held past `expires_at` by more than the grace.
    pub overdue: bool,
    /// The claim is a waitlist offer (its id is an entry id).
    pub offer: bool,
}

/// One waitlist offer: its entry's place in the join order, and its `outbox` row id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offer {
    pub position: i64,
    pub event_id: i64,
}

/// Adjacent offers whose `outbox` ids run against the line: the writer inserts one batch's
/// events in one statement, in no particular order (docs/outbox.md: events of different claims
/// have no order), so this is shown, not checked.
pub fn outbox_inversions(offers: &[Offer]) -> usize {
    let mut by_id = offers.to_vec();
    by_id.sort_by_key(|o| o.event_id);
    by_id
        .windows(2)
        .filter(|p| p[1].position < p[0].position)
        .count()
}

/// Units and claims by status, split between claims won outside the line and offers.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Census {
    /// status → (claims, units), for claims won by a claim request.
    pub holds: BTreeMap<String, (i64, i64)>,
    /// status → (claims, units), for offers.
    pub offers: BTreeMap<String, (i64, i64)>,
}

impl Census {
    pub fn of(rows: &[ClaimRow]) -> Census {
        let mut c = Census::default();
        for r in rows {
            let m = if r.offer { &mut c.offers } else { &mut c.holds };
            let e = m.entry(r.status.clone()).or_default();
            e.0 += 1;
            e.1 += r.quantity;
        }
        c
    }

    fn units(m: &BTreeMap<String, (i64, i64)>, status: &str) -> i64 {
        m.get(status).map_or(0, |e| e.1)
    }

    /// Units in `status`, holds and offers together.
    pub fn all(&self, status: &str) -> i64 {
        Census::units(&self.holds, status) + Census::units(&self.offers, status)
    }

    pub fn fresh_units(&self) -> i64 {
        self.holds.values().map(|e| e.1).sum()
    }

    pub fn offer_units(&self) -> i64 {
        self.offers.values().map(|e| e.1).sum()
    }
}

/// The unit balance of a settled SKU (see the module documentation).
pub fn unit_failures(view: &SkuView, census: &Census) -> Vec<String> {
    let mut f = Vec::new();
    let sku = &view.sku;
    let held = census.all("held");
    let confirmed = census.all("confirmed");
    let given_back = census.all("cancelled") + census.all("expired");
    for bad in census.holds.keys().chain(census.offers.keys()) {
        if !matches!(bad.as_str(), "held" | "confirmed" | "cancelled" | "expired") {
            f.push(format!(
                "{sku}: claims in status {bad:?}: a hold ends confirmed, cancelled or expired"
            ));
        }
    }
    if (view.held, view.confirmed) != (held, confirmed) {
        f.push(format!(
            "{sku}: the view says held {} confirmed {}, the ledger {held} and {confirmed}",
            view.held, view.confirmed
        ));
    }
    if view.recorded != held + confirmed {
        f.push(format!(
            "{sku}: recorded {} != held {held} + confirmed {confirmed}",
            view.recorded
        ));
    }
    match view.remaining {
        Some(remaining) => {
            if view.total != remaining + held + confirmed {
                f.push(format!(
                    "{sku}: total {} != remaining {remaining} + held {held} + confirmed {confirmed}",
                    view.total
                ));
            }
            let expected = view.total - census.fresh_units() + given_back - census.offer_units();
            if remaining != expected {
                f.push(format!(
                    "{sku}: remaining {remaining}, but total {} - claimed {} + given back {given_back} - offered {} = {expected}",
                    view.total,
                    census.fresh_units(),
                    census.offer_units()
                ));
            }
        }
        None => f.push(format!("{sku}: Redis cannot tell the remaining stock")),
    }
    f
}

/// Users holding (held or confirmed) more than `limit` units.
pub fn limit_failures(rows: &[ClaimRow], limit: i64) -> Vec<String> {
    let mut live: BTreeMap<&str, i64> = BTreeMap::new();
    for r in rows {
        if r.status == "held" || r.status == "confirmed" {
            *live.entry(&r.user_id).or_default() += r.quantity;
        }
    }
    live.into_iter()
        .filter(|(_, units)| *units > limit)
        .map(|(user, units)| format!("user {user} holds {units} units, over the limit {limit}"))
        .collect()
}

/// Offers in decision order must go to strictly increasing positions, and nobody still
/// waiting may stand before the last one offered.
pub fn order_failures(offers: &[Offer], lowest_waiting: Option<i64>) -> Vec<String> {
    let mut f = Vec::new();
    for (i, pair) in offers.windows(2).enumerate() {
        if pair[1].position <= pair[0].position {
            f.push(format!(
                "offer #{} went to position {} after offer #{} to position {}: out of line",
                i + 2,
                pair[1].position,
                i + 1,
                pair[0].position
            ));
        }
    }
    let last = offers.iter().map(|o| o.position).max();
    if let (Some(last), Some(low)) = (last, lowest_waiting) {
        if low < last {
            f.push(format!(
                "position {low} still waits, but an offer went to position {last} behind it"
            ));
        }
    }
    f
}

/// Compares every claim a buyer saw with the ledger; returns the failures and the ledger's
/// claims won outside the line that no buyer saw.
pub fn fate_failures(seen: &HashMap<String, Seen>, rows: &[ClaimRow]) -> (Vec<String>, usize) {
    let mut f = Vec::new();
    let by_id: HashMap<&str, &ClaimRow> = rows.iter().map(|r| (r.claim_id.as_str(), r)).collect();
    let mut ids: Vec<&String> = seen.keys().collect();
    ids.sort();
    for id in ids {
        let s = seen[id];
        match by_id.get(id.as_str()) {
            None => f.push(format!(
                "claim {id} ({}) was answered to a buyer but is not in the ledger",
                if s.offer { "offer" } else { "won" }
            )),
            Some(r) if !status_fits(s.expect, &r.status, !r.overdue) => f.push(format!(
                "claim {id} ({}) is {:?}{} in the ledger, but its buyer's last answer was {:?}",
                if s.offer { "offer" } else { "won" },
                r.status,
                if r.overdue { " past its time" } else { "" },
                s.expect
            )),
            Some(_) => {}
        }
    }
    let unseen = rows
        .iter()
        .filter(|r| !r.offer && !seen.contains_key(&r.claim_id))
        .count();
    (f, unseen)
}

/// What the ledger says at one instant.
struct Snapshot {
    claims: Vec<ClaimRow>,
    offers: Vec<Offer>,
    entries: BTreeMap<String, i64>,
    lowest_waiting: Option<i64>,
    /// Waitlist entries with an offer claim but no `waitlist.offered` event.
    offers_without_event: i64,
}

async fn read_snapshot(db: &PgPool, sku: &str) -> anyhow::Result<Snapshot> {
    let mut tx = db.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .execute(&mut *tx)
        .await?;
    let grace = EXPIRY_GRACE_SECS;
    let claims = sqlx::query(
        "SELECT i.claim_id::text AS claim_id, i.user_id, i.status, i.quantity::int8 AS quantity,
                coalesce(i.status = 'held'
                         AND i.expires_at < now() - make_interval(secs => $2), false) AS overdue,
                EXISTS (SELECT 1 FROM waitlist w WHERE w.entry_id = i.claim_id) AS offer
           FROM issuances i WHERE i.sku = $1",
    )
    .bind(sku)
    .bind(grace)
    .fetch_all(&mut *tx)
    .await?
    .into_iter()
    .map(|r| ClaimRow {
        claim_id: r.get("claim_id"),
        user_id: r.get("user_id"),
        status: r.get("status"),
        quantity: r.get("quantity"),
        overdue: r.get("overdue"),
        offer: r.get("offer"),
    })
    .collect();
    // The offer's claim carries the SKU's state sequence at its decision (`issuances.seq`):
    // Redis's order, even among offers one script call made in the same millisecond.
    let offers = sqlx::query_as::<_, (i64, i64)>(
        "SELECT w.position, o.id FROM waitlist w
           JOIN outbox o ON o.claim_id = w.entry_id AND o.event = 'waitlist.offered'
           LEFT JOIN issuances i ON i.claim_id = w.entry_id
          WHERE w.sku = $1
          ORDER BY i.seq NULLS LAST, o.occurred_at, o.id",
    )
    .bind(sku)
    .fetch_all(&mut *tx)
    .await?
    .into_iter()
    .map(|(position, event_id)| Offer { position, event_id })
    .collect();
    let entries: BTreeMap<String, i64> = sqlx::query_as::<_, (String, i64)>(
        "SELECT status, count(*) FROM waitlist WHERE sku = $1 GROUP BY status",
    )
    .bind(sku)
    .fetch_all(&mut *tx)
    .await?
    .into_iter()
    .collect();
    let lowest_waiting: Option<i64> = sqlx::query_scalar(
        "SELECT min(position) FROM waitlist WHERE sku = $1 AND status = 'waiting'",
    )
    .bind(sku)
    .fetch_one(&mut *tx)
    .await?;
    let offers_without_event: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM waitlist w WHERE w.sku = $1 AND w.claim_id IS NOT NULL
            AND NOT EXISTS (SELECT 1 FROM outbox o
                             WHERE o.claim_id = w.entry_id AND o.event = 'waitlist.offered')",
    )
    .bind(sku)
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Snapshot {
        claims,
        offers,
        entries,
        lowest_waiting,
        offers_without_event,
    })
}

fn same(a: &SkuView, b: &SkuView) -> bool {
    (
        a.remaining,
        a.recorded,
        a.in_flight,
        a.pending,
        a.held,
        a.confirmed,
        a.waiting,
        a.offered,
    ) == (
        b.remaining,
        b.recorded,
        b.in_flight,
        b.pending,
        b.held,
        b.confirmed,
        b.waiting,
        b.offered,
    )
}

/// Waits until the SKU has settled (see the module documentation); returns the last view,
/// how long it took, and whether it settled.
async fn settle(
    admin: &Admin,
    db: &PgPool,
    sku: &str,
    limit: Duration,
) -> anyhow::Result<(SkuView, Duration, bool)> {
    let start = Instant::now();
    loop {
        let view = admin.view(sku).await?;
        let ghosts: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM issuances
              WHERE sku = $1 AND status = 'held' AND expires_at < now()",
        )
        .bind(sku)
        .fetch_one(db)
        .await?;
        let settled =
            view.in_flight == Some(0) && view.pending == 0 && view.consistent && ghosts == 0;
        if settled || start.elapsed() >= limit {
            return Ok((view, start.elapsed(), settled));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Checks `checkout` and prints what it found.
pub async fn check(
    admin: &Admin,
    drop: &Drop,
    database_url: Option<&Secret>,
    drain: Duration,
) -> Verdict {
    let mut failures = Vec::new();
    match check_inner(admin, drop, database_url, drain, &mut failures).await {
        Ok(()) => {}
        Err(e) => failures.push(format!("could not check: {e:#}")),
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
    database_url: Option<&Secret>,
    drain: Duration,
    failures: &mut Vec<String>,
) -> anyhow::Result<()> {
    let t = &drop.tally;
    let book = &drop.book;
    let sku = &drop.skus[0];
    println!(
        "\n== checkout: 1 SKU x {} units (first stock), hold {} s, offer {} s, {} goose users, {} journeys (buyers)",
        drop.stock,
        drop.hold_secs,
        drop.offer_secs,
        drop.buyers,
        Tally::count(&book.journeys)
    );
    let answers = book.answers();
    let line: Vec<String> = answers.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    println!("   answers: {}", line.join(", "));
    println!(
        "   without answer: {}, other statuses {:?}, units restocked during the run {}",
        Tally::count(&book.transport),
        t.others(),
        Tally::count(&book.restocked)
    );

    let url = database_url.context("checkout reads the ledger: set DATABASE_URL")?;
    let db = PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(10))
        .connect(url.expose())
        .await
        .context("connecting to DATABASE_URL")?;

    // Holds end hold_seconds after the last win, offers offer_seconds after the last unit
    // given back; then the writer drains.
    let limit = drain + Duration::from_secs(u64::from(drop.hold_secs + drop.offer_secs));
    let (view, took, settled) = settle(admin, &db, sku, limit).await?;
    println!(
        "   settled in {:.1} s: no hold past its time, writer drained",
        took.as_secs_f64()
    );
    if !settled {
        failures.push(format!(
            "{sku}: did not settle within {limit:?} (in_flight {:?}, pending {}, consistent {})",
            view.in_flight, view.pending, view.consistent
        ));
    }

    // The last journal entries of a hand-over (an offer lapsed, the next one made) net to
    // in_flight 0 before both are written; give the writer a moment.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut stable = None;
    for _ in 0..SNAPSHOT_TRIES {
        let before = admin.view(sku).await?;
        let snap = read_snapshot(&db, sku).await?;
        let after = admin.view(sku).await?;
        if same(&before, &after) && after.in_flight == Some(0) {
            stable = Some((after, snap));
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    let Some((view, snap)) = stable else {
        anyhow::bail!("{sku}: the SKU kept changing across {SNAPSHOT_TRIES} reads");
    };

    if !view.consistent {
        failures.push(format!(
            "{sku}: ledger inconsistent: total {} != remaining {:?} + recorded {} + in_flight {:?} + pending {}",
            view.total, view.remaining, view.recorded, view.in_flight, view.pending
        ));
    }
    let census = Census::of(&snap.claims);
    let fmt = |m: &BTreeMap<String, (i64, i64)>| {
        m.iter()
            .map(|(s, (n, _))| format!("{s} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "   {sku} total {} hold_seconds {} remaining {} held {} confirmed {} recorded {} in_flight {} pending {} waiting {} offered {} consistent {}",
        view.total,
        view.hold_seconds,
        view.remaining.map_or("null".into(), |v| v.to_string()),
        view.held,
        view.confirmed,
        view.recorded,
        view.in_flight.map_or("null".into(), |v| v.to_string()),
        view.pending,
        view.waiting,
        view.offered,
        view.consistent
    );
    println!("   holds by outcome: {}", fmt(&census.holds));
    let offered = census.offers.values().map(|e| e.0).sum::<i64>();
    let by = |s: &str| census.offers.get(s).map_or(0, |e| e.0);
    println!(
        "   offers: made {offered}, taken (confirmed) {}, lapsed (expired) {}, declined (cancelled: left the line) {}, still held {}",
        by("confirmed"),
        by("expired"),
        by("cancelled"),
        by("held")
    );
    let entries: Vec<String> = snap
        .entries
        .iter()
        .map(|(s, n)| format!("{s} {n}"))
        .collect();
    println!("   waitlist entries: {}", entries.join(", "));

    failures.extend(unit_failures(&view, &census));
    let overdue = snap.claims.iter().filter(|r| r.overdue).count();
    if overdue > 0 {
        failures.push(format!(
            "{sku}: {overdue} hold(s) still held more than {EXPIRY_GRACE_SECS} s past their time"
        ));
    }
    let limit_f = limit_failures(&snap.claims, view.per_user_limit);
    if !limit_f.is_empty() {
        failures.push(format!(
            "{sku}: {} user(s) over the per-user limit, e.g. {}",
            limit_f.len(),
            limit_f[0]
        ));
    }
    let order = order_failures(&snap.offers, snap.lowest_waiting);
    println!(
        "   line order: {} offers in decision order (the SKU's state sequence), positions strictly increasing: {}; \
         outbox id order inverts {} adjacent pair(s) (not an order the outbox promises)",
        snap.offers.len(),
        if order.is_empty() { "yes" } else { "NO" },
        outbox_inversions(&snap.offers)
    );
    failures.extend(order.into_iter().take(10).map(|o| format!("{sku}: {o}")));
    if snap.offers.len() as i64 != offered {
        failures.push(format!(
            "{sku}: {offered} offer claims in issuances, {} waitlist.offered events",
            snap.offers.len()
        ));
    }
    if snap.offers_without_event > 0 {
        failures.push(format!(
            "{sku}: {} entries name an offer claim without a waitlist.offered event",
            snap.offers_without_event
        ));
    }

    let seen = book.claims();
    let (fates, unseen) = fate_failures(&seen, &snap.claims);
    println!(
        "   claims buyers saw: {} ({} offers); each ledger status fits what its buyer did: {}",
        seen.len(),
        seen.values().filter(|s| s.offer).count(),
        if fates.is_empty() { "yes" } else { "NO" }
    );
    if !fates.is_empty() {
        failures.push(format!(
            "{sku}: {} claim(s) whose status contradicts the buyer's answers, e.g.:",
            fates.len()
        ));
        failures.extend(fates.into_iter().take(10).map(|x| format!("  {x}")));
    }
    if unseen > 0 && Tally::count(&book.transport) == 0 {
        failures.push(format!(
            "{sku}: {unseen} claim(s) won outside the line that no buyer was answered"
        ));
    }
    let won = Tally::count(&t.won) as i64;
    let fresh = census.holds.values().map(|e| e.0).sum::<i64>();
    println!(
        "   fresh wins seen by buyers {won}, claims won outside the line in the ledger {fresh}"
    );
    if won > fresh {
        failures.push(format!(
            "{sku}: buyers saw {won} wins, the ledger has {fresh}"
        ));
    }
    let (count, examples) = t.violations();
    if count > 0 {
        failures.push(format!("{count} broken promise(s) seen by buyers, e.g.:"));
        failures.extend(examples.into_iter().map(|e| format!("  {e}")));
    }
    db.close().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::book::Expect;

    fn row(id: &str, user: &str, status: &str, offer: bool) -> ClaimRow {
        ClaimRow {
            claim_id: id.into(),
            user_id: user.into(),
            status: status.into(),
            quantity: 1,
            overdue: false,
            offer,
        }
    }

    fn offers(p: &[i64]) -> Vec<Offer> {
        p.iter()
            .zip(1..)
            .map(|(&position, event_id)| Offer { position, event_id })
            .collect()
    }

    #[test]
    fn outbox_id_inversions_are_counted() {
        let mut o = offers(&[23, 24, 25, 28]);
        assert_eq!(outbox_inversions(&o), 0);
        // One writer batch: decided 23, 24, 25, 28; inserted 23, 28, 24, 25.
        o[3].event_id = 2;
        o[1].event_id = 3;
        o[2].event_id = 4;
        assert_eq!(outbox_inversions(&o), 1);
        assert!(
            order_failures(&o, None).is_empty(),
            "decision order is fine"
        );
    }

    #[test]
    fn offers_in_line_order_pass() {
        assert!(order_failures(&offers(&[1, 2, 5, 9]), Some(10)).is_empty());
        assert!(order_failures(&offers(&[]), Some(1)).is_empty());
        assert!(order_failures(&offers(&[3]), None).is_empty());
    }

    #[test]
    fn an_offer_out_of_line_fails() {
        let f = order_failures(&offers(&[1, 3, 2, 4]), None);
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(f[0].contains("position 2 after"), "{f:?}");
        assert_eq!(order_failures(&offers(&[1, 1]), None).len(), 1, "twice");
    }

    #[test]
    fn a_waiter_passed_over_fails() {
        let f = order_failures(&offers(&[1, 2, 6]), Some(4));
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(f[0].contains("position 4 still waits"), "{f:?}");
    }

    #[test]
    fn no_user_may_hold_more_than_the_limit() {
        let rows = vec![
            row("a", "u1", "confirmed", false),
            row("b", "u1", "expired", false),
            row("c", "u2", "held", false),
            row("d", "u2", "confirmed", true),
        ];
        let f = limit_failures(&rows, 1);
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(f[0].contains("u2"));
        assert!(limit_failures(&rows, 2).is_empty());
    }

    fn view(total: i64, remaining: i64, held: i64, confirmed: i64) -> SkuView {
        SkuView {
            sku: "s".into(),
            total,
            per_user_limit: 1,
            remaining: Some(remaining),
            recorded: held + confirmed,
            in_flight: Some(0),
            pending: 0,
            compensated: 0,
            hold_seconds: 5,
            held,
            confirmed,
            waiting: 0,
            offered: 0,
            consistent: true,
        }
    }

    #[test]
    fn units_balance_through_holds_and_offers() {
        // 4 units: 4 claims (2 confirmed, 1 cancelled, 1 expired); the cancelled unit was
        // offered and taken, the expired one went back to stock.
        let rows = vec![
            row("a", "u1", "confirmed", false),
            row("b", "u2", "confirmed", false),
            row("c", "u3", "cancelled", false),
            row("d", "u4", "expired", false),
            row("e", "w1", "confirmed", true),
        ];
        let census = Census::of(&rows);
        assert!(unit_failures(&view(4, 1, 0, 3), &census).is_empty());
        // A unit missing from the stock, or a view that disagrees with the ledger.
        assert_eq!(unit_failures(&view(4, 0, 0, 3), &census).len(), 2);
        assert_eq!(unit_failures(&view(4, 1, 1, 2), &census).len(), 1);
        let mut odd = rows.clone();
        odd[3].status = "issued".into();
        assert!(unit_failures(&view(4, 1, 0, 3), &Census::of(&odd))
            .iter()
            .any(|f| f.contains("issued")));
    }

    #[test]
    fn a_claim_must_end_as_its_buyer_was_told() {
        let seen = |e| Seen {
            expect: e,
            offer: false,
        };
        let map = HashMap::from([
            ("a".to_string(), seen(Expect::Confirmed)),
            ("b".to_string(), seen(Expect::Open)),
            ("c".to_string(), seen(Expect::Cancelled)),
            ("z".to_string(), seen(Expect::Open)),
        ]);
        let rows = vec![
            row("a", "u1", "confirmed", false),
            row("b", "u2", "confirmed", false),
            row("c", "u3", "cancelled", false),
            row("x", "u4", "expired", false),
            row("o", "w1", "expired", true),
        ];
        let (f, unseen) = fate_failures(&map, &rows);
        assert_eq!(f.len(), 2, "b confirmed by nobody, z missing: {f:?}");
        assert_eq!(unseen, 1, "x won unseen; the offer o does not count");
    }
}
