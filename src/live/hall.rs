//! A seated SKU's hall on the live page: each row's seats as free, held or sold, from the
//! gateway's seat-map copy ([`crate::seatmaps`], at most a second old: the route's copy, so an
//! open page costs no map read of its own) and the SKU's live holds. Sent in a frame only when
//! the copy changed since the stream's previous frame (a 100,000-seat stadium is 100 KB of
//! text; a quiet hall costs nothing after its first frame).

use std::collections::HashSet;

use serde::Serialize;

use crate::catalog::Sku;
use crate::seating::SeatPlan;
use crate::seatmaps::{plan_tag, REFRESH};
use crate::store::Store;

/// Holds read at most, per frame: past this many records the held seats are drawn as sold
/// (`held_known: false`) rather than read a large hash once a second.
pub const MAX_HOLDS_READ: usize = 20_000;

/// One frame's hall (schema `LiveHall` of the OpenAPI document).
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct Hall {
    /// The seat-map copy's tag: equal tags, equal hall.
    pub tag: String,
    pub free: u64,
    pub held: u64,
    pub sold: u64,
    /// `false` when the SKU had more than [`MAX_HOLDS_READ`] hold records: `held` seats are
    /// then counted (and drawn) as sold.
    pub held_known: bool,
    pub sections: Vec<HallSection>,
}

#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct HallSection {
    pub name: String,
    /// Each row: `.` free, `h` held, `x` sold.
    pub rows: Vec<HallRow>,
}

#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct HallRow {
    pub name: String,
    pub seats: String,
}

/// The hall of `entry` when its copy's tag is not `last` (`None` when unchanged, when the SKU
/// is not seated, or when no copy can be had: the page keeps what it drew).
pub async fn changed(
    store: &Store,
    maps: &crate::seatmaps::SeatMaps,
    entry: &Sku,
    last: Option<&str>,
) -> Option<Hall> {
    let plan = entry.plan.as_ref()?;
    let copy = maps
        .copy(store, &entry.sku, &plan_tag(entry.tag, plan), REFRESH)
        .await
        .ok()?;
    let held = if entry.hold_seconds > 0 || entry.offer_seconds > 0 {
        held_bits(store, &entry.sku, plan).await
    } else {
        Some(HashSet::new())
    };
    // A change of the holds alone (a confirm) leaves the bits as they were: the tag names both.
    let tag = format!("{}-{}", copy.tag, held.as_ref().map_or(0, HashSet::len));
    if last == Some(tag.as_str()) {
        return None;
    }
    Some(draw(plan, |b| copy.taken_at(b), held.as_ref(), tag))
}

/// The hall of `plan` with `taken` seats (held when in `held`).
pub fn draw(
    plan: &SeatPlan,
    taken: impl Fn(u32) -> bool,
    held: Option<&HashSet<u32>>,
    tag: String,
) -> Hall {
    let (mut free, mut on_hold, mut sold) = (0, 0, 0);
    let sections = plan
        .sections()
        .iter()
        .map(|s| HallSection {
            name: s.name.clone(),
            rows: s
                .rows
                .iter()
                .map(|r| HallRow {
                    name: r.name.clone(),
                    seats: (r.offset..r.offset + r.count)
                        .map(|b| match (taken(b), held.is_some_and(|h| h.contains(&b))) {
                            (false, _) => {
                                free += 1;
                                '.'
                            }
                            (true, true) => {
                                on_hold += 1;
                                'h'
                            }
                            (true, false) => {
                                sold += 1;
                                'x'
                            }
                        })
                        .collect(),
                })
                .collect(),
        })
        .collect();
    Hall {
        tag,
        free,
        held: on_hold,
        sold,
        held_known: held.is_some(),
        sections,
    }
}

/// The bits of the SKU's live holds (`held` records carry `bit:id,...` after the user: see
/// `lua/lib/lifecycle.lua`'s `pack_hold`); `None` past [`MAX_HOLDS_READ`] records or when
/// Redis does not answer.
async fn held_bits(store: &Store, sku: &str, plan: &SeatPlan) -> Option<HashSet<u32>> {
    let key = store.keys(sku).holds();
    let mut con = store.hot();
    // Past the limit: `None`, so the hall says `held_known: false` (found by a helper's
    // review: an empty list here drew held seats as sold while claiming to know them).
    let records: Vec<String> = store
        .bounded(async {
            let n: usize = redis::cmd("HLEN").arg(&key).query_async(&mut con).await?;
            if n > MAX_HOLDS_READ {
                return Ok(None);
            }
            Ok(Some(
                redis::cmd("HVALS").arg(&key).query_async(&mut con).await?,
            ))
        })
        .await
        .ok()??;
    let mut bits = HashSet::new();
    for rec in &records {
        if let Some(h) = crate::lifecycle::records::Hold::parse(rec) {
            if h.status == crate::status::ClaimStatus::Held {
                let ids = h.seats.iter().flatten();
                bits.extend(ids.filter_map(|id| plan.bit_of(id).ok()));
            }
        }
    }
    Some(bits)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_hall_draws_free_held_and_sold_seats_in_declared_order() {
        let plan = SeatPlan::parse(&json!({"sections": [
            {"name": "A", "rows": 1, "count": 4}, {"name": "B", "rows": 1, "count": 2}]}))
        .unwrap();
        let held: HashSet<u32> = [1].into_iter().collect();
        let hall = draw(&plan, |b| [1, 2, 5].contains(&b), Some(&held), "t".into());
        assert_eq!(hall.sections[0].rows[0].seats, ".hx.");
        assert_eq!(hall.sections[1].rows[0].seats, ".x");
        assert_eq!((hall.free, hall.held, hall.sold), (3, 1, 2));
        let blind = draw(&plan, |b| b == 1, None, "t".into());
        assert_eq!((blind.held, blind.sold, blind.held_known), (0, 1, false));
    }
}
