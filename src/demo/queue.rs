//! `dropgate demo --queue`: the drop behind its waiting room. Every buyer joins the pre-queue
//! before the opening; at the opening the seed is published and checked against its
//! commitment; the queue admits at a set rate; each admitted buyer claims with the token the
//! queue minted; a token the queue did not mint is refused; and the line reads sold out.

use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{json, Value};

use crate::cli::DemoArgs;
use crate::config::Secret;
use crate::sku::SkuId;

pub(super) struct Room<'a> {
    pub http: &'a reqwest::Client,
    pub base: &'a str,
    pub admin_auth: &'a str,
    pub secret: &'a Secret,
}

impl Room<'_> {
    pub async fn run(&self, args: &DemoArgs, sku: &SkuId) -> anyhow::Result<()> {
        let (base, http) = (self.base, self.http);
        let rate = (args.buyers() / 5).max(20);
        let opens = chrono::Utc::now() + chrono::Duration::seconds(3);
        let r = http
            .put(format!("{base}/admin/skus/{sku}"))
            .header("authorization", self.admin_auth)
            .json(
                &json!({"total": args.units, "per_user_limit": 1, "opens_at": opens.to_rfc3339(),
                          "queue": {"admit_per_second": rate, "admission_ttl_seconds": 60}}),
            )
            .send()
            .await?;
        anyhow::ensure!(r.status() == 201, "declaring {sku}: {}", r.status());
        let view = self.view(sku).await?;
        let commitment = view["queue"]["seed_commitment"]
            .as_str()
            .unwrap_or("")
            .to_string();
        println!(
            "declared {sku} behind a waiting room: {} units, {rate} admissions/s, opens in 3 s",
            args.units
        );
        println!("seed commitment: {commitment}");
        // Nobody gets past the room with a token it did not mint.
        let plain = crate::auth::mint(self.secret, "gatecrasher", Some(sku.as_str()), 60)?;
        let r = self.claim(sku, &plain).await?;
        println!("a token the queue did not mint: {} {}", r.0, r.1["code"]);
        let mut tickets = Vec::with_capacity(args.buyers());
        for i in 0..args.buyers() {
            let v = crate::auth::mint_visitor(self.secret, &format!("visitor-{i}"), 600)?;
            let r = http
                .post(format!("{base}/v1/skus/{sku}/queue"))
                .header("authorization", format!("Bearer {v}"))
                .send()
                .await?;
            let b: Value = r.json().await?;
            let id = b["ticket_id"]
                .as_str()
                .context("a join answers a ticket")?
                .to_string();
            tickets.push((v, id));
        }
        println!("joined:     {} visitors before the opening", tickets.len());
        let seed = loop {
            if let Some(s) = self.view(sku).await?["queue"]["seed"].as_str() {
                break s.to_string();
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let checks = crate::queue::order::commitment(&seed) == commitment;
        println!("opened: seed {seed} (SHA-256 matches the commitment: {checks})");
        let started = Instant::now();
        let (mut won, mut sold_out, mut waiting) = (0, 0, tickets.clone());
        // Admitted visitors whose claim did not win, by the code they were answered.
        let mut admitted_lost: std::collections::BTreeMap<String, u64> = Default::default();
        while !waiting.is_empty() && started.elapsed() < Duration::from_secs(300) {
            let mut next = Vec::new();
            for (v, id) in waiting {
                let r = http
                    .get(format!("{base}/v1/queue/{id}"))
                    .header("authorization", format!("Bearer {v}"))
                    .send()
                    .await?;
                let t: Value = r.json().await.unwrap_or_default();
                match t["state"].as_str() {
                    Some("admitted") => {
                        let token = t["admission_token"].as_str().unwrap_or("");
                        let (status, body) = self.claim(sku, token).await?;
                        if status == 201 {
                            won += 1;
                        } else {
                            let code = body["code"].as_str().unwrap_or("no code").to_string();
                            *admitted_lost.entry(format!("{status} {code}")).or_default() += 1;
                        }
                    }
                    Some("sold_out") | Some("expired") => sold_out += 1,
                    _ => next.push((v, id)),
                }
            }
            waiting = next;
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        // The winners written before the books are read.
        let deadline = Instant::now() + Duration::from_secs(30);
        let view = loop {
            let v = self.view(sku).await?;
            if v["in_flight"] == 0 || Instant::now() > deadline {
                break v;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        println!("admitted:   {}", view["queue"]["admitted"]);
        println!("won:        {won} (with the tokens the queue minted)");
        let lost: u64 = admitted_lost.values().sum();
        let mut why: Vec<String> = admitted_lost
            .iter()
            .map(|(k, n)| format!("{n} answered {k}"))
            .collect();
        why.push(
            "admission knows the stock: up to 1.5 admitted per unit left, so the last units' \
             admitted may meet sold_out"
                .into(),
        );
        println!("admitted, did not win: {lost} ({})", why.join("; "));
        println!("told sold out while waiting: {sold_out}");
        println!("still waiting: {}", waiting.len());
        println!(
            "in {:.1} s from the opening",
            started.elapsed().as_secs_f64()
        );
        println!("{}", super::ledger_line(&view));
        anyhow::ensure!(checks, "the published seed does not match its commitment");
        anyhow::ensure!(won <= args.units, "more won than units");
        Ok(())
    }

    async fn view(&self, sku: &SkuId) -> anyhow::Result<Value> {
        Ok(self
            .http
            .get(format!("{}/admin/skus/{sku}", self.base))
            .header("authorization", self.admin_auth)
            .send()
            .await?
            .json()
            .await?)
    }

    async fn claim(&self, sku: &SkuId, token: &str) -> anyhow::Result<(u16, Value)> {
        let r = self
            .http
            .post(format!("{}/v1/skus/{sku}/claims", self.base))
            .header("authorization", format!("Bearer {token}"))
            .json(&json!({"quantity": 1}))
            .send()
            .await?;
        let s = r.status().as_u16();
        Ok((s, r.json().await.unwrap_or_default()))
    }
}
