//! The waiting room (API.md, "Waiting room"; docs/waiting-room.md): settings, joins, tickets,
//! the admission tokens the claim route of a queued SKU requires, the pre-queue's order from
//! the published seed, admission at the set rate by one gateway at a time, sold out told to
//! the whole line, failing closed, and the waiting page in Chromium.

mod admission;
mod closing;
mod cluster;
mod core;
mod durable;
mod fairness;
mod overbook;
mod page;
mod shop_page;
mod waitlist;

use std::time::Duration;

use dropgate::config::Secret;
use redis::AsyncCommands;
use serde_json::{json, Value};

use crate::helpers::{Api, Probe, ADMIN, SECRET};

pub fn visitor(user: &str) -> String {
    dropgate::auth::mint_visitor(&Secret::new(SECRET), user, 600).unwrap()
}

/// PUTs a SKU with a queue (`extra` merged into the body).
pub async fn declare_queued(
    api: &Api,
    sku: &str,
    total: i64,
    queue: Value,
    extra: Value,
) -> reqwest::Response {
    let mut body = json!({"total": total, "per_user_limit": 1, "queue": queue});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            b.insert(k.clone(), v.clone());
        }
    }
    api.http
        .put(format!("{}/admin/skus/{sku}", api.base))
        .bearer_auth(ADMIN)
        .json(&body)
        .send()
        .await
        .unwrap()
}

pub async fn join(api: &Api, sku: &str, token: &str) -> (u16, Value) {
    let r = api
        .http
        .post(format!("{}/v1/skus/{sku}/queue", api.base))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// A join retried after a 503 as a front end does after Retry-After (this machine's shared
/// Redis and PostgreSQL can be too slow to answer in time: the gateway fails closed, and a join
/// is safe to send again: it finds the visitor's ticket).
pub async fn join_retrying(api: &Api, sku: &str, token: &str) -> (u16, Value) {
    loop {
        let (s, b) = join(api, sku, token).await;
        if s != 503 {
            return (s, b);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

pub async fn ticket(api: &Api, id: &str, token: &str) -> (u16, Value) {
    let r = api
        .http
        .get(format!("{}/v1/queue/{id}", api.base))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

pub async fn claim_with(api: &Api, sku: &str, token: &str) -> (u16, Value) {
    let r = api
        .http
        .post(format!("{}/v1/skus/{sku}/claims", api.base))
        .bearer_auth(token)
        .json(&json!({"quantity": 1}))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// The queue's Redis keys of `sku` under the probe's prefix: hash, line, admitted.
pub fn qkeys(probe: &Probe, sku: &str) -> [String; 11] {
    dropgate::keys::SkuKeys::new(&probe.prefix, sku).queue()
}

/// (in line, admitted) as Redis holds them.
pub async fn counts(probe: &Probe, sku: &str) -> (i64, i64) {
    let k = qkeys(probe, sku);
    let mut r = probe.redis.clone();
    let line: i64 = r.zcard(&k[1]).await.unwrap();
    let admitted: i64 = r.zcard(&k[2]).await.unwrap();
    (line, admitted)
}

/// The admitted set: (ticket, admitted at ms) by time.
pub async fn admitted(probe: &Probe, sku: &str) -> Vec<(uuid::Uuid, i64)> {
    let k = qkeys(probe, sku);
    let mut r = probe.redis.clone();
    let v: Vec<(Vec<u8>, f64)> = r.zrange_withscores(&k[2], 0, -1).await.unwrap();
    v.into_iter()
        .map(|(m, s)| (uuid::Uuid::from_slice(&m).unwrap(), s as i64))
        .collect()
}

pub async fn qfield(probe: &Probe, sku: &str, field: &str) -> Option<String> {
    let k = qkeys(probe, sku);
    let mut r = probe.redis.clone();
    r.hget(&k[0], field).await.unwrap()
}

/// Joins `n` visitors `<prefix>-<i>` one after another; returns their ticket ids in order.
pub async fn join_all(api: &Api, sku: &str, prefix: &str, n: usize) -> Vec<String> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let (s, b) = join_retrying(api, sku, &visitor(&format!("{prefix}-{i}"))).await;
        assert!(s == 201 || s == 200, "{s} {b}");
        out.push(b["ticket_id"].as_str().unwrap().to_string());
    }
    out
}

/// Joins `n` visitors `<prefix>-<i>`, `at_once` at a time (one front end's connections);
/// returns their ticket ids by visitor.
pub async fn join_many(
    api: &Api,
    sku: &str,
    prefix: &str,
    n: usize,
    at_once: usize,
) -> Vec<String> {
    use futures_util::StreamExt;
    let joined: Vec<(u16, Value)> = futures_util::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            let (sku, v) = (sku.to_string(), visitor(&format!("{prefix}-{i}")));
            async move { join_retrying(&api, &sku, &v).await }
        })
        .buffered(at_once)
        .collect()
        .await;
    joined
        .into_iter()
        .map(|(s, b)| {
            assert!(s == 201 || s == 200, "{s} {b}");
            b["ticket_id"].as_str().unwrap().to_string()
        })
        .collect()
}

pub const LONG: Duration = Duration::from_secs(60);

/// Polls `f` until it gives a value; panics after `limit`. Conditions, not sleeps, synchronise.
pub async fn until<T, F, Fut>(limit: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "condition not met within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
