//! Redis's side of a reading ([`super`]): each shard's state and unacknowledged journal
//! entries, read in one script per shard, and what changed between the two readings.

use std::collections::HashSet;

use uuid::Uuid;

use crate::error::StoreError;
use crate::journal::{entry_batch, Batch};
use crate::keys::ShardName;
use crate::scripts::{self, books::Side};
use crate::store::Store;

/// Unacknowledged journal entries read per shard (the writer's own batch size): beyond it
/// the entries left out keep their units in `inflight` and count as unwritten.
const ENTRIES: usize = 256;

/// Nothing the view counts moved between two readings: every change of stock, pool or
/// transfers bumps or moves the head, a new entry or an acknowledgement changes the set
/// of unacknowledged entries (an id once acknowledged never comes back), and a restock's
/// marker is set with its stock and sequence.
pub(super) fn unmoved(this: &Side, other: &Side) -> bool {
    this.head == other.head
        && this.more == other.more
        && this.transfers == other.transfers
        && this.entries.len() == other.entries.len()
        && this
            .entries
            .iter()
            .zip(&other.entries)
            .all(|(a, b)| a.0 == b.0)
}

/// Runs `read_books.lua` on `name` (a SKU or a shard's Redis name), with the markers of
/// `restocks` (operations PostgreSQL has pending) and of the compensations of `claims`.
async fn read_side(
    store: &Store,
    name: &str,
    restocks: &[Uuid],
    claims: &[Uuid],
) -> Result<Side, StoreError> {
    let keys = store.keys(name);
    let mut con = store.hot();
    store
        .bounded(scripts::books::read_books(
            &mut con, &keys, restocks, claims, ENTRIES,
        ))
        .await
}

/// Every shard's side (shard 0 first), all in flight together, with the compensation markers
/// of `claims[i]` on shard i; `None` when Redis cannot answer for one of them.
pub(super) async fn read_sides(
    store: &Store,
    names: &[String],
    restocks: &[Uuid],
    claims: &[Vec<Uuid>],
) -> Option<Vec<Side>> {
    let reads = names.iter().enumerate().map(|(i, name)| {
        // Restocks move shard 0 only (src/inventory/restock.rs).
        let ops = if i == 0 { restocks } else { &[] };
        read_side(
            store,
            name,
            ops,
            claims.get(i).map_or(&[][..], Vec::as_slice),
        )
    });
    futures_util::future::try_join_all(reads).await.ok()
}

/// Units of the reprocessed claims whose compensation Redis has given back (their marker says
/// so) while their rows still count them in `pending`: they count once, in the stock. A
/// compensation gives back and bumps the state's sequence in one script, so a fenced reading
/// sees it either in both the stock and the marker or in neither.
pub(super) fn given_back(
    reprocessing: &[(Uuid, String, i64)],
    shards: &[Vec<Uuid>],
    sides: &[Side],
) -> i64 {
    let given: HashSet<Uuid> = shards
        .iter()
        .zip(sides)
        .flat_map(|(ids, s)| ids.iter().zip(&s.compensations))
        .filter(|(_, m)| m.as_deref() == Some("compensated"))
        .map(|(id, _)| *id)
        .collect();
    reprocessing
        .iter()
        .filter(|(id, _, _)| given.contains(id))
        .map(|(_, _, q)| *q)
        .sum()
}

/// The claims and the waitlist entries `batches` carry.
pub(super) fn ids(batches: &[Vec<Batch>]) -> (Vec<Uuid>, Vec<Uuid>) {
    let all = || batches.iter().flatten();
    let claims = all()
        .flat_map(|b| {
            b.winners
                .iter()
                .map(|w| w.claim_id)
                .chain(b.changes.iter().map(|c| c.claim_id))
        })
        .collect();
    let waits = all()
        .flat_map(|b| b.waits.iter().map(|w| w.entry_id))
        .collect();
    (claims, waits)
}

/// Per shard, the entries `first` showed unacknowledged and `second` no longer does (an id
/// once acknowledged never comes back).
pub(super) fn acknowledged_between(
    first: &[Side],
    second: &[Side],
    shards: &[ShardName],
) -> Vec<Vec<Batch>> {
    first
        .iter()
        .zip(second)
        .zip(shards)
        .map(|((a, b), name)| {
            let still: HashSet<&str> = b.entries.iter().map(|(id, _)| id.as_str()).collect();
            a.entries
                .iter()
                .filter(|(id, _)| !still.contains(id.as_str()))
                .map(|(_, e)| entry_batch(name, e.clone()))
                .collect()
        })
        .collect()
}

/// Each shard's unacknowledged entries as batches (none when Redis did not answer).
pub(super) fn batches(sides: Option<&[Side]>, shards: &[ShardName]) -> Vec<Vec<Batch>> {
    sides.map_or_else(Vec::new, |sides| {
        sides
            .iter()
            .zip(shards)
            .map(|(s, name)| {
                s.entries
                    .iter()
                    .map(|(_, e)| entry_batch(name, e.clone()))
                    .collect()
            })
            .collect()
    })
}
