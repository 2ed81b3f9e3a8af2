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
use crate::freshness::Marks;
use crate::keys::{bucket_of, SkuKeys};
use crate::metrics as m;
use crate::scripts::{self, ClaimInput, Decision};
use crate::settle::Settler;
use crate::soldout::SoldOut;
use crate::store::Store;
use crate::writer::WriterSignal;

/// Most claims decided by one script call; bounds the script's run time inside Redis.
pub const MAX_BATCH: usize = 128;
/// Reads of a claim's record after its call got no answer, before its outcome is reported
/// unknown (503 `outcome_unknown`, then settled in the background); with the call itself this
/// bounds a claim at three Redis timeouts (750 ms by default).
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
    /// The sale window has not opened / has closed (Redis's clock).
    NotOpen,
    Closed,
}

/// A winning claim, as the 201 body shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WonClaim {
    pub claim_id: Uuid,
    pub quantity: u32,
    /// Stock left right after this claim won.
    pub remaining: i64,
    /// When the hold expires (unix ms); `None` for a claim final at once.
    pub expires_ms: Option<i64>,
}

type Reply = oneshot::Sender<Result<Decision, StoreError>>;

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
    /// Takes over the claims whose outcome stayed unknown.
    settler: Arc<Settler>,
    /// The ledger's high-water marks: a Redis state behind its SKU's mark never sells.
    marks: Arc<Marks>,
    /// SKUs Redis said are sold out: refused from memory (the fast path, `soldout.rs`).
    sold_out: Arc<SoldOut>,
}

impl ClaimService {
    pub fn new(
        store: Store,
        coalesce: bool,
        max_queue: usize,
        writer: Arc<WriterSignal>,
        marks: Arc<Marks>,
        sold_out: Arc<SoldOut>,
    ) -> Self {
        ClaimService {
            settler: Arc::new(Settler::new(store.clone(), writer.clone())),
            store,
            lanes: DashMap::new(),
            coalesce,
            max_queue,
            writer,
            marks,
            sold_out,
        }
    }

    pub fn settler(&self) -> Arc<Settler> {
        self.settler.clone()
    }

    /// Decides one claim. `mark` is the SKU's high-water mark as the catalog last read it;
    /// `tag` its catalog tag, carried in the claim id (see [`crate::ids`]).
    ///
    /// # Errors
    /// A [`StoreError`] when Redis did not decide. [`StoreError::OutcomeUnknown`] when the call
    /// was sent and its outcome could not be read back: the claim is handed to the settler.
    /// Any other error is a promise that no stock moved for this claim id.
    pub async fn claim(
        &self,
        sku: &str,
        mark: i64,
        tag: i32,
        user: &str,
        quantity: u32,
        idempotency_key: Option<String>,
    ) -> Result<Outcome, StoreError> {
        let started = Instant::now();
        self.marks.observe(sku, mark);
        // The sold-out fast path. A keyed claim may be the replay of a win: it asks Redis.
        if idempotency_key.is_none() && self.sold_out.refuses(sku) {
            m::fast_refusal();
            m::claim_decided(&Outcome::SoldOut, started.elapsed());
            return Ok(Outcome::SoldOut);
        }
        // Before the call: what it says about the stock is learned only if no notification
        // of units coming back arrived in between.
        let ticket = self.sold_out.ticket();
        let input = ClaimInput {
            claim_id: crate::ids::mint(tag),
            user: user.to_string(),
            quantity,
            idempotency_key,
        };
        let claim_id = input.claim_id;
        let decided = if self.coalesce {
            self.decide_coalesced(sku, input).await
        } else {
            let keys = self.store.keys(sku);
            let floor = self.marks.floor(sku);
            let mut d = decide_batch(&self.store, &keys, std::slice::from_ref(&input), floor).await;
            d.pop()
                .unwrap_or_else(|| Err(StoreError::Protocol("empty claim reply".into())))
        };
        let decision = match decided {
            Ok(d) => d,
            Err(StoreError::OutcomeUnknown(id)) => {
                self.settler.hand_over(sku, id, user, quantity);
                return Err(StoreError::OutcomeUnknown(id));
            }
            Err(e) => return Err(e),
        };
        let outcome = match decision {
            Decision::Won {
                remaining,
                expires_ms,
            } => {
                self.writer.won(sku);
                if expires_ms.is_some() {
                    crate::lifecycle::expiry::count_decision("created");
                }
                Outcome::Won(WonClaim {
                    claim_id,
                    quantity,
                    remaining,
                    expires_ms,
                })
            }
            Decision::Replay {
                claim_id,
                quantity,
                remaining,
                expires_ms,
                ..
            } => Outcome::Replayed(WonClaim {
                claim_id,
                quantity,
                remaining,
                expires_ms,
            }),
            Decision::NotOpen => Outcome::NotOpen,
            Decision::Closed => Outcome::Closed,
            Decision::SoldOut { remaining } => {
                if remaining == 0 {
                    self.sold_out.learn(sku, ticket);
                }
                Outcome::SoldOut
            }
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

    async fn decide_coalesced(&self, sku: &str, input: ClaimInput) -> Result<Decision, StoreError> {
        let lane = match self.lanes.get(sku) {
            Some(l) => l.clone(),
            None => self.lanes.entry(sku.to_string()).or_default().clone(),
        };
        let claim_id = input.claim_id;
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
            tokio::spawn(drain_lane(store, sku, lane, self.marks.clone()));
        }
        match rx.await {
            Ok(r) => r,
            // The draining task died (panicked) with the claim perhaps sent: read it back.
            Err(_) => {
                let keys = self.store.keys(sku);
                resolve(&self.store, &keys, &[claim_id])
                    .await
                    .pop()
                    .unwrap_or(Err(StoreError::OutcomeUnknown(claim_id)))
            }
        }
    }
}

/// Calls Redis for the queued claims of one SKU until the queue is empty.
async fn drain_lane(store: Store, sku: String, lane: Arc<Mutex<Lane>>, marks: Arc<Marks>) {
    let keys = store.keys(&sku);
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
        let decisions = decide_batch(&store, &keys, &inputs, marks.floor(&sku)).await;
        for (reply, d) in replies.into_iter().zip(decisions) {
            let _ = reply.send(d);
        }
    }
}

/// Decides `inputs` in one script call; when the call gets no answer, reads each claim's
/// outcome back instead of sending it again. One result per input, in order.
async fn decide_batch(
    store: &Store,
    keys: &SkuKeys,
    inputs: &[ClaimInput],
    floor: i64,
) -> Vec<Result<Decision, StoreError>> {
    let mut con = store.hot();
    let started = Instant::now();
    let result = store
        .bounded(scripts::claim(&mut con, keys, inputs, now_ms(), floor))
        .await;
    m::redis_call("claim", started.elapsed());
    match result {
        Ok(decisions) if decisions.len() == inputs.len() => {
            let mut out: Vec<Result<Decision, StoreError>> =
                decisions.into_iter().map(Ok).collect();
            // A fresh id comes back fenced only when this very call ran twice (a cluster
            // connection resends after a connection error) and the first run decided it:
            // read what the first run decided.
            let fenced: Vec<usize> = (0..out.len())
                .filter(|&i| matches!(out[i], Ok(Decision::Fenced)))
                .collect();
            if !fenced.is_empty() {
                let ids: Vec<Uuid> = fenced.iter().map(|&i| inputs[i].claim_id).collect();
                for (i, answer) in fenced.into_iter().zip(resolve(store, keys, &ids).await) {
                    out[i] = answer;
                }
            }
            replicated_or_unknown(store, keys, inputs, out).await
        }
        Ok(_) => each(inputs.len(), || {
            StoreError::Protocol("claim reply of the wrong length".into())
        }),
        Err(e) if e.is_uncertain() => {
            let ids: Vec<Uuid> = inputs.iter().map(|c| c.claim_id).collect();
            let answers = resolve(store, keys, &ids).await;
            replicated_or_unknown(store, keys, inputs, answers).await
        }
        Err(e) => each(inputs.len(), || definite(&e)),
    }
}

/// Keeps the wins only once the configured replicas hold them (see [`Store::replicated`]);
/// without that acknowledgement a win's outcome is unknown to the buyer (a failover could
/// still take it away), and the settler reads it back later.
async fn replicated_or_unknown(
    store: &Store,
    keys: &SkuKeys,
    inputs: &[ClaimInput],
    out: Vec<Result<Decision, StoreError>>,
) -> Vec<Result<Decision, StoreError>> {
    if !out.iter().any(|d| matches!(d, Ok(Decision::Won { .. }))) {
        return out;
    }
    if matches!(store.replicated(keys).await, Ok(true)) {
        return out;
    }
    m::wait_short();
    out.into_iter()
        .zip(inputs)
        .map(|(d, c)| match d {
            Ok(Decision::Won { .. }) => Err(StoreError::OutcomeUnknown(c.claim_id)),
            other => other,
        })
        .collect()
}

/// Settles claims whose call got no answer, by reading their records (and fencing those that
/// did not win), never by sending them again. The read is retried a few times: every answer
/// that settles a claim saves an `outcome_unknown`.
async fn resolve(store: &Store, keys: &SkuKeys, ids: &[Uuid]) -> Vec<Result<Decision, StoreError>> {
    m::uncertain_outcome();
    let mut con = store.hot();
    for _ in 0..RESOLVE_ATTEMPTS {
        if let Ok(answers) = store
            .bounded(scripts::resolve_claims(&mut con, keys, ids))
            .await
        {
            return answers
                .into_iter()
                .map(|a| match a {
                    // A read-back cannot tell a hold's expiry: the claim's GET shows it.
                    Some(remaining) => Ok(Decision::Won {
                        remaining,
                        expires_ms: None,
                    }),
                    // Fenced: the claim did not and now cannot win. Nothing moved.
                    None => Err(StoreError::Unavailable(
                        "no answer from redis; the claim was fenced and moved nothing".into(),
                    )),
                })
                .collect();
        }
    }
    ids.iter()
        .map(|id| Err(StoreError::OutcomeUnknown(*id)))
        .collect()
}

fn each(n: usize, e: impl Fn() -> StoreError) -> Vec<Result<Decision, StoreError>> {
    (0..n).map(|_| Err(e())).collect()
}

/// The same definite failure, for each claim of a batch.
fn definite(e: &StoreError) -> StoreError {
    match e {
        StoreError::SkuLost => StoreError::SkuLost,
        StoreError::Stale => StoreError::Stale,
        StoreError::Protocol(s) => StoreError::Protocol(s.clone()),
        other => StoreError::Unavailable(other.to_string()),
    }
}

pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}
