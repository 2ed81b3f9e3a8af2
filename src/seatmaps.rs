//! Each seated SKU's seat map for the crowd (API.md "Reserved seating"; docs/seats.md): a copy
//! of the map's bits taken from Redis at most every half second per gateway, whatever the
//! number of readers, so a hundred thousand browsers refreshing the map cost Redis one read a
//! half second. The first reader after the copy ages takes the next one while the others wait
//! for it (one lock per SKU, never held by a reader that finds the copy fresh); a copy older
//! than [`MAX_AGE`] is never served (503 instead, when Redis cannot give a newer one).

use std::sync::Arc;
use std::time::{Duration, Instant};

use dashmap::DashMap;
use sha2::{Digest, Sha256};

use crate::error::StoreError;
use crate::seating::SeatPlan;
use crate::store::Store;

/// How old a copy may be before a reader takes a new one.
pub const REFRESH: Duration = Duration::from_millis(500);
/// How old a served copy may ever be (API.md: at most one second).
pub const MAX_AGE: Duration = Duration::from_secs(1);

/// One copy of a SKU's seat map.
#[derive(Debug)]
pub struct Copy {
    /// When this gateway took it (ages it).
    pub taken: Instant,
    /// Redis's clock when it was read, unix ms (the body's `as_of`).
    pub as_of_ms: i64,
    /// One bit per seat, 1 = sold or held (`lua/claim_seats.lua`'s layout); shorter than the
    /// plan when the last seats were never taken.
    pub bits: Vec<u8>,
    /// The plan the bits are read with (a re-declare that adds rows changes it).
    pub plan_tag: String,
    /// Names the bits and the plan: equal tags, equal map (the route's `ETag`).
    pub tag: String,
}

/// Free, taken and stranded seats (the SKU view's `seats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct SeatCounts {
    pub free: u64,
    pub taken: u64,
    pub single_gaps: u64,
}

impl Copy {
    /// Whether seat `bit` is sold or held.
    pub fn taken_at(&self, bit: u32) -> bool {
        taken_at(&self.bits, bit)
    }

    /// A row as the route shows it: `.` free, `x` sold or held.
    pub fn row(&self, offset: u32, count: u32) -> String {
        (offset..offset + count)
            .map(|b| if self.taken_at(b) { 'x' } else { '.' })
            .collect()
    }
}

fn taken_at(bits: &[u8], bit: u32) -> bool {
    bits.get((bit / 8) as usize)
        .is_some_and(|b| b & (0x80 >> (bit % 8)) != 0)
}

/// A seat map's counts over the whole plan; a stranded seat is free with neither neighbour in
/// its row free (a row's end counts as taken).
pub fn counts(bits: &[u8], plan: &SeatPlan) -> SeatCounts {
    let mut c = SeatCounts {
        free: 0,
        taken: 0,
        single_gaps: 0,
    };
    for row in plan.rows_of(None) {
        let free = |n: u32| n < row.count && !taken_at(bits, row.offset + n);
        for n in 0..row.count {
            if !free(n) {
                c.taken += 1;
                continue;
            }
            c.free += 1;
            let left = n > 0 && free(n - 1);
            if !left && !free(n + 1) {
                c.single_gaps += 1;
            }
        }
    }
    c
}

/// The copies of this gateway, by SKU.
#[derive(Default)]
pub struct SeatMaps {
    copies: DashMap<String, Arc<tokio::sync::Mutex<Option<Arc<Copy>>>>>,
}

impl SeatMaps {
    pub fn new() -> Self {
        Self::default()
    }

    /// The copy of `sku`'s map at most `fresh` old: the one held, or a new one read now.
    ///
    /// # Errors
    /// [`StoreError`] when a new copy is needed and Redis cannot give it: a timeout or a lost
    /// connection, [`StoreError::SkuLost`] when Redis holds no state for the SKU, and
    /// [`StoreError::Stale`] for a state older than the ledger (the map cannot be told) — unless
    /// the held copy is still within [`MAX_AGE`], which is then served.
    pub async fn copy(
        &self,
        store: &Store,
        sku: &str,
        plan_tag: &str,
        fresh: Duration,
    ) -> Result<Arc<Copy>, StoreError> {
        let slot = self.copies.entry(sku.to_string()).or_default().clone();
        let mut held = slot.lock().await;
        if let Some(c) = held.as_ref() {
            if c.taken.elapsed() < fresh && c.plan_tag == plan_tag {
                return Ok(c.clone());
            }
        }
        match read(store, sku, plan_tag).await {
            Ok(c) => {
                crate::metrics::seat_map_read();
                let c = Arc::new(c);
                *held = Some(c.clone());
                Ok(c)
            }
            // A state Redis lost or holds older than the ledger: the copy held may be of that
            // older state (read before anyone knew), so it goes too (found from outside: after
            // a rollback a gateway served sold seats as free for a second). A slow Redis: the
            // copy held is served while it is within a second.
            Err(e @ (StoreError::SkuLost | StoreError::Stale)) => {
                *held = None;
                Err(e)
            }
            Err(e) => match held.as_ref() {
                Some(c) if c.taken.elapsed() < MAX_AGE && c.plan_tag == plan_tag => Ok(c.clone()),
                _ => Err(e),
            },
        }
    }
}

/// Names the plan a copy is read with: a re-declare that adds rows or sections changes it.
pub fn plan_tag(tag: i32, plan: &SeatPlan) -> String {
    format!("{tag}.{}", plan.seats())
}

/// One read of the map, the state's health and Redis's clock, in one pipeline (the keys share
/// the SKU's hash tag).
async fn read(store: &Store, sku: &str, plan_tag: &str) -> Result<Copy, StoreError> {
    let keys = store.keys(sku);
    let mut con = store.hot();
    #[allow(clippy::type_complexity)]
    let (bits, (stock, stale, seq, inc), (secs, micros)): (
        Option<Vec<u8>>,
        (Option<i64>, Option<String>, Option<i64>, Option<i64>),
        (i64, i64),
    ) = store
        .bounded(async {
            Ok(redis::pipe()
                .cmd("GET")
                .arg(keys.seats())
                .cmd("HMGET")
                .arg(keys.state())
                .arg("stock")
                .arg("stale")
                .arg("seq")
                .arg("inc")
                .cmd("TIME")
                .query_async(&mut con)
                .await?)
        })
        .await?;
    if stale.is_some() {
        return Err(StoreError::Stale);
    }
    // A state older than the ledger's mark as this gateway knows it (a rollback no script has
    // met yet) is closed here as a script would close it, never drawn.
    if stock.is_some() && store.marks().fence_peek(sku).is_above(seq, inc) {
        crate::freshness::close_stale(store, sku, "seat map: state older than the ledger").await;
        return Err(StoreError::Stale);
    }
    if stock.is_none() {
        return Err(StoreError::SkuLost);
    }
    let bits = bits.unwrap_or_default();
    let digest = Sha256::digest(&bits);
    let tag = format!("{}-{plan_tag}", hex::encode(&digest[..8]));
    Ok(Copy {
        taken: Instant::now(),
        as_of_ms: secs * 1000 + micros / 1000,
        bits,
        plan_tag: plan_tag.to_string(),
        tag,
    })
}
