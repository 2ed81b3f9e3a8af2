//! Benchmarks of the claim path: the Redis connection kind, script coalescing, the admission
//! token check and the body decoding.
//!
//! Needs Redis at `REDIS_URL` (default `redis://127.0.0.1:6379`). Every key lives under a fresh
//! prefix `bench<random>:`; winners' claim keys, the per-user counts and the journal are trimmed
//! outside the timed region every [`TRIM_EVERY`] claims, and every key of the prefix is deleted
//! when the suite ends.
//!
//! ```text
//! cargo bench --bench claim_path                      # everything
//! cargo bench --bench claim_path -- redis_connection  # one group
//! ```
//!
//! Groups (ids are stable; criterion's `--save-baseline`/`--baseline` and `critcmp` compare them):
//! - `redis_connection/{connection_manager, bb8_pool/max64, bb8_pool_no_ping/max64,
//!   bb8_pool/max8}`: [`CONCURRENCY`] one-claim script calls in flight per iteration, each in
//!   its own task as each request is in the server; throughput in claims.
//! - `claim_script/{1,8,32,128}`: one script call per iteration deciding that many claims, one
//!   call in flight (a SKU's lane never has more); throughput in claims.
//! - `admission_token/{valid, bad_signature}`: `Verifier::buyer` on a minted token.
//! - `request_decoding/{typical, empty}`: `http::claim_quantity` on a claim body.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bb8_redis::RedisConnectionManager;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

use tokio::runtime::Runtime;
use tokio::task::JoinSet;
use uuid::Uuid;

use dropgate::auth::{mint, Verifier};
use dropgate::clock::now_ms;
use dropgate::config::Secret;
use dropgate::ids;
use dropgate::keys::SkuKeys;
use dropgate::scripts::{self, ClaimInput, Decision};
use dropgate::store::{RedisConn, Store};

/// Stock of every bench SKU: never sold out within a run.
const TOTAL: i64 = 1_000_000_000_000;
/// Per-user limit of every bench SKU (users are distinct anyway).
const PER_USER_LIMIT: i32 = i32::MAX;
/// Script calls in flight per iteration in `redis_connection`.
const CONCURRENCY: usize = 64;
/// Claims won on a SKU before its claim keys, users and journal are trimmed (untimed).
const TRIM_EVERY: u64 = 100_000;
/// Call timeout of the benchmark's `Store`; generous, as the machine is shared.
const STORE_TIMEOUT: Duration = Duration::from_secs(10);

fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_string())
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

static USER_SEQ: AtomicU64 = AtomicU64::new(0);

/// A claim of one unit by a user no other claim of the run uses.
fn fresh_claim() -> ClaimInput {
    ClaimInput {
        user: format!("u{}", USER_SEQ.fetch_add(1, Ordering::Relaxed)),
        quantity: 1,
        idempotency_key: None,
    }
}

fn fresh_claims(n: usize) -> Vec<ClaimInput> {
    (0..n).map(|_| fresh_claim()).collect()
}

/// Every claim of the bench must win; anything else means the setup is wrong.
fn expect_won(decisions: &[Decision], n: usize) {
    assert_eq!(decisions.len(), n, "one decision per claim");
    for d in decisions {
        assert!(matches!(d, Decision::Won { .. }), "bench claim lost: {d:?}");
    }
}

/// One seeded SKU and how many winners it holds since its last trim.
struct BenchSku {
    keys: Arc<SkuKeys>,
    since_trim: AtomicU64,
}

/// The Redis side shared by the benches: a `Store` (hot `ConnectionManager`, scripts loaded)
/// under a fresh prefix.
#[derive(Clone)]
struct Fixture {
    store: Store,
}

impl Fixture {
    async fn connect() -> Fixture {
        let prefix = format!("bench{}", &Uuid::new_v4().simple().to_string()[..12]);
        let store = Store::connect(&redis_url(), &prefix, STORE_TIMEOUT)
            .await
            .expect("Redis must be reachable at REDIS_URL for the claim benches");
        Fixture { store }
    }

    fn hot(&self) -> RedisConn {
        self.store.hot()
    }

    async fn sku(&self, name: &str) -> Arc<BenchSku> {
        let keys = self.store.keys(name);
        let mut con = self.hot();
        let declared = scripts::declare_sku(
            &mut con,
            &keys,
            true,
            TOTAL,
            &scripts::Terms::limit(PER_USER_LIMIT),
            &uuid::Uuid::nil(),
        )
        .await
        .expect("declare bench SKU");
        assert_eq!(
            declared,
            scripts::Declared::Seeded,
            "bench SKU already existed"
        );
        Arc::new(BenchSku {
            keys: Arc::new(keys),
            since_trim: AtomicU64::new(0),
        })
    }

    /// Counts `won` new winners on `sku` and trims it when enough have piled up.
    async fn account(&self, sku: &BenchSku, won: u64) {
        if sku.since_trim.fetch_add(won, Ordering::Relaxed) + won >= TRIM_EVERY {
            self.trim(sku).await;
        }
    }

    /// Deletes a SKU's claim records and per-user counts and empties its journal; the state
    /// hash and the journal's group stay, so claims keep winning.
    async fn trim(&self, sku: &BenchSku) {
        // The call records' buckets are `<head>claims:<n>`: only those go, never the state.
        let bucket = sku.keys.claims_bucket(0);
        let buckets = &bucket[..bucket.len() - 1];
        self.delete_matching(&format!("{buckets}*")).await;
        let mut con = self.hot();
        let _: i64 = redis::cmd("DEL")
            .arg(sku.keys.users())
            .arg(sku.keys.idempotency())
            .query_async(&mut con)
            .await
            .expect("DEL users");
        let _: i64 = redis::cmd("XTRIM")
            .arg(sku.keys.journal())
            .arg("MAXLEN")
            .arg(0)
            .query_async(&mut con)
            .await
            .expect("XTRIM journal");
        sku.since_trim.store(0, Ordering::Relaxed);
    }

    async fn delete_matching(&self, pattern: &str) -> u64 {
        let mut con = self.hot();
        let mut cursor: u64 = 0;
        let mut deleted = 0;
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(5000)
                .query_async(&mut con)
                .await
                .expect("SCAN");
            if !batch.is_empty() {
                deleted += redis::cmd("DEL")
                    .arg(&batch)
                    .query_async::<u64>(&mut con)
                    .await
                    .expect("DEL");
            }
            if next == 0 {
                return deleted;
            }
            cursor = next;
        }
    }

    /// Deletes every key of the bench prefix.
    async fn delete_all(&self) -> u64 {
        self.delete_matching(&format!("{}:*", self.store.prefix()))
            .await
    }
}

/// `CONCURRENCY` one-claim calls through clones of the multiplexed `ConnectionManager`.
async fn burst_connection_manager(con: &RedisConn, sku: &BenchSku) {
    let mut tasks = JoinSet::new();
    for input in fresh_claims(CONCURRENCY) {
        let mut con = con.clone();
        let keys = sku.keys.clone();
        tasks.spawn(async move {
            let d = scripts::claim(&mut con, &keys, &ids::mint_call(0), &[input], now_ms(), 0)
                .await
                .expect("claim");
            expect_won(&d, 1);
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.expect("claim task");
    }
}

/// `CONCURRENCY` one-claim calls, each on a connection checked out of a bb8 pool.
async fn burst_pool(pool: &bb8::Pool<RedisConnectionManager>, sku: &BenchSku) {
    let mut tasks = JoinSet::new();
    for input in fresh_claims(CONCURRENCY) {
        let pool = pool.clone();
        let keys = sku.keys.clone();
        tasks.spawn(async move {
            let mut con = pool.get().await.expect("bb8 get");
            let d = scripts::claim(&mut *con, &keys, &ids::mint_call(0), &[input], now_ms(), 0)
                .await
                .expect("claim");
            expect_won(&d, 1);
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.expect("claim task");
    }
}

fn bench_redis_connection(c: &mut Criterion, rt: &Runtime, fx: &Fixture) {
    let mut group = c.benchmark_group("redis_connection");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(5))
        .throughput(Throughput::Elements(CONCURRENCY as u64));

    let sku = rt.block_on(fx.sku("conn-mgr"));
    let hot = fx.hot();
    group.bench_function("connection_manager", |b| {
        b.to_async(rt).iter_custom(|iters| {
            let (fx, sku, hot) = (fx.clone(), sku.clone(), hot.clone());
            async move {
                let mut timed = Duration::ZERO;
                for _ in 0..iters {
                    let start = Instant::now();
                    burst_connection_manager(&hot, &sku).await;
                    timed += start.elapsed();
                    fx.account(&sku, CONCURRENCY as u64).await;
                }
                timed
            }
        });
    });
    rt.block_on(fx.trim(&sku));

    // bb8 as a pool user configures it: defaults (a PING on every check-out), sized to the
    // concurrency (no waiting for a connection) or like the gateway's background pool (8).
    // The no-ping variant shows how much of the gap the check-out test accounts for.
    let variants = [
        ("bb8_pool", CONCURRENCY as u32, true),
        ("bb8_pool_no_ping", CONCURRENCY as u32, false),
        ("bb8_pool", 8, true),
    ];
    for (name, max_size, ping) in variants {
        let sku = rt.block_on(fx.sku(&format!("{name}-{max_size}")));
        let pool = rt.block_on(async {
            bb8::Pool::builder()
                .max_size(max_size)
                .test_on_check_out(ping)
                .connection_timeout(STORE_TIMEOUT)
                .build(RedisConnectionManager::new(redis_url()).expect("redis url"))
                .await
                .expect("bb8 pool")
        });
        group.bench_function(BenchmarkId::new(name, format!("max{max_size}")), |b| {
            b.to_async(rt).iter_custom(|iters| {
                let (fx, sku, pool) = (fx.clone(), sku.clone(), pool.clone());
                async move {
                    let mut timed = Duration::ZERO;
                    for _ in 0..iters {
                        let start = Instant::now();
                        burst_pool(&pool, &sku).await;
                        timed += start.elapsed();
                        fx.account(&sku, CONCURRENCY as u64).await;
                    }
                    timed
                }
            });
        });
        rt.block_on(fx.trim(&sku));
        drop(pool);
    }
    group.finish();
}

fn bench_claim_script(c: &mut Criterion, rt: &Runtime, fx: &Fixture) {
    let mut group = c.benchmark_group("claim_script");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(5));
    for n in [1usize, 8, 32, 128] {
        let sku = rt.block_on(fx.sku(&format!("batch-{n}")));
        group.throughput(Throughput::Elements(n as u64));
        group.bench_function(BenchmarkId::from_parameter(n), |b| {
            b.to_async(rt).iter_custom(|iters| {
                let (fx, sku) = (fx.clone(), sku.clone());
                async move {
                    let mut con = fx.hot();
                    let mut timed = Duration::ZERO;
                    for _ in 0..iters {
                        let inputs = fresh_claims(n);
                        let start = Instant::now();
                        let d = scripts::claim(
                            &mut con,
                            &sku.keys,
                            &ids::mint_call(0),
                            &inputs,
                            now_ms(),
                            0,
                        )
                        .await
                        .expect("claim");
                        timed += start.elapsed();
                        expect_won(&d, n);
                        fx.account(&sku, n as u64).await;
                    }
                    timed
                }
            });
        });
        rt.block_on(fx.trim(&sku));
    }
    group.finish();
}

fn bench_admission_token(c: &mut Criterion) {
    let secret = Secret::new("bench-admission-secret-0123456789");
    let verifier = Verifier::new(&secret, None);
    let token = mint(&secret, "user-000042", Some("drop-1"), 24 * 3600).expect("mint");
    let valid = format!("Bearer {token}");
    let foreign = mint(
        &Secret::new("another-secret-0123456789"),
        "user-000042",
        Some("drop-1"),
        24 * 3600,
    )
    .expect("mint");
    let bad = format!("Bearer {foreign}");
    assert_eq!(
        verifier.buyer(Some(&valid), Some("drop-1")).as_deref(),
        Ok("user-000042")
    );
    assert!(verifier.buyer(Some(&bad), Some("drop-1")).is_err());

    let mut group = c.benchmark_group("admission_token");
    group
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    group.bench_function("valid", |b| {
        b.iter(|| verifier.buyer(black_box(Some(valid.as_str())), black_box(Some("drop-1"))));
    });
    group.bench_function("bad_signature", |b| {
        b.iter(|| verifier.buyer(black_box(Some(bad.as_str())), black_box(Some("drop-1"))));
    });
    group.finish();
}

fn bench_request_decoding(c: &mut Criterion) {
    let typical: &[u8] = br#"{"quantity": 1}"#;
    let empty: &[u8] = b"";
    assert_eq!(dropgate::http::claim_quantity(typical).ok(), Some(1));
    assert_eq!(dropgate::http::claim_quantity(empty).ok(), Some(1));

    let mut group = c.benchmark_group("request_decoding");
    group
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    group.bench_function("typical", |b| {
        b.iter(|| dropgate::http::claim_quantity(black_box(typical)));
    });
    group.bench_function("empty", |b| {
        b.iter(|| dropgate::http::claim_quantity(black_box(empty)));
    });
    group.finish();
}

fn redis_benches(c: &mut Criterion) {
    let rt = runtime();
    let fx = rt.block_on(Fixture::connect());
    bench_redis_connection(c, &rt, &fx);
    bench_claim_script(c, &rt, &fx);
    rt.block_on(fx.delete_all());
}

criterion_group!(
    benches,
    redis_benches,
    bench_admission_token,
    bench_request_decoding
);
criterion_main!(benches);
