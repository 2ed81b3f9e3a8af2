//! The operator's surface checked against the code: the Grafana dashboard has the shape Grafana
//! needs, every alert names its runbook section, and every metric the dashboard or the alerts
//! use is one a gateway really exports. (`promtool check rules` and `promtool test rules` check
//! the PromQL itself, in `.ci/run`.)

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::helpers::*;

fn repo_file(path: &str) -> String {
    let full = format!("{}/{path}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{full}: {e}"))
}

fn dashboard() -> Value {
    serde_json::from_str(&repo_file("deploy/grafana/dropgate.json"))
        .expect("the dashboard is valid JSON")
}

/// Every PromQL text of the dashboard: the panels' targets and the template variables' queries.
fn dashboard_queries(d: &Value) -> Vec<String> {
    let mut out: Vec<String> = d["panels"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .filter_map(|t| t["expr"].as_str().map(String::from))
        .collect();
    for v in d["templating"]["list"].as_array().into_iter().flatten() {
        if let Some(q) = v["definition"].as_str() {
            out.push(q.to_string());
        }
        if let Some(q) = v["query"]["query"].as_str() {
            out.push(q.to_string());
        }
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// Every `dropgate_*` identifier in `text` (a label never starts with `dropgate_`, so each is a
/// metric name).
fn dropgate_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (i, _) in text.match_indices("dropgate_") {
        if text[..i].chars().next_back().is_some_and(is_ident) {
            continue;
        }
        let name: String = text[i..].chars().take_while(|c| is_ident(*c)).collect();
        // The external label that carries the runbook's address (alerts.yml), not a metric.
        if name.trim_end_matches(':') == "dropgate_runbook" {
            continue;
        }
        names.insert(name);
    }
    names
}

/// Names written right before a `{` selector: metrics that are not dropgate's would show here.
fn selector_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (i, _) in expr.match_indices('{') {
        let name: String = expr[..i]
            .chars()
            .rev()
            .take_while(|c| is_ident(*c))
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        if !name.is_empty() {
            names.insert(name);
        }
    }
    names
}

/// The anchor GitHub gives a Markdown heading.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn runbook_anchors() -> HashSet<String> {
    repo_file("docs/runbook.md")
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| slug(l.trim_start_matches('#')))
        .collect()
}

#[test]
fn the_dashboard_has_the_shape_grafana_needs() {
    let d = dashboard();
    assert!(d["title"].as_str().is_some_and(|t| !t.is_empty()), "title");
    let uid = d["uid"].as_str().expect("uid");
    assert!(
        (1..=40).contains(&uid.len())
            && uid
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
        "uid {uid:?}: 1-40 characters of [A-Za-z0-9_-]"
    );
    let schema = d["schemaVersion"].as_i64().expect("schemaVersion");
    assert!((36..=41).contains(&schema), "schemaVersion {schema}");

    let panels = d["panels"].as_array().expect("panels");
    assert!(!panels.is_empty());
    let mut ids = HashSet::new();
    let mut cells: HashMap<(i64, i64), i64> = HashMap::new();
    for p in panels {
        let id = p["id"].as_i64().expect("every panel has an integer id");
        assert!(ids.insert(id), "panel id {id} is used twice");
        let title = p["title"].as_str().unwrap_or_default();
        assert!(!title.is_empty(), "panel {id} has a title");
        assert!(
            [
                "timeseries",
                "stat",
                "table",
                "gauge",
                "bargauge",
                "state-timeline"
            ]
            .contains(&p["type"].as_str().unwrap_or_default()),
            "panel {title}: a known panel type"
        );
        let g = &p["gridPos"];
        let [h, w, x, y] = ["h", "w", "x", "y"].map(|k| {
            g[k].as_i64()
                .unwrap_or_else(|| panic!("panel {title}: gridPos.{k} is an integer"))
        });
        assert!(
            h > 0 && (1..=24).contains(&w) && x >= 0 && y >= 0 && x + w <= 24,
            "panel {title}: gridPos {g} fits the 24-column grid"
        );
        for cx in x..x + w {
            for cy in y..y + h {
                if let Some(other) = cells.insert((cx, cy), id) {
                    panic!("panels {other} and {id} overlap at ({cx}, {cy})");
                }
            }
        }
        assert_eq!(
            p["datasource"]["type"], "prometheus",
            "panel {title}: datasource"
        );
        assert!(
            p["datasource"]["uid"].is_string(),
            "panel {title}: datasource uid"
        );
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "panel {title} has a target");
        let mut refs = HashSet::new();
        for t in targets {
            assert!(
                t["expr"].as_str().is_some_and(|e| !e.trim().is_empty()),
                "panel {title}: every target has an expr"
            );
            let r = t["refId"].as_str().expect("refId");
            assert!(refs.insert(r.to_string()), "panel {title}: refId {r} twice");
            assert_eq!(
                t["datasource"], p["datasource"],
                "panel {title}: target datasource"
            );
        }
    }

    let vars = d["templating"]["list"].as_array().expect("templating.list");
    let var = |name: &str| vars.iter().find(|v| v["name"] == name);
    assert_eq!(
        var("datasource").expect("a datasource variable")["type"],
        "datasource"
    );
    let sku = var("sku").expect("a sku variable");
    assert_eq!(sku["type"], "query");
    assert_eq!(
        sku["definition"],
        "label_values(dropgate_sku_remaining_units, sku)"
    );

    let titles: Vec<&str> = panels.iter().filter_map(|p| p["title"].as_str()).collect();
    for wanted in [
        "Remaining stock by SKU",
        "Claims/s by outcome",
        "Claim latency p99",
        "Journal lag p99",
        "In-flight, pending and compensated units",
        "Quarantined units",
        "Unknown outcomes and how they settled",
        "Fail-closed SKUs",
        "Ledger balance",
        "Shed load",
        "Outbox backlog",
        "Outbox publish lag p99 and failures",
        "Hold expiry lag p99",
        "Ghost and overdue holds",
        "Waitlist",
    ] {
        assert!(
            titles.contains(&wanted),
            "no panel {wanted:?} in {titles:?}"
        );
    }
}

#[test]
fn every_alert_has_a_summary_a_description_and_a_runbook_section() {
    let rules = repo_file("deploy/prometheus/alerts.yml");
    let anchors = runbook_anchors();
    // Each `- alert:` item up to the next one: promtool checks the YAML, this its content.
    let blocks: Vec<&str> = rules.split("- alert: ").skip(1).collect();
    assert!(blocks.len() >= 10, "{} alerts", blocks.len());
    let mut names = HashSet::new();
    for b in blocks {
        let name = b.lines().next().unwrap_or_default().trim();
        assert!(names.insert(name.to_string()), "alert {name} twice");
        for key in ["expr:", "severity:", "summary:", "description:"] {
            assert!(b.contains(key), "alert {name} has no {key}");
        }
        let url = b
            .lines()
            .find_map(|l| l.trim().strip_prefix("runbook_url: "))
            .unwrap_or_else(|| panic!("alert {name} has no runbook_url"))
            .trim_matches('\'');
        // Absolute: the runbook's address from Prometheus's external label, else the
        // documented placeholder, then the alert's own section.
        let anchor = url
            .strip_prefix(RUNBOOK_BASE_TEMPLATE)
            .and_then(|rest| rest.strip_prefix('#'))
            .unwrap_or_else(|| {
                panic!("alert {name}: runbook_url {url} is not {RUNBOOK_BASE_TEMPLATE}#<section>")
            });
        assert_eq!(anchor, name.to_lowercase(), "alert {name}: its own section");
        assert!(anchors.contains(anchor), "docs/runbook.md has no #{anchor}");
    }
    for wanted in [
        "DropgateJournalLagHigh",
        "DropgatePendingRowsGrowing",
        "DropgateCompensation",
        "DropgateLedgerUnbalanced",
        "DropgateSkuStateLost",
        "DropgateSkuStateStale",
        "DropgateOutcomesUnknown",
        "DropgateShedLoad",
        "DropgateQuarantinedRows",
        "DropgateRedisUnreachable",
        "DropgatePostgresUnreachable",
        "DropgateHoldExpiryLate",
        "DropgateGhostHolds",
        "DropgateOverdueHolds",
        "DropgateWaitlistStalled",
        "DropgateOutboxBacklog",
        "DropgateOutboxLagHigh",
        "DropgateOutboxPublishFailing",
    ] {
        assert!(names.contains(wanted), "no alert {wanted}");
    }
    // The unit tests exercise alerts that exist, and every alert is seen firing by one.
    let tests = repo_file("deploy/prometheus/alerts_test.yml");
    let mut fired = HashSet::new();
    let mut current = String::new();
    for line in tests.lines() {
        if let Some(n) = line.trim().strip_prefix("alertname: ") {
            assert!(
                names.contains(n.trim()),
                "alerts_test.yml tests unknown alert {n}"
            );
            current = n.trim().to_string();
        } else if line.trim() == "exp_alerts:" {
            fired.insert(current.clone());
        }
    }
    let untested: Vec<&String> = names.iter().filter(|n| !fired.contains(*n)).collect();
    assert!(
        untested.is_empty(),
        "alerts no test of alerts_test.yml sees firing: {untested:?}"
    );
}

/// What every `runbook_url` starts with: the runbook's address (deploy/prometheus/alerts.yml).
const RUNBOOK_BASE_TEMPLATE: &str =
    r#"{{ or $externalLabels.dropgate_runbook "https://dropgate.invalid/docs/runbook.md" }}"#;

#[test]
fn every_link_inside_the_runbook_reaches_a_section() {
    let text = repo_file("docs/runbook.md");
    let anchors = runbook_anchors();
    for (i, _) in text.match_indices("](#") {
        let anchor: String = text[i + 3..].chars().take_while(|c| *c != ')').collect();
        assert!(
            anchors.contains(&anchor),
            "docs/runbook.md links to missing #{anchor}"
        );
    }
}

/// Families a gateway exports, by name, with their type (from the `# TYPE` lines).
fn families(metrics: &str) -> HashMap<String, String> {
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| {
            let mut parts = l.split_whitespace();
            Some((parts.next()?.to_string(), parts.next()?.to_string()))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_and_the_alerts_name_is_exported_by_the_gateway() {
    let app = spawn_app_with(|raw| raw.sku_gauges_interval_ms = "100".into()).await;
    let sku = format!("deploy-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    assert_eq!(app.declare(&sku, 3, 1).await.status(), 201);
    for user in ["a", "b", "c", "d"] {
        app.claim(&sku, user, 1, None).await;
    }
    app.drained(&sku).await;
    // The per-SKU gauges appear with the observer's next round.
    let series = format!("dropgate_sku_remaining_units{{sku=\"{sku}\"}} 0");
    let deadline = Instant::now() + Duration::from_secs(10);
    let metrics = loop {
        let m = app.get("/metrics").await.text().await.unwrap();
        if m.lines().any(|l| l == series) {
            break m;
        }
        assert!(Instant::now() < deadline, "no {series} in:\n{m}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let exported = families(&metrics);

    let d = dashboard();
    let queries = dashboard_queries(&d);
    let rules = repo_file("deploy/prometheus/alerts.yml");
    let rule_tests = repo_file("deploy/prometheus/alerts_test.yml");
    let mut used = BTreeSet::new();
    for text in queries.iter().chain([&rules, &rule_tests]) {
        used.extend(dropgate_names(text));
    }
    assert!(used.len() > 15, "{used:?}");
    let missing: Vec<&String> = used
        .iter()
        .filter(|name| {
            if exported.contains_key(*name) {
                return false;
            }
            // A histogram's series: <family>_bucket, _sum and _count.
            !["_bucket", "_sum", "_count"].iter().any(|suffix| {
                name.strip_suffix(suffix)
                    .is_some_and(|base| exported.get(base).is_some_and(|k| k == "histogram"))
            })
        })
        .collect();
    assert!(
        missing.is_empty(),
        "named by the dashboard or the alerts, not exported: {missing:?}\n{metrics}"
    );

    // Besides dropgate's own families, only Prometheus's `up` is selected.
    for expr in queries.iter() {
        for name in selector_names(expr) {
            assert!(
                name.starts_with("dropgate_") || name == "up",
                "{expr}: selects {name}, which no gateway exports"
            );
        }
    }
    // The fail-closed gauge carries both reasons for every SKU, so alerts see it change.
    for reason in ["lost", "stale"] {
        let line = format!("dropgate_sku_closed{{sku=\"{sku}\",reason=\"{reason}\"}} 0");
        assert!(metrics.lines().any(|l| l == line), "{line}\n{metrics}");
    }
}
