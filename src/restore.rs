//! Restore: rebuilding a SKU's Redis state from the ledger, after Redis lost it or came back
//! with older data (a stale state).
//!
//! Work grows with the ledger, so it is done in bounded chunks: the live claims are streamed
//! from PostgreSQL, idempotency records and per-user counts are written [`CHUNK`] at a time,
//! the counts into a staging key that the final script moves into place with the state hash
//! itself, so claims stay closed until everything is back.

use std::collections::HashMap;
use std::time::Duration;

use futures_util::TryStreamExt;

use crate::catalog::{self, Catalog};
use crate::config::RECORD_TTL_SECS;
use crate::error::StoreError;
use crate::inventory::{InventoryError, Refusal, SkuLock};
use crate::keys::SkuKeys;
use crate::ledger::{view, SkuView};
use crate::record::ClaimRecord;
use crate::scripts::{self, SCRIPTS};
use crate::store::{RedisConn, Store};

/// Redis writes per pipeline: bounds the memory and the time of each round trip.
pub(crate) const CHUNK: usize = 5_000;
/// How long a restore waits for the writer to empty the SKU's journal.
const JOURNAL_DRAIN_LIMIT: Duration = Duration::from_secs(15);

/// Rebuilds the SKU's Redis state from the ledger. A state marked stale is rebuilt without
/// `force` (it is known to be wrong); any other present state needs `force`.
///
/// # Errors
/// [`Refusal::StatePresent`] when Redis holds the SKU and `force` is off, or infrastructure
/// errors.
pub async fn restore(
    store: &Store,
    catalog: &Catalog,
    sku: &str,
    force: bool,
) -> Result<SkuView, InventoryError> {
    let db = catalog.db();
    // One operator action per SKU at a time, across gateways: no restock moves the total
    // while the stock is computed from it.
    let mut lock = SkuLock::acquire(db, sku).await?;
    // Before anything is rebuilt: the holds and waitlist staged below need the expiry worker,
    // and a forced restore waits for the writers to empty the journal.
    crate::activity::mark(store, sku).await;
    // Restocks in flight move the total: settle them before it is read.
    crate::inventory::settle_restocks(store, db, sku, &mut lock, Duration::ZERO).await?;
    let row = catalog::fetch(db, sku)
        .await?
        .ok_or(InventoryError::Refused(Refusal::UnknownSku))?;
    // Every shard of the SKU is rebuilt together (one shard for most SKUs: src/shards/).
    let names = row.layout.names(sku);
    let keys: Vec<SkuKeys> = names.iter().map(|n| store.keys(n)).collect();
    for name in names.iter().skip(1) {
        crate::activity::mark(store, name).await;
    }
    let mut con = store.hot();
    let mut seqs = Vec::with_capacity(keys.len());
    let (mut present, mut missing, mut stale) = (false, false, None::<String>);
    for k in &keys {
        let (stock, seq, why): (Option<i64>, Option<i64>, Option<String>) = store
            .bounded(async {
                Ok(redis::cmd("HMGET")
                    .arg(k.state())
                    .arg("stock")
                    .arg("seq")
                    .arg("stale")
                    .query_async(&mut con)
                    .await?)
            })
            .await?;
        present |= stock.is_some();
        missing |= stock.is_none();
        stale = stale.or(why);
        seqs.push(seq.unwrap_or(0));
    }
    // A SKU with a shard lost fails closed as a whole: like a lost SKU, it needs no force.
    if present && !missing && stale.is_none() && !force {
        return Err(InventoryError::Refused(Refusal::StatePresent));
    }
    let epoch = lock.epoch().await?;
    // Close the SKU first (claims fail closed), so the ledger stops moving under us; a state a
    // newer operator action touched means this restore's lock is gone.
    for k in &keys {
        if !store
            .bounded(scripts::close_sku(&mut con, k, epoch))
            .await?
        {
            return Err(
                StoreError::Unavailable("a newer operator action holds the SKU".into()).into(),
            );
        }
    }
    // Winners decided before the close must be in the ledger before it is read, or their units
    // would be counted nowhere (and sold again).
    for k in &keys {
        wait_for_empty_journal(store, k).await?;
    }
    // Above every sequence either store has seen, so no gateway's mark is ahead of it; each
    // shard in its own range.
    let mut new_seqs = Vec::with_capacity(keys.len());
    for (i, name) in names.iter().enumerate() {
        let mark = crate::shards::marks::of(db, name).await?;
        let base = crate::shards::seq_base(i as u16);
        new_seqs.push(mark.max(seqs[i]).max(base) + 1);
    }
    let restore_id = uuid::Uuid::new_v4();
    let staged: Vec<String> = keys.iter().map(|k| k.users_restore(&restore_id)).collect();
    let (units, users) = stage_live_claims(store, &mut con, &keys, &staged, db, sku).await?;
    let wl_order = crate::lifecycle::restore::stage(store, &mut con, &keys, db, sku).await?;
    let terms = scripts::Terms::of(&row);
    // The total as it is now, and proof that no newer operator action (which would have taken
    // a newer epoch) has moved it since this restore's lock: a lock lost with its connection
    // would otherwise let a restock finish in between, and the stock computed from a total it
    // changed would sell what it took back.
    let (total, current): (i64, i64) =
        sqlx::query_as("SELECT total, op_epoch FROM skus WHERE sku = $1")
            .bind(sku)
            .fetch_one(db)
            .await?;
    if current != epoch {
        return Err(StoreError::Unavailable("a newer operator action holds the SKU".into()).into());
    }
    let mut stock = total - units;
    if stock < 0 {
        tracing::error!(
            sku,
            oversold = -stock,
            "the ledger holds more live units than the total"
        );
        stock = 0;
    }
    // The remaining stock all on shard 0, rebuilt last: the others (stock 0) first, so no
    // shard opens with units while a sibling is still closed.
    let sharded = keys.len() > 1;
    for i in (0..keys.len()).rev() {
        let k = &keys[i];
        let mut inv = SCRIPTS.restore_sku.prepare_invoke();
        inv.key(k.state())
            .key(k.users())
            .key(k.journal())
            .key(&staged[i]);
        if sharded {
            inv.key(k.transfers());
        }
        inv.arg(if i == 0 { stock } else { 0 })
            .arg(row.per_user_limit)
            .arg(new_seqs[i])
            .arg(row.declare_id.to_string())
            .arg(epoch)
            .arg(terms.hold_ms)
            .arg(terms.offer_ms)
            .arg(terms.opens_ms.map_or(String::new(), |v| v.to_string()))
            .arg(terms.closes_ms.map_or(String::new(), |v| v.to_string()))
            // Every shard's line continues above the highest join order the ledger has (each
            // shard numbers its own line's joins; src/shards/line.rs).
            .arg(wl_order);
        if sharded {
            // The generation: no transfer begun before this restore applies to its states.
            inv.arg(epoch);
        }
        let applied: i64 = store
            .bounded(async { Ok(inv.invoke_async(&mut con).await?) })
            .await?;
        if applied != 1 {
            // Another restore (whose lock this one's replaced) rebuilt it first, from the
            // same ledger: drop what this one staged.
            for key in &staged {
                let _ = store
                    .bounded(async {
                        Ok(redis::cmd("DEL")
                            .arg(key)
                            .query_async::<()>(&mut con)
                            .await?)
                    })
                    .await;
            }
            return Err(InventoryError::Refused(Refusal::StatePresent));
        }
    }
    for (name, seq) in names.iter().zip(&new_seqs).skip(1) {
        crate::shards::marks::raise(db, name, *seq).await?;
    }
    let new_seq = new_seqs[0];
    sqlx::query(
        "UPDATE skus SET seeded = true, redis_seq = GREATEST(redis_seq, $2) WHERE sku = $1",
    )
    .bind(sku)
    .bind(new_seq)
    .execute(db)
    .await?;
    tracing::info!(
        sku,
        units,
        users,
        force,
        stale = stale.as_deref().unwrap_or(""),
        "restored the SKU's Redis state from the ledger"
    );
    view(store, catalog, sku).await
}

#[derive(sqlx::FromRow)]
struct LiveClaim {
    claim_id: uuid::Uuid,
    /// `None` for a quarantined winner whose entry could not be read.
    user_id: Option<String>,
    quantity: i64,
    idempotency_key: Option<String>,
    remaining_after: Option<i64>,
    seq: Option<i64>,
    created_at: chrono::DateTime<chrono::Utc>,
    /// A claim PostgreSQL refused, still with the reprocessor.
    parked: bool,
}

/// Streams the claims that hold units (written and live, refused and not yet compensated, or
/// quarantined and not yet settled by an operator), writes their idempotency records and stages
/// the per-user counts, a chunk at a time.
/// Returns the live units and the number of users holding them.
async fn stage_live_claims(
    store: &Store,
    con: &mut RedisConn,
    keys: &[SkuKeys],
    staged: &[String],
    db: &sqlx::PgPool,
    sku: &str,
) -> Result<(i64, usize), InventoryError> {
    let mut rows = sqlx::query_as::<_, LiveClaim>(
        "SELECT claim_id, user_id, quantity::bigint AS quantity, idempotency_key,
                remaining_after, seq, created_at, false AS parked
           FROM issuances WHERE sku = $1 AND status IN ('issued', 'held', 'confirmed')
         UNION ALL
         SELECT claim_id, user_id, quantity::bigint, idempotency_key, remaining_after, seq,
                created_at, true
           FROM persistence_pending WHERE sku = $1 AND status IN ('pending', 'reprocessing')
            AND claim_status NOT IN ('cancelled', 'expired')
         UNION ALL
         SELECT COALESCE(q.claim_id, '00000000-0000-0000-0000-000000000000'), q.user_id,
                COALESCE(q.quantity, 0)::bigint, NULL, NULL, NULL, q.created_at, false
           FROM quarantine q
          WHERE q.sku = $1 AND q.resolved_at IS NULL
            AND NOT EXISTS (SELECT 1 FROM issuances i WHERE i.claim_id = q.claim_id)
            AND NOT EXISTS (SELECT 1 FROM persistence_pending p WHERE p.claim_id = q.claim_id)",
    )
    .bind(sku)
    .fetch(db);
    let shards = keys.len() as i32;
    // Each buyer's count and records go to the buyer's shard, each shard's in pipelines of
    // its own (a pipeline reaches one slot's node on a cluster).
    let shard_of = |user: &str| usize::from(crate::shards::shard_of_user(user, shards));
    let mut held: HashMap<String, i64> = HashMap::new();
    let mut units = 0i64;
    let mut pipes = ShardPipes::new(keys.len());
    let mut parked = Vec::new();
    while let Some(c) = rows.try_next().await.map_err(crate::error::DbError::from)? {
        if c.parked {
            parked.push(c);
            continue;
        }
        count(c, &mut units, &mut held, &mut pipes, keys, &shard_of);
        pipes.flush_full(store, con).await?;
    }
    drop(rows);
    // A parked claim whose units a reprocessor already gave back (to the state this restore
    // closed) holds none, whatever its row says yet: its compensation marker tells.
    for c in parked {
        let home = &keys[shard_of(c.user_id.as_deref().unwrap_or(""))];
        let marker: Option<String> = store
            .bounded(async {
                Ok(redis::cmd("GET")
                    .arg(home.compensation(&c.claim_id))
                    .query_async(&mut *con)
                    .await?)
            })
            .await?;
        if marker.as_deref() != Some("compensated") {
            count(c, &mut units, &mut held, &mut pipes, keys, &shard_of);
        }
    }
    pipes.flush_all(store, con).await?;
    for (user, n) in &held {
        let shard = shard_of(user);
        pipes.add(shard).hset(&staged[shard], user, *n).ignore();
        pipes.flush_full(store, con).await?;
    }
    pipes.flush_all(store, con).await?;
    Ok((units, held.len()))
}

/// One pipeline per shard, each flushed once it holds [`CHUNK`] commands.
pub(crate) struct ShardPipes {
    pipes: Vec<redis::Pipeline>,
    queued: Vec<usize>,
}

impl ShardPipes {
    pub(crate) fn new(shards: usize) -> Self {
        ShardPipes {
            pipes: (0..shards).map(|_| redis::pipe()).collect(),
            queued: vec![0; shards],
        }
    }

    /// The pipeline of `shard`, counting one more command on it.
    pub(crate) fn add(&mut self, shard: usize) -> &mut redis::Pipeline {
        self.queued[shard] += 1;
        &mut self.pipes[shard]
    }

    pub(crate) async fn flush_full(
        &mut self,
        store: &Store,
        con: &mut RedisConn,
    ) -> Result<(), StoreError> {
        for (pipe, queued) in self.pipes.iter_mut().zip(&mut self.queued) {
            if *queued >= CHUNK {
                flush(store, con, pipe).await?;
                *queued = 0;
            }
        }
        Ok(())
    }

    pub(crate) async fn flush_all(
        &mut self,
        store: &Store,
        con: &mut RedisConn,
    ) -> Result<(), StoreError> {
        for (pipe, queued) in self.pipes.iter_mut().zip(&mut self.queued) {
            flush(store, con, pipe).await?;
            *queued = 0;
        }
        Ok(())
    }
}

/// Counts one live claim's units (and its buyer's), and queues its idempotency record on its
/// buyer's shard.
fn count(
    c: LiveClaim,
    units: &mut i64,
    held: &mut HashMap<String, i64>,
    pipes: &mut ShardPipes,
    keys: &[SkuKeys],
    shard_of: &impl Fn(&str) -> usize,
) {
    *units += c.quantity;
    let Some(user_id) = c.user_id else { return };
    *held.entry(user_id.clone()).or_default() += c.quantity;
    if let Some(k) = c.idempotency_key {
        let shard = shard_of(&user_id);
        let key = keys[shard].idempotency(&user_id, &k);
        let record = ClaimRecord {
            claim_id: c.claim_id,
            quantity: c.quantity as u32,
            created_ms: c.created_at.timestamp_millis(),
            remaining: c.remaining_after.unwrap_or(0),
            seq: c.seq.unwrap_or(0),
            user: user_id,
            idempotency_key: Some(k),
            expires_ms: None,
        };
        pipes
            .add(shard)
            .set_ex(key, record.render(), RECORD_TTL_SECS)
            .ignore();
    }
}

pub(crate) async fn flush(
    store: &Store,
    con: &mut RedisConn,
    pipe: &mut redis::Pipeline,
) -> Result<(), StoreError> {
    if pipe.is_empty() {
        return Ok(());
    }
    let sent = std::mem::take(pipe);
    store
        .bounded(async { Ok(sent.query_async::<()>(con).await?) })
        .await
}

async fn wait_for_empty_journal(store: &Store, keys: &SkuKeys) -> Result<(), StoreError> {
    let deadline = tokio::time::Instant::now() + JOURNAL_DRAIN_LIMIT;
    loop {
        let mut con = store.hot();
        let len: i64 = store
            .bounded(async {
                Ok(redis::cmd("XLEN")
                    .arg(keys.journal())
                    .query_async(&mut con)
                    .await?)
            })
            .await?;
        if len == 0 {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            tracing::warn!(
                journal = len,
                "restore gave up waiting for the writer; the SKU stays closed"
            );
            return Err(StoreError::Unavailable(format!(
                "{len} journal entries not yet written"
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
