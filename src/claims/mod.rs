//! The claim decision: ask Redis once per call, resolve an uncertain answer by reading.
//!
//! Claims for one SKU that arrive while a call for that SKU is in flight are coalesced: they
//! queue on the SKU's lane and the next call decides all of them, in arrival order, with the
//! same script and the same per-claim semantics as a call of one. An idle SKU pays no waiting
//! window: the first claim starts a call at once.
//!
//! Ids are minted when a call is formed, not when a claim arrives: the call gets a fresh id
//! and its claims are that id with their index ([`crate::ids::claim_in`]), so Redis fences,
//! records and journals the call once, not each claim. A claim learns its id with its answer;
//! a shed claim never gets one.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Instant;

use dashmap::DashMap;
use futures_util::FutureExt;
use parking_lot::Mutex;
use tokio::sync::oneshot;
use uuid::Uuid;

use crate::catalog::Sku;
use crate::error::StoreError;
use crate::ids;
use crate::journal::WriterSignal;
use crate::metrics as m;
use crate::scripts::{ClaimInput, Decision};
use crate::settle::Settler;
use crate::shards::borrow::{Borrower, Refill};
use crate::soldout::SoldOut;
use crate::store::marks::Marks;
use crate::store::Store;

mod call;
mod outcome;

use call::{decide_batch, definite, probe, resolve};
pub use outcome::{Outcome, WonClaim};

/// Most claims decided by one script call; bounds the script's run time inside Redis (and is
/// what a call id's index can number).
pub const MAX_BATCH: usize = ids::CALL_CLAIMS;
/// Refills (each followed by a new call) a claim on a sharded SKU may wait for. Each refill
/// that does not prove the SKU sold out brought units or saw some left, which other claims
/// took first; a claim still without a unit after this many is shed (429 `overloaded`, with
/// Retry-After), never told `sold_out` while units remain ([`crate::shards::borrow`]).
const BORROW_ROUNDS: usize = 16;

/// What a claim is told: its id (from its call) and its decision. An outcome that stayed
/// unknown is [`StoreError::OutcomeUnknown`] with the id.
type Answer = Result<(Uuid, Decision), StoreError>;
type Reply = oneshot::Sender<Answer>;

/// Claims waiting for the next call on one SKU.
#[derive(Default)]
struct Lane {
    /// Claims queued while a call was in flight, each with the channel its request waits on.
    queue: Vec<(ClaimInput, Reply)>,
    /// Whether a task is currently calling Redis for this SKU (it drains the queue before
    /// it stops, so a queued claim never waits for a call that will not come).
    busy: bool,
    /// This SKU's last call got no answer, not even to its read-backs (Redis stalled, or cut
    /// off by a partition): the next call goes only after a read of the SKU's slot answers
    /// ([`probe`]).
    silent: bool,
}

/// Decides claims; shared by every request.
pub struct ClaimService {
    store: Store,
    /// One lane per Redis SKU seen (a SKU, or one shard of one); the set is bounded by the
    /// catalog.
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
    /// Refills of the shards of sharded SKUs, one at a time per shard ([`crate::shards`]).
    borrower: Borrower,
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
            borrower: Borrower::default(),
        }
    }

    /// Tells the writer `name` has a new winner (a seated claim decided outside
    /// [`ClaimService::claim`]).
    pub fn writer_won(&self, name: &str) {
        self.writer.won(name);
    }

    /// The sold-out memory, for a claim decided outside [`ClaimService::claim`] (a seated
    /// one): refused from memory once Redis said every seat is gone, learnt as count claims do.
    pub fn sold_out(&self) -> &SoldOut {
        &self.sold_out
    }

    pub fn settler(&self) -> Arc<Settler> {
        self.settler.clone()
    }

    /// Decides one claim on the SKU `entry` (its catalog row as last read: the high-water
    /// mark, the tag carried in the claim id (see [`crate::ids`]), the shard count).
    ///
    /// On a sharded SKU the claim goes to its buyer's shard ([`crate::shards`]); a sold out
    /// there borrows units from a sibling and decides again (a new call), and is answered
    /// `sold_out` only when one reading of every shard finds them dry with no transfer in
    /// flight (or too few units on all of them together); after [`BORROW_ROUNDS`] refills that
    /// proved neither it is shed.
    ///
    /// # Errors
    /// A [`StoreError`] when Redis did not decide. [`StoreError::OutcomeUnknown`] when the call
    /// was sent and its outcome could not be read back: the claim is handed to the settler.
    /// Any other error is a promise that no stock moved for this claim id.
    pub async fn claim(
        &self,
        entry: &Sku,
        user: &str,
        quantity: u32,
        idempotency_key: Option<String>,
    ) -> Result<Outcome, StoreError> {
        let started = Instant::now();
        let sku = entry.id();
        let layout = entry.layout;
        let shard = layout.shard_of_user(user);
        // Shard 0 is the SKU itself: a SKU of one shard names nothing new.
        let shard_name;
        let name = if shard == 0 {
            sku.as_str()
        } else {
            shard_name = layout.name(sku, shard);
            shard_name.as_str()
        };
        // Shard i >= 1 keeps its mark apart (src/freshness/shard_marks.rs); the refresher reads it.
        self.marks
            .observe(name, if shard == 0 { entry.redis_seq } else { 0 });
        // The sold-out fast path. A keyed claim may be the replay of a win: it asks Redis.
        if idempotency_key.is_none() && self.sold_out.refuses(sku) {
            m::fast_refusal();
            m::claim_decided(Outcome::SoldOut.label(), started.elapsed());
            return Ok(Outcome::SoldOut);
        }
        // Before the call: what it says about the stock is learned only if no notification
        // of units coming back arrived in between.
        let ticket = self.sold_out.ticket();
        let input = ClaimInput {
            user: user.to_string(),
            quantity,
            idempotency_key,
        };
        // Kept for a retry only where one can happen: a SKU of one shard copies nothing.
        let again = layout.is_sharded().then(|| input.clone());
        let mut decided = self.decide(name, entry.tag, input).await;
        // On a sharded SKU, whether a refill proved the sold out this claim was answered.
        let mut proven = !layout.is_sharded();
        if let Some(input) = again {
            let mut rounds = 0;
            while let Ok((_, Decision::SoldOut { .. })) = decided {
                if rounds == BORROW_ROUNDS {
                    break;
                }
                rounds += 1;
                let refill = self
                    .borrower
                    .refill(&self.store, sku, layout, shard, i64::from(quantity))
                    .await;
                match refill {
                    Ok(Refill::Moved) => {
                        decided = self.decide(name, entry.tag, input.clone()).await;
                    }
                    Ok(Refill::Dry) => {
                        self.sold_out.learn(sku, layout, ticket);
                        proven = true;
                        break;
                    }
                    Ok(Refill::Short) => {
                        proven = true;
                        break;
                    }
                    // The claim decided sold out and moved nothing; a shard failing closed or
                    // unreachable means the SKU cannot be said sold out either.
                    Err(e) => return Err(definite(&e)),
                }
            }
        }
        let (claim_id, decision) = match decided {
            Ok(d) => d,
            Err(StoreError::OutcomeUnknown(id)) => {
                self.settler.hand_over(name, id, user, quantity);
                return Err(StoreError::OutcomeUnknown(id));
            }
            Err(e) => return Err(e),
        };
        let outcome = match decision {
            Decision::Won {
                remaining,
                expires_ms,
            } => {
                self.writer.won(name);
                if expires_ms.is_some() {
                    m::hold_decided("created");
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
            // Units remain on some shard, and other claims kept taking them first: nothing
            // moved for this claim, and it may try again.
            Decision::SoldOut { .. } if !proven => Outcome::Shed,
            Decision::SoldOut { remaining } => {
                // A sharded SKU is known sold out only by a refill that found every shard dry.
                if remaining == 0 && !layout.is_sharded() {
                    self.sold_out.learn(sku, layout, ticket);
                }
                Outcome::SoldOut
            }
            Decision::LimitReached { .. } => Outcome::LimitReached,
            Decision::KeyReused => Outcome::KeyReused,
            Decision::Shed => Outcome::Shed,
            // decide_batch reads every fenced claim back: none is answered fenced.
            Decision::Fenced => {
                return Err(StoreError::Protocol("fresh claim id was fenced".into()))
            }
        };
        m::claim_decided(outcome.label(), started.elapsed());
        Ok(outcome)
    }

    /// One decision of `input` on the Redis SKU `name` (a SKU, or one shard of one).
    async fn decide(&self, name: &str, tag: i32, input: ClaimInput) -> Answer {
        if self.coalesce {
            return self.decide_coalesced(name, tag, input).await;
        }
        let keys = self.store.keys(name);
        let floor = self.marks.fence(name);
        let call = ids::mint_call(tag);
        let mut d = decide_batch(
            &self.store,
            name,
            &keys,
            &call,
            std::slice::from_ref(&input),
            floor,
        )
        .await
        .0;
        d.pop()
            .unwrap_or_else(|| Err(StoreError::Protocol("empty claim reply".into())))
            .map(|d| (ids::claim_in(&call, 0), d))
    }

    async fn decide_coalesced(&self, name: &str, tag: i32, input: ClaimInput) -> Answer {
        let lane = match self.lanes.get(name) {
            Some(l) => l.clone(),
            None => self.lanes.entry(name.to_string()).or_default().clone(),
        };
        let (tx, rx) = oneshot::channel();
        let start_call = {
            let mut l = lane.lock();
            if l.queue.len() >= self.max_queue {
                return Ok((Uuid::nil(), Decision::Shed));
            }
            l.queue.push((input, tx));
            !std::mem::replace(&mut l.busy, true)
        };
        if start_call {
            let store = self.store.clone();
            let name = name.to_string();
            tokio::spawn(drain_lane(store, name, tag, lane, self.marks.clone()));
        }
        // A call that panicked is read back by drain_lane itself (it alone knows the ids), so
        // a lost sender means the task died before this claim's call was formed or sent.
        rx.await.unwrap_or_else(|_| {
            Err(StoreError::Unavailable(
                "the claim's call was never sent".into(),
            ))
        })
    }
}

/// Calls Redis for the queued claims of one SKU until the queue is empty.
async fn drain_lane(
    store: Store,
    name: String,
    tag: i32,
    lane: Arc<Mutex<Lane>>,
    marks: Arc<Marks>,
) {
    let keys = store.keys(&name);
    loop {
        let batch: Vec<(ClaimInput, Reply)> = {
            let mut l = lane.lock();
            if l.queue.is_empty() {
                l.busy = false;
                return;
            }
            let take = l.queue.len().min(MAX_BATCH);
            l.queue.drain(..take).collect()
        };
        let (inputs, replies): (Vec<ClaimInput>, Vec<Reply>) = batch.into_iter().unzip();
        let was_silent = lane.lock().silent;
        if was_silent && !probe(&store, &keys).await {
            m::failed_fast(inputs.len());
            for reply in replies {
                let _ = reply.send(Err(StoreError::Unavailable(
                    "redis answers no call on this SKU; this claim was not sent".into(),
                )));
            }
            continue;
        }
        m::coalesced_batch(inputs.len());
        let call = ids::mint_call(tag);
        let decided = AssertUnwindSafe(decide_batch(
            &store,
            &name,
            &keys,
            &call,
            &inputs,
            marks.fence(&name),
        ))
        .catch_unwind()
        .await;
        let (decisions, silent) = match decided {
            Ok(d) => d,
            // A panic with the call perhaps sent: read its claims back, never send it again.
            Err(_) => {
                let ids: Vec<Uuid> = (0..inputs.len()).map(|i| ids::claim_in(&call, i)).collect();
                resolve(&store, &keys, &ids).await
            }
        };
        // An answer of any kind (a decision, a read-back, a refusal) ends the silence.
        lane.lock().silent = silent;
        for (i, (reply, d)) in replies.into_iter().zip(decisions).enumerate() {
            let _ = reply.send(d.map(|d| (ids::claim_in(&call, i), d)));
        }
    }
}
