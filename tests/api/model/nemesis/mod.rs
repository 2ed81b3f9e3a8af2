//! The gateway model's nemesis: one seeded fault every 150–400 ms while the clients run.
//! Redis: stalled, slowed, black-holed, every connection cut, a reply cut mid-way, paused,
//! SIGKILLed and restarted on its fsync-always AOF, rolled back to an older snapshot (with and
//! without every gateway restarted on it). PostgreSQL: stalled, every connection cut,
//! unreachable or its `issuances` locked for `GATEWAY_MODEL_PG_OUTAGE_MS`. NATS: SIGKILLed and
//! restarted. A gateway: SIGKILLed mid-request or between steps and restarted, partitioned
//! from Redis and PostgreSQL, restarted with its clock 30 s ahead or behind (libfaketime).
//! Each gateway reaches Redis and PostgreSQL through proxies of its own, so a partition can
//! cut one gateway off while the other serves.

mod faults;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::gateway::skus::Knobs;
use crate::helpers::Isolation;
use crate::proxy::{FaultProxy, Mode};
use crate::services::{pause_redis, GatewayProcess, PrivateNats, PrivateRedis};

/// The faults, by the name `GATEWAY_MODEL_SKIP` leaves one out with.
pub const FAULTS: &[&str] = &[
    "redis-stall",
    "redis-latency",
    "redis-cut",
    "redis-reply-cut",
    "redis-pause",
    "pg-stall",
    "pg-cut",
    "gateway-kill",
    "gateway-kill-between",
    "redis-restart",
    "rollback",
    "redis-blackhole",
    "partition",
    "nats",
    "pg-lock",
    "pg-down",
    "skew",
];

/// `env`, with the clock `skew` off if given.
pub fn env_with(env: &[(&'static str, String)], skew: Option<&str>) -> Vec<(&'static str, String)> {
    let mut env = env.to_vec();
    if let Some(offset) = skew {
        env.extend(super::gateway::skewed_clock(offset));
    }
    env
}

pub struct Nemesis {
    pub redis: PrivateRedis,
    pub nats: PrivateNats,
    /// Per gateway: its own way to Redis and to PostgreSQL.
    pub redis_proxies: Vec<Arc<FaultProxy>>,
    pub pg_proxies: Vec<Arc<FaultProxy>>,
    pub gateways: Vec<GatewayProcess>,
    /// The gateways the clients may use (a killed one leaves it until restarted).
    pub bases: Arc<Mutex<Vec<String>>>,
    pub iso: Isolation,
    /// Per gateway: its environment (its proxies, the NATS URL).
    pub envs: Vec<Vec<(&'static str, String)>>,
    /// Per gateway: its libfaketime offset (`+30s`, `-30s`), if skewed.
    pub skews: Vec<Option<&'static str>>,
    /// Write side held while a fault needs the clients quiet: no client step runs meanwhile.
    pub gate: Arc<tokio::sync::RwLock<()>>,
    /// A copy of Redis's data taken earlier, to come back to.
    pub snapshot: Option<PathBuf>,
    pub knobs: Knobs,
    /// Direct to PostgreSQL (not through a proxy), to lock a table.
    pub db: sqlx::PgPool,
    /// A `LOCK TABLE` held in the background, if one is.
    pub lock: Option<tokio::task::JoinHandle<()>>,
    /// How many times each fault ran.
    pub counts: std::collections::BTreeMap<&'static str, u32>,
}

impl Nemesis {
    /// Runs until `done`, then heals everything; returns itself, to keep the services alive
    /// for the final checks.
    pub async fn run(mut self, seed: u64, done: Arc<AtomicBool>) -> Self {
        let mut rng = StdRng::seed_from_u64(seed.rotate_left(17));
        let mut n = 0u32;
        while !done.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(rng.random_range(150..400))).await;
            n += 1;
            // The long PostgreSQL outage comes early in every run, so every run has one.
            let name = if n == 5 {
                if rng.random_bool(0.5) {
                    "pg-lock"
                } else {
                    "pg-down"
                }
            } else {
                FAULTS[rng.random_range(0..FAULTS.len())]
            };
            if !self.knobs.on(name) {
                continue;
            }
            *self.counts.entry(name).or_default() += 1;
            self.fault(name, &mut rng).await;
        }
        self.heal().await;
        self
    }

    async fn fault(&mut self, name: &str, rng: &mut StdRng) {
        let ms =
            |rng: &mut StdRng, lo: u64, hi: u64| Duration::from_millis(rng.random_range(lo..hi));
        match name {
            "redis-stall" => {
                self.redis_all(Mode::Stall);
                tokio::time::sleep(ms(rng, 100, 700)).await;
                self.redis_all(Mode::Pass);
            }
            "redis-latency" => {
                self.redis_all(Mode::Latency(ms(rng, 20, 200)));
                tokio::time::sleep(Duration::from_millis(300)).await;
                self.redis_all(Mode::Pass);
            }
            "redis-cut" => self.redis_proxies.iter().for_each(|p| p.cut_all()),
            "redis-reply-cut" => {
                let i = rng.random_range(0..self.redis_proxies.len());
                self.redis_proxies[i].cut_replies_after(rng.random_range(1..200));
            }
            "redis-pause" => pause_redis(&self.redis.url(), rng.random_range(200..600)).await,
            "pg-stall" => {
                self.pg_all(Mode::Stall);
                tokio::time::sleep(ms(rng, 300, 1200)).await;
                self.pg_all(Mode::Pass);
            }
            "pg-cut" => self.pg_proxies.iter().for_each(|p| p.cut_all()),
            "gateway-kill" => {
                let i = rng.random_range(0..self.gateways.len());
                self.restart_gateway(i).await;
            }
            "gateway-kill-between" => {
                let _quiet = self.gate.clone().write_owned().await;
                let i = rng.random_range(0..self.gateways.len());
                self.restart_gateway(i).await;
            }
            "redis-restart" => {
                // fsync-always AOF: a SIGKILL loses nothing Redis acknowledged.
                self.redis.kill();
                self.redis.restart().await;
            }
            "rollback" => {
                let restart = rng.random_bool(0.5);
                let operator = ms(rng, 500, 3000);
                self.roll_back(restart, operator).await;
            }
            "redis-blackhole" => {
                // Requests vanish on the way (and replies): then every connection is cut.
                self.redis_all(Mode::BlackHole);
                tokio::time::sleep(ms(rng, 100, 500)).await;
                self.redis_all(Mode::Pass);
                self.redis_proxies.iter().for_each(|p| p.cut_all());
            }
            "partition" => {
                let i = rng.random_range(0..self.gateways.len());
                self.partition(i, ms(rng, 300, 3000)).await;
            }
            "nats" => {
                self.nats.stop();
                tokio::time::sleep(ms(rng, 200, 3000)).await;
                self.nats.restart().await;
            }
            "pg-lock" => self.lock_issuances(),
            "pg-down" => self.pg_down().await,
            "skew" => {
                let skew = [Some("+30s"), Some("-30s"), None][rng.random_range(0..3)];
                self.skews[1] = skew;
                self.restart_gateway(1).await;
            }
            other => unreachable!("no fault {other}"),
        }
    }

    fn redis_all(&self, m: Mode) {
        self.redis_proxies.iter().for_each(|p| p.set(m));
    }

    fn pg_all(&self, m: Mode) {
        self.pg_proxies.iter().for_each(|p| p.set(m));
    }

    /// The environment gateway `i` starts with (its clock skewed if it is the skewed one).
    pub fn env_of(&self, i: usize) -> Vec<(&'static str, String)> {
        env_with(&self.envs[i], self.skews[i])
    }

    pub async fn restart_gateway(&mut self, i: usize) {
        self.gateways[i].sigkill().await;
        let gone = self.gateways[i].base.clone();
        self.bases.lock().retain(|b| *b != gone);
        let env_owned = self.env_of(i);
        let env: Vec<(&str, &str)> = env_owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let redis_url = self.redis_proxies[i].url("redis");
        // A start under faults may fail fast (as it should): try again.
        self.gateways[i] = loop {
            match GatewayProcess::try_start(&self.iso, &redis_url, &env).await {
                Ok(g) => break g,
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        };
        self.bases.lock().push(self.gateways[i].base.clone());
    }

    /// Everything back to normal for the final checks: proxies passing, the lock released
    /// (NATS is always back up when its fault ends).
    async fn heal(&mut self) {
        if let Some(lock) = self.lock.take() {
            let _ = lock.await;
        }
        self.redis_all(Mode::Pass);
        self.pg_all(Mode::Pass);
    }
}
