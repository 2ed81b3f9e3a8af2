//! Settling claims whose outcome is unknown: the call was sent, no answer came, and reading
//! back did not answer either (a Redis stalled longer than the call and both read-backs).
//!
//! The buyer was answered 503 `outcome_unknown` with the claim id. Such a claim may still win
//! (its call may be queued in a stalled Redis), so the settler keeps reading it back with
//! `resolve_claim.lua`, which reads its call's record, or fences the call when it has not run:
//! from then on it never will.
//! Until it knows, `GET /v1/claims/{id}` answers `outcome_unknown` again; then it tells.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dashmap::DashMap;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::journal::WriterSignal;
use crate::keys::{bucket_of, ShardName};
use crate::metrics as m;
use crate::scripts;
use crate::store::Store;

/// Pace of the read-backs while an outcome is unknown.
const RETRY: Duration = Duration::from_millis(200);
/// How long a settled outcome is remembered for `GET /v1/claims/{id}` (a won claim is in the
/// ledger within milliseconds; this only covers the writer's lag and a lookup right after).
const REMEMBER: Duration = Duration::from_secs(600);

/// What this gateway knows of a claim whose outcome was unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// Still unknown: it may win.
    Pending,
    /// It won; the stock left right after it, and its hold's expiry on a SKU with holds.
    Won {
        remaining: i64,
        expires_ms: Option<i64>,
    },
    /// It did not win, and now never will.
    Fenced,
}

#[derive(Debug, Clone)]
pub struct Unsettled {
    /// The Redis SKU the claim's call went to: the SKU, or the buyer's shard of it. What a
    /// buyer is told (and a token's scope is held to) is its catalog SKU, `name.sku()`.
    pub name: ShardName,
    pub user: String,
    pub quantity: u32,
    pub state: Settled,
    /// When it was handed over, or when it settled (for forgetting it).
    since: Instant,
}

/// The claims of this gateway whose outcome was unknown, and the task that settles them.
pub struct Settler {
    store: Store,
    claims: DashMap<Uuid, Unsettled>,
    /// Woken when a claim is handed over, so the first read-back does not wait a full round.
    wake: Notify,
    /// Told when a claim turns out to have won, so the writer reads its journal at once.
    writer: Arc<WriterSignal>,
}

impl Settler {
    pub fn new(store: Store, writer: Arc<WriterSignal>) -> Self {
        Settler {
            store,
            claims: DashMap::new(),
            wake: Notify::new(),
            writer,
        }
    }

    /// Takes over a claim whose outcome is unknown, sent to the Redis SKU `name`.
    pub fn hand_over(&self, name: &str, claim_id: Uuid, user: &str, quantity: u32) {
        m::outcome_unknown();
        self.claims.insert(
            claim_id,
            Unsettled {
                name: ShardName::parse(name),
                user: user.to_string(),
                quantity,
                state: Settled::Pending,
                since: Instant::now(),
            },
        );
        self.wake.notify_one();
    }

    /// What this gateway knows of `claim_id`, if its outcome was ever unknown here.
    pub fn lookup(&self, claim_id: &Uuid) -> Option<Unsettled> {
        self.claims.get(claim_id).map(|e| e.clone())
    }

    /// Claims still unknown.
    pub fn pending(&self) -> usize {
        self.claims
            .iter()
            .filter(|e| e.state == Settled::Pending)
            .count()
    }

    /// Reads back every pending claim until shutdown; on shutdown tries once more and logs
    /// what is still unknown (each such claim either won, and its journal entry is written by
    /// any gateway, or stays unsold: nothing is lost, only this gateway's memory of the id).
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(RETRY) => {}
                _ = shutdown.cancelled() => break,
            }
            self.round().await;
        }
        self.round().await;
        let left = self.pending();
        if left > 0 {
            tracing::warn!(
                left,
                "settler stopped with outcomes still unknown; their claims settle in Redis"
            );
        }
        tracing::info!("settler stopped");
    }

    async fn round(&self) {
        self.claims
            .retain(|_, c| c.state == Settled::Pending || c.since.elapsed() < REMEMBER);
        // One read-back per SKU and records bucket, for all of its pending ids (a call's
        // claims share its bucket, and the script reads each call once).
        let mut groups: HashMap<(String, u64), Vec<Uuid>> = HashMap::new();
        for e in self.claims.iter() {
            if e.state == Settled::Pending {
                groups
                    .entry((e.name.as_str().to_string(), bucket_of(e.key())))
                    .or_default()
                    .push(*e.key());
            }
        }
        for ((sku, _), ids) in groups {
            let keys = self.store.keys(&sku);
            let mut con = self.store.hot();
            let Ok(answers) = self
                .store
                .bounded(scripts::read_back(&mut con, &keys, &ids))
                .await
            else {
                continue;
            };
            // A win read back, and the fence a read-back writes, count only once the replicas
            // hold them (a failover could still take the win away, or lose the fence and let
            // the call run on the promoted replica): until then the claim stays unknown and is
            // read again.
            if !matches!(self.store.replicated(&keys).await, Ok(true)) {
                continue;
            }
            for (id, answer) in ids.iter().zip(answers) {
                let state = match answer {
                    Some(w) => Settled::Won {
                        remaining: w.remaining,
                        expires_ms: w.expires_ms,
                    },
                    None => Settled::Fenced,
                };
                m::outcome_settled(matches!(state, Settled::Won { .. }));
                if let Some(mut c) = self.claims.get_mut(id) {
                    c.state = state;
                    c.since = Instant::now();
                }
                if matches!(state, Settled::Won { .. }) {
                    tracing::info!(claim_id = %id, sku, "an unknown outcome settled: the claim won");
                    self.writer.won(&sku);
                } else {
                    tracing::info!(claim_id = %id, sku, "an unknown outcome settled: the claim did not win and never will");
                }
            }
        }
    }
}
