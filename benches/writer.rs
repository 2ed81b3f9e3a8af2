//! Benchmark of the journal writer's insert: `writer::write_batch` into `issuances`.
//!
//! Needs PostgreSQL; uses its own database, `BENCH_DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/dg_bench`), created and migrated on first use. Every row
//! has a fresh UUIDv7 claim id (the insert is `ON CONFLICT DO NOTHING`, so a reused id would
//! measure nothing). `issuances` is truncated before the run, outside the timed region every
//! [`TRUNCATE_EVERY`] rows, and after the run.
//!
//! ```text
//! cargo bench --bench writer
//! ```
//!
//! Group: `writer_insert/{1,64,512,2048}`, one `write_batch` call of that many rows per
//! iteration; throughput in rows.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use sqlx::PgPool;
use uuid::Uuid;

use dropgate::writer::{write_batch, Winner};

/// Rows written since the last truncate before the table is emptied again (untimed).
const TRUNCATE_EVERY: u64 = 250_000;
/// `first_retry` of `write_batch`; only used for refused rows, which the bench has none of.
const FIRST_RETRY: Duration = Duration::from_secs(1);

fn database_url() -> String {
    std::env::var("BENCH_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/dg_bench".to_string())
}

static SEQ: AtomicU64 = AtomicU64::new(0);

/// `n` winners as the journal would hold them, each with a claim id never used before.
fn winners(n: usize) -> Vec<Winner> {
    let now = dropgate::clock::now_ms();
    (0..n)
        .map(|i| {
            let seq = SEQ.fetch_add(1, Ordering::Relaxed);
            Winner {
                entry_id: format!("{now}-{i}"),
                claim_id: Uuid::now_v7(),
                sku: "bench-sku".to_string(),
                user: format!("u{seq}"),
                quantity: 1,
                idempotency_key: None,
                remaining_after: Some(1_000_000 - (seq % 1_000_000) as i64),
                created_ms: now,
                seq: seq as i64,
                expires_ms: None,
                offer: false,
                seats: None,
            }
        })
        .collect()
}

async fn truncate(db: &PgPool) {
    sqlx::query("TRUNCATE issuances, persistence_pending, outbox")
        .execute(db)
        .await
        .expect("TRUNCATE");
}

async fn count(db: &PgPool, table: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
        .fetch_one(db)
        .await
        .expect("count")
}

fn bench_writer_insert(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let db = rt
        .block_on(dropgate::db::connect_and_migrate(&database_url()))
        .expect("PostgreSQL must be reachable for the writer bench");
    rt.block_on(truncate(&db));
    let since_truncate = AtomicU64::new(0);

    let mut group = c.benchmark_group("writer_insert");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(5));
    for n in [1usize, 64, 512, 2048] {
        group.throughput(Throughput::Elements(n as u64));
        // 20 samples of a 2048-row insert (tens of ms each) need more than 5 s.
        if n >= 2048 {
            group.measurement_time(Duration::from_secs(10));
        }
        group.bench_function(BenchmarkId::from_parameter(n), |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let (db, since_truncate) = (&db, &since_truncate);
                async move {
                    let mut timed = Duration::ZERO;
                    for _ in 0..iters {
                        let rows = winners(n);
                        let start = Instant::now();
                        write_batch(db, &rows, FIRST_RETRY)
                            .await
                            .expect("write_batch");
                        timed += start.elapsed();
                        let written =
                            since_truncate.fetch_add(n as u64, Ordering::Relaxed) + n as u64;
                        if written >= TRUNCATE_EVERY {
                            // Every row must have landed in `issuances`, none parked.
                            assert_eq!(count(db, "issuances").await, written as i64);
                            assert_eq!(count(db, "persistence_pending").await, 0);
                            truncate(db).await;
                            since_truncate.store(0, Ordering::Relaxed);
                        }
                    }
                    timed
                }
            });
        });
    }
    group.finish();

    assert_eq!(rt.block_on(count(&db, "persistence_pending")), 0);
    rt.block_on(truncate(&db));
    rt.block_on(db.close());
}

criterion_group!(benches, bench_writer_insert);
criterion_main!(benches);
