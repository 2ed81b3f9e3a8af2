//! Borrowing: a shard that answered a claim sold out takes units from a sibling with stock.
//!
//! One refill at a time per shard per gateway (a drop's sell-out makes hundreds of claims on
//! one shard answer sold out at once; they wait for one refill and all retry, rather than
//! each moving units). A refill first finishes every transfer it finds pending (on any shard:
//! a pending transfer is finished by whoever finds it, so a claim is never refused while units
//! are in transit), then moves units from the siblings with the most stock, at least the
//! claim's quantity from each, until that much has come.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use dashmap::DashMap;

use super::transfer;
use super::view::survey;
use super::Layout;
use crate::error::StoreError;
use crate::store::Store;

/// Most units one transfer moves: a donor gives about half its stock, never more than this.
pub const TRANSFER_CAP: i64 = 1_000;

/// What a refill found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refill {
    /// Units came to the shard (or were already there): decide the claim again.
    Moved,
    /// Every shard's stock is 0 and no transfer is in flight: the SKU is sold out.
    Dry,
    /// Some units remain, but no shard could gather the claim's quantity.
    Short,
}

/// The refills in flight, one per shard this gateway has refilled.
#[derive(Default)]
pub struct Borrower {
    flights: DashMap<String, Arc<Flight>>,
}

#[derive(Default)]
struct Flight {
    /// Refills finished; a claim that waited while one finished takes its outcome.
    done: AtomicU64,
    /// Held while a refill runs; keeps the last outcome.
    last: tokio::sync::Mutex<Option<Refill>>,
}

impl Borrower {
    /// Brings at least `need` units to shard `shard` of `sku` (laid out as `layout`), or tells
    /// why not.
    ///
    /// # Errors
    /// [`StoreError::SkuLost`] / [`StoreError::Stale`] when any shard fails closed (the SKU is
    /// then not known sold out), or a Redis error; a transfer left half done is finished by
    /// the recovery task.
    pub async fn refill(
        &self,
        store: &Store,
        sku: &str,
        layout: Layout,
        shard: u16,
        need: i64,
    ) -> Result<Refill, StoreError> {
        let name = layout.name(sku, shard);
        let flight = match self.flights.get(&name) {
            Some(f) => f.clone(),
            None => self.flights.entry(name).or_default().clone(),
        };
        let seen = flight.done.load(Ordering::Acquire);
        let mut last = flight.last.lock().await;
        if flight.done.load(Ordering::Acquire) != seen {
            if let Some(outcome) = *last {
                return Ok(outcome);
            }
        }
        let outcome = gather(store, sku, layout, shard, need).await;
        *last = outcome.as_ref().ok().copied();
        flight.done.fetch_add(1, Ordering::AcqRel);
        outcome
    }
}

/// Brings at least `need` units to shard `shard` from its siblings, now: a claim's refill
/// (through [`Borrower::refill`], one at a time per shard), and what a negative restock of a
/// sharded SKU does before its single-slot step on shard 0 (under the SKU's lock; buyers may
/// still take units meanwhile, and the restock's own script then refuses as on one shard).
///
/// # Errors
/// As [`Borrower::refill`].
pub async fn gather(
    store: &Store,
    sku: &str,
    layout: Layout,
    shard: u16,
    need: i64,
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
    if own >= need {
        return Ok(Refill::Moved);
    }
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
            need - own,
            TRANSFER_CAP,
            transfer::Source::Stock,
        )
        .await?;
        if own >= need {
            return Ok(Refill::Moved);
        }
    }
    // Read again rather than trust what this refill saw: another gateway may have moved
    // units meanwhile, and "sold out" is said only of a SKU every shard of which is dry.
    let after = survey(store, sku, layout).await?;
    if after.iter().all(|s| s.stock == 0 && s.pending.is_empty()) {
        Ok(Refill::Dry)
    } else if after[usize::from(shard)].stock >= need {
        Ok(Refill::Moved)
    } else {
        Ok(Refill::Short)
    }
}
