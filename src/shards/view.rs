//! Reading every shard of a sharded SKU: for a refill's decision ([`survey`]), and for the SKU
//! view's sums and its per-shard lines ([`summed`], of shards src/books.rs read).

use serde::Serialize;

use super::transfer::Pending;
use crate::error::StoreError;
use crate::layout::Layout;
use crate::sku::SkuId;
use crate::store::Store;

/// One shard as Redis holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardState {
    pub stock: i64,
    /// Units kept for the SKU's waitlists (`wl_pool`, src/shards/line.rs): not open stock.
    pub pool: i64,
    pub in_flight: i64,
    /// Units this shard took out for transfers it has not forgotten yet.
    pub transfer_out: i64,
    /// Those transfers.
    pub pending: Vec<Pending>,
    /// The state's sequence: it moves with every change of the stock and every transfer
    /// taken out ([`settled`] compares two readings by it).
    pub seq: i64,
}

impl ShardState {
    /// No open stock and no transfer taken out of this shard and not yet forgotten.
    pub fn is_dry(&self) -> bool {
        self.stock == 0 && self.pending.is_empty()
    }
}

/// Two readings of every shard show the same stock, pool, sequence and transfers (the
/// in-flight count moves with the writer's acknowledgements, which change no stock).
fn agree(a: &[ShardState], b: &[ShardState]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            (x.seq, x.stock, x.pool, &x.pending) == (y.seq, y.stock, y.pool, &y.pending)
        })
}

/// A shard's line in the SKU view (`shards: [...]`, only on a SKU of more than one shard).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ShardView {
    pub shard: u16,
    /// Its Redis name (the hash tag of its keys), so an operator can find its keys.
    pub name: String,
    /// On a Cluster, the slot its keys live in (`CLUSTER KEYSLOT`), so an operator can see
    /// which master holds it ([`super::placement`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slot: Option<u16>,
    pub remaining: i64,
    /// Units given back while somebody waited in one of the SKU's lines, kept for the lines
    /// (offered in join order by the feed, src/shards/line.rs) and sold to nobody else.
    pub for_waitlist: i64,
    pub in_flight: i64,
    pub transfer_out: i64,
}

/// Every shard of `sku`, shard 0 first, each read in one round trip, all in flight together
/// (the shards live in different slots: on a Cluster, on different masters).
///
/// # Errors
/// [`StoreError::SkuLost`] when a shard's state is missing, [`StoreError::Stale`] when one is
/// marked stale (the SKU fails closed as a whole), or the Redis error.
pub async fn survey(
    store: &Store,
    sku: &SkuId,
    layout: Layout,
) -> Result<Vec<ShardState>, StoreError> {
    let names = layout.names(sku);
    let reads = names
        .iter()
        .enumerate()
        .map(|(i, name)| read_shard(store, name, i as u16));
    futures_util::future::try_join_all(reads).await
}

async fn read_shard(store: &Store, name: &str, shard: u16) -> Result<ShardState, StoreError> {
    let keys = store.keys(name);
    let mut con = store.hot();
    type Head = (
        Option<i64>,
        Option<i64>,
        Option<i64>,
        Option<String>,
        Option<i64>,
        Option<i64>,
    );
    let (head, pending): (Head, Vec<(String, String)>) = store
        .bounded(async {
            Ok(redis::pipe()
                .cmd("HMGET")
                .arg(keys.state())
                .arg("stock")
                .arg("inflight")
                .arg("transfer_out")
                .arg("stale")
                .arg("wl_pool")
                .arg("seq")
                .cmd("HGETALL")
                .arg(keys.transfers())
                .query_async(&mut con)
                .await?)
        })
        .await?;
    let (Some(stock), in_flight, transfer_out, stale, pool, seq) = head else {
        return Err(StoreError::SkuLost);
    };
    if stale.is_some() {
        return Err(StoreError::Stale);
    }
    Ok(ShardState {
        stock,
        pool: pool.unwrap_or(0),
        in_flight: in_flight.unwrap_or(0),
        transfer_out: transfer_out.unwrap_or(0),
        pending: pending
            .iter()
            .filter_map(|(id, rec)| Pending::parse(shard, id, rec))
            .collect(),
        seq: seq.unwrap_or(0),
    })
}

/// Readings of every shard of `sku` taken until two in a row agree (the same sequence, stock
/// and transfers on every shard), at most `tries` readings; `None` when they never did.
///
/// One [`survey`] is no snapshot: it reads the shards one by one, so it can see shard A
/// before a transfer from B to A landed and B after it left, and call units that exist
/// nowhere. Two agreeing readings are one: each shard's state stayed the same from its first
/// read to its second, and every first read came before every second, so at the instant of
/// the last first read every shard was in the state both readings show. That is what lets a
/// refill say `sold_out` ([`super::borrow`]) and the sold-out fast path refuse from memory
/// (src/soldout/).
///
/// # Errors
/// As [`survey`].
pub async fn settled(
    store: &Store,
    sku: &SkuId,
    layout: Layout,
    tries: usize,
) -> Result<Option<Vec<ShardState>>, StoreError> {
    let mut last = survey(store, sku, layout).await?;
    for _ in 1..tries {
        let now = survey(store, sku, layout).await?;
        if agree(&now, &last) {
            return Ok(Some(now));
        }
        last = now;
    }
    Ok(None)
}

/// Whether every shard of `sku` was dry at one instant, with no transfer in flight
/// ([`settled`]): `false` when units remain, or when the readings never agreed.
///
/// # Errors
/// As [`survey`].
pub async fn all_dry(store: &Store, sku: &SkuId, layout: Layout) -> Result<bool, StoreError> {
    // A first reading that finds units settles the question at once.
    let first = survey(store, sku, layout).await?;
    if !first.iter().all(ShardState::is_dry) {
        return Ok(false);
    }
    let second = survey(store, sku, layout).await?;
    Ok(agree(&first, &second))
}

/// The Redis side of a sharded SKU's view: stock and in-flight units summed over the shards,
/// the units in transit (taken out by a donor, not yet added by their recipient: a transfer
/// its recipient applied is in the recipient's stock already, however long the donor takes to
/// forget it), and each shard's line.
pub struct ShardedSide {
    pub remaining: i64,
    pub in_flight: i64,
    pub in_transit: i64,
    pub shards: Vec<ShardView>,
}

/// Units in transit over `states`: taken out by a donor and not yet added by their
/// recipient. `None` when Redis cannot tell.
pub async fn in_transit(
    store: &Store,
    sku: &SkuId,
    layout: Layout,
    states: &[ShardState],
) -> Option<i64> {
    let mut in_transit = 0;
    for p in states.iter().flat_map(|s| &s.pending) {
        let applied = store
            .keys(&layout.name(sku, p.recipient))
            .transfer_in(&p.id);
        let mut con = store.hot();
        let done: bool = store
            .bounded(async {
                Ok(redis::cmd("EXISTS")
                    .arg(applied)
                    .query_async(&mut con)
                    .await?)
            })
            .await
            .ok()?;
        if !done {
            in_transit += p.units;
        }
    }
    Some(in_transit)
}

/// [`ShardedSide`] of shards read as `states` (src/books.rs reads them, with each shard's
/// `in_flight` net of what the ledger already holds) and their units `in_transit`.
pub fn summed(
    store: &Store,
    sku: &SkuId,
    layout: Layout,
    states: &[ShardState],
    in_transit: i64,
) -> ShardedSide {
    ShardedSide {
        // Pooled units are the SKU's too: kept for its lines, sold to nobody else.
        remaining: states.iter().map(|s| s.stock + s.pool).sum(),
        in_flight: states.iter().map(|s| s.in_flight).sum(),
        in_transit,
        shards: states
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let name = layout.name(sku, i as u16);
                let slot = store
                    .is_cluster()
                    .then(|| super::placement::key_slot(&store.keys(&name).state()));
                ShardView {
                    shard: i as u16,
                    name,
                    slot,
                    remaining: s.stock,
                    for_waitlist: s.pool,
                    in_flight: s.in_flight,
                    transfer_out: s.transfer_out,
                }
            })
            .collect(),
    }
}
