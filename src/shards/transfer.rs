//! Transfers: units moved from one shard of a SKU to another, in two single-slot steps fenced
//! by a transfer id, then a third that forgets the finished transfer on the donor.
//!
//! 1. `transfer_out.lua` on the donor takes units out of its stock, counts them in its
//!    `transfer_out` field and records `id -> units|recipient|generation|created_ms` in its
//!    pending transfers;
//! 2. `transfer_in.lua` on the recipient gives them back once per id (a record of the applied
//!    id, kept [`super::TRANSFER_RECORD_TTL_SECS`]): through `give_back` (its pool under a
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

use super::Layout;
use crate::error::StoreError;
use crate::keys::SkuKeys;
use crate::metrics as m;
use crate::scripts::SCRIPTS;
use crate::store::Store;

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

/// Which of a donor's counts a transfer takes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Open stock (a refill, a restock's gathering): the recipient gives the units back
    /// (`give_back`: its line first, or its pool under a line lease).
    Stock,
    /// The waitlist pool (src/shards/line.rs): units kept for the SKU's lines stay in the
    /// recipient's pool, to be offered there.
    Pool,
}

impl Source {
    fn arg(self) -> &'static str {
        match self {
            Source::Stock => "",
            Source::Pool => "pool",
        }
    }
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

/// What step 1 found on the donor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Taken {
    /// Units taken out (now, or by an earlier send of the same id), and the donor's
    /// generation they carry.
    Units(i64, String),
    /// The donor had nothing to give.
    Dry,
}

/// The pending transfers of the donor shard `donor` of `sku`.
///
/// # Errors
/// The Redis error of the read.
pub async fn pending(
    store: &Store,
    sku: &str,
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
    let call = store.bounded(async {
        Ok(SCRIPTS
            .transfer_out
            .key(keys.state())
            .key(keys.transfers())
            .arg(id.to_string())
            .arg(need)
            .arg(cap)
            .arg(recipient)
            .arg(crate::claims::now_ms())
            .arg(source.arg())
            .arg(store.floor(donor))
            .invoke_async(&mut con)
            .await?)
    });
    // A pending transfer is the donor's background work (the recovery task finishes it).
    let (code, units, generation): (i64, i64, String) =
        crate::activity::with_mark(store, donor, call).await?;
    match code {
        1 | 2 => {
            if code == 1 {
                m::shard_transfer();
            }
            replicated(store, &keys).await?;
            Ok(Taken::Units(units, generation))
        }
        0 => Ok(Taken::Dry),
        -3 => Err(StoreError::Stale),
        -1 => Err(StoreError::SkuLost),
        other => Err(StoreError::Protocol(format!(
            "transfer_out answered {other}"
        ))),
    }
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
    sku: &str,
    layout: Layout,
    p: &Pending,
) -> Result<bool, StoreError> {
    let recipient = layout.name(sku, p.recipient);
    let to = store.keys(&recipient);
    let mut con = store.hot();
    let mut apply = SCRIPTS.transfer_in.prepare_invoke();
    for k in to.lifecycle() {
        apply.key(k);
    }
    apply
        .key(to.transfer_in(&p.id))
        .arg(p.units)
        .arg(&p.generation)
        .arg(super::TRANSFER_RECORD_TTL_SECS)
        .arg(p.source.arg())
        .arg(store.floor(&recipient));
    // The units may be offered (a journal entry and a hold) or pooled for the lines there.
    let call = store.bounded(async { Ok(apply.invoke_async(&mut con).await?) });
    let code: i64 = crate::activity::with_mark(store, &recipient, call).await?;
    let applied = match code {
        1 | 2 => true,
        -4 => false,
        -3 => return Err(StoreError::Stale),
        -1 => return Err(StoreError::SkuLost),
        other => {
            return Err(StoreError::Protocol(format!(
                "transfer_in answered {other}"
            )))
        }
    };
    replicated(store, &to).await?;
    let from = store.keys(&layout.name(sku, p.donor));
    let _: i64 = store
        .bounded(async {
            Ok(SCRIPTS
                .finish_transfer
                .key(from.state())
                .key(from.transfers())
                .arg(p.id.to_string())
                .invoke_async(&mut con)
                .await?)
        })
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
    sku: &str,
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
        created_ms: crate::claims::now_ms(),
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
