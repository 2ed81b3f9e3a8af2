//! Reading the ledger: the accounting of a SKU (the SKU view, from one reading of both stores:
//! [`crate::books`]), and the accounting of every SKU (reconcile).

use serde::Serialize;

use crate::catalog::{self, Catalog};
use crate::error::{InventoryError, Refusal};
use crate::sku::SkuId;
use crate::store::Store;

/// The view of every SKU (or of one), for `dropgate reconcile`.
///
/// # Errors
/// Database errors; an unreachable Redis shows as `remaining: null`, not as an error.
pub async fn accounting(
    store: &Store,
    catalog: &Catalog,
    only: Option<&SkuId>,
) -> Result<Vec<SkuView>, InventoryError> {
    let ids = match only {
        Some(s) => vec![s.as_str().to_owned()],
        None => catalog::all_ids(catalog.db()).await?,
    };
    let mut out = Vec::with_capacity(ids.len());
    // The caller's checked id, or the catalog's own.
    for id in ids {
        out.push(view(store, catalog, SkuId::trusted(&id)).await?);
    }
    Ok(out)
}

/// Renders views as the table `dropgate reconcile` prints: a header row, one row per SKU,
/// numbers right-aligned, no colour and no border (comfy-table, so a longer SKU id or a larger
/// number widens its column instead of shifting the row).
pub fn table(views: &[SkuView]) -> String {
    use comfy_table::{presets::NOTHING, CellAlignment, ContentArrangement, Table};
    const COLUMNS: [&str; 13] = [
        "sku",
        "total",
        "remaining",
        "recorded",
        "in_flight",
        "pending",
        "quarantined",
        "compensated",
        "held",
        "confirmed",
        "waiting",
        "offered",
        "status",
    ];
    let opt = |v: Option<i64>| v.map_or("?".to_string(), |n| n.to_string());
    let mut t = Table::new();
    t.load_preset(NOTHING)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(COLUMNS);
    for v in views {
        t.add_row([
            v.sku.clone(),
            v.total.to_string(),
            opt(v.remaining),
            v.recorded.to_string(),
            opt(v.in_flight),
            v.pending.to_string(),
            v.quarantined.to_string(),
            v.compensated.to_string(),
            v.held.to_string(),
            v.confirmed.to_string(),
            v.waiting.to_string(),
            v.offered.to_string(),
            if v.consistent { "ok" } else { "MISMATCH" }.to_string(),
        ]);
    }
    for i in 1..COLUMNS.len() - 1 {
        if let Some(c) = t.column_mut(i) {
            c.set_cell_alignment(CellAlignment::Right);
        }
    }
    let mut out = t
        .lines()
        .map(|l| l.trim_end().to_string())
        .collect::<Vec<_>>()
        .join("\n");
    out.push('\n');
    out
}

/// The SKU view of API.md.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SkuView {
    pub sku: String,
    pub total: i64,
    pub per_user_limit: i32,
    pub hold_seconds: i32,
    /// Redis stock; `None` when Redis is unreachable or lost the SKU.
    pub remaining: Option<i64>,
    pub recorded: i64,
    /// Units decided by Redis that the ledger does not hold yet, net of units given back
    /// whose change it does not hold yet; `None` when Redis cannot tell.
    pub in_flight: Option<i64>,
    /// Journal entries carrying anything the ledger does not hold yet (a win, a hold's or a
    /// waitlist entry's change): 0 exactly when the ledger has caught up with Redis, which
    /// `in_flight` cannot tell (a win and a give-back net out). `None` when Redis cannot tell.
    pub unwritten_entries: Option<i64>,
    pub pending: i64,
    /// Units of winners in the quarantine, not yet resolved by an operator: they left Redis
    /// stock and are in no other table, so the balance counts them.
    pub quarantined: i64,
    pub compensated: i64,
    /// Units of `recorded` still held (not yet confirmed, cancelled or expired), and confirmed.
    pub held: i64,
    pub confirmed: i64,
    /// Waitlist entries waiting, and holding an offer.
    pub waiting: i64,
    pub offered: i64,
    /// `total == remaining + recorded + in_flight + pending + quarantined` (+ `in_transit` on
    /// a SKU of several shards).
    pub consistent: bool,
    /// A SKU of several shards only ([`crate::shards`]): units a donor shard took out whose
    /// recipient has not added them yet (`remaining` and `in_flight` are the shards' sums).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_transit: Option<i64>,
    /// A SKU of several shards only: each shard's stock, in-flight units and units it took out
    /// for transfers it has not forgotten yet.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shards: Option<Vec<crate::shards::view::ShardView>>,
    /// A SKU with a waiting room only ([`crate::queue`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<crate::queue::QueueView>,
    /// A seated SKU only: free, taken (sold or held) and stranded seats of its map
    /// ([`crate::seatmaps`]); absent when Redis cannot tell.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seats: Option<crate::seatmaps::SeatCounts>,
    /// How this answer was read: whether Redis stood still while PostgreSQL was read (the
    /// two sides one instant's), and how many readings it took. The HTTP answer carries it
    /// in a header (`Dropgate-Reading`), not in the body the contract fixes.
    #[serde(skip)]
    pub reading: ReadingNote,
}

impl SkuView {
    /// A reading taken while acknowledgements kept moving Redis (no reading of the attempts
    /// was fenced) that does not balance: it cannot tell books that balance from books that do
    /// not, so it is no answer to `consistent` (the HTTP view says so with a 503, the gauge
    /// keeps its last value).
    pub fn moving(&self) -> bool {
        !self.reading.fenced && !self.consistent && self.remaining.is_some()
    }
}

/// See [`SkuView::reading`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadingNote {
    pub fenced: bool,
    pub attempts: u32,
}

impl std::fmt::Display for ReadingNote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let how = if self.fenced { "fenced" } else { "unfenced" };
        write!(f, "{how}; attempts={}", self.attempts)
    }
}

/// The SKU view: one reading of Redis and PostgreSQL at one instant ([`crate::books`]).
/// While a reading cannot be fenced (Redis moved while PostgreSQL was read) or does not
/// balance (an action half done across the stores, such as a compensation), a few more are
/// taken; the last one is answered as it is.
///
/// # Errors
/// [`Refusal::UnknownSku`] or the database error. An unreachable Redis is not an error here:
/// `remaining` is then `None` and the view is not consistent.
pub async fn view(
    store: &Store,
    catalog: &Catalog,
    sku: &SkuId,
) -> Result<SkuView, InventoryError> {
    read_view(store, catalog, sku, true).await
}

/// The view an operator action answers with while it still holds the SKU's operator lock
/// (declare, restock, restore): it must not wait for its own lock.
///
/// # Errors
/// As [`view`].
pub async fn view_under_lock(
    store: &Store,
    catalog: &Catalog,
    sku: &SkuId,
) -> Result<SkuView, InventoryError> {
    read_view(store, catalog, sku, false).await
}

async fn read_view(
    store: &Store,
    catalog: &Catalog,
    sku: &SkuId,
    wait_for_operators: bool,
) -> Result<SkuView, InventoryError> {
    let db = catalog.db();
    let row = catalog::fetch(db, sku)
        .await?
        .ok_or(InventoryError::Refused(Refusal::UnknownSku))?;
    let mut last = None;
    let started = std::time::Instant::now();
    let (mut attempt, mut missing_once) = (0, false);
    while attempt < VIEW_ATTEMPTS {
        let r = crate::books::read(store, db, sku, row.layout).await?;
        // A restore takes the state out of Redis and puts it back under the SKU's operator
        // lock: a state missing meanwhile is an action half done, not a loss. The view waits
        // for it, then says so; `remaining: null` only ever means Redis lost the SKU.
        // A restore that ended between the reading and the lock's check put the state back:
        // a state seen missing with no action under way is read once more before it counts
        // as lost.
        if r.remaining.is_none() && wait_for_operators {
            let busy = operator_busy(db, sku).await?;
            if busy && started.elapsed() >= OPERATOR_WAIT {
                return Err(InventoryError::Refused(Refusal::OperatorBusy));
            }
            if busy || !missing_once {
                missing_once |= !busy;
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                continue;
            }
        }
        attempt += 1;
        let sums = r.sums;
        let consistent = match (r.remaining, r.in_flight) {
            (Some(rem), Some(f)) => {
                r.total
                    == rem
                        + sums.recorded
                        + f
                        + sums.pending
                        + sums.quarantined
                        + r.in_transit.unwrap_or(0)
            }
            _ => false,
        };
        let v = SkuView {
            sku: row.sku.clone(),
            total: r.total,
            per_user_limit: row.per_user_limit,
            hold_seconds: row.hold_seconds,
            remaining: r.remaining,
            recorded: sums.recorded,
            in_flight: r.in_flight,
            unwritten_entries: r.unwritten_entries,
            pending: sums.pending,
            quarantined: sums.quarantined,
            compensated: sums.compensated,
            held: sums.held,
            confirmed: sums.confirmed,
            waiting: sums.waiting,
            offered: sums.offered,
            consistent,
            in_transit: r.in_transit,
            shards: r.shards,
            queue: queue_part(store, &row).await,
            // Read in the same script as the stock: `free` is `remaining` (read_books.lua).
            seats: row
                .plan
                .as_ref()
                .filter(|_| r.remaining.is_some())
                .map(|plan| crate::seatmaps::counts(r.seat_map.as_deref().unwrap_or(&[]), plan)),
            reading: ReadingNote {
                fenced: r.fenced,
                attempts: attempt as u32,
            },
        };
        if (consistent && r.fenced) || r.remaining.is_none() {
            return Ok(v);
        }
        last = Some(v);
        // A reading taken while Redis moves is read again at once a few times (claims go
        // on), then with pauses that let a half-done action finish.
        if attempt > 3 {
            tokio::time::sleep(std::time::Duration::from_millis(10 * attempt as u64)).await;
        }
    }
    Ok(last.expect("the loop ran at least once"))
}

/// How long the view waits for an operator action that has the SKU's state away from Redis.
const OPERATOR_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Whether an operator action holds the SKU's lock now (`crate::inventory::SkuLock`: the
/// session advisory lock on `hashtext('dropgate.sku.' || sku)`), read from `pg_locks` without
/// taking it.
async fn operator_busy(db: &sqlx::PgPool, sku: &SkuId) -> Result<bool, InventoryError> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_locks
                         WHERE locktype = 'advisory' AND granted AND objsubid = 1
                           AND database = (SELECT oid FROM pg_database
                                            WHERE datname = current_database())
                           AND ((classid::int8 << 32) | objid::int8)
                               = hashtext('dropgate.sku.' || $1)::int8)",
    )
    .bind(sku)
    .fetch_one(db)
    .await?)
}

/// Readings the view takes before it answers the last as it is.
const VIEW_ATTEMPTS: usize = 10;

/// The view's `queue`: the settings, the seed's commitment (and the seed once open by Redis's
/// clock), the line's counts when Redis answers.
async fn queue_part(store: &Store, row: &crate::catalog::Sku) -> Option<crate::queue::QueueView> {
    let q = row.queue.0.as_ref()?;
    let keys = store.keys(&row.sku);
    let mut con = store.hot();
    let counts = store
        .bounded(crate::queue::calls::counts(&mut con, &keys))
        .await
        .ok();
    Some(crate::queue::QueueView::of(q, row.opens_at, counts))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(sku: &str, total: i64, remaining: Option<i64>, consistent: bool) -> SkuView {
        SkuView {
            sku: sku.into(),
            total,
            per_user_limit: 1,
            hold_seconds: 0,
            remaining,
            recorded: total - remaining.unwrap_or(0),
            in_flight: remaining.map(|_| 0),
            unwritten_entries: remaining.map(|_| 0),
            pending: 0,
            quarantined: 0,
            compensated: 0,
            held: 0,
            confirmed: 0,
            waiting: 0,
            offered: 0,
            consistent,
            in_transit: None,
            shards: None,
            reading: ReadingNote::default(),
            queue: None,
            seats: None,
        }
    }

    #[test]
    fn the_reconcile_table_keeps_its_columns_whatever_the_widths() {
        let views = [
            view("drop-1", 100, Some(0), true),
            view(
                "a-sku-id-longer-than-any-column-header-0123456789",
                1_000_000_000,
                None,
                false,
            ),
        ];
        let table = table(&views);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3, "{table}");
        for l in &lines {
            assert_eq!(l.split_whitespace().count(), 13, "{l:?} in\n{table}");
            assert_eq!(l.trim_end(), *l, "no trailing blanks");
        }
        // Right-aligned numbers: each row's `total` ends where the header's does.
        let end = |l: &str, field: &str| l.find(field).map(|i| i + field.len());
        let header_end = end(lines[0], "total").unwrap();
        assert_eq!(end(lines[1], " 100 "), Some(header_end + 1));
        assert_eq!(end(lines[2], " 1000000000 "), Some(header_end + 1));
        assert!(lines[2].ends_with("MISMATCH") && lines[1].ends_with("ok"));
        assert!(lines[2].contains(" ? "), "an unknown remaining reads ?");
    }
}
