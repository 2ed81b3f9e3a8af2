//! Prometheus metrics: registered once per process, histograms with explicit buckets, and
//! names that follow Prometheus's conventions (the unit in the name, in base units: seconds,
//! rows, claims, units of stock; `_total` on counters only).
//!
//! Labels are low-cardinality: never a user id. A `sku` label appears only on the per-SKU
//! gauges (`dropgate_sku_*`), whose set is bounded by the catalog an operator declares.
//!
//! Every family is described and registered at zero when the recorder is installed, so a
//! scrape shows every name before the first event: `rate()` and `increase()` then see a
//! counter's first increment, and a dashboard or alert can be checked against a fresh
//! gateway (see `tests/api/deploy.rs`).

use std::sync::OnceLock;
use std::time::Duration;

use metrics::{counter, gauge, histogram, Counter, Histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::sku::SkuId;

mod register;

/// Latency buckets in seconds: the hot path lives between 100 µs and a few ms.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];
/// Batch sizes: claims per coalesced call, rows per writer batch.
const SIZE_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
];
const LAG_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 5.0, 30.0,
];

/// How late a hold expired: the goal is p99 <= 1 s, so the buckets are fine around it.
const EXPIRY_LAG_BUCKETS: &[f64] = &[0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.75, 1.0, 1.5, 2.0, 5.0];

pub const CLAIMS: &str = "dropgate_claims_total";
pub const CLAIM_LATENCY: &str = "dropgate_claim_latency_seconds";
pub const REDIS_CALL: &str = "dropgate_redis_call_seconds";
pub const COALESCED_BATCH: &str = "dropgate_coalesced_batch_claims";
pub const FAST_REFUSALS: &str = "dropgate_claim_fast_refusals_total";
pub const SOLD_OUT_RECHECKS: &str = "dropgate_sold_out_rechecks_total";
pub const UNCERTAIN_OUTCOMES: &str = "dropgate_uncertain_outcomes_total";
pub const WAIT_SHORT: &str = "dropgate_redis_wait_short_total";
pub const FAILED_FAST: &str = "dropgate_claims_failed_fast_total";
pub const SHARD_TRANSFERS: &str = "dropgate_shard_transfers_total";
pub const JOURNAL_LAG: &str = "dropgate_journal_lag_seconds";
pub const WRITER_BATCH_ROWS: &str = "dropgate_writer_batch_rows";
pub const WRITER_BATCH_SECONDS: &str = "dropgate_writer_batch_seconds";
pub const WRITER_REFUSED: &str = "dropgate_writer_refused_rows_total";
pub const PENDING_ROWS: &str = "dropgate_persistence_pending_rows";
pub const COMPENSATIONS: &str = "dropgate_compensations_total";
pub const COMPENSATED_UNITS: &str = "dropgate_compensated_units_total";
pub const OUTCOME_UNKNOWN: &str = "dropgate_claim_outcome_unknown_total";
pub const OUTCOME_SETTLED: &str = "dropgate_claim_outcome_settled_total";
pub const STALE_STATES: &str = "dropgate_stale_states_total";
pub const CONNECTIONS_REFUSED: &str = "dropgate_connections_refused_total";
pub const QUARANTINED: &str = "dropgate_quarantined_total";
pub const REDIS_UP: &str = "dropgate_redis_up";
pub const POSTGRES_UP: &str = "dropgate_postgres_up";
pub const SKU_TOTAL: &str = "dropgate_sku_total_units";
pub const SKU_REMAINING: &str = "dropgate_sku_remaining_units";
pub const SKU_RECORDED: &str = "dropgate_sku_recorded_units";
pub const SKU_IN_FLIGHT: &str = "dropgate_sku_in_flight_units";
pub const SKU_PENDING: &str = "dropgate_sku_pending_units";
pub const SKU_COMPENSATED: &str = "dropgate_sku_compensated_units";
pub const SKU_QUARANTINED: &str = "dropgate_sku_quarantined_units";
pub const SKU_CONSISTENT: &str = "dropgate_sku_consistent";
pub const SKU_CLOSED: &str = "dropgate_sku_closed";
pub const SKU_HELD: &str = "dropgate_sku_held_units";
pub const SKU_CONFIRMED: &str = "dropgate_sku_confirmed_units";
pub const SKU_GHOST_HOLDS: &str = "dropgate_sku_ghost_holds";
pub const SKU_WAITLIST: &str = "dropgate_sku_waitlist_length";
pub const SKU_OFFERED: &str = "dropgate_sku_waitlist_offered";
pub const SKU_OVERDUE_HOLDS: &str = "dropgate_sku_overdue_held_claims";
pub const OUTBOX_BACKLOG: &str = "dropgate_outbox_backlog_events";
pub const OUTBOX_OLDEST: &str = "dropgate_outbox_oldest_unsent_seconds";
pub const OUTBOX_PUBLISHED: &str = "dropgate_outbox_published_total";
pub const OUTBOX_DUPLICATES: &str = "dropgate_outbox_duplicates_total";
pub const OUTBOX_LAG: &str = "dropgate_outbox_lag_seconds";
pub const OUTBOX_PUBLISH_FAILURES: &str = "dropgate_outbox_publish_failures_total";
/// Age of the open transaction the next claim event waits for (0: none); src/outbox/held_back.rs.
pub const OUTBOX_HELD_BACK: &str = "dropgate_outbox_held_back_seconds";
pub const SKU_UNWRITTEN: &str = "dropgate_sku_unwritten_entries";
// The lifecycle's (src/lifecycle/): holds, their expiry, waitlist offers.
pub const HOLDS: &str = "dropgate_holds_total";
pub const EXPIRY_LAG: &str = "dropgate_hold_expiry_lag_seconds";
pub const OFFERS: &str = "dropgate_waitlist_offers_total";
/// Copies of seat maps read from Redis for `GET /v1/skus/{sku}/seats` (src/seatmaps.rs).
pub const SEAT_MAP_READS: &str = "dropgate_seat_map_reads_total";
// The waiting room's admission worker (src/queue/admit.rs).
pub const QUEUE_WAITING: &str = "dropgate_queue_waiting";
pub const QUEUE_ADMITTED: &str = "dropgate_queue_admitted_total";
pub const QUEUE_LAG: &str = "dropgate_queue_admission_lag_seconds";

/// Every `outcome` label of [`CLAIMS`]: the decisions, then the failures a claim is answered.
pub const CLAIM_OUTCOMES: &[&str] = &[
    "won",
    "replayed",
    "sold_out",
    "limit_reached",
    "key_reused",
    "overloaded",
    "not_open",
    "closed",
    "unavailable",
    "outcome_unknown",
];
/// The `reason` label of [`SKU_CLOSED`]: Redis lost the SKU's state, or holds an older one.
pub const CLOSED_REASONS: &[&str] = &["lost", "stale"];

/// `dropgate_build_info{version}`: always 1, the build a gateway runs (Prometheus's
/// `*_build_info` convention: join it on `instance` to see which version answered).
pub const BUILD_INFO: &str = "dropgate_build_info";

/// The process collector (`process_*`), described once with the other families.
fn process_collector() -> &'static metrics_process::Collector {
    static COLLECTOR: OnceLock<metrics_process::Collector> = OnceLock::new();
    COLLECTOR.get_or_init(metrics_process::Collector::default)
}

/// The scrape: the process's own figures read now (from /proc), then every family.
pub fn render(handle: &PrometheusHandle) -> String {
    process_collector().collect();
    handle.render()
}

/// Installs the process-wide recorder the first time; later calls (several apps in one test
/// process) share it.
pub fn handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
                .and_then(|b| {
                    b.set_buckets_for_metric(Matcher::Full(COALESCED_BATCH.into()), SIZE_BUCKETS)
                })
                .and_then(|b| {
                    b.set_buckets_for_metric(Matcher::Full(WRITER_BATCH_ROWS.into()), SIZE_BUCKETS)
                })
                .and_then(|b| {
                    b.set_buckets_for_metric(Matcher::Full(JOURNAL_LAG.into()), LAG_BUCKETS)
                })
                .and_then(|b| {
                    b.set_buckets_for_metric(Matcher::Full(EXPIRY_LAG.into()), EXPIRY_LAG_BUCKETS)
                })
                .and_then(|b| {
                    b.set_buckets_for_metric(Matcher::Full(OUTBOX_LAG.into()), LAG_BUCKETS)
                })
                .expect("bucket lists are non-empty constants")
                .build_recorder();
            let handle = recorder.handle();
            // Another recorder may already be installed (a benchmark); then ours only renders.
            if metrics::set_global_recorder(recorder).is_ok() {
                register::all();
            }
            handle
        })
        .clone()
}

/// Handles of the metrics every claim touches, looked up once: `counter!` with a label hashes
/// the name and labels into the registry on every call.
struct PerClaim {
    /// Each outcome's counter and latency histogram (`outcome` label on both: a p99 of the
    /// wins alone is what a buyer waits for, sold-out refusals answered from memory aside).
    outcomes: Vec<(&'static str, Counter, Histogram)>,
    fast_refusals: Counter,
}

fn per_claim() -> &'static PerClaim {
    static HANDLES: OnceLock<PerClaim> = OnceLock::new();
    HANDLES.get_or_init(|| {
        // The recorder first, so these handles are never the no-op ones.
        let _ = handle();
        PerClaim {
            outcomes: CLAIM_OUTCOMES
                .iter()
                .map(|o| {
                    (
                        *o,
                        counter!(CLAIMS, "outcome" => *o),
                        histogram!(CLAIM_LATENCY, "outcome" => *o),
                    )
                })
                .collect(),
            fast_refusals: counter!(FAST_REFUSALS),
        }
    })
}

/// Counts a claim's decision by its `outcome` label ([`crate::claims::Outcome::label`]) and
/// records how long it took.
pub fn claim_decided(label: &'static str, took: Duration) {
    let h = per_claim();
    match h.outcomes.iter().find(|(o, ..)| *o == label) {
        Some((_, c, l)) => {
            c.increment(1);
            l.record(took.as_secs_f64());
        }
        None => {
            counter!(CLAIMS, "outcome" => label).increment(1);
            histogram!(CLAIM_LATENCY, "outcome" => label).record(took.as_secs_f64());
        }
    }
}

/// Counts a hold decision (`created`, `confirmed`, `cancelled`, `expired`).
pub fn hold_decided(outcome: &'static str) {
    counter!(HOLDS, "outcome" => outcome).increment(1);
}

/// Counts offers as the writer records them.
pub fn offers(result: &'static str, n: usize) {
    if n > 0 {
        counter!(OFFERS, "result" => result).increment(n as u64);
    }
}

/// Counts a seat map read from Redis (one per copy, whatever the number of readers).
pub fn seat_map_read() {
    counter!(SEAT_MAP_READS).increment(1);
}

pub fn claim_failed(code: &'static str) {
    counter!(CLAIMS, "outcome" => code).increment(1);
}

pub fn redis_call(script: &'static str, took: Duration) {
    histogram!(REDIS_CALL, "script" => script).record(took.as_secs_f64());
}

/// A claim refused `sold_out` from memory (see [`crate::soldout`]).
pub fn fast_refusal() {
    per_claim().fast_refusals.increment(1);
}

pub fn sold_out_rechecks(skus: usize) {
    counter!(SOLD_OUT_RECHECKS).increment(skus as u64);
}

pub fn coalesced_batch(size: usize) {
    histogram!(COALESCED_BATCH).record(size as f64);
}

pub fn shard_transfer() {
    counter!(SHARD_TRANSFERS).increment(1);
}

pub fn wait_short() {
    counter!(WAIT_SHORT).increment(1);
}

pub fn failed_fast(claims: usize) {
    counter!(FAILED_FAST).increment(claims as u64);
}

pub fn uncertain_outcome() {
    counter!(UNCERTAIN_OUTCOMES).increment(1);
}

pub fn journal_lag(lag: Duration) {
    histogram!(JOURNAL_LAG).record(lag.as_secs_f64());
}

pub fn writer_batch(rows: usize, took: Duration) {
    histogram!(WRITER_BATCH_ROWS).record(rows as f64);
    histogram!(WRITER_BATCH_SECONDS).record(took.as_secs_f64());
}

pub fn writer_refused(rows: usize) {
    counter!(WRITER_REFUSED).increment(rows as u64);
}

pub fn pending_rows(n: i64) {
    gauge!(PENDING_ROWS).set(n as f64);
}

pub fn compensated(units: i64) {
    counter!(COMPENSATIONS).increment(1);
    counter!(COMPENSATED_UNITS).increment(units as u64);
}

/// A claim answered 503 `outcome_unknown`: handed to the settler.
pub fn outcome_unknown() {
    counter!(OUTCOME_UNKNOWN).increment(1);
}

/// How an unknown outcome settled.
pub fn outcome_settled(won: bool) {
    let result = if won { "won" } else { "fenced" };
    counter!(OUTCOME_SETTLED, "result" => result).increment(1);
}

/// A SKU's Redis state found behind the ledger and closed.
pub fn stale_state() {
    counter!(STALE_STATES).increment(1);
}

pub fn connection_refused() {
    counter!(CONNECTIONS_REFUSED).increment(1);
}

/// A journal entry no table would take, stored in `quarantine`.
pub fn quarantined() {
    counter!(QUARANTINED).increment(1);
}

/// Whether Redis and PostgreSQL answered this gateway (its periodic ping, or `/readyz`).
pub fn backends_up(redis: Option<bool>, postgres: Option<bool>) {
    if let Some(up) = redis {
        gauge!(REDIS_UP).set(f64::from(u8::from(up)));
    }
    if let Some(up) = postgres {
        gauge!(POSTGRES_UP).set(f64::from(u8::from(up)));
    }
}

/// Ghost holds (past their expires_at, not yet expired) and the waitlist's length, as Redis
/// has them; NaN when Redis cannot tell.
pub fn sku_lifecycle(sku: &SkuId, counts: Option<(i64, i64)>) {
    let (ghosts, line) = counts.map_or((f64::NAN, f64::NAN), |(g, l)| (g as f64, l as f64));
    gauge!(SKU_GHOST_HOLDS, "sku" => sku.to_string()).set(ghosts);
    gauge!(SKU_WAITLIST, "sku" => sku.to_string()).set(line);
}

/// Claims the ledger still has held past their time (see [`crate::observe`]); NaN when the
/// ledger could not be read.
pub fn sku_overdue_holds(sku: &SkuId, n: Option<i64>) {
    gauge!(SKU_OVERDUE_HOLDS, "sku" => sku.to_string()).set(n.map_or(f64::NAN, |n| n as f64));
}

/// The SKU's Redis side is unknown (Redis unreachable): what depends on it turns NaN.
pub fn sku_redis_unknown(sku: &SkuId) {
    for name in [SKU_REMAINING, SKU_IN_FLIGHT, SKU_CONSISTENT, SKU_UNWRITTEN] {
        gauge!(name, "sku" => sku.to_string()).set(f64::NAN);
    }
}

/// Sets `dropgate_sku_closed{sku, reason}`: 1 for the reason the SKU fails closed, 0 for the
/// others (both 0 while it is open), so each series exists and an alert sees it change.
pub fn sku_closed(sku: &SkuId, reason: Option<&str>) {
    for r in CLOSED_REASONS {
        let v = f64::from(u8::from(reason == Some(*r)));
        gauge!(SKU_CLOSED, "sku" => sku.to_string(), "reason" => *r).set(v);
    }
}

/// The outbox's unsent events (all gateways'), and how long the oldest has waited.
pub fn outbox_backlog(events: i64, oldest: Option<f64>) {
    gauge!(OUTBOX_BACKLOG).set(events as f64);
    gauge!(OUTBOX_OLDEST).set(oldest.unwrap_or(0.0));
}

/// The age of the transaction the relay waits for (0 when it waits for none).
pub fn outbox_held_back(seconds: f64) {
    gauge!(OUTBOX_HELD_BACK).set(seconds);
}

/// Events acknowledged by JetStream and marked sent by this gateway's relay.
pub fn outbox_published(events: u64) {
    counter!(OUTBOX_PUBLISHED).increment(events);
}

/// Publishes JetStream acknowledged as duplicates: a redelivery it dropped by `Nats-Msg-Id`.
pub fn outbox_duplicates(events: u64) {
    counter!(OUTBOX_DUPLICATES).increment(events);
}

/// From an event's insert (its transaction commits right after) to JetStream's acknowledgement.
pub fn outbox_lag(lag: Duration) {
    histogram!(OUTBOX_LAG).record(lag.as_secs_f64());
}

/// Events a relay could not publish this round (NATS unreachable, no stream, no ack in time).
pub fn outbox_publish_failed(events: u64) {
    counter!(OUTBOX_PUBLISH_FAILURES).increment(events);
}
