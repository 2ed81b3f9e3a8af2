//! Transfers: units moved from one shard of a SKU to another, in two single-slot steps fenced
//! by a transfer id, then a third that forgets the finished transfer on the donor.
//!
//! 1. `transfer_out.lua` on the donor takes units out of its stock, counts them in its
//!    `transfer_out` field and records `id -> units|recipient|generation|created_ms` in its
//!    pending transfers;
//! 2. `transfer_in.lua` on the recipient gives them back once per id (a record of the applied
//!    id, kept [`crate::scripts::shards::TRANSFER_RECORD_TTL_SECS`]): through `give_back` (its pool under a
//!    line lease, src/shards/line.rs; else its line's head first, the rest to its stock), or
//!    into its pool when they came from the donor's ([`Source::Pool`]);
//! 3. `finish_transfer.lua` on the donor removes the pending record and the units from
//!    `transfer_out`.
//!
//! Every step may be repeated (the id fences each), so a crash between two steps never creates
//! or loses a unit: the units wait in the donor's `transfer_out` until some gateway's recovery
//! task ([`super::recovery`]) or borrowing claim finishes the transfer. On a Cluster a `WAIT`
//! follows each step (as it follows a win, [`Store::replicated`]): a step is built on only once
//! the replicas hold the one before it, so a failover cannot take back step 1 after step 2
//! added its units.

use uuid::Uuid;

use crate::error::StoreError;
use crate::keys::SkuKeys;
use crate::layout::Layout;
use crate::metrics as m;
use crate::scripts;
use crate::sku::SkuId;
use crate::store::Store;

// The scripts' words for a transfer's source and step 1's answer.
pub use crate::scripts::shards::{Source, Taken};

/// A transfer a donor recorded and has not forgotten yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub id: Uuid,
    pub donor: u16,
    pub recipient: u16,
    pub units: i64,
    /// The donor state's generation when the units were taken (see `transfer_out.lua`).
    pub generation: String,
    pub created_ms: i64,
    /// Where the units were taken from, and so where the recipient puts them.
    pub source: Source,
}

impl Pending {
    /// Parses a record `units|recipient|generation|created_ms[|source]` of the donor `donor`
    /// (records written before pools have no source: stock).
    pub(crate) fn parse(donor: u16, id: &str, rec: &str) -> Option<Pending> {
        let mut p = rec.splitn(5, '|');
        Some(Pending {
            id: Uuid::parse_str(id).ok()?,
            donor,
            units: p.next()?.parse().ok()?,
            recipient: p.next()?.parse().ok()?,
            generation: p.next()?.to_string(),
            created_ms: p.next()?.parse().ok()?,
            source: match p.next() {
                Some("pool") => Source::Pool,
                _ => Source::Stock,
            },
        })
    }
}

/// The pending transfers of the donor shard `donor` of `sku`.
///
/// # Errors
/// The Redis error of the read.
pub async fn pending(
    store: &Store,
    sku: &SkuId,
    layout: Layout,
    donor: u16,
) -> Result<Vec<Pending>, StoreError> {
    let keys = store.keys(&layout.name(sku, donor));
    let mut con = store.hot();
    let all: Vec<(String, String)> = store
        .bounded(async {
            Ok(redis::cmd("HGETALL")
                .arg(keys.transfers())
                .query_async(&mut con)
                .await?)
        })
        .await?;
    Ok(all
        .iter()
        .filter_map(|(id, rec)| Pending::parse(donor, id, rec))
        .collect())
}

/// Step 1: takes at least `need` units (fewer when the donor holds fewer; at most `cap`, about
/// half its stock) out of the donor shard, named `donor` in Redis, for shard `recipient`,
/// under the transfer `id`. A script on the donor alone: the recipient is only recorded.
///
/// # Errors
/// [`StoreError::SkuLost`] / [`StoreError::Stale`] for a donor that fails closed; the Redis
/// error of the call (its effect is then unknown: the recovery task finishes it if it ran).
pub async fn take(
    store: &Store,
    donor: &str,
    id: &Uuid,
    recipient: u16,
    need: i64,
    cap: i64,
    source: Source,
) -> Result<Taken, StoreError> {
    let keys = store.keys(donor);
    let mut con = store.hot();
    let call = store.bounded(scripts::shards::transfer_out(
        &mut con,
        &keys,
        id,
        recipient,
        need,
        cap,
        crate::clock::now_ms(),
        source,
        store.floor(donor),
    ));
    // A pending transfer is the donor's background work (the recovery task finishes it).
    let (taken, now) = crate::activity::with_mark(store, donor, call).await?;
    if let Taken::Units(..) = taken {
        if now {
            m::shard_transfer();
        }
        replicated(store, &keys).await?;
    }
    Ok(taken)
}

/// Steps 2 and 3 of the transfer `p`: its units into the recipient's stock (once), then the
/// donor forgets it. Returns whether the units are in the recipient's stock (`false`: the
/// transfer belonged to a state a restore replaced, and is dropped).
///
/// # Errors
/// [`StoreError::SkuLost`] / [`StoreError::Stale`] when the recipient fails closed (the
/// transfer stays pending: the restore that reopens the SKU ends it), or a Redis error
/// (every step may be sent again).
pub async fn complete(
    store: &Store,
    sku: &SkuId,
    layout: Layout,
    p: &Pending,
) -> Result<bool, StoreError> {
    let recipient = layout.name(sku, p.recipient);
    let to = store.keys(&recipient);
    let mut con = store.hot();
    // The units may be offered (a journal entry and a hold) or pooled for the lines there.
    let call = store.bounded(scripts::shards::transfer_in(
        &mut con,
        &to,
        &p.id,
        p.units,
        &p.generation,
        p.source,
        store.floor(&recipient),
    ));
    let applied = crate::activity::with_mark(store, &recipient, call).await?;
    replicated(store, &to).await?;
    let from = store.keys(&layout.name(sku, p.donor));
    store
        .bounded(scripts::shards::finish_transfer(&mut con, &from, &p.id))
        .await?;
    replicated(store, &from).await?;
    Ok(applied)
}

/// Moves units of `source` from `donor` to `recipient` now, all three steps. Returns the
/// units moved.
///
/// # Errors
/// As [`take`] and [`complete`]; a transfer left half done is finished by the recovery task.
pub async fn transfer(
    store: &Store,
    sku: &SkuId,
    layout: Layout,
    (donor, recipient): (u16, u16),
    need: i64,
    cap: i64,
    source: Source,
) -> Result<i64, StoreError> {
    let id = Uuid::now_v7();
    let from = layout.name(sku, donor);
    let taken = take(store, &from, &id, recipient, need, cap, source).await?;
    let (units, generation) = match taken {
        Taken::Units(u, g) => (u, g),
        Taken::Dry => return Ok(0),
    };
    let p = Pending {
        id,
        donor,
        recipient,
        units,
        generation,
        created_ms: crate::clock::now_ms(),
        source,
    };
    Ok(if complete(store, sku, layout, &p).await? {
        units
    } else {
        0
    })
}

/// A step is built on only once the configured replicas hold it.
async fn replicated(store: &Store, keys: &SkuKeys) -> Result<(), StoreError> {
    if store.replicated(keys).await? {
        Ok(())
    } else {
        m::wait_short();
        Err(StoreError::Timeout)
    }
}
