//! The script model's own Redis connection: it waits for a slow answer (issue 37.6).
//!
//! The model injects no fault on this connection, so a slow answer (a loaded machine) is
//! waited for, never counted as a failure: redis-rs's default response timeout of 500 ms once
//! failed a run ("world 17 step 1227: timed out", `MODEL_SEED=13303507675807602579`).

use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use uuid::Uuid;

use dropgate::keys::SkuKeys;

use crate::helpers::REDIS_URL;
use crate::services::PrivateRedis;

/// How long the model waits for one answer.
const PATIENCE: Duration = Duration::from_secs(60);

/// A connection to `url` that waits [`PATIENCE`] for each answer.
async fn patient(url: &str) -> ConnectionManager {
    let config = redis::aio::ConnectionManagerConfig::new().set_response_timeout(Some(PATIENCE));
    let client = redis::Client::open(url).unwrap();
    ConnectionManager::new_with_config(client, config)
        .await
        .unwrap()
}

/// A patient connection and the keys of a SKU under a fresh prefix.
pub async fn patient_sku(sku: &str) -> (ConnectionManager, SkuKeys) {
    let prefix = format!("t{}", &Uuid::new_v4().simple().to_string()[..16]);
    (patient(REDIS_URL).await, SkuKeys::new(&prefix, sku))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_models_connection_waits_out_an_answer_slower_than_the_default_timeout() {
    let redis = PrivateRedis::start().await;
    let mut con = patient(&redis.url()).await;
    let mut hasty = ConnectionManager::new(redis::Client::open(redis.url()).unwrap())
        .await
        .unwrap();
    // Redis answers nobody for 1.5 s: the default connection gives up, the model's waits.
    redis.pause(1500).await;
    let started = Instant::now();
    let (set, get) = (
        redis::cmd("SET").arg("k").arg("v").clone(),
        redis::cmd("GET").arg("k").clone(),
    );
    let (patient_answer, hasty_answer) = tokio::join!(
        set.query_async::<()>(&mut con),
        get.query_async::<Option<String>>(&mut hasty),
    );
    assert!(
        hasty_answer.is_err_and(|e| e.is_timeout()),
        "redis-rs's default gives up"
    );
    assert!(patient_answer.is_ok(), "{patient_answer:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(1000),
        "{:?}",
        started.elapsed()
    );
    let v: Option<String> = redis::cmd("GET")
        .arg("k")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(v.as_deref(), Some("v"), "the slow answer's write is there");
}
