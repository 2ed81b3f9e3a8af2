//! Drops on a real Redis Cluster (tests/api/cluster_support/): three `dropgate serve`
//! processes on one cluster and one PostgreSQL database, many more buyers than units, and the
//! cluster's own faults while they buy: a slot migrated under them, a master killed and its
//! replica promoted, a gateway SIGKILLed with journal entries in hand. Every test asserts on
//! what is left behind: Redis stock and per-user counts (read through a cluster connection),
//! the rows of `issuances`, and the SKU view's balance.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

use crate::cluster_support::{sku_key, skus_on_every_master, ClusterProbe, PrivateCluster};
use crate::helpers::*;
use crate::services::GatewayProcess;

/// Three gateways on one cluster, one database and one key prefix.
struct ClusterDrop {
    gateways: Vec<GatewayProcess>,
    apis: Vec<Api>,
    probe: ClusterProbe,
    db: PgPool,
}

impl ClusterDrop {
    async fn start(cluster: &PrivateCluster, env: &[(&str, &str)]) -> Self {
        let iso = Isolation::new();
        // A replica on this loaded 2-core machine may take longer than the default 200 ms to
        // acknowledge (1 s here, under the 2 s call timeout); a win it did not acknowledge in time is answered outcome_unknown, which
        // the tests accept only where they expect it.
        let mut env: Vec<(&str, &str)> = env.to_vec();
        if !env.iter().any(|(k, _)| *k == "DROPGATE_REDIS_WAIT_MS") {
            env.push(("DROPGATE_REDIS_WAIT_MS", "1000"));
        }
        let env = env.as_slice();
        // The first creates the database and migrates; the others find it done.
        let mut gateways = vec![GatewayProcess::start(&iso, &cluster.urls(), env).await];
        for _ in 0..2 {
            gateways.push(GatewayProcess::start(&iso, &cluster.urls(), env).await);
        }
        let apis = gateways.iter().map(|g| Api::new(g.base.clone())).collect();
        ClusterDrop {
            probe: ClusterProbe::new(cluster, &iso.prefix).await,
            db: PgPool::connect(&iso.database_url).await.unwrap(),
            gateways,
            apis,
        }
    }

    async fn issued_ids(&self, sku: &str) -> Vec<Uuid> {
        sqlx::query_scalar("SELECT claim_id FROM issuances WHERE sku = $1 ORDER BY claim_id")
            .bind(sku)
            .fetch_all(&self.db)
            .await
            .unwrap()
    }
}

/// One buyer: a SKU and a user, claiming one unit.
#[derive(Clone)]
pub(crate) struct Buyer {
    pub(crate) sku: String,
    pub(crate) user: String,
}

pub(crate) fn buyers(sku: &str, stem: &str, n: usize) -> Vec<Buyer> {
    users(stem, n)
        .into_iter()
        .map(|user| Buyer {
            sku: sku.to_string(),
            user,
        })
        .collect()
}

/// Releases every buyer at once (a barrier), buyer `i` on gateway `i % apis.len()`; `answered`
/// counts the answers as they come. Each result is the status (0: no answer, the connection
/// failed) and body.
/// Releases `waves` waves of 150 fresh buyers one after the other, in the background, so a
/// drop keeps running while the test breaks something; the tally of every answer.
fn spawn_waves(
    apis: &[Api],
    sku: &'static str,
    waves: usize,
    answered: &Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<Tally> {
    let (apis, answered) = (apis.to_vec(), answered.clone());
    tokio::spawn(async move {
        let mut tally = Tally::default();
        for w in 0..waves {
            let wave = buyers(sku, &format!("w{w}"), 150);
            let results = release(&apis, &wave, &answered).await;
            tally.add(&wave, results);
        }
        tally
    })
}

pub(crate) async fn release(
    apis: &[Api],
    buyers: &[Buyer],
    answered: &Arc<AtomicUsize>,
) -> Vec<(u16, Value)> {
    // A client of its own that keeps no connection: a pooled one that the gateway closes as
    // idle (its header-read timeout) just as a later release reuses it would fail that buyer.
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    all_at_once(buyers.len(), |i| {
        // Built before the barrier (the token minted too), so the release sends at once.
        let api = &apis[i % apis.len()];
        let request = http
            .post(format!("{}/v1/skus/{}/claims", api.base, buyers[i].sku))
            .bearer_auth(token(&buyers[i].user));
        let answered = answered.clone();
        async move {
            let r = request
                .json(&serde_json::json!({"quantity": 1}))
                .send()
                .await;
            let out = match r {
                Ok(r) => {
                    let s = r.status().as_u16();
                    (s, r.json().await.unwrap_or(Value::Null))
                }
                Err(e) => (0, Value::String(format!("{e:?}"))),
            };
            answered.fetch_add(1, Ordering::Relaxed);
            out
        }
    })
    .await
}

/// A stream of buyers on `sku` until a replica has taken over from the SKU's master, which
/// is SIGKILLed once 100 units are sold: 15 buyers at a time (5 per gateway, started
/// together), each followed at once by the next, so claims are in flight at the kill and all
/// through the failover. Checks what must hold of every answer: only the contract's, every
/// buyer answered, every winner answered 201 shown as won, nobody answered 503 `unavailable`
/// holding a unit. Returns the killed master's port and the answers.
async fn kill_master_mid_drop(
    cluster: &mut PrivateCluster,
    fleet: &ClusterDrop,
    sku: &'static str,
    total: i64,
) -> (u16, Tally) {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stream = tokio::spawn(stream_buyers(fleet.apis.clone(), sku, 15, stop.clone()));
    wait_for(Duration::from_secs(60), || async {
        fleet
            .probe
            .stock(sku)
            .await
            .is_some_and(|s| s <= total - 100)
    })
    .await;
    let killed = cluster.kill_master_of(&sku_key(sku)).await;
    let promoted = cluster.wait_promoted(&sku_key(sku)).await;
    stop.store(true, Ordering::Relaxed);
    let tally = stream.await.unwrap();
    eprintln!(
        "master {killed} killed, {promoted} promoted: {} won, {} sold out, {} unavailable, {} unknown",
        tally.won.len(),
        tally.sold_out,
        tally.unavailable.len(),
        tally.unknown.len()
    );
    assert!(
        tally.other.is_empty(),
        "answers outside 201/409/503: {:?}",
        tally.other
    );
    assert_eq!(tally.no_answer, 0);
    for (id, user) in &tally.won {
        assert!(
            settled_won(&fleet.apis[1], user, *id).await,
            "winner {id} ({user}) was answered 201 and then lost"
        );
    }
    for user in &tally.unavailable {
        assert_eq!(
            fleet.probe.held(sku, user).await,
            0,
            "{user} was promised nothing"
        );
    }
    (killed, tally)
}

/// `workers` buyers at once (a barrier), worker `i` on gateway `i % apis.len()`, each claiming
/// one unit with a fresh user, then the next, until `stop`; returns every answer, tallied.
async fn stream_buyers(
    apis: Vec<Api>,
    sku: &'static str,
    workers: usize,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> Tally {
    let http = reqwest::Client::new();
    let per_worker = all_at_once(workers, |i| {
        let (api, http, stop) = (apis[i % apis.len()].clone(), http.clone(), stop.clone());
        async move {
            let mut tally = Tally::default();
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let b = Buyer {
                    sku: sku.to_string(),
                    user: format!("s{i}-{n}"),
                };
                n += 1;
                let r = http
                    .post(format!("{}/v1/skus/{sku}/claims", api.base))
                    .bearer_auth(token(&b.user))
                    .json(&serde_json::json!({"quantity": 1}))
                    .send()
                    .await;
                let out = match r {
                    Ok(r) => {
                        let s = r.status().as_u16();
                        (s, r.json().await.unwrap_or(Value::Null))
                    }
                    Err(e) => (0, Value::String(format!("{e:?}"))),
                };
                tally.add(&[b], vec![out]);
            }
            tally
        }
    })
    .await;
    let mut all = Tally::default();
    for t in per_worker {
        all.won.extend(t.won);
        all.sold_out += t.sold_out;
        all.unavailable.extend(t.unavailable);
        all.unknown.extend(t.unknown);
        all.no_answer += t.no_answer;
        all.other.extend(t.other);
    }
    all
}

/// [`release`] in rounds of at most 1,000 buyers, each round released together.
async fn release_in_rounds(apis: &[Api], buyers: &[Buyer]) -> Vec<(u16, Value)> {
    let mut out = Vec::with_capacity(buyers.len());
    for round in buyers.chunks(1000) {
        out.extend(release(apis, round, &Arc::new(AtomicUsize::new(0))).await);
    }
    out
}

/// Waits until the claim `id` of `user` is settled: `true` when it won (the gateway shows it),
/// `false` when it never will (404).
/// How many of a tally's `outcome_unknown` answers settle as won.
async fn settled_wins(api: &Api, tally: &Tally) -> i64 {
    let mut n = 0;
    for (id, user) in &tally.unknown {
        if settled_won(api, user, *id).await {
            n += 1;
        }
    }
    n
}

pub(crate) async fn settled_won(api: &Api, user: &str, id: Uuid) -> bool {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = api
            .http
            .get(format!("{}/v1/claims/{id}", api.base))
            .bearer_auth(token(user))
            .send()
            .await;
        match r.map(|r| r.status().as_u16()) {
            Ok(200) => return true,
            Ok(404) => return false,
            _ => {}
        }
        assert!(Instant::now() < deadline, "claim {id} never settled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The answers of one drop, sorted by kind.
#[derive(Default, Debug)]
pub(crate) struct Tally {
    /// Claim ids answered 201, with their user.
    pub(crate) won: Vec<(Uuid, String)>,
    pub(crate) sold_out: usize,
    /// Users answered 503 `unavailable`: promised that nothing moved.
    pub(crate) unavailable: Vec<String>,
    /// 503 `outcome_unknown`: claim id and user, to be settled by reading.
    pub(crate) unknown: Vec<(Uuid, String)>,
    /// Connection failures (a gateway killed under its buyers).
    pub(crate) no_answer: usize,
    /// Anything else, with its body: the contract allows none of it here.
    pub(crate) other: Vec<(u16, Value)>,
}

impl Tally {
    pub(crate) fn add(&mut self, buyers: &[Buyer], results: Vec<(u16, Value)>) {
        for (b, (status, body)) in buyers.iter().zip(results) {
            let id = || -> Uuid { body["claim_id"].as_str().unwrap().parse().unwrap() };
            match (status, code(&body)) {
                (201, _) => self.won.push((id(), b.user.clone())),
                (409, "sold_out") => self.sold_out += 1,
                (503, "unavailable") => self.unavailable.push(b.user.clone()),
                (503, "outcome_unknown") => self.unknown.push((id(), b.user.clone())),
                (0, _) => {
                    if self.no_answer == 0 {
                        eprintln!("first unanswered claim: {body}");
                    }
                    self.no_answer += 1
                }
                _ => self.other.push((status, body)),
            }
        }
    }

    pub(crate) fn won_ids(&self) -> HashSet<Uuid> {
        self.won.iter().map(|(id, _)| *id).collect()
    }
}

/// Every user's count is within the limit of 1, and they add up to `units`.
pub(crate) async fn counts_within_limit(probe: &ClusterProbe, sku: &str, units: i64) {
    let counts = probe.counts(sku).await;
    let over: Vec<_> = counts.iter().filter(|(_, &n)| n > 1).collect();
    assert!(over.is_empty(), "{sku}: users over the limit: {over:?}");
    assert_eq!(
        counts.values().sum::<i64>(),
        units,
        "{sku}: per-user counts"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drop_on_many_skus_across_every_master_sells_out_exactly_and_writes_every_winner() {
    let _heavy = crate::helpers::heavy().await;
    let started = Instant::now();
    let cluster = PrivateCluster::start(3, 1).await;
    let fleet = ClusterDrop::start(&cluster, &[]).await;
    // Two SKUs on each master: the drop touches every node.
    let skus = skus_on_every_master(&cluster, "wide", 2).await;
    let mut by_master: HashMap<u16, Vec<String>> = HashMap::new();
    for sku in &skus {
        let master = cluster.master_of(&sku_key(sku)).await;
        by_master.entry(master).or_default().push(sku.clone());
        assert_eq!(fleet.apis[0].declare(sku, 100, 1).await.status(), 201);
    }
    assert_eq!(by_master.len(), 3, "the SKUs' slots cover every master");

    // 1,000 buyers per SKU, each SKU's released together and spread over the three gateways,
    // the SKUs in turn, masters alternating (a thousand requests at once is what two cores,
    // shared with the other tests, send within the gateway's 5 s header-read timeout; three
    // thousand was not, under a parallel run).
    let mut per_sku: HashMap<String, Tally> = HashMap::new();
    let mut order: Vec<&String> = Vec::new();
    for round in 0..2 {
        order.extend(by_master.values().map(|on_master| &on_master[round]));
    }
    for sku in order {
        let all = buyers(sku, &format!("{sku}-b"), 1000);
        let results = release(&fleet.apis, &all, &Arc::new(AtomicUsize::new(0))).await;
        per_sku.entry(sku.clone()).or_default().add(&all, results);
    }
    for sku in &skus {
        let t = &per_sku[sku];
        assert!(
            t.other.is_empty() && t.unavailable.is_empty() && t.unknown.is_empty(),
            "{sku}: answers other than 201/409: {:?}",
            (&t.other, &t.unavailable, &t.unknown, t.no_answer)
        );
        assert_eq!(t.no_answer, 0, "{sku}: every buyer got an answer");
        assert_eq!(t.won.len(), 100, "{sku}: exactly the units were won");
        assert_eq!(t.sold_out, 900, "{sku}");
        assert_eq!(fleet.probe.stock(sku).await, Some(0), "{sku}");
        let v = fleet.apis[1].drained(sku).await;
        assert_eq!(v["recorded"], 100, "{sku}: {v}");
        assert_eq!(v["consistent"], true, "{sku}: {v}");
        let issued: HashSet<Uuid> = fleet.issued_ids(sku).await.into_iter().collect();
        assert_eq!(
            issued,
            t.won_ids(),
            "{sku}: issuances are exactly the winners"
        );
        counts_within_limit(&fleet.probe, sku, 100).await;
    }
    eprintln!(
        "{} SKUs x 1000 buyers on 3 masters: {:?}",
        skus.len(),
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_migrated_mid_drop_oversells_nothing_and_loses_no_winner() {
    let _heavy = crate::helpers::heavy().await;
    let started = Instant::now();
    let cluster = PrivateCluster::start(3, 1).await;
    let fleet = ClusterDrop::start(&cluster, &[]).await;
    let sku = "migrating";
    let total = 1000;
    assert_eq!(fleet.apis[0].declare(sku, total, 1).await.status(), 201);
    let from = cluster.master_of(&sku_key(sku)).await;
    let to = cluster.other_master(&sku_key(sku)).await;

    // Buyers in waves of 150 (3,000 in all), so the drop is still running while the slot moves.
    let answered = Arc::new(AtomicUsize::new(0));
    let waves = spawn_waves(&fleet.apis, sku, 20, &answered);

    // Once the drop is under way the slot starts moving; half its keys go, and claims keep
    // coming while the SKU's keys are split between two masters.
    wait_for(Duration::from_secs(60), || async {
        answered.load(Ordering::Relaxed) >= 150
    })
    .await;
    let mut migration = cluster.begin_migration(&sku_key(sku), to).await;
    let keys = migration.keys_left().await;
    let half = migration.move_keys(keys.div_ceil(2)).await;
    assert!(
        half >= 1 && migration.keys_left().await >= 1,
        "the slot is split"
    );
    let at_split = answered.load(Ordering::Relaxed);
    wait_for(Duration::from_secs(120), || async {
        answered.load(Ordering::Relaxed) >= at_split + 450 || waves.is_finished()
    })
    .await;
    let during_split = answered.load(Ordering::Relaxed) - at_split;
    // Every key moved, the slot not yet handed over: the old owner answers ASK for all of
    // them and claims are sent on to the new one (ASKING), while the cluster still names the
    // old. (claim.lua also names keys a SKU without holds never has, `holds` and `expiry`:
    // an importing node answers TRYAGAIN to a script whose keys are not all there, so these
    // claims are refused too, 503 `unavailable` with nothing moved, until the handover.)
    while migration.move_keys(100).await > 0 {}
    let at_ask = answered.load(Ordering::Relaxed);
    wait_for(Duration::from_secs(120), || async {
        answered.load(Ordering::Relaxed) >= at_ask + 450 || waves.is_finished()
    })
    .await;
    let during_ask = answered.load(Ordering::Relaxed) - at_ask;
    let stock_at_handover = fleet.probe.stock(sku).await;
    migration.finish().await;
    assert_eq!(cluster.master_of(&sku_key(sku)).await, to);

    let mut tally = waves.await.unwrap();
    assert!(
        tally.other.is_empty(),
        "answers outside 201/409/503: {:?}",
        tally.other
    );
    assert_eq!(tally.no_answer, 0);
    eprintln!(
        "slot moved from master {from} to {to}: {} won, {} sold out, {} unavailable, {} unknown; {during_split} answered while split, {during_ask} while asked over (stock then {stock_at_handover:?})",
        tally.won.len(),
        tally.sold_out,
        tally.unavailable.len(),
        tally.unknown.len()
    );

    // Every unknown outcome settles; those that won are winners like the 201s.
    let mut won = tally.won_ids();
    for (id, user) in std::mem::take(&mut tally.unknown) {
        if settled_won(&fleet.apis[0], &user, id).await {
            won.insert(id);
        }
    }
    let v = fleet.apis[2].drained(sku).await;
    assert_eq!(v["consistent"], true, "{v}");
    let issued: HashSet<Uuid> = fleet.issued_ids(sku).await.into_iter().collect();
    assert_eq!(issued, won, "issuances are exactly the winners");
    let stock = fleet.probe.stock(sku).await.unwrap();
    assert_eq!(stock + won.len() as i64, total, "stock + won = total");
    counts_within_limit(&fleet.probe, sku, won.len() as i64).await;
    // Nobody answered 503 `unavailable` holds a unit.
    for user in &tally.unavailable {
        assert_eq!(
            fleet.probe.held(sku, user).await,
            0,
            "{user} was promised nothing"
        );
    }

    // On its new master the SKU sells exactly what is left.
    let rest = buyers(sku, "after", stock as usize + 100);
    let mut after = Tally::default();
    after.add(&rest, release_in_rounds(&fleet.apis, &rest).await);
    assert_eq!(after.won.len() as i64, stock, "{after:?}");
    assert_eq!(fleet.probe.stock(sku).await, Some(0));
    let v = fleet.apis[0].drained(sku).await;
    assert_eq!(v["recorded"], total, "{v}");
    assert_eq!(v["consistent"], true, "{v}");
    eprintln!("migration test: {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_killed_mid_drop_loses_no_answered_winner_and_oversells_nothing() {
    let _heavy = crate::helpers::heavy().await;
    let started = Instant::now();
    // Two replicas per master: after the failover the promoted master still has one, so
    // the one-replica acknowledgement a win waits for can be given again.
    let mut cluster = PrivateCluster::start(3, 2).await;
    let fleet = ClusterDrop::start(&cluster, &[]).await;
    let sku = "failover";
    let total = 1500;
    assert_eq!(fleet.apis[0].declare(sku, total, 1).await.status(), 201);
    let (_, mut tally) = kill_master_mid_drop(&mut cluster, &fleet, sku, total).await;

    // Unknown outcomes settle; those that won are winners like the 201s.
    let mut won = tally.won_ids();
    for (id, user) in std::mem::take(&mut tally.unknown) {
        if settled_won(&fleet.apis[0], &user, id).await {
            won.insert(id);
        }
    }
    // The writers get every one of them into the ledger (whatever the SKU's Redis state).
    let deadline = Instant::now() + Duration::from_secs(30);
    let issued = loop {
        let issued: HashSet<Uuid> = fleet.issued_ids(sku).await.into_iter().collect();
        if issued.is_superset(&won) || Instant::now() > deadline {
            break issued;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let lost: Vec<_> = tally.won_ids().difference(&issued).copied().collect();
    assert!(
        lost.is_empty(),
        "answered winners missing from issuances: {lost:?}"
    );
    assert!(issued.is_superset(&won), "every settled winner is written");
    assert!(
        issued.len() as i64 <= total,
        "oversold: {} > {total}",
        issued.len()
    );
    let v = fleet.apis[0].view(sku).await;

    // After the promotion the SKU sells on, or fails closed (503) until restore.
    let left_at_promotion = fleet.probe.stock(sku).await;
    let probe_buyer = buyers(sku, "after-failover", 1);
    let mut first = Tally::default();
    first.add(
        &probe_buyer,
        release(&fleet.apis, &probe_buyer, &Arc::new(AtomicUsize::new(0))).await,
    );
    let mut sold_after = first.won.len() as i64;
    assert!(
        first.sold_out == 0,
        "{left_at_promotion:?} units were left, yet the first buyer after the failover was refused: {first:?}"
    );
    if !first.unavailable.is_empty() || !first.unknown.is_empty() {
        eprintln!("after failover the SKU fails closed: {first:?}; view {v}");
        let r = fleet.apis[2].restore(sku, false).await;
        let r = if r.status() == 409 {
            fleet.apis[2].restore(sku, true).await
        } else {
            r
        };
        assert_eq!(r.status(), 200, "restore: {:?}", r.text().await);
    } else {
        assert!(first.other.is_empty(), "{first:?}");
    }
    let v = fleet.apis[0].drained(sku).await;
    assert_eq!(v["consistent"], true, "{v}");
    let recorded = v["recorded"].as_i64().unwrap();
    let left = fleet.probe.stock(sku).await.unwrap();
    assert_eq!(left + recorded, total, "stock + recorded = total: {v}");
    // ...and sells exactly what is left.
    let rest = buyers(sku, "rest", 2 * left as usize + 100);
    let mut after = Tally::default();
    after.add(&rest, release_in_rounds(&fleet.apis, &rest).await);
    assert!(
        after.other.is_empty() && after.unavailable.is_empty(),
        "{after:?}"
    );
    // A replica slow to acknowledge on this loaded machine makes a win outcome_unknown: it
    // counts once settled.
    let won_after = after.won.len() as i64 + settled_wins(&fleet.apis[0], &after).await;
    sold_after += won_after;
    assert_eq!(won_after, left, "{after:?}");
    assert_eq!(fleet.probe.stock(sku).await, Some(0));
    let v = fleet.apis[1].drained(sku).await;
    assert_eq!(v["recorded"], total, "{v}");
    assert_eq!(v["consistent"], true, "{v}");
    counts_within_limit(&fleet.probe, sku, total).await;
    assert!(
        sold_after > 0,
        "the drop sold out before the failover was over"
    );
    eprintln!(
        "failover test: {sold_after} sold after promotion, {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_killed_on_a_one_replica_cluster_sells_on_or_fails_closed_and_sells_exactly_the_rest_once_a_replica_is_back(
) {
    let _heavy = crate::helpers::heavy().await;
    let started = Instant::now();
    // One replica per master, the usual layout: after the failover the promoted master has
    // none until the dead node comes back (as its replica).
    let mut cluster = PrivateCluster::start(3, 1).await;
    let fleet = ClusterDrop::start(&cluster, &[]).await;
    let sku = "lonely";
    let total = 1500;
    assert_eq!(fleet.apis[0].declare(sku, total, 1).await.status(), 201);
    let (killed, mut tally) = kill_master_mid_drop(&mut cluster, &fleet, sku, total).await;
    // What the contract promises and this layout breaks is collected, and asserted last, after
    // the checks of what must hold whatever the layout.
    let mut broken: Vec<String> = Vec::new();

    // Buyers while the promoted master has no replica: the SKU sells on (201, written) or
    // fails closed (503 `unavailable`, nothing moved).
    let round = buyers(sku, "alone", 300);
    let mut alone = Tally::default();
    alone.add(
        &round,
        release(&fleet.apis, &round, &Arc::new(AtomicUsize::new(0))).await,
    );
    assert!(alone.other.is_empty() && alone.no_answer == 0, "{alone:?}");
    for user in &alone.unavailable {
        assert_eq!(
            fleet.probe.held(sku, user).await,
            0,
            "{user} was promised nothing"
        );
    }
    // A claim still unknown (no replica holds it) is unknown to GET too: 503 outcome_unknown
    // again, never "won" (a failover now would take the claim away with its master).
    let mut shown_won_unreplicated = 0;
    for (id, user) in &alone.unknown {
        let r = fleet.apis[2]
            .http
            .get(format!("{}/v1/claims/{id}", fleet.apis[2].base))
            .bearer_auth(token(user))
            .send()
            .await
            .unwrap();
        if r.status() == 200 {
            shown_won_unreplicated += 1;
        }
    }
    if shown_won_unreplicated > 0 {
        broken.push(format!(
            "GET /v1/claims/{{id}} answered 200 for {shown_won_unreplicated} claims answered 503 \
             outcome_unknown that no replica holds yet (the settler still counts them unknown)"
        ));
    }
    let mut won = tally.won_ids();
    won.extend(alone.won_ids());
    for (id, user) in std::mem::take(&mut tally.unknown) {
        if settled_won(&fleet.apis[0], &user, id).await {
            won.insert(id);
        }
    }
    let mut told_503_but_won = 0;
    for (id, user) in &alone.unknown {
        if settled_won(&fleet.apis[0], user, *id).await {
            won.insert(*id);
            told_503_but_won += 1;
        }
    }
    eprintln!(
        "with no replica: {} won, {} sold out, {} unavailable, {} unknown ({told_503_but_won} of them won)",
        alone.won.len(),
        alone.sold_out,
        alone.unavailable.len(),
        alone.unknown.len()
    );
    if told_503_but_won > 0 {
        broken.push(format!(
            "with no replica behind the promoted master, {told_503_but_won} of 300 buyers were \
             answered 503 outcome_unknown for claims that won (stock spent, buyer told 503): \
             neither selling on nor failing closed"
        ));
    }
    let answered: HashSet<Uuid> = tally.won_ids().union(&alone.won_ids()).copied().collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    let unwritten = loop {
        let issued: HashSet<Uuid> = fleet.issued_ids(sku).await.into_iter().collect();
        let missing = answered.difference(&issued).count();
        if missing == 0 || Instant::now() > deadline {
            break missing;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    if unwritten > 0 {
        broken.push(format!(
            "{unwritten} winners answered 201 were still not in issuances 10 s after the failover: \
             the writers stall while the promoted master has no replica"
        ));
    }

    // The dead node comes back, as the promoted master's replica: everything drains.
    cluster.restart(killed).await;
    let v = fleet.apis[1].drained(sku).await;
    assert_eq!(v["consistent"], true, "{v}");
    let issued: HashSet<Uuid> = fleet.issued_ids(sku).await.into_iter().collect();
    assert_eq!(issued, won, "issuances are exactly the winners");
    let left = fleet.probe.stock(sku).await.unwrap();
    assert_eq!(
        left + issued.len() as i64,
        total,
        "stock + recorded = total"
    );
    let rest = buyers(sku, "rest", 2 * left as usize + 100);
    let mut after = Tally::default();
    after.add(&rest, release_in_rounds(&fleet.apis, &rest).await);
    assert!(
        after.other.is_empty() && after.unavailable.is_empty(),
        "{after:?}"
    );
    let won_after = after.won.len() as i64 + settled_wins(&fleet.apis[0], &after).await;
    assert_eq!(won_after, left, "sells exactly what is left");
    let v = fleet.apis[1].drained(sku).await;
    assert_eq!(v["recorded"], total, "{v}");
    assert_eq!(v["consistent"], true, "{v}");
    counts_within_limit(&fleet.probe, sku, total).await;
    eprintln!("one-replica failover test: {:?}", started.elapsed());
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_sigkilled_on_a_cluster_has_its_journal_entries_taken_over() {
    let _heavy = crate::helpers::heavy().await;
    let started = Instant::now();
    let cluster = PrivateCluster::start(3, 1).await;
    let mut fleet =
        ClusterDrop::start(&cluster, &[("DROPGATE_JOURNAL_CLAIM_IDLE_MS", "500")]).await;
    let sku = "takeover";
    let total = 300;
    assert_eq!(fleet.apis[0].declare(sku, total, 1).await.status(), 201);

    // No writer can commit while the test holds this lock: every winner a writer reads stays
    // pending in its consumer's list, so the gateway killed below surely dies holding some.
    let mut lock = fleet.db.begin().await.unwrap();
    sqlx::query("LOCK TABLE issuances IN SHARE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();

    let answered = Arc::new(AtomicUsize::new(0));
    let waves = spawn_waves(&fleet.apis, sku, 8, &answered);
    // Each gateway's writer holds entries of its own.
    let journal = fleet.probe.key(sku, "journal");
    wait_for(Duration::from_secs(60), || async {
        pending_by_consumer(&fleet.probe, &journal)
            .await
            .values()
            .filter(|&&n| n > 0)
            .count()
            >= 3
    })
    .await;
    let before = pending_by_consumer(&fleet.probe, &journal).await;
    fleet.gateways[0].sigkill().await;
    let tally = waves.await.unwrap();
    lock.rollback().await.unwrap();

    // Buyers of the killed gateway after its death got no answer; nobody got anything else
    // unexpected.
    assert!(tally.other.is_empty(), "{:?}", tally.other);
    assert!(
        tally.unavailable.is_empty() && tally.unknown.is_empty(),
        "{tally:?}"
    );
    let won = tally.won_ids();
    assert!(!won.is_empty());

    let v = fleet.apis[1].drained(sku).await;
    let issued: HashSet<Uuid> = fleet.issued_ids(sku).await.into_iter().collect();
    let lost: Vec<_> = won.difference(&issued).collect();
    assert!(
        lost.is_empty(),
        "winners lost with the killed gateway: {lost:?}"
    );
    // Beyond the 201s, only claims whose answer died with the gateway may have won.
    assert!(
        issued.len() <= won.len() + tally.no_answer,
        "{} issued for {} answered winners and {} unanswered",
        issued.len(),
        won.len(),
        tally.no_answer
    );
    assert_eq!(v["consistent"], true, "{v}");
    let stock = fleet.probe.stock(sku).await.unwrap();
    assert_eq!(stock + issued.len() as i64, total);
    // Nothing is left pending: the dead gateway's entries were taken over and acknowledged.
    let after = pending_by_consumer(&fleet.probe, &journal).await;
    assert!(
        after.values().all(|&n| n == 0),
        "entries still pending: {after:?} (before the kill: {before:?})"
    );
    eprintln!(
        "takeover test: {} won, pending at the kill {before:?}, {:?}",
        won.len(),
        started.elapsed()
    );
}

/// The writers' consumer group on every journal (`dropgate::keys::JOURNAL_GROUP`).
const WRITERS_GROUP: &str = "writers";

/// Entries pending per consumer of the writers' group on `journal` (`XINFO CONSUMERS`).
async fn pending_by_consumer(probe: &ClusterProbe, journal: &str) -> HashMap<String, i64> {
    let mut con = probe.redis.clone();
    let consumers: Vec<HashMap<String, redis::Value>> = redis::cmd("XINFO")
        .arg("CONSUMERS")
        .arg(journal)
        .arg(WRITERS_GROUP)
        .query_async(&mut con)
        .await
        .unwrap_or_default();
    consumers
        .into_iter()
        .map(|c| {
            let name: String = redis::from_redis_value(c["name"].clone()).unwrap();
            let pending: i64 = redis::from_redis_value(c["pending"].clone()).unwrap();
            (name, pending)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_rows_compensate_restore_rebuilds_and_reconcile_balances_on_a_cluster() {
    let _heavy = crate::helpers::heavy().await;
    let cluster = PrivateCluster::start(3, 1).await;
    let fleet = ClusterDrop::start(&cluster, &[("DROPGATE_REPROCESS_MAX_ATTEMPTS", "2")]).await;
    crate::durability::install_trigger(&fleet.db).await;
    // One SKU per master: the reprocessor's give-backs and restore's rebuild each reach the
    // SKU's own node.
    let skus = skus_on_every_master(&cluster, "comp", 1).await;
    for sku in &skus {
        assert_eq!(fleet.apis[0].declare(sku, 100, 1).await.status(), 201);
        // 60 buyers, every third one's row refused by PostgreSQL until it is compensated.
        let buyers: Vec<String> = (0..60)
            .map(|i| format!("{}-{i}", if i % 3 == 0 { "bad" } else { "good" }))
            .collect();
        let results = release_buyers(&fleet.apis[1], sku, buyers).await;
        assert_eq!(won_ids(&results).len(), 60);
    }
    for sku in &skus {
        let sku_ref = sku.as_str();
        wait_for(Duration::from_secs(60), || async {
            let v = fleet.apis[2].view(sku_ref).await;
            v["compensated"] == 20 && v["recorded"] == 40 && v["pending"] == 0
        })
        .await;
        // The compensations gave 20 units back to the SKU's own node: 100 - 40 written.
        assert_eq!(fleet.probe.stock(sku).await, Some(60), "{sku}");
        assert_eq!(fleet.apis[2].view(sku).await["consistent"], true);
    }

    // Redis loses one SKU: every key of its slot on its master is deleted.
    let lost = &skus[0];
    let master = cluster.master_of(&sku_key(lost)).await;
    let slot = cluster.slot_of(&sku_key(lost)).await;
    let mut con = cluster.connection().await;
    for key in PrivateCluster::keys_in_slot(master, slot, 10_000).await {
        let _: i64 = redis::cmd("DEL")
            .arg(&key)
            .query_async(&mut con)
            .await
            .unwrap();
    }
    assert_eq!(fleet.probe.stock(lost).await, None);
    let r = fleet.apis[0].claim(lost, "late-1", 1, None).await;
    assert_eq!(r.status(), 503, "a lost SKU fails closed");
    assert_eq!(fleet.apis[1].restore(lost, false).await.status(), 200);
    assert_eq!(fleet.probe.stock(lost).await, Some(60));
    let v = fleet.apis[2].view(lost).await;
    assert_eq!(v["consistent"], true, "{v}");
    // The 40 holders keep their count: none of them wins again.
    let again = release_buyers(&fleet.apis[0], lost, vec!["good-1".to_string()]).await;
    assert_eq!(won_ids(&again).len(), 0, "{again:?}");

    // reconcile reads every SKU on its own node.
    let db_url = fleet
        .db
        .connect_options()
        .get_database()
        .map(|d| format!("postgres://postgres@127.0.0.1:5432/{d}"));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dropgate"))
        .arg("reconcile")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("REDIS_URL", cluster.urls())
        .env("DATABASE_URL", db_url.unwrap())
        .env("DROPGATE_KEY_PREFIX", &fleet.probe.prefix)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{table}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for sku in &skus {
        assert!(table.contains(sku.as_str()), "{table}");
    }
}
