//! The comparison: each case's instructions per claim inside `EVALSHA` against the baseline's.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

/// Callgrind's counts move by under 1 % between runs (docs/performance.md, "Issue 39"): 3 %
/// is past the noise and under the 5 % a regression must not slip through.
pub const DEFAULT_THRESHOLD_PCT: f64 = 3.0;

/// One case's counts, per claim.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Counts {
    pub evalsha: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<u64>,
}

/// What `benches/script_cost.rs` writes under `SCRIPT_COST_JSON`.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Run {
    pub bench: String,
    pub calls: u64,
    pub redis: String,
    pub cases: BTreeMap<String, Counts>,
}

impl Run {
    pub fn read(path: &Path) -> anyhow::Result<Run> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("read the run's counts {}", path.display()))?;
        let run: Run = serde_json::from_str(&text)
            .with_context(|| format!("{} is not script_cost's JSON", path.display()))?;
        if run.bench != "script_cost" {
            bail!(
                "{}: bench {:?}, expected script_cost",
                path.display(),
                run.bench
            );
        }
        Ok(run)
    }
}

/// The baseline kept in the repository: a run, the commit it measured, why it was moved.
#[derive(Debug, Deserialize, Serialize)]
pub struct Baseline {
    pub commit: String,
    pub reason: String,
    pub saved: String,
    pub threshold_pct: f64,
    #[serde(flatten)]
    pub run: Run,
}

impl Baseline {
    pub fn read(path: &Path) -> anyhow::Result<Baseline> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("read the baseline {}", path.display()))?;
        serde_json::from_str(&text)
            .with_context(|| format!("parse the baseline {}", path.display()))
    }

    pub fn from_run(run: Run, commit: String, reason: String, threshold_pct: f64) -> Baseline {
        Baseline {
            commit,
            reason,
            saved: chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string(),
            threshold_pct,
            run,
        }
    }

    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        let text = serde_json::to_string_pretty(self)? + "\n";
        std::fs::write(path, text).with_context(|| format!("write {}", path.display()))
    }
}

pub struct Row {
    pub case: String,
    pub baseline: u64,
    pub current: u64,
    pub change_pct: f64,
}

pub struct Report {
    pub rows: Vec<Row>,
    pub threshold_pct: f64,
}

/// Every case of the baseline must be in the run: a case that vanished is an error, not a pass.
pub fn compare(baseline: &Baseline, run: &Run, threshold_pct: f64) -> anyhow::Result<Report> {
    if baseline.run.redis != run.redis {
        eprintln!(
            "warning: the baseline was measured on {:?}, this run on {:?}: counts differ between Redis builds",
            baseline.run.redis, run.redis
        );
    }
    let mut rows = Vec::new();
    for (case, counts) in &baseline.run.cases {
        let Some(base) = counts.evalsha else { continue };
        let Some(current) = run.cases.get(case).and_then(|c| c.evalsha) else {
            bail!(
                "case {case} of the baseline is missing from the run (script_cost's EVALSHA count)"
            );
        };
        let change_pct = (current as f64 / base as f64 - 1.0) * 100.0;
        rows.push(Row {
            case: case.clone(),
            baseline: base,
            current,
            change_pct,
        });
    }
    if rows.is_empty() {
        bail!("the baseline has no EVALSHA counts");
    }
    Ok(Report {
        rows,
        threshold_pct,
    })
}

impl Report {
    pub fn passed(&self) -> bool {
        self.rows.iter().all(|r| r.change_pct <= self.threshold_pct)
    }

    /// One line per regressed case, naming the bench and the case.
    pub fn regressions(&self) -> Vec<String> {
        self.rows
            .iter()
            .filter(|r| r.change_pct > self.threshold_pct)
            .map(|r| {
                format!(
                    "bench script_cost/{} regressed: {} instructions per claim in EVALSHA, {:+.1} % over the baseline's {} (threshold {} %)",
                    r.case, r.current, r.change_pct, r.baseline, self.threshold_pct
                )
            })
            .collect()
    }

    pub fn table(&self) -> String {
        let mut out = format!(
            "script_cost: instructions per claim in EVALSHA (threshold +{} %)\n{:<12} {:>10} {:>10} {:>8}\n",
            self.threshold_pct, "case", "baseline", "now", "change"
        );
        for r in &self.rows {
            let mark = if r.change_pct > self.threshold_pct {
                "  REGRESSED"
            } else {
                ""
            };
            let _ = writeln!(
                out,
                "{:<12} {:>10} {:>10} {:>+7.1}%{mark}",
                r.case, r.baseline, r.current, r.change_pct
            );
        }
        out
    }
}

/// One line of history: when, which commit, each case's count, the verdict.
#[derive(Deserialize, Serialize)]
pub struct Entry {
    pub time: String,
    pub commit: String,
    pub passed: bool,
    pub evalsha: BTreeMap<String, u64>,
}

pub fn append_history(path: &Path, commit: &str, run: &Run, passed: bool) -> anyhow::Result<()> {
    let entry = Entry {
        time: chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string(),
        commit: commit.to_string(),
        passed,
        evalsha: run
            .cases
            .iter()
            .filter_map(|(k, c)| Some((k.clone(), c.evalsha?)))
            .collect(),
    };
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("open the history {}", path.display()))?;
    writeln!(file, "{}", serde_json::to_string(&entry)?)?;
    Ok(())
}

pub fn read_history(path: &Path) -> anyhow::Result<Vec<Entry>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("read {}", path.display())),
    };
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l).with_context(|| format!("{} line {}", path.display(), i + 1))
        })
        .collect()
}

/// The checkout's commit, or `unknown` outside git.
pub fn head_commit() -> String {
    std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".to_string())
}
