//! `q0`'s checks once the run is quiet (after the ledger's, the lifecycle's and the events'):
//! admissions against the ledger, the admitted set against the answers, the readings against
//! the lifecycle table, and sold out told to the whole line, then reopened.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use dropgate::status::TicketState;
use uuid::Uuid;

use super::{keys, line_reads, zset, TicketRead, SKU, TTL};
use crate::helpers::{Api, Probe, SECRET};
use crate::model::gateway::history::History;

pub async fn check(api: &Api, probe: &Probe, h: &History) -> Result<(), String> {
    let admitted = zset(probe, &keys(probe)[2]).await?;
    let in_set: HashMap<Uuid, i64> = admitted.iter().copied().collect();
    nobody_without_admission(probe, h, &in_set).await?;
    admitted_once(probe, h, &in_set).await?;
    // No ticket is lost, with rollbacks and restores too: every answered ticket keeps its
    // place and its one admission (src/queue/tickets.rs, src/queue/rebuild.rs).
    readings_follow_the_table(&h.queue.reads)?;
    settings_never_reverted(probe).await?;
    sold_out_reaches_the_line(api, probe).await?;
    eprintln!(
        "gateway model: {SKU}: {} tickets, {} admitted, {} visitor readings; sold out told \
         to the line and reopened",
        h.queue.of.len(),
        admitted.len(),
        h.queue.reads.len()
    );
    Ok(())
}

/// Every buyer of `q0` in the ledger (any status, parked rows too) and every user on its
/// waitlist was admitted by its queue: their ticket is in the admitted set, or a client read
/// it admitted (a rollback may have taken it out of the set since).
async fn nobody_without_admission(
    probe: &Probe,
    h: &History,
    in_set: &HashMap<Uuid, i64>,
) -> Result<(), String> {
    let tag: i32 = sqlx::query_scalar("SELECT tag FROM skus WHERE sku = $1")
        .bind(SKU)
        .fetch_one(&probe.db)
        .await
        .map_err(|e| e.to_string())?;
    let seen: HashSet<Uuid> = (h.queue.reads.iter())
        .filter(|r| r.state == TicketState::Admitted)
        .map(|r| r.ticket)
        .collect();
    let users: Vec<(String, String)> = sqlx::query_as(
        "SELECT user_id, 'a claim' FROM issuances WHERE sku = $1
         UNION ALL SELECT user_id, 'a parked claim' FROM persistence_pending WHERE sku = $1
         UNION ALL SELECT user_id, 'a waitlist entry' FROM waitlist WHERE sku = $1",
    )
    .bind(SKU)
    .fetch_all(&probe.db)
    .await
    .map_err(|e| e.to_string())?;
    let secret = dropgate::config::Secret::new(SECRET);
    for (user, what) in &users {
        let t = dropgate::queue::order::ticket_id(&secret, crate::helpers::sku_id(SKU), tag, user);
        if !in_set.contains_key(&t) && !seen.contains(&t) {
            return Err(format!(
                "{user} has {what} of {SKU} and was never admitted (ticket {t})"
            ));
        }
    }
    Ok(())
}

/// One admission per ticket: the admitted set has as many tickets as admissions were counted,
/// none of them is in line, and every admitted answer a visitor got carries the one expiry of
/// the ticket's admission in the set.
async fn admitted_once(
    probe: &Probe,
    h: &History,
    in_set: &HashMap<Uuid, i64>,
) -> Result<(), String> {
    let k = keys(probe);
    let counted: Option<i64> = redis::cmd("HGET")
        .arg(&k[0])
        .arg("admitted_total")
        .query_async(&mut probe.redis.clone())
        .await
        .map_err(|e| e.to_string())?;
    if counted.unwrap_or(0) != in_set.len() as i64 {
        return Err(format!(
            "{SKU}: {counted:?} admissions counted, {} tickets in the admitted set",
            in_set.len()
        ));
    }
    let line = zset(probe, &k[1]).await?;
    if let Some((t, _)) = line.iter().find(|(t, _)| in_set.contains_key(t)) {
        return Err(format!("{SKU}: ticket {t} is in line and admitted"));
    }
    if let Some(t) = h.queue.recreated.first() {
        return Err(format!(
            "{SKU}: ticket {t} was created twice (Redis lost it)"
        ));
    }
    for r in h
        .queue
        .reads
        .iter()
        .filter(|r| r.state == TicketState::Admitted)
    {
        let Some(at) = in_set.get(&r.ticket) else {
            return Err(format!(
                "{} was read admitted and is not in the set",
                r.ticket
            ));
        };
        if r.expires_ms != Some(at + TTL * 1000) {
            return Err(format!(
                "{} read admitted until {:?}; its admission at {at} ends at {} (admitted twice?)",
                r.ticket,
                r.expires_ms,
                at + TTL * 1000
            ));
        }
    }
    Ok(())
}

/// Each visitor's readings of its ticket follow the table: a reading answered before another
/// was asked leads to it by the table's steps.
fn readings_follow_the_table(reads: &[TicketRead]) -> Result<(), String> {
    let mut per: HashMap<Uuid, Vec<&TicketRead>> = HashMap::new();
    for r in reads {
        per.entry(r.ticket).or_default().push(r);
    }
    for (t, list) in &per {
        for a in list {
            for b in list.iter().filter(|b| b.asked > a.answered) {
                if a.state != b.state && !TicketState::reaches(Some(a.state), b.state) {
                    let all: Vec<&str> = list.iter().map(|r| r.state.as_str()).collect();
                    return Err(format!(
                        "ticket {t} read {} then {}: no steps of the table lead there ({all:?})",
                        a.state, b.state
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Takes `q0`'s last units away: every ticket in line (and a few visitors joining now) must
/// read `sold_out` at once, nobody is admitted; then a unit back reopens the line.
async fn sold_out_reaches_the_line(api: &Api, probe: &Probe) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let v = api.view(SKU).await;
        let left = v["remaining"].as_i64().unwrap_or(-1);
        if left == 0 {
            break;
        }
        if left > 0 {
            let _ = api.restock(SKU, -left).await;
        }
        if Instant::now() > deadline {
            return Err(format!("{SKU} could not be sold out: {v}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for i in 0..5 {
        let (s, b) =
            crate::queue::join_retrying(api, SKU, &super::visitor(&format!("late-{i}"))).await;
        if !(s == 201 || s == 200) || b["state"] != "sold_out" {
            return Err(format!("a visitor joining {SKU} once sold out: {s} {b}"));
        }
    }
    let count = || async {
        let n: Option<i64> = redis::cmd("HGET")
            .arg(&keys(probe)[0])
            .arg("admitted_total")
            .query_async(&mut probe.redis.clone())
            .await
            .unwrap_or(None);
        n
    };
    let before = count().await;
    let n = line_reads(api, probe, TicketState::SoldOut, Duration::from_secs(1)).await?;
    // Past several admission rounds: still nobody admitted.
    tokio::time::sleep(Duration::from_millis(500)).await;
    if count().await != before {
        return Err(format!("{SKU} admitted tickets while sold out"));
    }
    // A unit back: no ticket reads sold_out any more (the line waits, its head is admitted).
    if api.restock(SKU, 1).await.status() != 200 {
        return Err(format!("restock of {SKU} refused"));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let line = zset(probe, &keys(probe)[1]).await?;
        let mut sold_out = 0;
        for (t, _) in &line {
            let r = api
                .http
                .get(format!("{}/v1/queue/{t}", api.base))
                .bearer_auth(crate::helpers::ADMIN)
                .send()
                .await
                .map_err(|e| e.to_string())?;
            let body: serde_json::Value = r.json().await.unwrap_or_default();
            sold_out += usize::from(body["state"] == "sold_out");
        }
        // Units that come back go to the waitlist first: admission waits for it to empty.
        let v = api.view(SKU).await;
        let line_first =
            v["waiting"].as_i64().unwrap_or(0) + v["offered"].as_i64().unwrap_or(0) > 0;
        // Admission knows the stock: admitted and unused tickets at the overbook bound (some
        // admitted while more units were left) already are the unit's buyers, so nobody more
        // need be admitted (admission_never_passes_overbook_times_the_units_left checks the
        // bound itself).
        let (live, cap) = overbook_bound(probe).await?;
        if sold_out == 0 && (count().await > before || line_first || live >= cap) {
            eprintln!("gateway model: {SKU}: {n} tickets read sold_out, then reopened");
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "a unit back on {SKU}: {sold_out} tickets still read sold_out, admissions {:?} \
                 (were {before:?})",
                count().await
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The waiting room's settings Redis holds once quiet are the catalog's last (rate, overbook,
/// version): no gateway that read the catalog before an operator's change put the older
/// settings back (each rewrites them every 2 s; `lua/queue_config.lua` keeps the highest
/// version), and a restore after a rollback wrote them back.
async fn settings_never_reverted(probe: &Probe) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let pg: (Option<i32>, Option<i32>, i64) = sqlx::query_as(
            "SELECT queue_admit_per_second, queue_overbook_milli, queue_version
             FROM skus WHERE sku = $1",
        )
        .bind(SKU)
        .fetch_one(&probe.db)
        .await
        .map_err(|e| e.to_string())?;
        let redis: (Option<i64>, Option<i64>, Option<i64>) = redis::cmd("HMGET")
            .arg(&keys(probe)[0])
            .arg("rate")
            .arg("overbook_milli")
            .arg("version")
            .query_async(&mut probe.redis.clone())
            .await
            .map_err(|e| e.to_string())?;
        let want = (
            pg.0.map(i64::from),
            Some(i64::from(pg.1.unwrap_or(1500))),
            Some(pg.2),
        );
        if redis == want {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{SKU}'s queue settings in Redis (rate, overbook_milli, version) {redis:?}, \
                 the catalog's {want:?}: an older version came back"
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `q0`'s admitted tickets not yet used or expired (each visitor's per-user count tells a used
/// one), and the bound they must stay within: ceil(overbook × (stock + live holds)).
async fn overbook_bound(probe: &Probe) -> Result<(i64, i64), String> {
    let k = keys(probe);
    let mut con = probe.redis.clone();
    let e = |e: redis::RedisError| e.to_string();
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut con).await.map_err(e)?;
    let now = secs * 1000 + micros / 1000;
    let live: Vec<Vec<u8>> = redis::cmd("ZRANGEBYSCORE")
        .arg(&k[8])
        .arg(format!("({now}"))
        .arg("+inf")
        .query_async(&mut con)
        .await
        .map_err(e)?;
    let mut unused = 0;
    for t in &live {
        let who: Option<String> = redis::cmd("HGET")
            .arg(&k[9])
            .arg(t.as_slice())
            .query_async(&mut con)
            .await
            .map_err(e)?;
        let bought: Option<i64> = match &who {
            Some(w) => redis::cmd("HGET")
                .arg(&k[6])
                .arg(w)
                .query_async(&mut con)
                .await
                .map_err(e)?,
            None => None,
        };
        unused += i64::from(bought.unwrap_or(0) <= 0);
    }
    let stock: Option<i64> = redis::cmd("HGET")
        .arg(&k[3])
        .arg("stock")
        .query_async(&mut con)
        .await
        .map_err(e)?;
    let holds: i64 = redis::cmd("ZCARD")
        .arg(&k[5])
        .query_async(&mut con)
        .await
        .map_err(e)?;
    let overbook: Option<i64> = redis::cmd("HGET")
        .arg(&k[0])
        .arg("overbook_milli")
        .query_async(&mut con)
        .await
        .map_err(e)?;
    let units = stock.unwrap_or(0).max(0) + holds;
    Ok((unused, (overbook.unwrap_or(1500) * units + 999) / 1000))
}
