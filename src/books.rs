//! One reading of a SKU's books across Redis and PostgreSQL, for the SKU view
//! ([`crate::ledger::view`]), and so for `reconcile` and the `dropgate_sku_*` gauges.
//!
//! Redis is read twice, each time in one script (`read_books.lua`: stock, `inflight`, the
//! journal entries not acknowledged, transfers, restock markers), with PostgreSQL read in
//! one snapshot in between. When nothing the view counts moved in Redis between the two
//! reads, Redis held that state the whole time PostgreSQL's snapshot was taken: both sides
//! are one instant's, and the reading is *fenced*. At that instant:
//! - a journal entry whose rows the snapshot already holds (written, its acknowledgement not
//!   yet made: a writer between the two steps, or SIGKILLed there) counts once, in the
//!   ledger: its units come off `inflight`;
//! - a restock PostgreSQL still has pending counts in the total exactly when Redis has
//!   applied it (its marker), whichever store the restock moved first.
//!
//! docs/ledger-view.md says what each number counts and why a fenced reading balances.

use std::future::Future;

use sqlx::PgPool;
use uuid::Uuid;

use crate::error::DbError;
use crate::journal::Batch;
use crate::keys::ShardName;
use crate::layout::Layout;
use crate::scripts::books::Side;
use crate::shards::transfer::Pending;
use crate::shards::view::{ShardState, ShardView};
use crate::sku::SkuId;
use crate::store::Store;

mod ledger_side;
mod redis_side;
use ledger_side::{backlog, ledger_side, Backlog};
pub use ledger_side::{books_drift, LedgerSums};
use redis_side::{acknowledged_between, given_back, ids, read_sides, unmoved};

/// The books of one SKU at one reading.
#[derive(Debug, Clone)]
pub struct Reading {
    /// The catalog total, with the restocks PostgreSQL has pending counted as Redis has them
    /// (applied or not).
    pub total: i64,
    /// `None` when Redis cannot tell (unreachable, the SKU lost; a shard stale).
    pub remaining: Option<i64>,
    /// Units decided in Redis that the ledger does not hold yet, net of units given back
    /// whose change it does not hold yet.
    pub in_flight: Option<i64>,
    /// Journal entries carrying anything the ledger does not hold yet (0: caught up).
    pub unwritten_entries: Option<i64>,
    pub in_transit: Option<i64>,
    pub shards: Option<Vec<ShardView>>,
    pub sums: LedgerSums,
    /// Redis did not move while PostgreSQL was read: the two sides are one instant's.
    pub fenced: bool,
    /// A seated SKU's seat map, read in the same instant as `remaining` (`None` otherwise).
    pub seat_map: Option<Vec<u8>>,
}

/// Reads the books of `sku` once: Redis, PostgreSQL's snapshot, Redis again.
///
/// # Errors
/// The database error. Redis not answering is no error: its numbers are then `None`.
pub async fn read(
    store: &Store,
    db: &PgPool,
    sku: &SkuId,
    layout: Layout,
) -> Result<Reading, DbError> {
    let now = || std::future::ready(());
    read_between(
        store,
        db,
        sku,
        layout,
        Between {
            before_snapshot: now(),
            before_second: now(),
        },
    )
    .await
}

/// What a test runs between the steps of a reading, to place a move of Redis or PostgreSQL
/// exactly there (tests/api/view_consistency.rs).
#[doc(hidden)]
pub struct Between<A, B> {
    /// After the first Redis reading, before PostgreSQL's snapshot.
    pub before_snapshot: A,
    /// After the snapshot, before the second Redis reading.
    pub before_second: B,
}

/// [`read`], with `between`'s steps run where they say.
///
/// # Errors
/// As [`read`].
#[doc(hidden)]
pub async fn read_between<A: Future<Output = ()>, B: Future<Output = ()>>(
    store: &Store,
    db: &PgPool,
    sku: &SkuId,
    layout: Layout,
    between: Between<A, B>,
) -> Result<Reading, DbError> {
    let names = layout.names(sku);
    let shards: Vec<ShardName> = names.iter().map(|n| ShardName::parse(n)).collect();
    let first = read_sides(store, &names, &[], &[]).await;
    let batches = redis_side::batches(first.as_deref(), &shards);
    let (claims, waits) = ids(&batches);
    between.before_snapshot.await;
    let states = first.as_ref().and_then(|s| shard_states(s, &[]));
    // A transfer's second step moves its recipient's stock: read between the two readings,
    // the fence covers it.
    let in_transit = match &states {
        Some(states) if layout.is_sharded() => {
            crate::shards::view::in_transit(store, sku, layout, states).await
        }
        _ => None,
    };
    let (mut ledger, mut snapshot) = ledger_side(db, sku, &claims, &waits).await?;
    let ops: Vec<Uuid> = ledger.restocks.iter().map(|(op, _)| *op).collect();
    // Each reprocessed claim's marker lives on its buyer's shard.
    let mut compensating = vec![Vec::new(); names.len()];
    for (claim, user, _) in &ledger.reprocessing {
        compensating[usize::from(layout.shard_of_user(user))].push(*claim);
    }
    between.before_second.await;
    let second = read_sides(store, &names, &ops, &compensating).await;
    let fenced = match (&first, &second) {
        (Some(a), Some(b)) => a.len() == b.len() && a.iter().zip(b).all(|(x, y)| unmoved(x, y)),
        _ => false,
    };
    // Claims move Redis all the time during a drop, so a reading where nothing moved is rare
    // then; but a claim moves Redis alone (stock and `inflight` together). Only an
    // acknowledgement follows a change of the ledger (the writer commits, then acknowledges):
    // while `acks` stands still, no entry left the journal between the readings, so the
    // second reading's entries looked up in the snapshot are exact (below, as unfenced).
    let acks_still = !fenced && !layout.is_sharded() && acks_stood_still(&first, &second);
    // Unfenced, the second reading's entries count, looked up in the same snapshot; those
    // the first showed and the second no longer does were acknowledged in between.
    let (batches, vanished) = match (fenced, &first, &second) {
        (false, Some(a), Some(b)) => {
            let now = redis_side::batches(second.as_deref(), &shards);
            let (claims, waits) = ids(&now);
            ledger.look_up(&mut snapshot, &claims, &waits).await?;
            (now, acknowledged_between(a, b, &shards))
        }
        (false, _, _) => (redis_side::batches(second.as_deref(), &shards), Vec::new()),
        (true, _, _) => (batches, Vec::new()),
    };
    snapshot.close().await?;
    let fenced = fenced || acks_still;
    let total = ledger.total + restocks_pending(&ledger.restocks, second.as_ref());
    let Some(sides) = second else {
        return Ok(unknown(total, ledger.sums));
    };
    ledger.sums.pending -= given_back(&ledger.reprocessing, &compensating, &sides);
    let backlogs: Vec<Backlog> = sides
        .iter()
        .enumerate()
        .map(|(i, s)| backlog(shard(&batches, i), shard(&vanished, i), s.more, &ledger))
        .collect();
    let unwritten = backlogs.iter().map(|b| b.unwritten).sum();
    if !layout.is_sharded() {
        let h = &sides[0].head;
        return Ok(Reading {
            total,
            remaining: h.stock,
            in_flight: h.inflight.map(|f| f - backlogs[0].written_units),
            unwritten_entries: h.stock.map(|_| unwritten),
            in_transit: None,
            shards: None,
            sums: ledger.sums,
            fenced,
            seat_map: sides[0].seat_map.clone(),
        });
    }
    let Some(states) = shard_states(&sides, &backlogs) else {
        return Ok(unknown(total, ledger.sums));
    };
    let in_transit = if fenced {
        in_transit
    } else {
        crate::shards::view::in_transit(store, sku, layout, &states).await
    };
    let Some(in_transit) = in_transit else {
        return Ok(unknown(total, ledger.sums));
    };
    let side = crate::shards::view::summed(store, sku, layout, &states, in_transit);
    Ok(Reading {
        total,
        remaining: Some(side.remaining),
        in_flight: Some(side.in_flight),
        unwritten_entries: Some(unwritten),
        in_transit: Some(side.in_transit),
        shards: Some(side.shards),
        sums: ledger.sums,
        fenced,
        seat_map: None,
    })
}

/// Whether an unsharded SKU's two readings saw the same acknowledgements, every entry of
/// the journal (none cut off) and the same transfers.
fn acks_stood_still(first: &Option<Vec<Side>>, second: &Option<Vec<Side>>) -> bool {
    match (first.as_deref(), second.as_deref()) {
        (Some([a]), Some([b])) => {
            a.head.acks == b.head.acks
                && !a.more
                && !b.more
                && a.transfers == b.transfers
                && a.head.stock.is_some()
                && b.head.stock.is_some()
        }
        _ => false,
    }
}

/// Shard `i`'s entries (none past the end).
fn shard(batches: &[Vec<Batch>], i: usize) -> &[Batch] {
    batches.get(i).map_or(&[][..], Vec::as_slice)
}

fn unknown(total: i64, sums: LedgerSums) -> Reading {
    Reading {
        total,
        remaining: None,
        in_flight: None,
        unwritten_entries: None,
        in_transit: None,
        shards: None,
        sums,
        fenced: false,
        seat_map: None,
    }
}

/// What the restocks PostgreSQL has pending change in its total, as of Redis's reading: a
/// positive delta is in the total before Redis has it (off again until its marker says
/// applied), a negative one comes off the total only after Redis applied it (off already
/// once its marker says so). A marker "void" is a restock fenced: it never applies.
fn restocks_pending(restocks: &[(Uuid, i64)], sides: Option<&Vec<Side>>) -> i64 {
    let markers = sides
        .and_then(|s| s.first())
        .map_or(&[][..], |s| s.markers.as_slice());
    restocks
        .iter()
        .enumerate()
        .map(|(i, (_, delta))| {
            let applied = markers
                .get(i)
                .and_then(Option::as_deref)
                .is_some_and(|m| m != "void");
            match (applied, *delta > 0) {
                (true, false) => *delta,
                (false, true) => -*delta,
                _ => 0,
            }
        })
        .sum()
}

/// The shards as [`ShardState`]s, `in_flight` less the units the ledger already holds;
/// `None` when a shard is lost or stale (the SKU fails closed as a whole).
fn shard_states(sides: &[Side], backlogs: &[Backlog]) -> Option<Vec<ShardState>> {
    sides
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let h = &s.head;
            if h.stale.is_some() {
                return None;
            }
            let written = backlogs.get(i).map_or(0, |b| b.written_units);
            Some(ShardState {
                stock: h.stock?,
                pool: h.pool.unwrap_or(0),
                in_flight: h.inflight.unwrap_or(0) - written,
                transfer_out: h.transfer_out.unwrap_or(0),
                seq: h.seq.unwrap_or(0),
                pending: s
                    .transfers
                    .iter()
                    .filter_map(|(id, rec)| Pending::parse(i as u16, id, rec))
                    .collect(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scripts::books::Head;

    fn side(markers: Vec<Option<&str>>) -> Vec<Side> {
        vec![Side {
            head: Head {
                stock: Some(0),
                inflight: Some(0),
                seq: None,
                stale: None,
                pool: None,
                transfer_out: None,
                acks: None,
            },
            entries: Vec::new(),
            more: false,
            transfers: Vec::new(),
            markers: markers.into_iter().map(|m| m.map(String::from)).collect(),
            compensations: Vec::new(),
            seat_map: None,
        }]
    }

    #[test]
    fn a_pending_restock_counts_in_the_total_exactly_when_redis_applied_it() {
        let (up, down) = (Uuid::now_v7(), Uuid::now_v7());
        let ops = [(up, 3), (down, -3)];
        // Neither applied: the +3 already in the total comes off; the -3 is not in it yet.
        assert_eq!(restocks_pending(&ops, Some(&side(vec![None, None]))), -3);
        // Both applied: the +3 stays; the -3 not yet taken off the total comes off.
        assert_eq!(
            restocks_pending(&ops, Some(&side(vec![Some("7"), Some("8")]))),
            -3
        );
        assert_eq!(
            restocks_pending(&ops, Some(&side(vec![Some("7"), None]))),
            0
        );
        // Fenced ("void"): never applied.
        assert_eq!(
            restocks_pending(&ops, Some(&side(vec![Some("void"), Some("void")]))),
            -3
        );
    }
}
