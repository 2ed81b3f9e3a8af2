//! The best-available search of a seated claim (`claim_seats.lua`, docs/seats.md), on rows of
//! 10, 100 and 1,000 seats (20 rows each), against Redis at `REDIS_URL` (default
//! `redis://127.0.0.1:6379`) under a fresh prefix, deleted when the suite ends.
//!
//! ```text
//! cargo bench --bench seat_search
//! ```
//!
//! Groups (ids are stable for criterion's baselines):
//! - `best_available_scan/{10,100,1000}`: a hall where every row alternates taken and free
//!   seats, asked for 2 adjacent: every row is read and searched, and the answer is
//!   `no_adjacent` (the search's worst case; nothing changes, so every iteration is alike).
//!   Throughput in seats searched.
//! - `best_available_win/{10,100,1000}`: the same hall with its last row free: the search
//!   reads every row and seats 2 in the last one's middle (a win: bits, stock, journal).
//!   The hall is put back between iterations, outside the timed call.
//! - `best_available_filled_front/{10,100,1000}`: every row full but the last, which is free:
//!   a hall selling best rows first, late in the drop. The full rows are skipped unread
//!   (a scan for the next byte with a free bit), so this costs about one row, not the hall.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use serde_json::json;
use tokio::runtime::Runtime;
use uuid::Uuid;

use dropgate::keys::SkuKeys;
use dropgate::scripts::seats::{claim_seats, SeatAsk, SeatOutcome};
use dropgate::scripts::{self, Floor};
use dropgate::seating::SeatPlan;
use dropgate::store::Store;

const ROWS: u32 = 20;
const ROW_SIZES: [u32; 3] = [10, 100, 1000];

fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_string())
}

struct Hall {
    keys: SkuKeys,
    plan: SeatPlan,
    /// Every row alternating taken/free (or, with `full_front`, every row taken), the last
    /// one free when `last_free`.
    map: Vec<u8>,
    free: i64,
}

fn hall(store: &Store, seats: u32, last_free: bool, full_front: bool) -> Hall {
    let plan = SeatPlan::parse(&json!({"sections": [{"name": "A", "rows": ROWS, "count": seats}]}))
        .expect("a valid plan");
    let mut map = vec![0u8; plan.map_bytes()];
    let mut free = 0;
    for row in 0..ROWS {
        for n in 0..seats {
            let bit = row * seats + n;
            let taken = (full_front || n % 2 == 0) && !(last_free && row == ROWS - 1);
            if taken {
                map[(bit / 8) as usize] |= 0x80 >> (bit % 8);
            } else {
                free += 1;
            }
        }
    }
    let name = format!(
        "hall{seats}{}{}",
        if last_free { "w" } else { "s" },
        if full_front { "f" } else { "" }
    );
    Hall {
        keys: store.keys(&name),
        plan,
        map,
        free,
    }
}

/// Seeds the hall's state (stock = its free seats) and map.
async fn put_back(store: &Store, h: &Hall) {
    let mut con = store.hot();
    let _ = scripts::declare_sku(
        &mut con,
        &h.keys,
        true,
        h.free,
        &scripts::Terms::limit(i32::MAX),
        &Uuid::nil(),
    )
    .await
    .expect("declare the hall");
    let _: () = redis::pipe()
        .cmd("SET")
        .arg(h.keys.seats())
        .arg(&h.map)
        .ignore()
        .cmd("HSET")
        .arg(h.keys.state())
        .arg("stock")
        .arg(h.free)
        .ignore()
        .cmd("DEL")
        .arg(h.keys.journal())
        .arg(h.keys.users())
        .ignore()
        .query_async(&mut con)
        .await
        .expect("put the hall back");
}

async fn ask(store: &Store, h: &Hall, user: &str) -> SeatOutcome {
    let mut con = store.hot();
    let ask = SeatAsk::best(&h.plan, None, 2, true).expect("a valid ask");
    claim_seats(
        &mut con,
        &h.keys,
        Floor::seq(0),
        &dropgate::ids::mint_call(1),
        user,
        &ask,
        None,
        0,
    )
    .await
    .expect("claim_seats answers")
}

fn bench(c: &mut Criterion) {
    let rt = Runtime::new().expect("tokio runtime");
    let prefix = format!("bench{}", &Uuid::new_v4().simple().to_string()[..12]);
    let store = rt
        .block_on(Store::connect(
            &redis_url(),
            &prefix,
            Duration::from_secs(10),
        ))
        .expect("Redis must be reachable at REDIS_URL for the seat benches");

    let mut scan = c.benchmark_group("best_available_scan");
    for seats in ROW_SIZES {
        let h = hall(&store, seats, false, false);
        rt.block_on(put_back(&store, &h));
        scan.throughput(Throughput::Elements(u64::from(seats * ROWS)));
        scan.bench_with_input(BenchmarkId::from_parameter(seats), &h, |b, h| {
            b.to_async(&rt).iter(|| async {
                let o = ask(&store, h, "scanner").await;
                assert!(matches!(o, SeatOutcome::NoAdjacent { largest: 1 }), "{o:?}");
            });
        });
    }
    scan.finish();

    for (group, full_front) in [
        ("best_available_win", false),
        ("best_available_filled_front", true),
    ] {
        let mut win = c.benchmark_group(group);
        for seats in ROW_SIZES {
            let h = hall(&store, seats, true, full_front);
            win.throughput(Throughput::Elements(u64::from(seats * ROWS)));
            win.bench_with_input(BenchmarkId::from_parameter(seats), &h, |b, h| {
                let store = &store;
                b.to_async(&rt).iter_custom(|iters| async move {
                    let mut took = Duration::ZERO;
                    for i in 0..iters {
                        put_back(store, h).await;
                        let started = Instant::now();
                        let o = ask(store, h, &format!("w{i}")).await;
                        took += started.elapsed();
                        assert!(matches!(o, SeatOutcome::Won { .. }), "{o:?}");
                    }
                    took
                });
            });
        }
        win.finish();
    }

    rt.block_on(async {
        let mut con = store.hot();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{prefix}:*"))
            .query_async(&mut con)
            .await
            .unwrap_or_default();
        if !keys.is_empty() {
            let _: Result<(), _> = redis::cmd("DEL").arg(&keys).query_async(&mut con).await;
        }
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
