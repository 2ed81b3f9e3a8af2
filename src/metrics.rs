//! Prometheus metrics: registered once per process, low-cardinality labels only (never a user
//! or a SKU), histograms with explicit buckets.

use std::sync::OnceLock;
use std::time::Duration;

use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::claims::Outcome;

/// Latency buckets in seconds: the hot path lives between 100 µs and a few ms.
const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];
const SIZE_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
];
const LAG_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 5.0, 30.0,
];

/// Installs the process-wide recorder the first time; later calls (several apps in one test
/// process) share it.
pub fn handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
                .and_then(|b| {
                    b.set_buckets_for_metric(Matcher::Suffix("_size".into()), SIZE_BUCKETS)
                })
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full("dropgate_journal_lag_seconds".into()),
                        LAG_BUCKETS,
                    )
                })
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full("dropgate_outbox_lag_seconds".into()),
                        LAG_BUCKETS,
                    )
                })
                .expect("bucket lists are non-empty constants")
                .build_recorder();
            let handle = recorder.handle();
            // Another recorder may already be installed (a benchmark); then ours only renders.
            let _ = metrics::set_global_recorder(recorder);
            handle
        })
        .clone()
}

pub fn claim_decided(outcome: &Outcome, took: Duration) {
    let label = match outcome {
        Outcome::Won(_) => "won",
        Outcome::Replayed(_) => "replayed",
        Outcome::SoldOut => "sold_out",
        Outcome::LimitReached => "limit_reached",
        Outcome::KeyReused => "key_reused",
        Outcome::Shed => "overloaded",
    };
    counter!("dropgate_claims_total", "outcome" => label).increment(1);
    histogram!("dropgate_claim_latency_seconds").record(took.as_secs_f64());
}

pub fn claim_failed(code: &'static str) {
    counter!("dropgate_claims_total", "outcome" => code).increment(1);
}

pub fn redis_call(script: &'static str, took: Duration) {
    histogram!("dropgate_redis_call_seconds", "script" => script).record(took.as_secs_f64());
}

pub fn coalesced_batch(size: usize) {
    histogram!("dropgate_coalesced_batch_size").record(size as f64);
}

pub fn uncertain_outcome() {
    counter!("dropgate_uncertain_outcomes_total").increment(1);
}

pub fn journal_lag(lag: Duration) {
    histogram!("dropgate_journal_lag_seconds").record(lag.as_secs_f64());
}

pub fn writer_batch(rows: usize, took: Duration) {
    histogram!("dropgate_writer_batch_size").record(rows as f64);
    histogram!("dropgate_writer_batch_seconds").record(took.as_secs_f64());
}

pub fn writer_refused(rows: usize) {
    counter!("dropgate_writer_refused_rows_total").increment(rows as u64);
}

pub fn pending_rows(n: i64) {
    gauge!("dropgate_persistence_pending_rows").set(n as f64);
}

pub fn compensated(units: i64) {
    counter!("dropgate_compensations_total").increment(1);
    counter!("dropgate_compensated_units_total").increment(units as u64);
}

/// A claim answered 503 `outcome_unknown`: handed to the settler.
pub fn outcome_unknown() {
    counter!("dropgate_claim_outcome_unknown_total").increment(1);
}

/// How an unknown outcome settled.
pub fn outcome_settled(won: bool) {
    let result = if won { "won" } else { "fenced" };
    counter!("dropgate_claim_outcome_settled_total", "result" => result).increment(1);
}

/// A SKU's Redis state found behind the ledger and closed.
pub fn stale_state() {
    counter!("dropgate_stale_states_total").increment(1);
}

pub fn connection_refused() {
    counter!("dropgate_connections_refused_total").increment(1);
}

/// A journal entry no table would take, stored in `quarantine`.
pub fn quarantined() {
    counter!("dropgate_quarantined_total").increment(1);
}

/// The outbox's unsent events (all gateways'), and how long the oldest has waited.
pub fn outbox_backlog(events: i64, oldest: Option<f64>) {
    gauge!("dropgate_outbox_backlog_events").set(events as f64);
    gauge!("dropgate_outbox_oldest_unsent_seconds").set(oldest.unwrap_or(0.0));
}

/// Events acknowledged by JetStream and marked sent by this gateway's relay.
pub fn outbox_published(events: u64) {
    counter!("dropgate_outbox_published_total").increment(events);
}

/// Publishes JetStream acknowledged as duplicates: a redelivery it dropped by `Nats-Msg-Id`.
pub fn outbox_duplicates(events: u64) {
    counter!("dropgate_outbox_duplicates_total").increment(events);
}

/// From an event's insert (its transaction commits right after) to JetStream's acknowledgement.
pub fn outbox_lag(lag: Duration) {
    histogram!("dropgate_outbox_lag_seconds").record(lag.as_secs_f64());
}

/// Events a relay could not publish this round (NATS unreachable, no stream, no ack in time).
pub fn outbox_publish_failed(events: u64) {
    counter!("dropgate_outbox_publish_failures_total").increment(events);
}
