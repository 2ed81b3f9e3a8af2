//! `dropgate demo --seats`: a 5,000-seat arena sold to groups of one to six over real HTTP.
//! Most groups ask for the best available seats; some pick their own (and ask for the best
//! available when theirs are taken); a group no row can seat together goes away. The
//! summary counts seats sold twice (0), the single seats left stranded, and what a naive
//! first-fit (first row with room, leftmost seats) leaves stranded on the same requests in
//! the order they were answered; the final map is written as an SVG.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use super::{balanced, buyer, by_answer, ledger_line};
use crate::cli::DemoArgs;
use crate::config::Secret;
use crate::sku::SkuId;

const SECTIONS: [&str; 5] = ["A", "B", "C", "D", "E"];
const ROWS: usize = 25;
const SEATS: usize = 40;
/// Requests in flight at once (the arena's buyers arrive together; the client keeps its own
/// sockets within reason).
const IN_FLIGHT: usize = 256;

pub(super) struct Arena<'a> {
    pub http: &'a reqwest::Client,
    pub base: &'a str,
    pub admin_auth: &'a str,
    pub secret: &'a Secret,
}

/// What one group asked for: `n` seats, and the seats it picked (row index, first seat).
#[derive(Debug, Clone, Copy)]
struct Ask {
    n: usize,
    pick: Option<(usize, usize)>,
}

/// One group's end: the seats it got, the answer that decided it, when it was answered.
struct Got {
    seats: Vec<String>,
    answer: String,
    order: usize,
}

fn seat_id(row: usize, n: usize) -> String {
    format!("{}-{}-{}", SECTIONS[row / ROWS], row % ROWS + 1, n + 1)
}

fn asks(buyers: usize) -> Vec<Ask> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(20_261_204);
    (0..buyers)
        .map(|_| {
            let n = [1, 2, 2, 2, 3, 3, 4, 4, 5, 6][rng.random_range(0..10)];
            // One group in five picks seats: near the front of the best sections, mostly.
            let pick = rng.random_bool(0.2).then(|| {
                let row = (rng.random_range(0.0f64..1.0).powi(2) * (ROWS * 5) as f64) as usize;
                (row, rng.random_range(0..=SEATS - n))
            });
            Ask { n, pick }
        })
        .collect()
}

impl Arena<'_> {
    pub async fn run(&self, args: &DemoArgs, sku: &SkuId) -> anyhow::Result<()> {
        let sections: Vec<Value> = SECTIONS
            .iter()
            .map(|s| json!({"name": s, "rows": ROWS, "count": SEATS}))
            .collect();
        let r = self
            .http
            .put(format!("{}/admin/skus/{sku}", self.base))
            .header("authorization", self.admin_auth)
            .json(&json!({"seats": {"sections": sections}, "per_user_limit": 6}))
            .send()
            .await?;
        anyhow::ensure!(r.status() == 201, "declaring {sku}: {}", r.status());
        let asks = asks(args.buyers());
        let total = SECTIONS.len() * ROWS * SEATS;
        println!(
            "declared {sku}: an arena of {total} seats ({} sections of {ROWS} rows of {SEATS}), {} groups of 1-6",
            SECTIONS.len(),
            asks.len()
        );
        let started = Instant::now();
        let got = self.sell(sku, &asks).await?;
        let wall = started.elapsed();
        let view = self.settled(sku).await?;
        let map = self.final_map(sku, &view).await?;
        self.summary(args, &asks, &got, &view, &map, wall)
    }

    async fn sell(&self, sku: &SkuId, asks: &[Ask]) -> anyhow::Result<Vec<Got>> {
        let gate = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
        let answered = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::with_capacity(asks.len());
        for (i, ask) in asks.iter().copied().enumerate() {
            let token =
                crate::auth::mint(self.secret, &format!("group-{i}"), Some(sku.as_str()), 600)?;
            let (http, gate, answered) = (self.http.clone(), gate.clone(), answered.clone());
            let url = format!("{}/v1/skus/{sku}/claims", self.base);
            tasks.push(tokio::spawn(async move {
                let _slot = gate.acquire_owned().await;
                let mut tries = Vec::new();
                if let Some((row, first)) = ask.pick {
                    let seats: Vec<String> =
                        (first..first + ask.n).map(|s| seat_id(row, s)).collect();
                    tries.push(json!({ "seats": seats }));
                }
                tries.push(json!({"quantity": ask.n}));
                let mut answer = String::new();
                for (k, body) in tries.iter().enumerate() {
                    let b = buyer::buy_with(&http, &url, &token, &format!("g{i}-{k}"), body).await;
                    answer = buyer::answer(b.status, &b.code);
                    if b.status == 201 {
                        let seats = b.body["seats"].as_array().cloned().unwrap_or_default();
                        let seats = seats.iter().filter_map(|s| s.as_str().map(str::to_string));
                        let order = answered.fetch_add(1, Ordering::Relaxed);
                        return Got {
                            seats: seats.collect(),
                            answer,
                            order,
                        };
                    }
                    if !matches!(b.code.as_str(), "seats_taken" | "no_adjacent_seats") {
                        break;
                    }
                }
                let order = answered.fetch_add(1, Ordering::Relaxed);
                Got {
                    seats: Vec::new(),
                    answer,
                    order,
                }
            }));
        }
        let mut got = Vec::with_capacity(tasks.len());
        for t in tasks {
            got.push(t.await?);
        }
        Ok(got)
    }

    /// The SKU view once the writer holds every winner (bounded).
    async fn settled(&self, sku: &SkuId) -> anyhow::Result<Value> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let r = self
                .http
                .get(format!("{}/admin/skus/{sku}", self.base))
                .header("authorization", self.admin_auth)
                .send()
                .await?;
            let v: Value = r.json().await.unwrap_or_default();
            if v["in_flight"] == 0 || Instant::now() > deadline {
                return Ok(v);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The map as the crowd reads it (`GET /v1/skus/{sku}/seats`), once its copy shows the
    /// view's free seats: one string per row, in order.
    async fn final_map(&self, sku: &SkuId, view: &Value) -> anyhow::Result<Vec<String>> {
        let token = crate::auth::mint(self.secret, "map-reader", Some(sku.as_str()), 600)?;
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let v: Value = self
                .http
                .get(format!("{}/v1/skus/{sku}/seats", self.base))
                .bearer_auth(&token)
                .send()
                .await?
                .json()
                .await?;
            let rows: Vec<String> = v["sections"]
                .as_array()
                .context("the seat map has sections")?
                .iter()
                .flat_map(|s| s["rows"].as_array().cloned().unwrap_or_default())
                .filter_map(|r| r["seats"].as_str().map(str::to_string))
                .collect();
            let free = rows.iter().map(|r| r.matches('.').count()).sum::<usize>();
            if Some(free as i64) == view["seats"]["free"].as_i64() || Instant::now() > deadline {
                return Ok(rows);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn summary(
        &self,
        args: &DemoArgs,
        asks: &[Ask],
        got: &[Got],
        view: &Value,
        map: &[String],
        wall: Duration,
    ) -> anyhow::Result<()> {
        let mut owners: HashMap<&str, usize> = HashMap::new();
        for g in got {
            for s in &g.seats {
                *owners.entry(s.as_str()).or_default() += 1;
            }
        }
        let twice = owners.values().filter(|n| **n > 1).count();
        let sold: usize = owners.len();
        let won = got.iter().filter(|g| !g.seats.is_empty()).count();
        let mut answers = std::collections::BTreeMap::<String, usize>::new();
        for g in got.iter().filter(|g| g.seats.is_empty()) {
            *answers.entry(g.answer.clone()).or_default() += 1;
        }
        let taken_on_map = map.iter().map(|r| r.matches('x').count()).sum::<usize>();
        let (naive_first, naive_end) = naive(asks, got);
        let first = gateway_at_first_refusal(got);
        println!(
            "won:        {won} groups, {sold} seats ({:.0} ms)",
            wall.as_secs_f64() * 1e3
        );
        println!("not seated: {}", by_answer(&answers));
        println!("sold twice: {twice} seats");
        println!(
            "stranded:   {first} single seats when the first group was turned away, {} at the end \
             (a naive first-fit on the same requests: {naive_first}, {naive_end})",
            view["seats"]["single_gaps"]
        );
        println!(
            "map:        {taken_on_map} taken on the crowd's map, {} free, view {}",
            map.iter().map(|r| r.matches('.').count()).sum::<usize>(),
            view["seats"]
        );
        println!("{}", ledger_line(view));
        std::fs::write(&args.map, svg(map))
            .with_context(|| format!("writing the map to {}", args.map.display()))?;
        println!("map drawn:  {}", args.map.display());
        let ok = twice == 0
            && taken_on_map == sold
            && view["recorded"] == sold as i64
            && view["consistent"] == true;
        balanced(ok, sold as i64, view["recorded"].as_i64().unwrap_or(-1))
    }
}

/// Stranded seats of a hall: free, with neither neighbour in the row free.
fn stranded(hall: &[Vec<bool>]) -> usize {
    hall.iter()
        .map(|row| {
            let free = |k: usize| k < row.len() && !row[k];
            (0..row.len())
                .filter(|s| free(*s) && !(*s > 0 && free(s - 1)) && !free(s + 1))
                .count()
        })
        .sum()
}

fn empty_hall() -> Vec<Vec<bool>> {
    vec![vec![false; SEATS]; SECTIONS.len() * ROWS]
}

/// The requests in the order the gateway answered them.
fn answer_order(got: &[Got]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..got.len()).collect();
    order.sort_by_key(|i| got[*i].order);
    order
}

/// The gateway's own hall when it first turned a group away (rebuilt from its answers in the
/// order they came): its stranded seats then.
fn gateway_at_first_refusal(got: &[Got]) -> usize {
    let mut hall = empty_hall();
    for i in answer_order(got) {
        if got[i].seats.is_empty() {
            break;
        }
        for id in &got[i].seats {
            let mut parts = id.split('-');
            let (Some(sec), Some(row), Some(n)) = (parts.next(), parts.next(), parts.next()) else {
                continue;
            };
            let sec = SECTIONS.iter().position(|x| *x == sec).unwrap_or(0);
            let (row, n) = (
                row.parse::<usize>().unwrap_or(1),
                n.parse::<usize>().unwrap_or(1),
            );
            hall[sec * ROWS + row - 1][n - 1] = true;
        }
    }
    stranded(&hall)
}

/// A naive first-fit on the same requests, in the order the gateway answered them: a picked
/// run if free, else the first row with `n` adjacent free seats at its leftmost, else the
/// group goes away (as at the gateway). Its stranded seats when it first turned a group away,
/// and at the end.
fn naive(asks: &[Ask], got: &[Got]) -> (usize, usize) {
    let mut hall = empty_hall();
    let mut at_refusal = None;
    for i in answer_order(got) {
        let Ask { n, pick } = asks[i];
        if let Some((row, first)) = pick {
            if hall[row][first..first + n].iter().all(|t| !t) {
                hall[row][first..first + n]
                    .iter_mut()
                    .for_each(|t| *t = true);
                continue;
            }
        }
        let run = hall.iter().enumerate().find_map(|(r, row)| {
            (0..=SEATS - n)
                .find(|s| row[*s..*s + n].iter().all(|t| !t))
                .map(|s| (r, s))
        });
        match run {
            Some((r, s)) => hall[r][s..s + n].iter_mut().for_each(|t| *t = true),
            None => {
                at_refusal.get_or_insert_with(|| stranded(&hall));
            }
        }
    }
    let end = stranded(&hall);
    (at_refusal.unwrap_or(end), end)
}

/// The hall as an SVG: sections side by side, a square per seat (taken dark, free light,
/// stranded free red).
fn svg(rows: &[String]) -> String {
    let (cell, gap) = (6, 18);
    let width = SECTIONS.len() * (SEATS * cell + gap);
    let height = ROWS * cell + 30;
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\">\n"
    );
    for (r, row) in rows.iter().enumerate() {
        let (section, line) = (r / ROWS, r % ROWS);
        let seats: Vec<bool> = row.chars().map(|c| c == 'x').collect();
        for (s, taken) in seats.iter().enumerate() {
            let free = |k: usize| k < seats.len() && !seats[k];
            let neighbour_free = (s > 0 && free(s - 1)) || free(s + 1);
            let stranded = !taken && !neighbour_free;
            let fill = match (taken, stranded) {
                (true, _) => "#334",
                (false, true) => "#d33",
                (false, false) => "#cde",
            };
            let x = section * (SEATS * cell + gap) + s * cell;
            let y = 20 + line * cell;
            out.push_str(&format!(
                "<rect x=\"{x}\" y=\"{y}\" width=\"{}\" height=\"{}\" fill=\"{fill}\"/>\n",
                cell - 1,
                cell - 1
            ));
        }
    }
    for (i, name) in SECTIONS.iter().enumerate() {
        let x = i * (SEATS * cell + gap);
        out.push_str(&format!(
            "<text x=\"{x}\" y=\"14\" font-size=\"12\">{name}</text>\n"
        ));
    }
    out.push_str("</svg>\n");
    out
}
