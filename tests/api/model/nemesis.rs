//! The gateway model's nemesis: one seeded fault every 150–400 ms while the clients run.
//! Redis: stalled, slowed, black-holed, every connection cut, a reply cut mid-way, paused,
//! SIGKILLed and restarted on its fsync-always AOF, rolled back to an older copy of its data.
//! PostgreSQL: stalled, every connection cut. A gateway: SIGKILLed and restarted.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::gateway::SKUS;
use crate::helpers::{Api, Isolation};
use crate::proxy::{FaultProxy, Mode};
use crate::services::{pause_redis, GatewayProcess, PrivateRedis};

pub struct Nemesis {
    pub redis: PrivateRedis,
    pub redis_proxy: Arc<FaultProxy>,
    pub pg_proxy: Arc<FaultProxy>,
    pub gateways: Vec<GatewayProcess>,
    /// The gateways the clients may use (a killed one leaves it until restarted).
    pub bases: Arc<Mutex<Vec<String>>>,
    pub iso: Isolation,
    pub env: Vec<(&'static str, String)>,
    /// Redis as the gateways see it (through the proxy).
    pub redis_url: String,
    /// Write side held while a rollback is staged: no client step runs meanwhile.
    pub gate: Arc<tokio::sync::RwLock<()>>,
    /// A copy of Redis's data taken earlier, to come back to.
    pub snapshot: Option<PathBuf>,
}

impl Nemesis {
    /// Runs until `done`; returns how many faults it caused (and itself, to keep the services
    /// alive for the final checks).
    pub async fn run(mut self, seed: u64, done: Arc<AtomicBool>) -> (u32, Self) {
        let mut rng = StdRng::seed_from_u64(seed.rotate_left(17));
        let mut faults = 0u32;
        while !done.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(rng.random_range(150..400))).await;
            faults += 1;
            match rng.random_range(0..12) {
                0 => {
                    self.redis_proxy.set(Mode::Stall);
                    tokio::time::sleep(Duration::from_millis(rng.random_range(100..700))).await;
                    self.redis_proxy.set(Mode::Pass);
                }
                1 => {
                    let d = Duration::from_millis(rng.random_range(20..200));
                    self.redis_proxy.set(Mode::Latency(d));
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    self.redis_proxy.set(Mode::Pass);
                }
                2 => self.redis_proxy.cut_all(),
                3 => self.redis_proxy.cut_replies_after(rng.random_range(1..200)),
                4 => pause_redis(&self.redis.url(), rng.random_range(200..600)).await,
                5 => {
                    self.pg_proxy.set(Mode::Stall);
                    tokio::time::sleep(Duration::from_millis(rng.random_range(300..1200))).await;
                    self.pg_proxy.set(Mode::Pass);
                }
                6 => self.pg_proxy.cut_all(),
                7 => {
                    self.restart_gateway(rng.random_range(0..self.gateways.len()))
                        .await
                }
                8 => {
                    // fsync-always AOF: a SIGKILL loses nothing Redis acknowledged.
                    self.redis.kill();
                    self.redis.restart().await;
                }
                9 => self.roll_back().await,
                10 => {
                    // Requests vanish on the way (and replies): then every connection is cut.
                    self.redis_proxy.set(Mode::BlackHole);
                    tokio::time::sleep(Duration::from_millis(rng.random_range(100..500))).await;
                    self.redis_proxy.set(Mode::Pass);
                    self.redis_proxy.cut_all();
                }
                _ => {}
            }
        }
        (faults, self)
    }

    async fn restart_gateway(&mut self, i: usize) {
        self.gateways[i].sigkill().await;
        let gone = self.gateways[i].base.clone();
        self.bases.lock().retain(|b| *b != gone);
        let env: Vec<(&str, &str)> = self.env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        // A start under faults may fail fast (as it should): try again.
        self.gateways[i] = loop {
            match GatewayProcess::try_start(&self.iso, &self.redis_url, &env).await {
                Ok(g) => break g,
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        };
        self.bases.lock().push(self.gateways[i].base.clone());
    }

    /// The first time, copies Redis's data; the next time, brings Redis back with that older
    /// copy. The clients are held and the writer drained first, so every winner is in the
    /// ledger: what is lost is only Redis's memory of sales, which must be detected (stale),
    /// never sold again.
    async fn roll_back(&mut self) {
        let Some(snapshot) = self.snapshot.take() else {
            self.snapshot = Some(self.redis.snapshot());
            return;
        };
        let _quiet = self.gate.write().await;
        let api = Api::new(self.bases.lock()[0].clone());
        for (sku, _, _) in SKUS {
            for _ in 0..300 {
                let r = api
                    .http
                    .get(format!("{}/admin/skus/{sku}", api.base))
                    .bearer_auth(crate::helpers::ADMIN)
                    .send()
                    .await;
                let drained = match r {
                    Ok(r) => r.json::<serde_json::Value>().await.is_ok_and(|v| {
                        v["in_flight"] == 0 && v["pending"] == 0 || v["remaining"].is_null()
                    }),
                    Err(_) => false,
                };
                if drained {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        // Past one refresh of every gateway's marks (1 s): the rollback then loses more than
        // what any gateway could still be unaware of, which is the case dropgate detects
        // before a sale (docs/durability.md, "Other limits", names the shorter window).
        tokio::time::sleep(Duration::from_millis(1500)).await;
        self.redis.kill();
        self.redis.roll_back_to(&snapshot);
        self.redis.restart().await;
    }
}
