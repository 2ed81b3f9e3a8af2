//! The refresher: learns the marks of every SKU of the catalog (at start, and new SKUs as they
//! appear), compares each state with its mark once, keeps the marks of the SKUs this gateway
//! moves current every second, and advances the incarnation of those found fresh.

use std::sync::Arc;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use super::{close_stale, REFRESH};
use crate::error::{DbError, TaskError};
use crate::scripts::Floor;
use crate::scripts::{self, fresh::Rotation};
use crate::sku::SkuId;
use crate::store::marks::Marks;
use crate::store::Store;

/// Catalog rows read per query while loading marks.
const LOAD_CHUNK: i64 = 10_000;

/// Learns the marks of the catalog's SKUs this gateway has not loaded yet (all of them at
/// start), shards included, and queues their states for one comparison. Returns how many
/// SKUs were new. A SKU's row exists before any of its state does (declare writes it first),
/// so a gateway that ran this at start knows every mark before its first script call on
/// that SKU, whatever it was used for.
///
/// # Errors
/// The database error (what was loaded stays loaded).
pub async fn load_new(db: &PgPool, marks: &Marks) -> Result<usize, DbError> {
    let mut n = 0;
    loop {
        let after = marks.loaded_tag();
        let rows: Vec<(String, i32, i64, i64, i32, Vec<i32>)> = sqlx::query_as(
            "SELECT sku, tag, redis_seq, redis_inc, shards, shard_salts FROM skus
              WHERE tag > $1 ORDER BY tag LIMIT $2",
        )
        .bind(after)
        .bind(LOAD_CHUNK)
        .fetch_all(db)
        .await
        .map_err(DbError::from)?;
        let Some(last) = rows.last().map(|r| r.1) else {
            return Ok(n);
        };
        let mut shard_names = Vec::new();
        let mut fresh = Vec::with_capacity(rows.len());
        for (sku, _, seq, inc, shards, salts) in &rows {
            marks.learn(sku, *seq, *inc);
            let layout = crate::layout::Layout::stored(*shards, salts);
            fresh.push(sku.clone());
            for name in layout.names(SkuId::trusted(sku)).into_iter().skip(1) {
                shard_names.push(name);
            }
        }
        if !shard_names.is_empty() {
            for (name, f) in crate::freshness::shard_marks::read_floors(db, &shard_names).await? {
                marks.learn(&name, f.seq, f.inc);
            }
            fresh.extend(shard_names);
        }
        n += rows.len();
        marks.loaded(fresh, i64::from(last));
    }
}

/// Keeps this gateway's marks current and compares states with them, every second.
pub struct Refresher {
    pub store: Store,
    pub db: PgPool,
    pub marks: Arc<Marks>,
}

impl Refresher {
    pub async fn run(self, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(REFRESH) => {}
                _ = shutdown.cancelled() => break,
            }
            if let Err(e) = self.round().await {
                tracing::debug!(error = %e, "freshness round failed; retrying");
            }
        }
        tracing::info!("freshness refresher stopped");
    }

    async fn round(&self) -> Result<(), TaskError> {
        load_new(&self.db, &self.marks).await?;
        // SKUs loaded from the catalog: each state compared once, used or not (a gateway
        // started after Redis came back older finds it without waiting for a buyer).
        let unchecked = self.marks.take_unchecked();
        for (i, name) in unchecked.iter().enumerate() {
            if let Err(e) = self.compare(name, self.marks.fence_peek(name)).await {
                // Compared again next round.
                self.marks.unchecked_again(unchecked[i..].iter().cloned());
                return Err(e);
            }
        }
        // Floors of names not moved here yet, in turns: current when this gateway first does.
        let walked = self.marks.walk();
        if !walked.is_empty() {
            for (name, f) in crate::freshness::shard_marks::read_floors(&self.db, &walked).await? {
                self.marks.learn(&name, f.seq, f.inc);
            }
        }
        let skus = self.marks.active();
        if skus.is_empty() {
            return Ok(());
        }
        // Shards of sharded SKUs among them keep their marks apart (src/freshness/shard_marks.rs).
        let rows = crate::freshness::shard_marks::read_floors(&self.db, &skus).await?;
        for (sku, floor) in rows {
            self.marks.observe(&sku, floor.seq);
            self.marks.observe_inc(&sku, floor.inc);
            let floor = self.marks.fence_peek(&sku);
            if let Some((moves, inc)) = self.compare(&sku, floor).await? {
                self.rotate(&sku, floor, moves, inc).await;
            }
        }
        Ok(())
    }

    /// Compares the state of `name` with `floor`, closing it when older. Returns, when it is
    /// present and fresh, its moves so far (the state's sequence plus its waiting room line's:
    /// both only grow, so the sum changes whenever either does) and its incarnation.
    async fn compare(&self, name: &str, floor: Floor) -> Result<Option<(i64, i64)>, TaskError> {
        let keys = self.store.keys(name);
        let line = keys.queue()[0].clone();
        let mut con = self.store.hot();
        #[allow(clippy::type_complexity)]
        let ((seq, stale, inc), (qseq,)): (
            (Option<i64>, Option<String>, Option<i64>),
            (Option<i64>,),
        ) = self
            .store
            .bounded(async {
                Ok(redis::pipe()
                    .cmd("HMGET")
                    .arg(keys.state())
                    .arg("seq")
                    .arg("stale")
                    .arg("inc")
                    .cmd("HMGET")
                    .arg(line)
                    .arg("qseq")
                    .query_async(&mut con)
                    .await?)
            })
            .await?;
        let (Some(seq), None) = (seq, stale) else {
            return Ok(None);
        };
        let inc = inc.unwrap_or(0);
        if seq < floor.seq || inc < floor.inc {
            close_stale(&self.store, name, "state older than the ledger").await;
            return Ok(None);
        }
        Ok(Some((seq + qseq.unwrap_or(0), inc)))
    }

    /// Advances the incarnation of a state found fresh that moved (a unit, or its waiting
    /// room's line) since its last rotation, and records it once the replicas hold it: a copy
    /// of the state taken before now is then recognised as older whatever its sequence or its
    /// line's becomes (`lua/rotate.lua`; every queue script checks the state's incarnation).
    async fn rotate(&self, name: &str, floor: Floor, moves: i64, inc: i64) {
        if self.marks.rotated_at(name) == moves {
            return;
        }
        let keys = self.store.keys(name);
        let mut con = self.store.hot();
        let rotated = self
            .store
            .bounded(scripts::fresh::rotate(&mut con, &keys, floor, inc))
            .await;
        let new = match rotated {
            Ok(Rotation::Advanced(new)) => new,
            // Another gateway rotated it (it records it), or the state just closed.
            Ok(Rotation::Skipped) => return,
            Ok(Rotation::Stale) => {
                crate::metrics::stale_state();
                return;
            }
            Err(e) => {
                tracing::debug!(sku = name, error = %e, "could not rotate the incarnation; next round");
                return;
            }
        };
        // Recorded only once a promoted replica would hold it: a failover must never bring
        // back a state older than what PostgreSQL says it is.
        match self.store.replicated(&keys).await {
            Ok(true) => {}
            _ => return,
        }
        match crate::freshness::shard_marks::record_inc(&self.db, name, new).await {
            Ok(()) => {
                self.marks.observe_inc(name, new);
                self.marks.set_rotated_at(name, moves);
            }
            Err(e) => {
                tracing::debug!(sku = name, error = %e, "could not record the incarnation; next round");
            }
        }
    }
}
