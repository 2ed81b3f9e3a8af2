//! The nemesis's longer faults: a Redis rollback (with or without every gateway restarted on
//! it), a partition of one gateway, and PostgreSQL locked or unreachable for the run's outage.

use std::time::Duration;

use super::Nemesis;
use crate::helpers::{Api, ADMIN};
use crate::model::gateway::skus::SKUS;
use crate::proxy::Mode;

impl Nemesis {
    /// The first time, copies Redis's data; the next time, brings Redis back with that older
    /// copy, and with `restart_gateways` every gateway restarts on it (a fresh gateway knows
    /// only the ledger's marks). The clients are held and the writer drained first, so every
    /// winner is in the ledger: what is lost is only Redis's memory of sales and of holds and
    /// the line, which must be detected (stale), never sold or offered again.
    ///
    /// An operator then restores every SKU `operator` later, as the runbook says (a restore of
    /// a SKU that is not stale is refused and changes nothing): the clients meanwhile meet the
    /// stale states, and afterwards sell from the rebuilt ones.
    pub(super) async fn roll_back(&mut self, restart_gateways: bool, operator: Duration) {
        let Some(snapshot) = self.snapshot.take() else {
            self.snapshot = Some(self.redis.snapshot());
            return;
        };
        // A rollback over a ledger that cannot be written (a lock held) would lose the
        // unwritten winners by the test's hand, not the gateway's.
        if let Some(lock) = self.lock.take() {
            let _ = lock.await;
        }
        let _quiet = self.gate.clone().write_owned().await;
        let api = Api::new(self.bases.lock()[0].clone());
        for s in SKUS {
            let mut settled = false;
            for _ in 0..1200 {
                let r = api
                    .http
                    .get(format!("{}/admin/skus/{}", api.base, s.name))
                    .bearer_auth(ADMIN)
                    .send()
                    .await;
                let drained = match r {
                    Ok(r) => r.json::<serde_json::Value>().await.is_ok_and(|v| {
                        v["in_flight"] == 0 && v["pending"] == 0 || v["remaining"].is_null()
                    }),
                    Err(_) => false,
                };
                // `in_flight` nets unwritten wins against unwritten give-backs (a cancel, an
                // expiry): only empty journals say every decision is in the ledger.
                let drained = drained && self.journals_empty(s.name).await;
                if drained {
                    settled = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if !settled {
                // What the rollback then loses of this SKU is lost by the test's hand: said, so
                // that a failure it explains is not taken for the gateway's.
                eprintln!(
                    "gateway model: rollback with {}'s journal not drained after 60 s",
                    s.name
                );
            }
        }
        // Past one refresh of every gateway's marks (1 s): the rollback then loses more than
        // what any gateway could still be unaware of, which is the case dropgate detects
        // before a sale (docs/durability.md, "Other limits", names the shorter window).
        tokio::time::sleep(Duration::from_millis(1500)).await;
        self.redis.kill();
        self.redis.roll_back_to(&snapshot);
        self.redis.restart().await;
        if restart_gateways {
            for i in 0..self.gateways.len() {
                self.restart_gateway(i).await;
            }
        }
        let bases = self.bases.clone();
        tokio::spawn(async move {
            tokio::time::sleep(operator).await;
            for s in SKUS {
                // Retried while the restore cannot run (a fault of the moment): 200 rebuilt,
                // 409 not stale (or rebuilt by someone else).
                for _ in 0..50 {
                    let Some(base) = bases.lock().first().cloned() else {
                        break;
                    };
                    let r = reqwest::Client::new()
                        .post(format!("{base}/admin/skus/{}/restore", s.name))
                        .bearer_auth(ADMIN)
                        .timeout(Duration::from_secs(20))
                        .send()
                        .await;
                    if r.is_ok_and(|r| matches!(r.status().as_u16(), 200 | 409)) {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        });
    }

    async fn journals_empty(&self, sku: &str) -> bool {
        let Ok(client) = redis::Client::open(self.redis.url()) else {
            return false;
        };
        let Ok(mut con) = client.get_multiplexed_async_connection().await else {
            return false;
        };
        for name in crate::model::gateway::monitor::shard_names(sku) {
            let key = format!("{}:{{{name}}}:journal", self.iso.prefix);
            let len: redis::RedisResult<i64> =
                redis::cmd("XLEN").arg(&key).query_async(&mut con).await;
            if len.map_or(true, |n| n > 0) {
                return false;
            }
        }
        true
    }

    /// Gateway `i` cut off from Redis and PostgreSQL (its requests and their replies vanish),
    /// then every connection it had is cut, as when a partition heals.
    pub(super) async fn partition(&mut self, i: usize, d: Duration) {
        self.redis_proxies[i].set(Mode::BlackHole);
        self.pg_proxies[i].set(Mode::BlackHole);
        tokio::time::sleep(d).await;
        self.redis_proxies[i].set(Mode::Pass);
        self.pg_proxies[i].set(Mode::Pass);
        self.redis_proxies[i].cut_all();
        self.pg_proxies[i].cut_all();
    }

    /// `LOCK TABLE issuances IN SHARE MODE` for the run's outage, in the background: reads
    /// go on, every write of the ledger waits (the writer's, a restock's, a restore's).
    pub(super) fn lock_issuances(&mut self) {
        if self.lock.as_ref().is_some_and(|l| !l.is_finished()) {
            return;
        }
        let (db, hold) = (
            self.db.clone(),
            Duration::from_millis(self.knobs.pg_outage_ms),
        );
        self.lock = Some(tokio::spawn(async move {
            let Ok(mut tx) = db.begin().await else { return };
            if sqlx::query("LOCK TABLE issuances IN SHARE MODE")
                .execute(&mut *tx)
                .await
                .is_ok()
            {
                tokio::time::sleep(hold).await;
            }
            let _ = tx.commit().await;
        }));
    }

    /// PostgreSQL unreachable from every gateway for the run's outage: connections cut,
    /// new ones hang. The clients go on (Redis decides; the winners wait in the journal).
    pub(super) async fn pg_down(&mut self) {
        self.pg_all(Mode::BlackHole);
        self.pg_proxies.iter().for_each(|p| p.cut_all());
        tokio::time::sleep(Duration::from_millis(self.knobs.pg_outage_ms)).await;
        self.pg_all(Mode::Pass);
        self.pg_proxies.iter().for_each(|p| p.cut_all());
    }
}
