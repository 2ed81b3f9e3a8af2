//! Every process-wide family described (its HELP text) and registered at zero when the
//! recorder is installed (see the docs of [`crate::metrics`]). A family missing here shows in
//! no scrape until its first event, without HELP: `tests/api/metrics.rs` scrapes a fresh
//! gateway and checks every name used in src/ against it, and `promtool check metrics` runs
//! on that scrape.

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};

use super::*;

/// Describes every process-wide family and registers it at zero (see the module docs). The
/// per-SKU gauges appear with the first round of [`crate::observe`].
pub(super) fn all() {
    lifecycle();
    process_collector().describe();
    process_collector().collect();
    describe_gauge!(
        BUILD_INFO,
        "Always 1: the version of dropgate this gateway runs"
    );
    gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    describe_counter!(
        CLAIMS,
        "Claims answered, by outcome (decisions, and 429/503 answers)"
    );
    describe_histogram!(
        CLAIM_LATENCY,
        "Time from a claim's arrival at the decision to Redis's answer, in seconds, by outcome"
    );
    for outcome in CLAIM_OUTCOMES {
        counter!(CLAIMS, "outcome" => *outcome).increment(0);
        let _registered = histogram!(CLAIM_LATENCY, "outcome" => *outcome);
    }
    describe_histogram!(REDIS_CALL, "Duration of one Redis script call, in seconds");
    let _registered = histogram!(REDIS_CALL, "script" => "claim");
    describe_histogram!(
        COALESCED_BATCH,
        "Claims decided by one coalesced claim.lua call"
    );
    let _registered = histogram!(COALESCED_BATCH);
    describe_counter!(
        FAST_REFUSALS,
        "Claims refused sold_out from memory, without a Redis call (also counted in dropgate_claims_total)"
    );
    counter!(FAST_REFUSALS).increment(0);
    describe_counter!(
        SOLD_OUT_RECHECKS,
        "Stock reads of SKUs known sold out, that keep the fast path's answers at most 100 ms old"
    );
    counter!(SOLD_OUT_RECHECKS).increment(0);
    describe_counter!(
        UNCERTAIN_OUTCOMES,
        "Claim calls that got no answer and were read back"
    );
    counter!(UNCERTAIN_OUTCOMES).increment(0);
    describe_counter!(
        WAIT_SHORT,
        "Decisions with wins that fewer replicas than DROPGATE_REDIS_WAIT_REPLICAS acknowledged in time (answered outcome_unknown, then settled by reading)"
    );
    counter!(WAIT_SHORT).increment(0);
    describe_counter!(
        FAILED_FAST,
        "Claims answered 503 unavailable without a call: their SKU's last call got no answer, and a read of its slot got none either (src/claims/call.rs, probe)"
    );
    counter!(FAILED_FAST).increment(0);
    describe_counter!(
        SHARD_TRANSFERS,
        "Transfers of units between two shards of a sharded SKU (begun: transfer_out.lua took units)"
    );
    counter!(SHARD_TRANSFERS).increment(0);
    describe_histogram!(
        JOURNAL_LAG,
        "Time from Redis deciding a winner to its row committed in PostgreSQL, in seconds"
    );
    let _registered = histogram!(JOURNAL_LAG);
    describe_histogram!(WRITER_BATCH_ROWS, "Winners written by one writer batch");
    let _registered = histogram!(WRITER_BATCH_ROWS);
    describe_histogram!(
        WRITER_BATCH_SECONDS,
        "Duration of one writer batch insert, in seconds"
    );
    let _registered = histogram!(WRITER_BATCH_SECONDS);
    describe_counter!(
        WRITER_REFUSED,
        "Winners PostgreSQL refused, parked in persistence_pending"
    );
    counter!(WRITER_REFUSED).increment(0);
    describe_gauge!(
        PENDING_ROWS,
        "Rows of persistence_pending not yet resolved (pending or reprocessing)"
    );
    gauge!(PENDING_ROWS).set(0.0);
    describe_counter!(
        COMPENSATIONS,
        "Claims compensated: their units given back after the last attempt"
    );
    counter!(COMPENSATIONS).increment(0);
    describe_counter!(COMPENSATED_UNITS, "Units given back by compensations");
    counter!(COMPENSATED_UNITS).increment(0);
    describe_counter!(
        OUTCOME_UNKNOWN,
        "Claims answered 503 outcome_unknown and handed to the settler"
    );
    counter!(OUTCOME_UNKNOWN).increment(0);
    describe_counter!(
        OUTCOME_SETTLED,
        "Unknown outcomes settled, by result (won, fenced)"
    );
    for result in ["won", "fenced"] {
        counter!(OUTCOME_SETTLED, "result" => result).increment(0);
    }
    describe_counter!(
        STALE_STATES,
        "SKU states found behind the ledger and closed until restore"
    );
    counter!(STALE_STATES).increment(0);
    describe_counter!(
        CONNECTIONS_REFUSED,
        "Connections refused past DROPGATE_MAX_CONNECTIONS"
    );
    counter!(CONNECTIONS_REFUSED).increment(0);
    describe_counter!(
        QUARANTINED,
        "Journal entries no table would take, stored in quarantine"
    );
    counter!(QUARANTINED).increment(0);
    describe_gauge!(REDIS_UP, "1 when Redis answered this gateway's last ping");
    describe_gauge!(
        POSTGRES_UP,
        "1 when PostgreSQL answered this gateway's last ping"
    );
    describe_gauge!(SKU_TOTAL, "Units declared for the SKU (catalog total)");
    describe_gauge!(
        SKU_REMAINING,
        "Redis stock of the SKU; NaN when Redis cannot tell"
    );
    describe_gauge!(SKU_RECORDED, "Units of live claims written to issuances");
    describe_gauge!(
        SKU_IN_FLIGHT,
        "Units decided by Redis not yet written; NaN when Redis cannot tell"
    );
    describe_gauge!(SKU_PENDING, "Units in persistence_pending not yet resolved");
    describe_gauge!(
        SKU_COMPENSATED,
        "Units given back to stock after a claim could not be recorded"
    );
    describe_gauge!(SKU_QUARANTINED, "Units of open quarantine rows");
    describe_gauge!(
        SKU_CONSISTENT,
        "1 when total = remaining + recorded + in_flight + pending + quarantined, 0 when not, NaN when Redis cannot tell"
    );
    describe_gauge!(SKU_HELD, "Units of the SKU's claims still held (written)");
    describe_gauge!(
        SKU_CONFIRMED,
        "Units of the SKU's confirmed holds (written)"
    );
    describe_gauge!(
        SKU_GHOST_HOLDS,
        "Holds Redis still has past their expires_at, not yet expired (the expiry worker's backlog)"
    );
    describe_gauge!(
        SKU_WAITLIST,
        "Entries waiting in the SKU's waitlist (Redis)"
    );
    describe_gauge!(SKU_OFFERED, "Waitlist entries holding an offer (written)");
    describe_gauge!(
        SKU_OVERDUE_HOLDS,
        "Claims the ledger still has held more than 5 s past their expires_at (an expiry Redis made and the writer has not recorded, or one never made)"
    );
    describe_gauge!(
        SKU_CLOSED,
        "1 while the SKU fails closed, by reason (lost: Redis has no state; stale: older than the ledger)"
    );
    outbox();
    describe_gauge!(
        SKU_UNWRITTEN,
        "Journal entries of the SKU carrying a win or a change the ledger does not hold yet (0: the ledger has caught up, whatever in_flight nets to); NaN when Redis cannot tell"
    );
    queue();
}

/// The outbox relay's families (`src/outbox/relay.rs`): every gateway runs a relay when
/// `DROPGATE_NATS_URL` is set; without it they stay at zero.
fn outbox() {
    describe_gauge!(
        OUTBOX_BACKLOG,
        "Outbox events not yet published to JetStream (all gateways'), as this gateway's relay last counted them"
    );
    gauge!(OUTBOX_BACKLOG).set(0.0);
    describe_gauge!(
        OUTBOX_OLDEST,
        "Age of the oldest outbox event not yet published, in seconds (0 when none waits)"
    );
    gauge!(OUTBOX_OLDEST).set(0.0);
    describe_gauge!(
        OUTBOX_HELD_BACK,
        "Age in seconds of the open transaction (any database of the PostgreSQL server) the next claim event waits for; 0 when none"
    );
    gauge!(OUTBOX_HELD_BACK).set(0.0);
    describe_counter!(
        OUTBOX_PUBLISHED,
        "Outbox events JetStream acknowledged and this gateway's relay marked sent"
    );
    counter!(OUTBOX_PUBLISHED).increment(0);
    describe_counter!(
        OUTBOX_DUPLICATES,
        "Publishes JetStream acknowledged as duplicates (a redelivery dropped by Nats-Msg-Id)"
    );
    counter!(OUTBOX_DUPLICATES).increment(0);
    describe_histogram!(
        OUTBOX_LAG,
        "Time from an event's insert (its transaction commits right after) to JetStream's acknowledgement, in seconds"
    );
    let _registered = histogram!(OUTBOX_LAG);
    describe_counter!(
        OUTBOX_PUBLISH_FAILURES,
        "Outbox events a relay could not publish in a round (NATS unreachable, no stream, no acknowledgement in time); retried next round"
    );
    counter!(OUTBOX_PUBLISH_FAILURES).increment(0);
}

/// The lifecycle's families (src/lifecycle/): holds by outcome, their expiry lag, waitlist
/// offers.
fn lifecycle() {
    describe_counter!(
        HOLDS,
        "Holds by outcome: created (a held win), confirmed, cancelled, expired"
    );
    for outcome in ["created", "confirmed", "cancelled", "expired"] {
        counter!(HOLDS, "outcome" => outcome).increment(0);
    }
    describe_histogram!(
        EXPIRY_LAG,
        "How long after its expires_at a hold was expired (Redis's clock), in seconds"
    );
    let _registered = histogram!(EXPIRY_LAG);
    describe_counter!(
        OFFERS,
        "Waitlist offers, by result: made, taken (confirmed), lapsed (expired or declined); counted as the writer records them"
    );
    for result in ["made", "taken", "lapsed"] {
        counter!(OFFERS, "result" => result).increment(0);
    }
    describe_counter!(
        SEAT_MAP_READS,
        "Seat map copies read from Redis for GET /v1/skus/{sku}/seats: one a half second per seated SKU read, whatever the number of readers"
    );
    counter!(SEAT_MAP_READS).increment(0);
}

/// Describes the worker's families and registers them at zero. They sum the SKUs this
/// gateway admits now (each SKU's own line and admissions are in its SKU view, `queue`): a
/// label per SKU would leave a series behind on every gateway that once held a SKU's lease.
fn queue() {
    describe_gauge!(
        QUEUE_WAITING,
        "Tickets in the lines (pre-queue included) of the queued SKUs this gateway admits, as its last rounds read them"
    );
    gauge!(QUEUE_WAITING).set(0.0);
    describe_counter!(
        QUEUE_ADMITTED,
        "Tickets this gateway admitted from queued SKUs' lines (sum(rate()) over the gateways is the admitted per second)"
    );
    counter!(QUEUE_ADMITTED).increment(0);
    describe_gauge!(
        QUEUE_LAG,
        "Longest time between this gateway's last two admission rounds of a SKU it admits (Redis's clock), in seconds: 0.05 when healthy; a stall that kept a line waiting shows here"
    );
    gauge!(QUEUE_LAG).set(0.0);
}
