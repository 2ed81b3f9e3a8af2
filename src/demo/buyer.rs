//! One buyer of the demo's drop, as a front end would buy: a 429 or a 503 is tried again after
//! its `Retry-After` with the same `Idempotency-Key`, so an unknown outcome (503
//! `outcome_unknown`: the call was sent and its answer lost) settles as the claim it was, won
//! or not, and never as a second claim (API.md, "POST /v1/skus/{sku}/claims").

use std::time::{Duration, Instant};

/// How many times a buyer asks in all before giving up on an answer.
const TRIES: u32 = 8;
/// The longest a buyer waits between tries, whatever `Retry-After` says.
const MOST_WAIT: Duration = Duration::from_millis(1000);

/// What one buyer was told in the end.
pub(super) struct Bought {
    /// The final answer's status (0: no answer at all).
    pub status: u16,
    /// The final answer's problem `code`, if any.
    pub code: String,
    pub claim_id: Option<String>,
    /// How long the gateway took for the first answer.
    pub first_took: Duration,
    /// The first answer's status and code when it was tried again.
    pub retried: Option<String>,
    /// The final answer's body.
    pub body: serde_json::Value,
}

pub(super) async fn buy(http: &reqwest::Client, url: &str, token: &str, key: &str) -> Bought {
    buy_with(http, url, token, key, &serde_json::json!({"quantity": 1})).await
}

/// As [`buy`], with the claim's body.
pub(super) async fn buy_with(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    key: &str,
    claim: &serde_json::Value,
) -> Bought {
    let mut first: Option<(Duration, String)> = None;
    let mut tries = 0;
    loop {
        tries += 1;
        let t = Instant::now();
        let r = http
            .post(url)
            .header("authorization", format!("Bearer {token}"))
            .header("idempotency-key", key)
            .json(claim)
            .send()
            .await;
        let took = t.elapsed();
        let (status, wait, body) = match r {
            Ok(r) => {
                let wait = r
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<u64>().ok())
                    .map_or(Duration::from_millis(200), Duration::from_secs);
                let status = r.status().as_u16();
                (status, wait, r.json().await.unwrap_or_default())
            }
            Err(_) => (0, Duration::from_millis(200), serde_json::Value::Null),
        };
        let code = body["code"].as_str().unwrap_or("").to_string();
        let again = matches!(status, 0 | 429 | 503) && tries < TRIES;
        if first.is_none() {
            first = Some((took, answer(status, &code)));
        }
        if again {
            tokio::time::sleep(wait.min(MOST_WAIT)).await;
            continue;
        }
        let (first_took, first_answer) = first.unwrap_or_default();
        return Bought {
            status,
            code,
            claim_id: body["claim_id"].as_str().map(str::to_string),
            first_took,
            retried: (tries > 1).then_some(first_answer),
            body,
        };
    }
}

/// An answer as the summary names it: "503 outcome_unknown", or "no answer" (the connection
/// failed before a status came).
pub(super) fn answer(status: u16, code: &str) -> String {
    match status {
        0 => "no answer".into(),
        _ => format!("{status} {code}").trim_end().to_string(),
    }
}
