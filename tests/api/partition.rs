//! A network partition between a gateway and one master of a Redis Cluster, on real separate
//! hosts: the gateway runs in a network namespace of its own, joined to this host by a veth
//! pair; each cluster node binds (and announces) an address of its own on the host side, so a
//! blackhole route in the namespace cuts the gateway off from exactly one master, while the
//! cluster itself, the test's probes and PostgreSQL (over its unix socket) stay whole. Packets
//! to the cut-off master are dropped, not refused: the gateway sees timeouts.

use std::collections::HashSet;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::PgPool;
use uuid::Uuid;

use crate::cluster::{buyers, counts_within_limit, release, settled_won, Buyer, Tally};
use crate::cluster_support::{sku_key, skus_on_every_master, ClusterProbe, PrivateCluster};
use crate::helpers::*;
use crate::services::{GatewayProcess, PrivatePostgres};

/// Runs `ip` with `args`; panics with its stderr when it fails.
fn ip(args: &[&str]) {
    let out = Command::new(crate::tools::require("ip", "iproute2"))
        .args(args)
        .output()
        .expect("iproute2 is installed");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A network namespace of the test's own, a second host: a veth pair to this host, the host
/// side `10.231.X.1/24` plus one address per cluster node (`10.231.X.11`, `.12`, ...), the
/// namespace side `10.231.X.100/24`, default route via the host. X comes from the pid, so two
/// test runs at once do not share a subnet. Removed on drop, after a panic too.
struct Netns {
    name: String,
    /// The host side of the veth pair; deleting it deletes its peer at once (deleting the
    /// namespace alone leaves the pair to be reaped later, with its addresses).
    host_veth: String,
    subnet: u8,
}

impl Netns {
    fn new(nodes: usize) -> Self {
        let pid = std::process::id();
        let ns = Netns {
            name: format!("dg-part-{pid}"),
            host_veth: format!("dgp{pid}h"),
            // 20..=219: clear of the .0 and .255 that other tools like to take.
            subnet: (pid % 200 + 20) as u8,
        };
        let peer = format!("dgp{pid}n");
        let x = ns.subnet;
        ip(&["netns", "add", &ns.name]);
        ip(&[
            "link",
            "add",
            &ns.host_veth,
            "type",
            "veth",
            "peer",
            "name",
            &peer,
        ]);
        ip(&["link", "set", &peer, "netns", &ns.name]);
        ip(&[
            "addr",
            "add",
            &format!("10.231.{x}.1/24"),
            "dev",
            &ns.host_veth,
        ]);
        for i in 0..nodes {
            ip(&[
                "addr",
                "add",
                &format!("{}/24", ns.node(i)),
                "dev",
                &ns.host_veth,
            ]);
        }
        ip(&["link", "set", &ns.host_veth, "up"]);
        let inside = |args: &[&str]| {
            let mut all = vec!["netns", "exec", &ns.name, "ip"];
            all.extend_from_slice(args);
            ip(&all);
        };
        inside(&["link", "set", "lo", "up"]);
        inside(&[
            "addr",
            "add",
            &format!("{}/24", ns.gateway_ip()),
            "dev",
            &peer,
        ]);
        inside(&["link", "set", &peer, "up"]);
        inside(&["route", "add", "default", "via", &format!("10.231.{x}.1")]);
        ns
    }

    /// The host-side address of cluster node `i`.
    fn node(&self, i: usize) -> String {
        format!("10.231.{}.{}", self.subnet, 11 + i)
    }

    fn nodes(&self, n: usize) -> Vec<String> {
        (0..n).map(|i| self.node(i)).collect()
    }

    /// The namespace's own address, where its gateway listens.
    fn gateway_ip(&self) -> String {
        format!("10.231.{}.100", self.subnet)
    }

    /// What runs a command inside.
    fn exec(&self) -> [&str; 3] {
        ["netns", "exec", &self.name]
    }

    /// Drops every packet from the namespace to `addr` (a blackhole route: no refusal, no
    /// ICMP; the sender's segments just never leave).
    fn cut_off(&self, addr: &str) {
        ip(&[
            "netns",
            "exec",
            &self.name,
            "ip",
            "route",
            "add",
            "blackhole",
            &format!("{addr}/32"),
        ]);
    }

    fn heal(&self, addr: &str) {
        ip(&[
            "netns",
            "exec",
            &self.name,
            "ip",
            "route",
            "del",
            "blackhole",
            &format!("{addr}/32"),
        ]);
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_veth])
            .output();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// Units per SKU.
const TOTAL: i64 = 100;
/// Buyers per SKU before the partition: all win.
const BEFORE: usize = 60;
/// Buyers per SKU during the partition, and for the cut-off SKU after healing.
const DURING: usize = 300;
/// Buyers of the cut-off SKU in a second round during the partition.
const LATER: usize = 100;
/// Units added to the cut-off SKU after healing.
const RESTOCK: i64 = 50;

/// Waits until the writer has drained `sku` (the view answers, nothing in flight or pending).
async fn drained(api: &Api, sku: &str, limit: Duration) -> serde_json::Value {
    let deadline = Instant::now() + limit;
    loop {
        let r = api
            .http
            .get(format!("{}/admin/skus/{sku}", api.base))
            .bearer_auth(ADMIN)
            .send()
            .await;
        let last = match r {
            Ok(r) if r.status() == 200 => {
                let v: serde_json::Value = r.json().await.unwrap();
                if v["in_flight"] == 0 && v["pending"] == 0 {
                    return v;
                }
                v.to_string()
            }
            Ok(r) => format!("status {}", r.status()),
            Err(e) => e.to_string(),
        };
        assert!(
            Instant::now() < deadline,
            "the writer did not drain {sku} within {limit:?}: {last}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Releases every buyer at once and tallies the answers per SKU (in `skus`' order); bounded,
/// so a gateway that never answers fails the test instead of hanging it.
async fn wave(api: &Api, skus: &[String], all: &[Buyer]) -> Vec<Tally> {
    let results = tokio::time::timeout(
        Duration::from_secs(120),
        release(
            std::slice::from_ref(api),
            all,
            &Arc::new(AtomicUsize::new(0)),
        ),
    )
    .await
    .expect("every buyer is answered within 120 s");
    let mut per_sku: Vec<Tally> = skus.iter().map(|_| Tally::default()).collect();
    for (b, r) in all.iter().zip(results) {
        let i = skus.iter().position(|s| *s == b.sku).unwrap();
        per_sku[i].add(std::slice::from_ref(b), vec![r]);
    }
    per_sku
}

/// The lowest stock of each SKU seen in Redis until `go` is cleared (sampled every 20 ms).
async fn lowest_stock(probe: ClusterProbe, skus: Vec<String>, go: Arc<AtomicBool>) -> Vec<i64> {
    let mut lowest = vec![i64::MAX; skus.len()];
    while go.load(Ordering::Relaxed) {
        for (sku, low) in skus.iter().zip(lowest.iter_mut()) {
            if let Some(s) = probe.stock(sku).await {
                *low = (*low).min(s);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    lowest
}

fn summary(t: &Tally) -> String {
    format!(
        "{} won, {} sold out, {} unavailable, {} unknown, {} unanswered, other {:?}",
        t.won.len(),
        t.sold_out,
        t.unavailable.len(),
        t.unknown.len(),
        t.no_answer,
        t.other
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_cut_off_from_one_master_fails_closed_on_its_skus_and_sells_the_rest_exactly() {
    let _heavy = crate::helpers::heavy().await;
    let started = Instant::now();
    // Arrange: the namespace first, so it is dropped last (after the gateway inside it).
    let net = Netns::new(3);
    let cluster = PrivateCluster::start_on(3, 0, &net.nodes(3)).await;
    let pg = PrivatePostgres::start().await;
    let id = Uuid::new_v4().simple().to_string();
    let db_name = format!("dg_test_{}", &id[..16]);
    let iso = Isolation {
        database_url: pg.socket_url(&db_name),
        prefix: format!("t{}", &id[..16]),
    };
    let listen = format!("{}:0", net.gateway_ip());
    let gateway = GatewayProcess::start_in(
        &[&["ip"][..], &net.exec()[..]].concat(),
        &iso,
        &cluster.urls(),
        &[
            ("DROPGATE_LISTEN", listen.as_str()),
            // Masters without replicas: no WAIT.
            ("DROPGATE_REDIS_WAIT_REPLICAS", "0"),
            // A call to the cut-off master times out in half a second, not two.
            ("DROPGATE_REDIS_TIMEOUT_MS", "500"),
        ],
    )
    .await;
    assert!(
        gateway.base.contains(&net.gateway_ip()),
        "{} listens in the namespace",
        gateway.base
    );
    let api = Api::new(gateway.base.clone());
    let probe = ClusterProbe::new(&cluster, &iso.prefix).await;
    let db = PgPool::connect(&pg.url(&db_name)).await.unwrap();

    // One SKU on each master; the last one's master is the one cut off.
    let skus = skus_on_every_master(&cluster, "part", 1).await;
    let mut masters = Vec::new();
    for sku in &skus {
        masters.push(cluster.master_of(&sku_key(sku)).await);
        assert_eq!(api.declare(sku, TOTAL, 1).await.status(), 201);
    }
    assert_eq!(masters.iter().collect::<HashSet<_>>().len(), 3);
    let cut = skus.len() - 1;
    let cut_host = cluster.host_of(masters[cut]).to_string();

    // Every SKU's stock as Redis holds it, read all through the test from this host (which
    // the partition does not cut): its lowest value is checked at the end.
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = tokio::spawn(lowest_stock(probe.clone(), skus.clone(), sampling.clone()));

    // A drop under way on every master before the partition: every buyer wins.
    let first: Vec<Buyer> = skus
        .iter()
        .flat_map(|s| buyers(s, &format!("{s}-a"), BEFORE))
        .collect();
    let before = wave(&api, &skus, &first).await;
    for (sku, t) in skus.iter().zip(&before) {
        assert_eq!(
            t.won.len(),
            BEFORE,
            "{sku} before the partition: {}",
            summary(t)
        );
    }

    // Act: the gateway loses one master; many more buyers than units on every SKU at once.
    net.cut_off(&cut_host);
    let cut_at = Instant::now();
    let second: Vec<Buyer> = skus
        .iter()
        .flat_map(|s| buyers(s, &format!("{s}-b"), DURING))
        .collect();
    let mut during = wave(&api, &skus, &second).await;
    let left = TOTAL - BEFORE as i64;
    for (i, (sku, t)) in skus.iter().zip(&during).enumerate() {
        eprintln!(
            "{sku} during the partition (cut: {}): {}",
            i == cut,
            summary(t)
        );
        assert!(t.other.is_empty(), "{sku}: answers outside the contract");
        assert_eq!(t.no_answer, 0, "{sku}: every buyer is answered");
        if i == cut {
            assert!(
                t.won.is_empty() && t.sold_out == 0,
                "{sku}: a cut-off master's SKU answers only 503: {}",
                summary(t)
            );
            assert_eq!(t.unavailable.len() + t.unknown.len(), DURING);
            // Only the first call (at most one coalesced batch) is sent to the silent master;
            // every later batch is refused after a probe read got no answer, with nothing
            // sent (src/claims/call.rs).
            assert!(
                t.unknown.len() <= dropgate::claims::MAX_BATCH,
                "{sku}: claims kept being sent to a master that answers nothing: {}",
                summary(t)
            );
            // Nothing reached the master: the partition is real.
            assert_eq!(probe.stock(sku).await, Some(left), "{sku}");
        } else {
            assert_eq!(
                t.won.len() as i64,
                left,
                "{sku}: a reachable master's SKU sells exactly its stock: {}",
                summary(t)
            );
            assert_eq!(t.sold_out, DURING - left as usize, "{sku}: {}", summary(t));
            assert_eq!(probe.stock(sku).await, Some(0), "{sku}");
        }
    }
    // Still cut off, once the gateway has seen its calls to that master time out: a second
    // round on the cut-off SKU alone meets a connection known to be broken.
    let cut_sku = &skus[cut];
    let again = buyers(cut_sku, &format!("{cut_sku}-b2"), LATER);
    let later = wave(&api, std::slice::from_ref(cut_sku), &again)
        .await
        .remove(0);
    eprintln!("{cut_sku} later in the partition: {}", summary(&later));
    assert!(
        later.other.is_empty()
            && later.no_answer == 0
            && later.won.is_empty()
            && later.sold_out == 0,
        "{cut_sku}: a cut-off master's SKU answers only 503: {}",
        summary(&later)
    );
    assert!(
        later.unknown.is_empty(),
        "{cut_sku}: a SKU whose master stayed silent sends no more claim calls: {}",
        summary(&later)
    );
    assert_eq!(probe.stock(cut_sku).await, Some(left), "{cut_sku}");
    during[cut].unavailable.extend(later.unavailable);
    during[cut].unknown.extend(later.unknown);
    let partitioned_for = cut_at.elapsed();

    // Heal; every outcome_unknown settles, and the writer drains every SKU.
    net.heal(&cut_host);
    let mut settled = 0i64;
    for (id, user) in &during[cut].unknown {
        if settled_won(&api, user, *id).await {
            settled += 1;
        }
    }
    for sku in &skus {
        drained(&api, sku, Duration::from_secs(60)).await;
    }
    let stock = probe.stock(cut_sku).await.expect("the cut-off SKU's state");
    assert_eq!(
        stock,
        left - settled,
        "{cut_sku}: only the outcome_unknown claims that settled as won took units"
    );

    // After healing, the cut-off SKU sells exactly what is left, and more units added now
    // (the claims queued during the partition may have taken every unit left).
    assert_eq!(api.restock(cut_sku, RESTOCK).await.status(), 200);
    let stock = stock + RESTOCK;
    assert_eq!(
        probe.stock(cut_sku).await,
        Some(stock),
        "{cut_sku} restocked"
    );
    let third = buyers(cut_sku, &format!("{cut_sku}-c"), DURING);
    let after = wave(&api, std::slice::from_ref(cut_sku), &third)
        .await
        .remove(0);
    eprintln!("{cut_sku} after healing: {}", summary(&after));
    assert!(
        after.other.is_empty()
            && after.no_answer == 0
            && after.unavailable.is_empty()
            && after.unknown.is_empty(),
        "{cut_sku} after healing: {}",
        summary(&after)
    );
    assert_eq!(
        after.won.len() as i64,
        stock,
        "{cut_sku}: {}",
        summary(&after)
    );
    assert_eq!(after.sold_out, DURING - stock as usize);

    // Assert: no oversell, every winner recorded exactly once, every view balanced, and no
    // buyer answered `unavailable` holds anything.
    for (i, sku) in skus.iter().enumerate() {
        let units = if i == cut { TOTAL + RESTOCK } else { TOTAL };
        let v = drained(&api, sku, Duration::from_secs(60)).await;
        assert_eq!(probe.stock(sku).await, Some(0), "{sku}");
        assert_eq!(v["recorded"], units, "{sku}: {v}");
        assert_eq!(v["consistent"], true, "{sku}: {v}");
        let mut winners: HashSet<Uuid> = before[i].won_ids();
        winners.extend(during[i].won_ids());
        if i == cut {
            winners.extend(after.won_ids());
            for (id, user) in &during[i].unknown {
                if settled_won(&api, user, *id).await {
                    winners.insert(*id);
                }
            }
        }
        let issued: Vec<Uuid> =
            sqlx::query_scalar("SELECT claim_id FROM issuances WHERE sku = $1 ORDER BY claim_id")
                .bind(sku)
                .fetch_all(&db)
                .await
                .unwrap();
        assert_eq!(issued.len() as i64, units, "{sku}: units issued");
        let issued_set: HashSet<Uuid> = issued.iter().copied().collect();
        assert_eq!(
            issued_set.len(),
            issued.len(),
            "{sku}: a claim issued twice"
        );
        assert_eq!(
            issued_set, winners,
            "{sku}: issuances are exactly the winners"
        );
        counts_within_limit(&probe, sku, units).await;
        for user in &during[i].unavailable {
            assert_eq!(
                probe.held(sku, user).await,
                0,
                "{sku}: {user} was answered unavailable and holds a unit"
            );
        }
    }
    sampling.store(false, Ordering::Relaxed);
    let lowest = sampler.await.unwrap();
    for (sku, low) in skus.iter().zip(&lowest) {
        assert!(*low >= 0, "{sku}: stock went down to {low}");
    }
    eprintln!(
        "partition of {partitioned_for:?}, {settled} outcome_unknown settled as won; test took {:?}",
        started.elapsed()
    );
}
