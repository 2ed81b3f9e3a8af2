//! `/metrics` of a fresh gateway: every family dropgate names in its source is there from the
//! start, each with HELP and TYPE, and `promtool check metrics` finds nothing to say.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::time::{Duration, Instant};

use crate::helpers::*;

/// `dropgate_*` strings of src/ that are not metric names.
const NOT_METRICS: &[&str] = &[
    // The PostgreSQL channel the outbox relay listens on (src/outbox/relay.rs).
    "dropgate_outbox",
];

/// Every `"dropgate_..."` string literal in the Rust files under `dir`.
fn names_in_source(dir: &std::path::Path, out: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            names_in_source(&path, out);
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for (i, _) in text.match_indices("\"dropgate_") {
            let name: String = text[i + 1..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if text[i + 1 + name.len()..].starts_with('"') && !NOT_METRICS.contains(&&*name) {
                out.insert(name);
            }
        }
    }
}

/// Family name → (HELP present, TYPE) from an exposition.
fn families(text: &str) -> BTreeMap<String, (bool, Option<String>)> {
    let mut out: BTreeMap<String, (bool, Option<String>)> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            out.entry(name.to_string()).or_default().0 = !help.trim().is_empty();
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let name = parts.next().unwrap_or_default().to_string();
            out.entry(name).or_default().1 = parts.next().map(String::from);
        } else if !line.starts_with('#') && !line.trim().is_empty() {
            let series: String = line
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| series.strip_suffix(s))
                .filter(|base| out.contains_key(*base))
                .map_or(series.clone(), String::from);
            out.entry(family).or_default();
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_family_is_registered_at_start_with_help_and_type_and_passes_promtool() {
    let app = spawn_app_with(|raw| raw.sku_gauges_interval_ms = "100".into()).await;
    let sku = format!("fresh-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    // The per-SKU gauges exist once a SKU does; no claim is made, so nothing but the start
    // registered the process-wide families.
    assert_eq!(app.declare(&sku, 3, 1).await.status(), 201);
    let series = format!("dropgate_sku_overdue_held_claims{{sku=\"{sku}\"}} 0");
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let m = app.get("/metrics").await.text().await.unwrap();
        // The view's gauges come after the overdue count in the observer's round.
        let view = format!("dropgate_sku_consistent{{sku=\"{sku}\"}} 1");
        if m.lines().any(|l| l == series)
            && m.lines().any(|l| l == view)
            && m.contains("dropgate_redis_up ")
        {
            break m;
        }
        assert!(Instant::now() < deadline, "no {series} in:\n{m}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };

    let exported = families(&text);
    let without: Vec<&String> = exported
        .iter()
        .filter(|(name, (help, kind))| name.starts_with("dropgate_") && (!help || kind.is_none()))
        .map(|(name, _)| name)
        .collect();
    assert!(
        without.is_empty(),
        "families without HELP or TYPE: {without:?}\n{text}"
    );

    let mut used = BTreeSet::new();
    names_in_source(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut used,
    );
    assert!(used.len() > 40, "{used:?}");
    assert!(used.contains("dropgate_outbox_publish_failures_total"));
    let missing: Vec<&String> = used.iter().filter(|n| !exported.contains_key(*n)).collect();
    assert!(
        missing.is_empty(),
        "named in src/, not in a fresh gateway's /metrics: {missing:?}\n{text}"
    );

    let promtool = crate::tools::require("promtool", "prometheus");
    let mut child = std::process::Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool check metrics: {said}"
    );
}

/// The families every Prometheus client exports and a dashboard joins on: the process's own
/// (`process_*`, read at each scrape) and the build it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_carry_the_process_families_and_build_info() {
    let app = spawn_app().await;
    let text = app.get("/metrics").await.text().await.unwrap();
    let exported = families(&text);
    for name in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_start_time_seconds",
    ] {
        assert!(exported.contains_key(name), "no {name} in:\n{text}");
    }
    let build = format!(
        "dropgate_build_info{{version=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION")
    );
    assert!(text.lines().any(|l| l == build), "no {build} in:\n{text}");
    // Read at the scrape: the resident memory is a live figure, not zero.
    let rss: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("process_resident_memory_bytes "))
        .and_then(|v| v.trim().parse().ok())
        .expect("a resident memory sample");
    assert!(rss > 1e6, "{rss}");
}
