//! Borrowing: a shard that answered a claim sold out takes units from a sibling with stock.
//!
//! One refill at a time per shard per gateway (a drop's sell-out makes hundreds of claims on
//! one shard answer sold out at once; they wait for one refill and all retry, rather than
//! each moving units). The refill brings what every claim waiting for it wants, not just the
//! quantity of the claim that runs it: claims queue behind the running refill, and one unit
//! per refill would send each of them round again for the next (issue 19, scenario 7: 40
//! buyers on one shard bought 5 or 6 of 8 units before their rounds ran out). A refill first
//! finishes every transfer it finds pending (on any shard: a pending transfer is finished by
//! whoever finds it, so a claim is never refused while units are in transit), then moves
//! units from the siblings with the most stock until the wanted units have come.
//!
//! `sold_out` is said of a sharded SKU only from a reading of every shard that is one instant
//! ([`view::settled`]): every shard dry and no transfer in flight ([`Refill::Dry`]), or fewer
//! units left on all of them together than the claim asks for ([`Refill::Short`]).

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use dashmap::DashMap;

use super::transfer;
use super::view::{self, survey, ShardState};
use crate::error::StoreError;
use crate::layout::Layout;
use crate::sku::SkuId;
use crate::store::Store;

/// Most units one transfer moves: a donor gives about half its stock, never more than this.
pub const TRANSFER_CAP: i64 = 1_000;
/// Readings of every shard a refill takes, at most, to find two that agree ([`view::settled`]).
const READINGS: usize = 4;

/// What a refill found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refill {
    /// Units came to the shard (or were already there), or remain on some shard while others
    /// moved them meanwhile: decide the claim again.
    Moved,
    /// Every shard's stock was 0 and no transfer was in flight, at one instant during the
    /// refill: the SKU is sold out.
    Dry,
    /// Fewer units than the claim's quantity remained on all shards together, at one instant
    /// during the refill (no partial fills: sold out for this claim).
    Short,
}

/// The refills in flight, one per shard this gateway has refilled.
#[derive(Default)]
pub struct Borrower {
    flights: DashMap<String, Arc<Flight>>,
}

#[derive(Default)]
struct Flight {
    /// Units wanted by the claims waiting for (or running) a refill of this shard.
    wanted: AtomicI64,
    /// Refills begun; a waiting claim takes the outcome of one begun after it came.
    begun: AtomicU64,
    /// Held while a refill runs; keeps the last one's number, the quantity it refilled for
    /// and its outcome.
    last: tokio::sync::Mutex<Option<(u64, i64, Refill)>>,
}

/// A claim's units counted in its flight's `wanted` while it waits.
struct Wanting<'a>(&'a AtomicI64, i64);

impl Drop for Wanting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(self.1, Ordering::AcqRel);
    }
}

impl Borrower {
    /// Brings at least `need` units to shard `shard` of `sku` (laid out as `layout`), and as
    /// many as the claims waiting with it want, or tells why not.
    ///
    /// # Errors
    /// [`StoreError::SkuLost`] / [`StoreError::Stale`] when any shard fails closed (the SKU is
    /// then not known sold out), or a Redis error; a transfer left half done is finished by
    /// the recovery task.
    pub async fn refill(
        &self,
        store: &Store,
        sku: &SkuId,
        layout: Layout,
        shard: u16,
        need: i64,
    ) -> Result<Refill, StoreError> {
        let name = layout.name(sku, shard);
        let flight = match self.flights.get(&name) {
            Some(f) => f.clone(),
            None => self.flights.entry(name).or_default().clone(),
        };
        // Counted before the ticket: any refill begun after it sees these units wanted.
        flight.wanted.fetch_add(need, Ordering::AcqRel);
        let _wanting = Wanting(&flight.wanted, need);
        let ticket = flight.begun.load(Ordering::Acquire);
        let mut last = flight.last.lock().await;
        if let Some((n, for_need, outcome)) = *last {
            // A Short for a larger claim says nothing of a smaller one.
            if n > ticket && (outcome != Refill::Short || for_need <= need) {
                return Ok(outcome);
            }
        }
        let n = flight.begun.fetch_add(1, Ordering::AcqRel) + 1;
        let want = flight.wanted.load(Ordering::Acquire).max(need);
        let outcome = fill(store, sku, layout, shard, need, want).await;
        *last = outcome.as_ref().ok().map(|o| (n, need, *o));
        outcome
    }
}

/// Brings at least `need` units to shard `shard` from its siblings, now: what a negative
/// restock of a sharded SKU does before its single-slot step on shard 0 (under the SKU's
/// lock; buyers may still take units meanwhile, and the restock's own script then refuses as
/// on one shard).
///
/// # Errors
/// As [`Borrower::refill`].
pub async fn gather(
    store: &Store,
    sku: &SkuId,
    layout: Layout,
    shard: u16,
    need: i64,
) -> Result<Refill, StoreError> {
    fill(store, sku, layout, shard, need, need).await
}

/// Brings `want` units to shard `shard` (at least `need` of them, the claim's own quantity)
/// from its siblings.
async fn fill(
    store: &Store,
    sku: &SkuId,
    layout: Layout,
    shard: u16,
    need: i64,
    want: i64,
) -> Result<Refill, StoreError> {
    let states = survey(store, sku, layout).await?;
    let mut own = states[usize::from(shard)].stock;
    // Units in transit first: finishing them may be all it takes, and until they land nobody
    // may say the SKU is sold out.
    for p in states.iter().flat_map(|s| &s.pending) {
        if transfer::complete(store, sku, layout, p).await? && p.recipient == shard {
            own += p.units;
        }
    }
    if own < want {
        let mut donors: Vec<(i64, u16)> = states
            .iter()
            .enumerate()
            .filter(|(i, s)| *i != usize::from(shard) && s.stock > 0)
            .map(|(i, s)| (s.stock, i as u16))
            .collect();
        donors.sort_unstable_by(|a, b| b.cmp(a));
        for (_, donor) in donors {
            own += transfer::transfer(
                store,
                sku,
                layout,
                (donor, shard),
                want - own,
                TRANSFER_CAP,
                transfer::Source::Stock,
            )
            .await?;
            if own >= want {
                break;
            }
        }
    }
    if own >= need {
        return Ok(Refill::Moved);
    }
    // Read again rather than trust what this refill saw: another refill (of another shard,
    // or on another gateway) may have moved units meanwhile, and "sold out" is said only of
    // a reading that is one instant.
    Ok(match view::settled(store, sku, layout, READINGS).await? {
        Some(after) => verdict(&after, usize::from(shard), need),
        // Units kept moving under every reading: some exist, so decide again.
        None => Refill::Moved,
    })
}

/// What one instant's reading of every shard says to a claim of `need` units on `shard`.
fn verdict(states: &[ShardState], shard: usize, need: i64) -> Refill {
    if states.iter().all(ShardState::is_dry) {
        return Refill::Dry;
    }
    let in_transit: i64 = states
        .iter()
        .flat_map(|s| &s.pending)
        .map(|p| p.units)
        .sum();
    let left: i64 = states.iter().map(|s| s.stock).sum::<i64>() + in_transit;
    if states[shard].stock >= need || left >= need {
        Refill::Moved
    } else {
        Refill::Short
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(stock: i64) -> ShardState {
        ShardState {
            stock,
            pool: 0,
            in_flight: 0,
            transfer_out: 0,
            pending: Vec::new(),
            seq: 1,
        }
    }

    #[test]
    fn a_claim_is_refused_only_by_a_reading_with_too_few_units_anywhere() {
        assert_eq!(verdict(&[shard(0), shard(0)], 0, 1), Refill::Dry);
        // A unit on a sibling: borrow it and decide again, never sold out.
        assert_eq!(verdict(&[shard(0), shard(1)], 0, 1), Refill::Moved);
        assert_eq!(
            verdict(&[shard(0), shard(1), shard(1)], 0, 2),
            Refill::Moved
        );
        assert_eq!(verdict(&[shard(0), shard(1)], 0, 2), Refill::Short);
        let mut moving = shard(0);
        moving.pending.push(transfer::Pending {
            id: uuid::Uuid::nil(),
            donor: 1,
            recipient: 0,
            units: 1,
            generation: String::new(),
            created_ms: 0,
            source: transfer::Source::Stock,
        });
        assert_eq!(
            verdict(&[shard(0), moving], 0, 1),
            Refill::Moved,
            "in transit"
        );
    }
}
