//! The claim decision: mint an id, ask Redis once, resolve an uncertain answer by reading.
//!
//! Claims for one SKU that arrive while a call for that SKU is in flight are coalesced: they
//! queue on the SKU's lane and the next call decides all of them, in arrival order, with the
//! same script and the same per-claim semantics as a call of one. An idle SKU pays no waiting
//! window: the first claim starts a call at once.

use std::sync::Arc;
use std::time::Instant;

use dashmap::DashMap;
use parking_lot::Mutex;
use tokio::sync::oneshot;
use uuid::Uuid;

use crate::error::StoreError;
use crate::keys::bucket_of;
use crate::metrics as m;
use crate::scripts::{self, ClaimInput, Decision};
use crate::store::Store;
use crate::writer::WriterSignal;

/// Most claims decided by one script call; bounds the script's run time inside Redis.
pub const MAX_BATCH: usize = 128;
/// Reads of a timed-out claim's record before its outcome is reported unknown (503); with the
/// call itself this bounds a claim at three Redis timeouts (750 ms by default).
const RESOLVE_ATTEMPTS: usize = 2;

/// What the gateway answers for a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Won(WonClaim),
    /// An earlier win under the same Idempotency-Key and the same request.
    Replayed(WonClaim),
    SoldOut,
    LimitReached,
    KeyReused,
    /// Shed before reaching Redis: too many claims already wait on this SKU. Nothing moved.
    Shed,
}

/// A winning claim, as the 201 body shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WonClaim {
    pub claim_id: Uuid,
    pub quantity: u32,
    /// Stock left right after this claim won.
    pub remaining: i64,
}

type Reply = oneshot::Sender<Result<Decision, Arc<StoreError>>>;

/// Claims waiting for the next call on one SKU.
#[derive(Default)]
struct Lane {
    /// Claims queued while a call was in flight, each with the channel its request waits on.
    queue: Vec<(ClaimInput, Reply)>,
    /// Whether a task is currently calling Redis for this SKU (it drains the queue before
    /// it stops, so a queued claim never waits for a call that will not come).
    busy: bool,
}

/// Decides claims; shared by every request.
pub struct ClaimService {
    store: Store,
    /// One lane per SKU seen; the set is bounded by the catalog.
    lanes: DashMap<String, Arc<Mutex<Lane>>>,
    /// Off: one script call per claim (kept for the benchmarks' side-by-side runs).
    coalesce: bool,
    /// Claims allowed to wait on one SKU before new ones are shed (429).
    max_queue: usize,
    /// Told after every win so the writer picks it up without polling delay.
    writer: Arc<WriterSignal>,
}

impl ClaimService {
    pub fn new(store: Store, coalesce: bool, max_queue: usize, writer: Arc<WriterSignal>) -> Self {
        ClaimService {
            store,
            lanes: DashMap::new(),
            coalesce,
            max_queue,
            writer,
        }
    }

    /// Decides one claim.
    ///
    /// # Errors
    /// A [`StoreError`] when Redis could not decide (down, lost the SKU, or an outcome that
    /// stayed unknown after reading back): the caller answers 503 and no stock moved for this
    /// claim id.
    pub async fn claim(
        &self,
        sku: &str,
        user: String,
        quantity: u32,
        idempotency_key: Option<String>,
    ) -> Result<Outcome, StoreError> {
        let started = Instant::now();
        let input = ClaimInput {
            claim_id: Uuid::now_v7(),
            user,
            quantity,
            idempotency_key,
        };
        let claim_id = input.claim_id;
        let decided = if self.coalesce {
            self.decide_coalesced(sku, input).await
        } else {
            self.decide_alone(sku, input).await
        };
        let decision = match decided {
            Ok(d) => d,
            Err(StoreError::Timeout) => self.resolve(sku, &claim_id).await?,
            Err(e) => return Err(e),
        };
        let outcome = match decision {
            Decision::Won { remaining } => {
                self.writer.won(sku);
                Outcome::Won(WonClaim {
                    claim_id,
                    quantity,
                    remaining,
                })
            }
            Decision::Replay {
                claim_id,
                quantity,
                remaining,
                ..
            } => Outcome::Replayed(WonClaim {
                claim_id,
                quantity,
                remaining,
            }),
            Decision::SoldOut { .. } => Outcome::SoldOut,
            Decision::LimitReached { .. } => Outcome::LimitReached,
            Decision::KeyReused => Outcome::KeyReused,
            Decision::Shed => Outcome::Shed,
            // Our own fresh id was fenced: only a resolver of this same id fences it, so this
            // is a broken invariant, answered as "Redis could not decide".
            Decision::Fenced => {
                return Err(StoreError::Protocol("fresh claim id was fenced".into()))
            }
        };
        m::claim_decided(&outcome, started.elapsed());
        Ok(outcome)
    }

    async fn decide_alone(&self, sku: &str, input: ClaimInput) -> Result<Decision, StoreError> {
        let keys = self.store.keys(sku);
        let mut con = self.store.hot();
        let now = now_ms();
        let started = Instant::now();
        let r = self
            .store
            .bounded(scripts::claim(
                &mut con,
                &keys,
                std::slice::from_ref(&input),
                now,
            ))
            .await;
        m::redis_call("claim", started.elapsed());
        let mut decisions = r?;
        decisions
            .pop()
            .ok_or_else(|| StoreError::Protocol("empty claim reply".into()))
    }

    async fn decide_coalesced(&self, sku: &str, input: ClaimInput) -> Result<Decision, StoreError> {
        let lane = match self.lanes.get(sku) {
            Some(l) => l.clone(),
            None => self.lanes.entry(sku.to_string()).or_default().clone(),
        };
        let (tx, rx) = oneshot::channel();
        let start_call = {
            let mut l = lane.lock();
            if l.queue.len() >= self.max_queue {
                return Ok(Decision::Shed);
            }
            l.queue.push((input, tx));
            !std::mem::replace(&mut l.busy, true)
        };
        if start_call {
            let store = self.store.clone();
            let sku = sku.to_string();
            tokio::spawn(drain_lane(store, sku, lane));
        }
        match rx.await {
            Ok(r) => r.map_err(unshare),
            // The draining task died (panicked): the outcome is unknown, read it back.
            Err(_) => Err(StoreError::Timeout),
        }
    }

    /// Settles a claim whose call timed out, by reading its record (and fencing it when it
    /// did not win), never by sending it again. The read is retried a few times: a read that
    /// fails leaves the outcome unknown, and every answer that settles it saves a 503.
    async fn resolve(&self, sku: &str, claim_id: &Uuid) -> Result<Decision, StoreError> {
        let keys = self.store.keys(sku);
        let mut con = self.store.hot();
        m::uncertain_outcome();
        let mut last = StoreError::Timeout;
        for _ in 0..RESOLVE_ATTEMPTS {
            match self
                .store
                .bounded(scripts::resolve_claim(&mut con, &keys, claim_id))
                .await
            {
                Ok(Some(remaining)) => return Ok(Decision::Won { remaining }),
                // Fenced: the claim did not and now cannot win. 503, nothing moved.
                Ok(None) => return Err(StoreError::Timeout),
                Err(e) => last = e,
            }
        }
        Err(last)
    }
}

/// Calls Redis for the queued claims of one SKU until the queue is empty.
async fn drain_lane(store: Store, sku: String, lane: Arc<Mutex<Lane>>) {
    let keys = store.keys(&sku);
    let mut con = store.hot();
    loop {
        let batch: Vec<(ClaimInput, Reply)> = {
            let mut l = lane.lock();
            if l.queue.is_empty() {
                l.busy = false;
                return;
            }
            // One call holds claims of one records bucket (claim.lua's KEYS[4]); a batch
            // that straddles the 10-minute boundary leaves the later ids for the next call.
            let bucket = bucket_of(&l.queue[0].0.claim_id);
            let take = l
                .queue
                .iter()
                .take(MAX_BATCH)
                .take_while(|(c, _)| bucket_of(&c.claim_id) == bucket)
                .count();
            l.queue.drain(..take).collect()
        };
        let (inputs, replies): (Vec<ClaimInput>, Vec<Reply>) = batch.into_iter().unzip();
        m::coalesced_batch(inputs.len());
        let started = Instant::now();
        let result = store
            .bounded(scripts::claim(&mut con, &keys, &inputs, now_ms()))
            .await;
        m::redis_call("claim", started.elapsed());
        match result {
            Ok(decisions) => {
                for (reply, d) in replies.into_iter().zip(decisions) {
                    let _ = reply.send(Ok(d));
                }
            }
            Err(e) => {
                let e = Arc::new(e);
                for reply in replies {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
    }
}

/// Rebuilds an owned error from one shared by a whole batch; the kind is what callers act on.
fn unshare(e: Arc<StoreError>) -> StoreError {
    match &*e {
        StoreError::Timeout => StoreError::Timeout,
        StoreError::SkuLost => StoreError::SkuLost,
        StoreError::Protocol(s) => StoreError::Protocol(s.clone()),
        other => StoreError::Unavailable(other.to_string()),
    }
}

pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}
