//! The batched writer: moves winners from each SKU's journal (a Redis Stream appended by
//! claim.lua in the same atomic step as the decrement) into PostgreSQL's `issuances`.
//!
//! Delivery is at least once and the insert is idempotent (`ON CONFLICT (claim_id) DO
//! NOTHING`), so every winner is written exactly once: an entry is acknowledged only after the
//! commit that holds it, and entries left unacknowledged by a gateway that died are taken over
//! with XAUTOCLAIM once they have been idle for `journal_claim_idle`. Winners a live writer
//! read and could not settle (PostgreSQL down, a lock timeout) stay in its memory and are
//! retried first, so they never wait for that idle time. A hold's change read before its win
//! was written waits for it by the journal's order (`order.rs`), never by a clock.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::activity;
use crate::error::{StoreError, TaskError};
use crate::freshness;
use crate::journal::{self, reap_idle_consumers, Batch, WriterSignal, GONE_AFTER_CLAIM_IDLES};
use crate::keys::ShardName;
use crate::metrics as m;
use crate::repeats::{self, Repeats, BACKEND};
use crate::store::marks::Marks;
use crate::store::Store;

mod lifecycle;
mod order;
mod postgres;
mod quarantine;

// What the writer takes: the journal's entries, as its parser reads them (also the tests'
// and the tools' paths).
pub use crate::journal::{winners_of, Change, WaitChange, Winner};
pub use postgres::{write_batch, Unwritable};
pub use quarantine::Quarantined;
// The lifecycle table's test runs these statements (tests/api/lifecycle_table.rs).
pub use lifecycle::{apply_changes, apply_waits};

/// Every SKU of the active set ([`crate::activity`]) is read this often, wake-up or not.
const SWEEP: Duration = Duration::from_millis(500);
/// Retry pace of the writer itself while PostgreSQL or Redis is unreachable (with jitter,
/// [`crate::pace::retries`]).
const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

/// Moves journaled winners into PostgreSQL.
pub struct Writer {
    store: Store,
    db: PgPool,
    /// This process's consumer name in the group; a restarted gateway is a new consumer and
    /// its predecessor's unacknowledged entries are taken over by idle time.
    consumer: String,
    /// Woken by the claim path after a win, so a winner is written within milliseconds.
    signal: Arc<WriterSignal>,
    claim_idle: Duration,
    /// Delay before a parked row's first retry (DROPGATE_REPROCESS_BACKOFF_MS).
    first_retry: Duration,
    /// The ledger's high-water marks, raised after every batch (the claim path reads them).
    marks: Arc<Marks>,
    /// Winners read and not yet settled, per SKU, after a pass failed (PostgreSQL or Redis
    /// unreachable, a lock timeout): retried from memory before the SKU's journal is read
    /// again, so while this gateway lives none of them waits for XAUTOCLAIM's idle time.
    held: HashMap<String, Batch>,
    /// SKUs whose last journal read failed: Redis may have delivered entries whose reply was
    /// lost, so the next pass first re-reads this consumer's own pending entries.
    reread: HashSet<String>,
    /// Entries of hold changes whose wins are not written yet (`order.rs`), per SKU: settled
    /// with each later pass's entries, once their wins are in a table.
    waiting: HashMap<String, Batch>,
}

impl Writer {
    pub fn new(
        store: Store,
        db: PgPool,
        signal: Arc<WriterSignal>,
        claim_idle: Duration,
        first_retry: Duration,
        marks: Arc<Marks>,
    ) -> Self {
        Writer {
            store,
            db,
            consumer: format!("gw-{}", Uuid::new_v4().simple()),
            signal,
            claim_idle,
            first_retry,
            marks,
            held: HashMap::new(),
            reread: HashSet::new(),
            waiting: HashMap::new(),
        }
    }

    /// Runs until `shutdown`, then drains what the journals hold once more and returns.
    ///
    /// SKUs that won on this gateway are read as soon as the claim path signals them; every
    /// SKU of the active set is swept every 500 ms (winners of other gateways, entries of
    /// dead ones, lifecycle changes), so idle SKUs of the catalog cost nothing (a SKU with
    /// journal entries is in the set: see [`crate::activity`]); a SKU with winners held from
    /// a failed pass is retried every round, with backoff, until they are settled. Once per
    /// claim-idle time a sweep also removes the consumer names of gateways that are gone.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut active_skus: Vec<String> = Vec::new();
        let mut last_sweep: Option<Instant> = None;
        let mut last_autoclaim = Instant::now();
        let mut last_reap = Instant::now();
        // Zero while passes succeed; the pause after each failed round otherwise.
        let mut backoff = Duration::ZERO;
        let mut pauses = crate::pace::retries(BACKOFF_MIN, BACKOFF_MAX);
        // SKUs whose last read came back full: more is waiting.
        let mut unfinished: HashSet<String> = HashSet::new();
        let faults = Repeats::default();
        loop {
            let stopping = shutdown.is_cancelled();
            let sweep =
                stopping || !backoff.is_zero() || last_sweep.is_none_or(|t| t.elapsed() > SWEEP);
            let mut targets: HashSet<String> = self.signal.take();
            targets.extend(unfinished.drain());
            // A SKU with winners in hand is retried whether or not anything signals it (it
            // may not be in the active list yet, and reading that list may be what failed).
            targets.extend(self.held.keys().cloned());
            targets.extend(self.waiting.keys().cloned());
            targets.extend(self.reread.iter().cloned());
            if sweep {
                if let Ok(list) = activity::members(&self.store).await {
                    active_skus = list;
                }
                targets.extend(active_skus.iter().cloned());
                // And what this gateway marked itself, even if the set lost it.
                targets.extend(self.store.recent_marks().recent());
                last_sweep = Some(Instant::now());
            }
            let autoclaim = sweep && last_autoclaim.elapsed() > self.claim_idle / 2;
            if autoclaim {
                last_autoclaim = Instant::now();
            }
            let mut moved = 0usize;
            let mut failed = false;
            // A backend fault is over only after a round without one: a SKU with nothing to
            // write passes while PostgreSQL is down for the others.
            let mut backend_failed = false;
            for sku in &targets {
                match self.pass(sku, autoclaim).await {
                    Ok(n) => {
                        moved += n;
                        if let Some(end) = faults.clear(sku) {
                            repeats::ended(sku, end, "writer passes of the SKU succeed again");
                        }
                        if n >= journal::READ_COUNT {
                            unfinished.insert(sku.clone());
                        }
                    }
                    Err(e) => {
                        failed = true;
                        // Once when it starts, then at most every 10 s with a count.
                        let key = if e.is_about_sku() {
                            sku.as_str()
                        } else {
                            backend_failed = true;
                            BACKEND
                        };
                        if let Some(o) = faults.occurred(key, &e.to_string()) {
                            tracing::warn!(sku, error = %e, repeated = o.repeated, for_secs = o.for_secs,
                                "writer pass failed; the journal keeps the winners");
                        }
                    }
                }
            }
            if !backend_failed {
                if let Some(end) = faults.clear(BACKEND) {
                    repeats::ended(BACKEND, end, "writer passes succeed again");
                }
            }
            if sweep && !stopping && last_reap.elapsed() > self.claim_idle {
                last_reap = Instant::now();
                self.reap_gone_consumers(&active_skus).await;
            }
            if failed {
                backoff = pauses.next().unwrap_or(BACKOFF_MAX);
            } else {
                backoff = Duration::ZERO;
                pauses = crate::pace::retries(BACKOFF_MIN, BACKOFF_MAX);
            }
            if stopping {
                if moved == 0 || failed {
                    break;
                }
                continue;
            }
            if !unfinished.is_empty() && !failed {
                continue;
            }
            let pause = if failed { backoff } else { SWEEP };
            tokio::select! {
                _ = self.signal.notified(), if !failed => {}
                _ = tokio::time::sleep(pause) => {}
                _ = shutdown.cancelled() => {}
            }
        }
        tracing::info!(consumer = %self.consumer, "writer stopped");
    }

    /// Removes the consumer names that gateways which stopped left in each SKU's group (see
    /// `consumers.rs`); a failure only postpones that to the next sweep.
    async fn reap_gone_consumers(&self, skus: &[String]) {
        let idle = self.claim_idle * GONE_AFTER_CLAIM_IDLES;
        for sku in skus {
            if let Err(e) = reap_idle_consumers(&self.store, sku, idle, &self.consumer).await {
                tracing::warn!(sku, error = %e, "could not remove the consumer names of stopped gateways; retrying later");
            }
        }
    }

    /// Settles the entries of the Redis SKU `name` (a SKU, or one shard of one): those held
    /// from a failed pass first, else what its journal holds, with the changes still waiting
    /// for their wins. Returns how many entries were settled.
    async fn pass(&mut self, name: &str, autoclaim: bool) -> Result<usize, TaskError> {
        // A shard of a sharded SKU is `sku#i`: parsed once for the catalog SKU its rows name.
        let shard = ShardName::parse(name);
        let mut batch = match self.held.remove(name) {
            // Entries of a stopped gateway may be what a held batch waits for (the wins of
            // its hold changes): they are taken over all the same.
            Some(mut held) if autoclaim => {
                if let Ok(taken) =
                    journal::autoclaim(&self.store, &self.consumer, self.claim_idle, &shard).await
                {
                    held.extend(taken);
                    held.dedup();
                }
                held
            }
            Some(held) => held,
            None => match self.read(&shard, autoclaim).await {
                Ok(b) => b,
                Err(e) => {
                    self.reread.insert(name.to_string());
                    return Err(e.into());
                }
            },
        };
        if let Some(waiting) = self.waiting.remove(name) {
            batch.extend(waiting);
            batch.dedup();
        }
        if batch.is_empty() {
            return Ok(0);
        }
        match self.settle(&shard, &batch).await {
            Ok(kept) if kept.is_empty() => Ok(batch.entries()),
            Ok(kept) => {
                tracing::debug!(
                    sku = name,
                    changes = kept.changes.len(),
                    "hold changes wait for their wins"
                );
                let settled = batch.entries().saturating_sub(kept.entries());
                self.waiting.insert(name.to_string(), kept);
                Ok(settled)
            }
            Err(e) => {
                self.held.insert(name.to_string(), batch);
                Err(e)
            }
        }
    }

    /// Reads a SKU's journal: entries of stopped gateways when `autoclaim`, this consumer's own
    /// unacknowledged entries after a failed read, else new ones.
    async fn read(&mut self, name: &ShardName, autoclaim: bool) -> Result<Batch, StoreError> {
        let mut batch = Batch::default();
        if autoclaim {
            batch.extend(
                journal::autoclaim(&self.store, &self.consumer, self.claim_idle, name).await?,
            );
        }
        if self.reread.remove(name.as_str()) {
            batch.extend(journal::read(&self.store, &self.consumer, name, "0").await?);
        }
        if batch.is_empty() {
            batch = journal::read(&self.store, &self.consumer, name, ">").await?;
        }
        batch.dedup();
        Ok(batch)
    }

    /// Writes the winners to PostgreSQL (or parks them), quarantines what no table takes,
    /// applies the lifecycle changes, then acknowledges the entries. Every step may be repeated
    /// after a failure: the inserts are idempotent and an entry's units leave `inflight` once.
    ///
    /// Returns the entries kept back: hold changes whose wins are still on their way
    /// (`order.rs`), with this writer's own entries found unacknowledged meanwhile.
    async fn settle(&self, name: &ShardName, batch: &Batch) -> Result<Batch, TaskError> {
        let started = Instant::now();
        let unwritable = write_batch(&self.db, &batch.winners, self.first_retry).await?;
        // Rows name the catalog's SKU, while the journal, the acknowledgements and the mark are
        // the shard's.
        let (sku, catalog_sku) = (name.as_str(), name.sku());
        // Before the changes are ordered: a change meets a quarantined win as a row.
        let mut poison = Vec::with_capacity(unwritable.len() + batch.unreadable.len());
        for u in unwritable {
            let w = &batch.winners[u.index];
            // The bytes as Redis holds them; rendered from what was read if the entry is gone.
            let raw = journal::raw_entry(&self.store, sku, &w.entry_id)
                .await?
                .unwrap_or_else(|| journal::render(w));
            poison.push(Quarantined::winner(w, raw, u.error));
        }
        poison.extend(batch.unreadable.iter().map(Quarantined::unreadable));
        quarantine::record(&self.db, catalog_sku, &poison).await?;

        let order = order::waiting(&self.db, &self.store, &self.consumer, name, batch).await?;
        for claim_id in &order.orphans {
            tracing::warn!(sku, %claim_id, "hold change of a claim whose win never reached the ledger; acknowledged as it is");
        }
        // Only a batch with changes to keep back is copied.
        let (split, mut kept);
        let ready = if order.entries.is_empty() {
            kept = Batch::default();
            batch
        } else {
            let mut rest = batch.clone();
            kept = rest.split_off(&order.entries);
            split = rest;
            &split
        };
        kept.extend(order.adopted);

        let forget = journal::Forget {
            holds: lifecycle::apply_changes(&self.db, &ready.changes).await?,
            entries: lifecycle::apply_waits(&self.db, catalog_sku, &ready.waits).await?,
        };
        lifecycle::count_offers(ready);
        let lifecycle_seq = (ready.changes.iter().map(|c| c.seq))
            .chain(ready.waits.iter().map(|w| w.seq))
            .max();
        if !ready.winners.is_empty() || lifecycle_seq.is_some() {
            let written: Vec<(i64, Uuid)> =
                ready.winners.iter().map(|w| (w.seq, w.claim_id)).collect();
            freshness::record_batch(
                &self.db,
                &self.store,
                &self.marks,
                name,
                &written,
                lifecycle_seq,
            )
            .await?;
            m::writer_batch(ready.winners.len(), started.elapsed());
        }
        let now = crate::clock::now_ms();
        for w in &ready.winners {
            m::journal_lag(Duration::from_millis((now - w.created_ms).max(0) as u64));
        }
        journal::ack(&self.store, sku, ready, &forget).await?;
        Ok(kept)
    }
}
