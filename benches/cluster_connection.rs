//! The Redis Cluster connection choice, measured as the single-node one was
//! (`benches/claim_path.rs`, group `redis_connection`): [`CONCURRENCY`] one-claim `claim.lua`
//! calls in flight per iteration, each in its own task, through
//! - `cluster_connection`: clones of the one multiplexed cluster connection the gateway uses
//!   (`Store::hot()` on a cluster: one socket per node);
//! - `bb8_cluster_pool/max{8,64}`: a bb8 pool of cluster connections (each its own sockets to
//!   every node), checked out per call, as a pool user would configure it (PING on check-out).
//!
//! Needs a throwaway cluster: `DROPGATE_BENCH_CLUSTER` = its comma-separated URLs. Without it
//! the bench says so and measures nothing. Every key lives under a fresh prefix; the bench
//! SKUs are left behind (a few MB), so use a cluster of its own:
//!
//! ```text
//! for p in 7100 7101 7102 7103 7104 7105; do mkdir -p /tmp/cl/$p; redis-server --port $p \
//!   --cluster-enabled yes --cluster-config-file /tmp/cl/$p/nodes.conf --save "" \
//!   --appendonly no --dir /tmp/cl/$p --daemonize yes; done
//! redis-cli --cluster create 127.0.0.1:71{00,01,02,03,04,05} --cluster-replicas 1 --cluster-yes
//! DROPGATE_BENCH_CLUSTER=redis://127.0.0.1:7100,redis://127.0.0.1:7101,redis://127.0.0.1:7102 \
//!   cargo bench --bench cluster_connection
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use redis::cluster::ClusterClient;
use tokio::runtime::Runtime;
use tokio::task::JoinSet;
use uuid::Uuid;

use dropgate::clock::now_ms;
use dropgate::keys::SkuKeys;
use dropgate::scripts::{self, ClaimInput, Decision};
use dropgate::store::{RedisConn, Store};

const TOTAL: i64 = 1_000_000_000_000;
const CONCURRENCY: usize = 64;
const TIMEOUT: Duration = Duration::from_secs(10);

static USER_SEQ: AtomicU64 = AtomicU64::new(0);

fn fresh_claims(n: usize) -> Vec<ClaimInput> {
    (0..n)
        .map(|_| ClaimInput {
            user: format!("u{}", USER_SEQ.fetch_add(1, Ordering::Relaxed)),
            quantity: 1,
            idempotency_key: None,
        })
        .collect()
}

/// One burst through clones of the multiplexed cluster connection; every claim must win.
async fn burst_hot(keys: &SkuKeys, hot: &RedisConn) {
    let mut tasks = JoinSet::new();
    for input in fresh_claims(CONCURRENCY) {
        let (keys, mut con) = (keys.clone(), hot.clone());
        tasks.spawn(async move {
            let call = dropgate::ids::mint_call(0);
            let d = scripts::claim(&mut con, &keys, &call, &[input], now_ms(), 0)
                .await
                .expect("claim");
            assert!(matches!(d[..], [Decision::Won { .. }]), "{d:?}");
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.expect("claim task");
    }
}

/// One burst, each call on a cluster connection checked out of `pool`.
async fn burst_pool(keys: &SkuKeys, pool: &bb8::Pool<ClusterClient>) {
    let mut tasks = JoinSet::new();
    for input in fresh_claims(CONCURRENCY) {
        let (keys, pool) = (keys.clone(), pool.clone());
        tasks.spawn(async move {
            let mut con = pool.get_owned().await.expect("bb8 get");
            let call = dropgate::ids::mint_call(0);
            let d = scripts::claim(&mut *con, &keys, &call, &[input], now_ms(), 0)
                .await
                .expect("claim");
            assert!(matches!(d[..], [Decision::Won { .. }]), "{d:?}");
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.expect("claim task");
    }
}

async fn seeded(store: &Store, name: &str) -> SkuKeys {
    let keys = store.keys(name);
    let mut con = store.hot();
    let d = scripts::declare_sku(
        &mut con,
        &keys,
        true,
        TOTAL,
        &scripts::Terms::limit(i32::MAX),
        &Uuid::nil(),
    )
    .await
    .expect("declare bench SKU");
    assert_eq!(d, scripts::Declared::Seeded);
    keys
}

fn bench_cluster_connection(c: &mut Criterion) {
    let Ok(urls) = std::env::var("DROPGATE_BENCH_CLUSTER") else {
        eprintln!(
            "DROPGATE_BENCH_CLUSTER is not set: no cluster to measure (see the file's header)"
        );
        return;
    };
    let rt = Runtime::new().expect("tokio runtime");
    let prefix = format!("bench{}", &Uuid::new_v4().simple().to_string()[..12]);
    let store = rt
        .block_on(Store::connect(&urls, &prefix, TIMEOUT))
        .expect("the cluster at DROPGATE_BENCH_CLUSTER");
    assert!(store.is_cluster(), "DROPGATE_BENCH_CLUSTER names one node");
    let mut group = c.benchmark_group("redis_cluster_connection");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(5))
        .throughput(Throughput::Elements(CONCURRENCY as u64));

    let keys = rt.block_on(seeded(&store, "cluster-conn"));
    let hot: RedisConn = store.hot();
    group.bench_function("cluster_connection", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let (keys, hot) = (keys.clone(), hot.clone());
            async move {
                let start = Instant::now();
                for _ in 0..iters {
                    burst_hot(&keys, &hot).await;
                }
                start.elapsed()
            }
        });
    });

    let nodes: Vec<String> = urls.split(',').map(str::to_string).collect();
    for max in [8u32, 64] {
        let keys = rt.block_on(seeded(&store, &format!("pool-{max}")));
        let pool = rt.block_on(async {
            bb8::Pool::builder()
                .max_size(max)
                .connection_timeout(TIMEOUT)
                .build(ClusterClient::new(nodes.clone()).expect("cluster client"))
                .await
                .expect("bb8 pool of cluster connections")
        });
        group.bench_function(
            BenchmarkId::new("bb8_cluster_pool", format!("max{max}")),
            |b| {
                b.to_async(&rt).iter_custom(|iters| {
                    let (keys, pool) = (keys.clone(), pool.clone());
                    async move {
                        let start = Instant::now();
                        for _ in 0..iters {
                            burst_pool(&keys, &pool).await;
                        }
                        start.elapsed()
                    }
                });
            },
        );
    }
    group.finish();
}

criterion_group!(benches, bench_cluster_connection);
criterion_main!(benches);
