//! The operator's operations during the run: restocks up and down, forced restores, and
//! changes of terms (PUT with the current total: the per-user limit, `hold_seconds` and
//! `offer_seconds` of a held SKU, including to 0, which changes new claims only).

use rand::rngs::StdRng;
use rand::Rng;
use serde_json::{json, Value};

use super::ops::{answer, Ctx};
use super::skus::{spec, SKUS};
use crate::helpers::{code, ADMIN};

async fn expect(
    cx: &Ctx<'_>,
    op: &str,
    r: reqwest::Result<reqwest::Response>,
    allowed: &[(u16, &str)],
) -> Result<Value, String> {
    let (status, body, _) = answer(r).await;
    let c = code(&body).to_string();
    cx.history.lock().count(op, status, &c);
    if status == 0
        || allowed
            .iter()
            .any(|(s, k)| *s == status && (*k == "*" || *k == c))
    {
        Ok(body)
    } else {
        Err(format!("{op} answered {status} {body}"))
    }
}

pub async fn restock(cx: &Ctx<'_>, rng: &mut StdRng) -> Result<(), String> {
    let sku = SKUS[rng.random_range(0..SKUS.len())].name;
    let delta = if rng.random_bool(0.6) {
        rng.random_range(1..6)
    } else {
        -rng.random_range(1..4)
    };
    let r = cx
        .http
        .post(format!("{}/admin/skus/{sku}/restock", cx.base))
        .bearer_auth(ADMIN)
        .json(&json!({ "delta": delta }))
        .send()
        .await;
    // A seated SKU grows by its plan, never by a count.
    let allowed: &[(u16, &str)] = if super::seats::seated(sku) {
        &[(409, "seated_sku"), (503, "*")]
    } else {
        &[(200, ""), (409, "insufficient_stock"), (503, "*")]
    };
    expect(cx, "restock", r, allowed).await.map(|_| ())
}

pub async fn restore(cx: &Ctx<'_>, rng: &mut StdRng) -> Result<(), String> {
    let sku = SKUS[rng.random_range(0..SKUS.len())].name;
    let r = cx
        .http
        .post(format!("{}/admin/skus/{sku}/restore?force=true", cx.base))
        .bearer_auth(ADMIN)
        .send()
        .await;
    // Two restores whose locks overlapped (a connection cut): the later finds the state the
    // earlier rebuilt from the same ledger, and says so.
    let allowed = [(200, ""), (409, "state_present"), (503, "*")];
    expect(cx, "restore", r, &allowed).await.map(|_| ())
}

/// A change of terms: the SKU's current total (read first; a restock in between makes it
/// 409 `sku_exists`, as it should) with a limit of its base or one more, and for the held
/// SKU a new `hold_seconds` / `offer_seconds` (0 only unless `terms0` is skipped).
pub async fn terms(cx: &Ctx<'_>, rng: &mut StdRng) -> Result<(), String> {
    let s = spec(SKUS[rng.random_range(0..SKUS.len())].name);
    let r = cx
        .http
        .get(format!("{}/admin/skus/{}", cx.base, s.name))
        .bearer_auth(ADMIN)
        .send()
        .await;
    let view = expect(cx, "view", r, &[(200, ""), (503, "*")]).await?;
    let Some(total) = view["total"].as_i64() else {
        return Ok(());
    };
    let limit = s.limit + i64::from(rng.random_bool(0.5));
    let (hold, offer) = if s.hold == 0 {
        (0, 0)
    } else {
        let mut choices = vec![1, 2, 3];
        if cx.knobs.on("terms0") {
            choices.push(0);
        }
        let h = choices[rng.random_range(0..choices.len())];
        (h, choices[rng.random_range(0..choices.len())].max(1))
    };
    let mut body = json!({"total": total, "per_user_limit": limit, "hold_seconds": hold,
                      "offer_seconds": offer, "shards": s.shards});
    super::seats::declare_extra(s.name, &mut body);
    let r = cx
        .http
        .put(format!("{}/admin/skus/{}", cx.base, s.name))
        .bearer_auth(ADMIN)
        .json(&body)
        .send()
        .await;
    let allowed = [(200, ""), (409, "sku_exists"), (503, "*")];
    expect(cx, "terms", r, &allowed).await.map(|_| ())
}
