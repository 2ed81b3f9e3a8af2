//! What an operator watches that no request produces: the per-SKU gauges (`dropgate_sku_*`:
//! stock, in-flight, pending, compensated and quarantined units, whether the ledger balances,
//! whether the SKU fails closed and why), and whether Redis and PostgreSQL answer
//! (`dropgate_redis_up`, `dropgate_postgres_up`). A periodic task refreshes them, and logs each
//! SKU's fail-closed transitions (closed because Redis lost or holds a stale state; open again
//! after a restore).
//!
//! Cost per round (every `DROPGATE_SKU_GAUGES_INTERVAL_MS`, 5 s by default), bounded whatever
//! the catalog's size: one PING, one `SELECT 1`, one page of the catalog, and for each of at
//! most [`SKUS_PER_ROUND`] SKUs one pipelined HMGET + ZCOUNT + ZCARD (its line) per shard (one
//! for a SKU of one shard; a sharded SKU fails closed when any shard is lost or stale) and one
//! SKU view ([`crate::ledger::view`]: an HMGET per shard and one ledger query, taken
//! again up to four times while claims straddle the snapshot), and one count of the SKU's
//! claims held past their time in the ledger (by the `issuances (sku, user_id)` index). A
//! larger catalog is walked a page per round, so each SKU is refreshed every
//! `ceil(skus / SKUS_PER_ROUND)` rounds. A round never outlives its interval. Every gateway
//! runs its own observer: dashboards aggregate the gauges with `max by (sku)`.

use std::sync::Arc;
use std::time::Duration;

use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use metrics::gauge;
use tokio_util::sync::CancellationToken;

use crate::catalog::Catalog;
use crate::error::StoreError;
use crate::layout::Layout;
use crate::ledger::{self, SkuView};
use crate::metrics as m;
use crate::sku::SkuId;
use crate::store::Store;

/// SKU views read per round at most (see the module docs for what one costs).
pub const SKUS_PER_ROUND: i64 = 32;

/// Why a SKU fails closed (its claims answer 503 `unavailable` until a restore).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    /// Redis holds no state for the SKU (it restarted empty, or the key was deleted).
    Lost,
    /// Redis holds a state older than the ledger (an older snapshot, a lagging replica).
    Stale,
}

impl Closed {
    /// The `reason` label of `dropgate_sku_closed`.
    pub fn label(self) -> &'static str {
        match self {
            Closed::Lost => "lost",
            Closed::Stale => "stale",
        }
    }
}

/// The SKUs this gateway has seen fail closed, so each transition is logged once: by the
/// claim path when a claim meets it first, or by the observer's round, whichever comes first.
#[derive(Default)]
pub struct FailClosed {
    /// The SKUs seen closed, and why: a transition is news only against this. Bounded by the
    /// catalog (only declared SKUs reach Redis).
    skus: DashMap<String, Closed>,
}

impl FailClosed {
    /// Records that `sku` fails closed for `why`; logs at ERROR when that is news.
    pub fn close(&self, sku: &SkuId, why: Closed) {
        m::sku_closed(sku, Some(why.label()));
        let news = match self.skus.entry(sku.as_str().to_owned()) {
            Entry::Occupied(mut e) => e.insert(why) != why,
            Entry::Vacant(e) => {
                e.insert(why);
                true
            }
        };
        if news {
            match why {
                Closed::Lost => tracing::error!(
                    sku = sku.as_str(),
                    reason = why.label(),
                    "redis holds no state for the SKU: its claims fail closed (503) until POST /admin/skus/{{sku}}/restore"
                ),
                Closed::Stale => tracing::error!(
                    sku = sku.as_str(),
                    reason = why.label(),
                    "redis holds an older state of the SKU than the ledger: its claims fail closed (503) until POST /admin/skus/{{sku}}/restore"
                ),
            }
        }
    }

    /// Records that `sku` is open; logs at INFO when it was closed.
    pub fn open(&self, sku: &SkuId) {
        m::sku_closed(sku, None);
        if let Some((_, was)) = self.skus.remove(sku.as_str()) {
            tracing::info!(
                sku = sku.as_str(),
                was = was.label(),
                "the SKU's redis state is back: its claims are decided again"
            );
        }
    }
}

/// The periodic task behind the gauges of this module.
pub struct Observer {
    /// Its multiplexed connection carries the round's few small reads (as it carries the SKU
    /// view's), taking none of the pool connections the journal readers need.
    store: Store,
    /// Catalog reads go through the request path's pool: one query at a time, never one of the
    /// writer's connections.
    catalog: Catalog,
    /// Shared with the claim path, so a transition either side sees first is logged once.
    closed: Arc<FailClosed>,
    /// Round interval (`DROPGATE_SKU_GAUGES_INTERVAL_MS`); also the bound of one round.
    every: Duration,
    /// The last SKU id of the previous round's page ("" = start from the first): a catalog
    /// larger than [`SKUS_PER_ROUND`] is walked a page per round.
    after: String,
}

impl Observer {
    pub fn new(store: Store, catalog: Catalog, closed: Arc<FailClosed>, every: Duration) -> Self {
        Observer {
            store,
            catalog,
            closed,
            every,
            after: String::new(),
        }
    }

    /// Refreshes the gauges every `every` until `shutdown`. The first round runs at once, so
    /// a gateway that just started shows its backends and SKUs within a round trip.
    pub async fn run(mut self, shutdown: CancellationToken) {
        loop {
            let every = self.every;
            tokio::select! {
                done = tokio::time::timeout(every, self.round()) => {
                    if done.is_err() {
                        tracing::warn!(?every, "observer round took longer than its interval; cut short");
                    }
                }
                _ = shutdown.cancelled() => break,
            }
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = shutdown.cancelled() => break,
            }
        }
        tracing::info!("observer stopped");
    }

    async fn round(&mut self) {
        let db = self.catalog.db().clone();
        let (redis, pg) = tokio::join!(self.store.ping(), sqlx::query("SELECT 1").execute(&db));
        m::backends_up(Some(redis.is_ok()), Some(pg.is_ok()));
        if pg.is_err() {
            // The catalog cannot be read: nothing per SKU to refresh.
            return;
        }
        let page: Vec<(String, bool, i32, Vec<i32>)> = match sqlx::query_as(
            "SELECT sku, seeded, shards, shard_salts FROM skus WHERE sku > $1 ORDER BY sku
              LIMIT $2",
        )
        .bind(&self.after)
        .bind(SKUS_PER_ROUND)
        .fetch_all(&db)
        .await
        {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!(error = %e, "observer could not read the catalog; retrying next round");
                return;
            }
        };
        self.after = match page.last() {
            Some((last, _, _, _)) if page.len() as i64 == SKUS_PER_ROUND => last.clone(),
            _ => String::new(),
        };
        for (sku, seeded, shards, salts) in page {
            let sku = SkuId::trusted(&sku);
            if redis.is_err() {
                m::sku_redis_unknown(sku);
                continue;
            }
            self.observe(sku, seeded, Layout::stored(shards, &salts))
                .await;
        }
    }

    async fn observe(&self, sku: &SkuId, seeded: bool, layout: Layout) {
        // Every shard of a sharded SKU (src/shards/): the SKU fails closed as a whole when any
        // shard is lost or stale, and its holds and lines live on every shard.
        let mut heads = Vec::with_capacity(layout.count() as usize);
        let mut ghosts = Some(0);
        let mut line = Some(0);
        for name in layout.names(sku) {
            let keys = self.store.keys(&name);
            let mut con = self.store.hot();
            type Read = (StateHead, i64, i64);
            let read: Result<Read, StoreError> = self
                .store
                .bounded(async {
                    Ok(redis::pipe()
                        .cmd("HMGET")
                        .arg(keys.state())
                        .arg("stock")
                        .arg("stale")
                        // Holds past their time not yet expired (the expiry worker's backlog).
                        .cmd("ZCOUNT")
                        .arg(keys.expiry())
                        .arg("-inf")
                        .arg(crate::clock::now_ms())
                        // The shard's line (a sharded SKU has one per shard, src/shards/line.rs).
                        .cmd("ZCARD")
                        .arg(keys.waitlist())
                        .query_async(&mut con)
                        .await?)
                })
                .await;
            (ghosts, line) = match (&read, ghosts, line) {
                (Ok((_, n, w)), Some(sum), Some(waiting)) => (Some(sum + n), Some(waiting + w)),
                _ => (None, None),
            };
            heads.push(read.map(|(head, _, _)| head));
        }
        match fail_closed(&heads) {
            // Never seeded: a declare whose Redis step has not happened yet, not a loss.
            Some(Some(Closed::Lost)) if !seeded => {}
            Some(Some(why)) => self.closed.close(sku, why),
            Some(None) => self.closed.open(sku),
            // No answer: no news either way; the view below turns the Redis side NaN.
            None => {}
        }
        m::sku_lifecycle(sku, ghosts.zip(line));
        m::sku_overdue_holds(sku, overdue_holds(self.catalog.db(), sku).await);
        match ledger::view(&self.store, &self.catalog, sku).await {
            Ok(v) => publish_view(&v),
            Err(e) => {
                tracing::debug!(sku = sku.as_str(), error = %e, "observer could not read the SKU view")
            }
        }
    }
}

/// How late past its `expires_at` a claim the ledger still has `held` counts as overdue: an
/// expiry made in Redis reaches the ledger through the journal within the writer's lag.
const OVERDUE_AFTER_SECS: i32 = 5;

/// Claims of `sku` the ledger still has `held` more than [`OVERDUE_AFTER_SECS`] past their
/// `expires_at` (`dropgate_sku_overdue_held_claims`): the ledger's side of ghost holds, whose
/// Redis side is `dropgate_sku_ghost_holds`. `None` when the query fails.
async fn overdue_holds(db: &sqlx::PgPool, sku: &SkuId) -> Option<i64> {
    sqlx::query_scalar(
        "SELECT count(*) FROM issuances
          WHERE sku = $1 AND status = 'held'
            AND expires_at < now() - make_interval(secs => $2)",
    )
    .bind(sku)
    .bind(f64::from(OVERDUE_AFTER_SECS))
    .fetch_one(db)
    .await
    .map_err(|e| tracing::debug!(sku = sku.as_str(), error = %e, "observer could not count overdue holds"))
    .ok()
}

/// A shard state's `stock` and `stale` fields.
type StateHead = (Option<i64>, Option<String>);

/// Whether a SKU whose shards' state heads (`stock`, `stale`) are `heads` fails closed, and
/// why: lost when any shard's state is missing, else stale when any is stale; `Some(None)`
/// when every shard is open; `None` when some shard did not answer and none is closed (no
/// news either way).
fn fail_closed(heads: &[Result<StateHead, StoreError>]) -> Option<Option<Closed>> {
    let mut answered = true;
    let mut why = None;
    for head in heads {
        match head {
            Ok((None, _)) => return Some(Some(Closed::Lost)),
            Ok((Some(_), Some(_))) => why = Some(Closed::Stale),
            Ok((Some(_), None)) => {}
            Err(_) => answered = false,
        }
    }
    match why {
        Some(w) => Some(Some(w)),
        None if answered => Some(None),
        None => None,
    }
}

/// Publishes a SKU view. A value Redis could not give (`None`) is published as NaN, never
/// left at its last value: a stale number on a dashboard reads as the truth.
fn publish_view(v: &SkuView) {
    let sku = v.sku.clone();
    let known = |x: Option<i64>| x.map_or(f64::NAN, |n| n as f64);
    gauge!(m::SKU_TOTAL, "sku" => sku.clone()).set(v.total as f64);
    gauge!(m::SKU_REMAINING, "sku" => sku.clone()).set(known(v.remaining));
    gauge!(m::SKU_RECORDED, "sku" => sku.clone()).set(v.recorded as f64);
    gauge!(m::SKU_IN_FLIGHT, "sku" => sku.clone()).set(known(v.in_flight));
    gauge!(m::SKU_PENDING, "sku" => sku.clone()).set(v.pending as f64);
    gauge!(m::SKU_COMPENSATED, "sku" => sku.clone()).set(v.compensated as f64);
    gauge!(m::SKU_QUARANTINED, "sku" => sku.clone()).set(v.quarantined as f64);
    gauge!(m::SKU_HELD, "sku" => sku.clone()).set(v.held as f64);
    gauge!(m::SKU_CONFIRMED, "sku" => sku.clone()).set(v.confirmed as f64);
    gauge!(m::SKU_OFFERED, "sku" => sku.clone()).set(v.offered as f64);
    gauge!(m::SKU_UNWRITTEN, "sku" => sku.clone()).set(known(v.unwritten_entries));
    let consistent = match (v.remaining, v.in_flight) {
        (Some(_), Some(_)) => f64::from(u8::from(v.consistent)),
        _ => f64::NAN,
    };
    // A reading that cannot tell (ledger::SkuView::moving) leaves the last value: an alert on
    // the gauge must not fire for books that balance.
    if !v.moving() {
        gauge!(m::SKU_CONSISTENT, "sku" => sku).set(consistent);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sku_fails_closed_when_any_shard_does() {
        let open = || Ok((Some(3), None));
        let stale = || Ok((Some(3), Some("behind".to_string())));
        let lost = || Ok((None, None));
        let silent = || Err(StoreError::Timeout);
        assert_eq!(fail_closed(&[open(), open()]), Some(None));
        assert_eq!(fail_closed(&[open(), stale()]), Some(Some(Closed::Stale)));
        assert_eq!(
            fail_closed(&[stale(), lost(), open()]),
            Some(Some(Closed::Lost))
        );
        assert_eq!(fail_closed(&[open(), silent()]), None, "no news");
        assert_eq!(fail_closed(&[silent(), stale()]), Some(Some(Closed::Stale)));
    }
}
