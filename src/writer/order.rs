//! How a hold's change meets its win: by the journal's order, never by a clock.
//!
//! A hold's win and its later change (confirmed, cancelled, expired) are entries of the same
//! stream, the win first: the hold exists only once its claim.lua call journaled it. A group
//! delivers a stream's entries in order, so once a change is delivered its win has been too,
//! though maybe to another writer (one that died, or has not committed yet). An entry is
//! acknowledged only after its winners are in a table (`issuances`, `persistence_pending`,
//! `quarantine`). So a change whose claim no table holds waits exactly while an entry before it
//! is still unacknowledged and may carry its win: a winner of that claim, or an entry nobody
//! could read. When none is left the win will never arrive (its entry was quarantined without
//! a claim id, or the journal was lost), and the change is acknowledged as it is.
//!
//! What a change waits for is always settled by someone: a live writer settles and
//! acknowledges every winner and unreadable entry it reads in the same pass (only entries of
//! waiting changes are kept back), a dead gateway's entries are taken over with XAUTOCLAIM,
//! and this writer's own entries whose delivery reply it lost are adopted here.

use std::collections::HashSet;

use sqlx::PgPool;
use uuid::Uuid;

use crate::error::{DbError, TaskError};
use crate::journal::{self, Batch};
use crate::keys::ShardName;
use crate::scripts;
use crate::store::Store;

/// Entries of other writers looked at before a change, beyond the batch's own.
const LOOK_BEHIND: usize = 256;

/// What [`waiting`] found.
#[derive(Debug, Default)]
pub struct Waiting {
    /// Entries (of hold changes) whose changes wait for their wins.
    pub entries: HashSet<String>,
    /// This writer's own unacknowledged entries it does not hold in memory (their delivery's
    /// reply was lost): settled with the batch from the next pass on.
    pub adopted: Batch,
    /// Changes whose win will never reach the ledger: applied as they are.
    pub orphans: Vec<Uuid>,
}

/// The changes of `batch` that must wait for their wins (see the module's text). The batch's
/// own winners and unreadable entries are settled in PostgreSQL before this is asked.
///
/// # Errors
/// PostgreSQL or Redis unreachable: nothing is decided, the batch is retried.
pub async fn waiting(
    db: &PgPool,
    store: &Store,
    consumer: &str,
    name: &ShardName,
    batch: &Batch,
) -> Result<Waiting, TaskError> {
    let mut out = Waiting::default();
    let claims: Vec<Uuid> = batch.changes.iter().map(|c| c.claim_id).collect();
    let first = homeless(db, &claims).await?;
    let Some(last) = (batch.changes.iter())
        .filter(|c| first.contains(&c.claim_id))
        .map(|c| c.entry_id.as_str())
        .max_by_key(|e| key(e))
    else {
        return Ok(out);
    };
    let mine = batch.entry_ids();
    // Redis first, PostgreSQL after: a win's entry is acknowledged only after its row
    // commits, so a win not pending in this reading is in a table for the query below.
    let limit = mine.len() + LOOK_BEHIND;
    let keys = store.keys(name);
    let mut con = store.hot();
    let pending = store
        .bounded(scripts::journal::pending_before(
            &mut con, &keys, last, limit,
        ))
        .await?;
    let full = pending.len() >= limit;
    let seen_to = pending.last().map(|p| key(&p.0));
    // (entry, claim it may carry: None when nobody can read the entry)
    let mut carriers: Vec<((u64, u64), Option<Uuid>)> = Vec::new();
    for (entry_id, owner, entry) in pending {
        if mine.contains(entry_id.as_str()) {
            continue;
        }
        let read = journal::parse_one(name, entry);
        let at = key(&entry_id);
        carriers.extend(read.winners.iter().map(|w| (at, Some(w.claim_id))));
        carriers.extend(read.unreadable.iter().map(|u| (at, u.claim_id)));
        if owner == consumer {
            out.adopted.extend(read);
        }
    }
    let still = homeless(db, &first).await?;
    for c in batch.changes.iter().filter(|c| still.contains(&c.claim_id)) {
        let at = key(&c.entry_id);
        let carried = carriers
            .iter()
            .any(|(e, claim)| *e < at && claim.is_none_or(|id| id == c.claim_id));
        // Past what the reading covered, an entry may yet carry it.
        let unseen = full && seen_to.is_none_or(|s| s < at);
        if carried || unseen {
            out.entries.insert(c.entry_id.clone());
        } else {
            out.orphans.push(c.claim_id);
        }
    }
    Ok(out)
}

/// The claims of `ids` that no table holds.
async fn homeless(db: &PgPool, ids: &[Uuid]) -> Result<Vec<Uuid>, DbError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    Ok(sqlx::query_scalar(
        "SELECT c FROM UNNEST($1::uuid[]) AS c
          WHERE NOT EXISTS (SELECT 1 FROM issuances WHERE claim_id = c)
            AND NOT EXISTS (SELECT 1 FROM persistence_pending WHERE claim_id = c)
            AND NOT EXISTS (SELECT 1 FROM quarantine WHERE claim_id = c)",
    )
    .bind(ids)
    .fetch_all(db)
    .await?)
}

/// A stream entry id ("ms-seq") in the stream's order.
fn key(id: &str) -> (u64, u64) {
    let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
    (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::key;

    #[test]
    fn entry_ids_order_as_the_stream_does() {
        assert!(key("9-5") < key("10-0"));
        assert!(key("10-2") < key("10-10"));
        assert_eq!(key("1700000000000-3"), (1_700_000_000_000, 3));
    }
}
