//! `dropgate demo --hold-seconds N`: after the drop, a checkout. Most winners confirm, some
//! cancel, the rest walk away and their holds expire; buyers who lost join the waitlist and
//! take the offers that come to them. Prints how every unit ended.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::Value;

use crate::sku::SkuId;

/// What buyer `i` of the drop's winners does with its hold: confirm (the first `confirm` in
/// every hundred), cancel (the next `cancel`), or nothing (left to expiry).
fn choice(i: usize, confirm: u8, cancel: u8) -> &'static str {
    let slot = (i % 100) as u8;
    if slot < confirm {
        "confirm"
    } else if slot < confirm.saturating_add(cancel) {
        "cancel"
    } else {
        "walk away"
    }
}

pub struct Checkout<'a> {
    pub http: &'a reqwest::Client,
    pub base: &'a str,
    pub sku: &'a SkuId,
    pub admin_auth: &'a str,
    /// Bearer tokens by user.
    pub tokens: &'a HashMap<String, String>,
    pub hold_seconds: u64,
    /// Percent of winners who confirm, and who cancel; the rest walk away.
    pub confirm_percent: u8,
    pub cancel_percent: u8,
}

impl Checkout<'_> {
    async fn post(&self, path: &str, user: &str) -> anyhow::Result<(u16, Value)> {
        let r = self
            .http
            .post(format!("{}{path}", self.base))
            .header("authorization", format!("Bearer {}", self.tokens[user]))
            .send()
            .await?;
        Ok((r.status().as_u16(), r.json().await.unwrap_or(Value::Null)))
    }

    async fn view(&self) -> anyhow::Result<Value> {
        Ok(self
            .http
            .get(format!("{}/admin/skus/{}", self.base, self.sku))
            .header("authorization", self.admin_auth)
            .send()
            .await?
            .json()
            .await?)
    }

    /// How late the holds expired, from the gateway's own histogram (bucket bounds: the
    /// quantile is at most the bound printed).
    async fn print_expiry_lag(&self) -> anyhow::Result<()> {
        let text = self
            .http
            .get(format!("{}/metrics", self.base))
            .send()
            .await?
            .text()
            .await?;
        let name = crate::metrics::EXPIRY_LAG;
        let mut buckets: Vec<(f64, f64)> = Vec::new();
        for line in text
            .lines()
            .filter(|l| l.starts_with(&format!("{name}_bucket")))
        {
            let le = line
                .split("le=\"")
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or("+Inf");
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse()?
            };
            let n: f64 = line.rsplit(' ').next().unwrap_or("0").parse()?;
            buckets.push((le, n));
        }
        let total = buckets.iter().map(|b| b.1).fold(0.0, f64::max);
        if total == 0.0 {
            return Ok(());
        }
        let at = |q: f64| {
            buckets
                .iter()
                .find(|(_, n)| *n >= q * total)
                .map_or(f64::INFINITY, |b| b.0)
        };
        println!(
            "expiry lag: {total} holds expired; p50 <= {} s, p99 <= {} s after expires_at",
            at(0.5),
            at(0.99)
        );
        Ok(())
    }

    /// Runs the checkout: `winners` are (user, claim id) of the drop's 201s, `losers` the
    /// users it refused. Returns the final SKU view.
    pub async fn run(
        &self,
        winners: &[(String, String)],
        losers: &[String],
    ) -> anyhow::Result<Value> {
        // Losers line up first, so every unit that comes back is offered to them.
        let mut line: Vec<(String, String)> = Vec::new();
        for user in losers.iter().take(winners.len()) {
            let (s, b) = self
                .post(&format!("/v1/skus/{}/waitlist", self.sku), user)
                .await?;
            if s == 201 || s == 200 {
                let id = b["entry_id"].as_str().context("entry id")?.to_string();
                line.push((user.clone(), id));
            }
        }
        let mut tally: HashMap<&str, usize> = HashMap::new();
        for (i, (user, id)) in winners.iter().enumerate() {
            let what = choice(i, self.confirm_percent, self.cancel_percent);
            if what != "walk away" {
                self.post(&format!("/v1/claims/{id}/{what}"), user).await?;
            }
            *tally.entry(what).or_default() += 1;
        }
        println!(
            "checkout:   {} confirm, {} cancel, {} walk away (holds of {} s); {} join the waitlist",
            tally.get("confirm").unwrap_or(&0),
            tally.get("cancel").unwrap_or(&0),
            tally.get("walk away").unwrap_or(&0),
            self.hold_seconds,
            line.len()
        );
        // Waiters take what they are offered, until nobody waits or holds anything.
        let deadline = Instant::now() + Duration::from_secs(self.hold_seconds * 4 + 30);
        let mut taken = 0;
        loop {
            let mut open = 0;
            for (user, id) in &line {
                let r = self
                    .http
                    .get(format!("{}/v1/waitlist/{id}", self.base))
                    .header("authorization", format!("Bearer {}", self.tokens[user]))
                    .send()
                    .await?;
                let e: Value = r.json().await.unwrap_or(Value::Null);
                match e["status"].as_str() {
                    Some("offered") => {
                        let claim = e["claim_id"].as_str().context("offer claim")?;
                        let (s, _) = self
                            .post(&format!("/v1/claims/{claim}/confirm"), user)
                            .await?;
                        taken += usize::from(s == 200);
                    }
                    Some("waiting") => open += 1,
                    _ => {}
                }
            }
            let v = self.view().await?;
            let settled = v["held"] == 0 && v["offered"] == 0 && v["in_flight"] == 0;
            if (open == 0 && settled) || Instant::now() > deadline {
                println!("waitlist:   {taken} offers taken, {open} still waiting");
                self.print_expiry_lag().await?;
                return Ok(v);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}
