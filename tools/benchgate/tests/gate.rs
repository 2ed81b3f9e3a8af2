//! The gate as CI runs it: a run 5 % over the baseline fails naming the bench and the case;
//! one within the noise passes; either way the history gains a line and the chart is drawn.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{json, Value};

struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let dir = std::env::temp_dir().join(format!("benchgate-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Dir(dir)
    }
    fn path(&self, file: &str) -> PathBuf {
        self.0.join(file)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A run as `benches/script_cost.rs` writes it, with plain/19 scaled by `factor`.
fn run_json(factor: f64) -> Value {
    json!({
        "bench": "script_cost",
        "unit": "instructions per claim",
        "calls": 200,
        "redis": "Redis server v=7.0.15",
        "cases": {
            "plain/1": {"evalsha": 160_789},
            "plain/19": {"evalsha": (22_190.0 * factor).round() as u64},
            "keyed/19": {"evalsha": 43_463},
        }
    })
}

fn write(path: &Path, v: &Value) {
    std::fs::write(path, serde_json::to_string_pretty(v).unwrap()).unwrap();
}

fn benchgate(dir: &Dir, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_benchgate"))
        .arg("--baseline")
        .arg(dir.path("baseline.json"))
        .arg("--history")
        .arg(dir.path("history.jsonl"))
        .arg("--chart")
        .arg(dir.path("history.svg"))
        .args(args)
        .output()
        .expect("run benchgate")
}

fn saved_baseline(dir: &Dir) {
    write(&dir.path("base-run.json"), &run_json(1.0));
    let out = benchgate(
        dir,
        &[
            "save",
            "--current",
            dir.path("base-run.json").to_str().unwrap(),
            "--reason",
            "test",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn history_lines(dir: &Dir) -> Vec<Value> {
    std::fs::read_to_string(dir.path("history.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn a_five_percent_regression_fails_naming_the_bench_and_case() {
    let dir = Dir::new("regress");
    saved_baseline(&dir);
    write(&dir.path("now.json"), &run_json(1.05));
    let out = benchgate(
        &dir,
        &[
            "check",
            "--current",
            dir.path("now.json").to_str().unwrap(),
            "--commit",
            "abc1234",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(
        stderr.contains("bench script_cost/plain/19 regressed") && stderr.contains("+5.0 %"),
        "stderr: {stderr}"
    );
    assert!(
        !stderr.contains("plain/1 regressed"),
        "only plain/19 regressed: {stderr}"
    );
    let history = history_lines(&dir);
    assert_eq!(history.len(), 1);
    assert_eq!(history[0]["commit"], "abc1234");
    assert_eq!(history[0]["passed"], false);
    assert_eq!(history[0]["evalsha"]["plain/19"], 23_300);
    let svg = std::fs::read_to_string(dir.path("history.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("plain/19") && svg.contains("abc1234"));
}

#[test]
fn a_run_within_the_noise_passes_and_extends_the_history() {
    let dir = Dir::new("pass");
    saved_baseline(&dir);
    for (i, factor) in [1.004, 0.99].iter().enumerate() {
        write(&dir.path("now.json"), &run_json(*factor));
        let commit = format!("c{i}");
        let out = benchgate(
            &dir,
            &[
                "check",
                "--current",
                dir.path("now.json").to_str().unwrap(),
                "--commit",
                &commit,
            ],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let history = history_lines(&dir);
    assert_eq!(history.len(), 2);
    assert!(history.iter().all(|h| h["passed"] == true));
    let svg = std::fs::read_to_string(dir.path("history.svg")).unwrap();
    assert!(
        svg.contains("c0") && svg.contains("c1"),
        "both runs labelled on the chart"
    );
}

#[test]
fn a_case_missing_from_the_run_is_an_error_not_a_pass() {
    let dir = Dir::new("missing");
    saved_baseline(&dir);
    let mut run = run_json(1.0);
    run["cases"].as_object_mut().unwrap().remove("keyed/19");
    write(&dir.path("now.json"), &run);
    let out = benchgate(
        &dir,
        &["check", "--current", dir.path("now.json").to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("keyed/19"));
}
