//! The SKU view's Redis side (`read_books.lua`): one SKU's (or shard's) state, its journal
//! entries not acknowledged, its transfers out and the restock and compensation markers asked
//! for, in one read.

use redis::aio::ConnectionLike;
use redis::Value;
use uuid::Uuid;

use super::SCRIPTS;
use crate::error::StoreError;
use crate::keys::{SkuKeys, JOURNAL_GROUP};

/// The Redis side of one SKU (one shard), as `read_books.lua` returns it.
#[derive(Debug, Clone)]
pub struct Side {
    pub head: Head,
    /// (entry id, the entry as XRANGE returns it), oldest first.
    pub entries: Vec<(String, Value)>,
    /// More entries are unacknowledged than were read (the list is cut).
    pub more: bool,
    /// The transfers out, as HGETALL returns them.
    pub transfers: Vec<(String, String)>,
    /// Each restock marker's value, in the order asked (`None` when absent).
    pub markers: Vec<Option<String>>,
    /// Each compensation marker's value, in the order asked (`None` when absent).
    pub compensations: Vec<Option<String>>,
    /// A seated SKU's seat map, read with the stock (`None` on a SKU sold by count).
    pub seat_map: Option<Vec<u8>>,
}

/// The state's fields the view counts (`None` where absent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub stock: Option<i64>,
    pub inflight: Option<i64>,
    pub seq: Option<i64>,
    pub stale: Option<String>,
    pub pool: Option<i64>,
    pub transfer_out: Option<i64>,
    /// Journal entries acknowledged so far (`ack_journal.lua`): the one count that moves when
    /// an entry leaves the journal for the ledger.
    pub acks: Option<i64>,
}

type HeadReply = (
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<String>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
);

/// Reads the Redis side of the SKU (or shard) of `keys` (`read_books.lua`), with the markers of
/// the restock operations `restocks`, the compensation markers of `claims` and at most
/// `entries` unacknowledged journal entries.
///
/// # Errors
/// The Redis error of the call.
pub async fn read_books<C: ConnectionLike>(
    con: &mut C,
    keys: &SkuKeys,
    restocks: &[Uuid],
    claims: &[Uuid],
    entries: usize,
) -> Result<Side, StoreError> {
    let mut inv = SCRIPTS.read_books.prepare_invoke();
    inv.key(keys.state())
        .key(keys.journal())
        .key(keys.transfers())
        .key(keys.seats());
    for op in restocks {
        inv.key(keys.restock_op(op));
    }
    for claim in claims {
        inv.key(keys.compensation(claim));
    }
    inv.arg(JOURNAL_GROUP).arg(entries);
    type Reply = (
        HeadReply,
        Vec<Value>,
        i64,
        Vec<(String, String)>,
        Vec<Option<String>>,
        Option<Vec<u8>>,
    );
    let (h, entries, more, transfers, mut markers, seat_map): Reply = inv.invoke_async(con).await?;
    // The script answers every marker asked for in one list: the restocks' first.
    let compensations = markers.split_off(restocks.len().min(markers.len()));
    let entries = entries
        .into_iter()
        .filter_map(|e| match &e {
            Value::Array(parts) if parts.len() == 2 => {
                let id = redis::from_redis_value::<String>(parts[0].clone()).ok()?;
                Some((id, e))
            }
            _ => None,
        })
        .collect();
    Ok(Side {
        head: Head {
            stock: h.0,
            inflight: h.1,
            seq: h.2,
            stale: h.3,
            pool: h.4,
            transfer_out: h.5,
            acks: h.6,
        },
        entries,
        more: more == 1,
        transfers,
        markers,
        seat_map,
        compensations,
    })
}
