//! The binary's subcommands as an operator runs them.

use std::process::Command;

use crate::helpers::*;

/// The real binary with nothing of the test's environment but `PATH`.
pub fn dropgate() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_dropgate"));
    c.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default());
    c
}

#[test]
fn serve_reports_every_configuration_error_at_once_and_exits_64() {
    let out = dropgate()
        .arg("serve")
        .env("DROPGATE_LISTEN", "not-an-address")
        .env("DROPGATE_REPROCESS_MAX_ATTEMPTS", "0")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    for name in [
        "DROPGATE_ADMISSION_SECRET",
        "DROPGATE_LISTEN",
        "DROPGATE_REPROCESS_MAX_ATTEMPTS",
    ] {
        assert!(err.contains(name), "{name} missing from: {err}");
    }
}

#[test]
fn token_mints_a_jwt_the_gateway_accepts() {
    let out = dropgate()
        .args(["token", "--user", "u-17", "--sku", "drop-1", "--ttl", "60"])
        .env("DROPGATE_ADMISSION_SECRET", SECRET)
        .output()
        .unwrap();
    assert!(out.status.success());
    let token = String::from_utf8(out.stdout).unwrap();
    let verifier = dropgate::auth::Verifier::new(&dropgate::config::Secret::new(SECRET), None);
    let header = format!("Bearer {}", token.trim());
    assert_eq!(
        verifier.buyer(Some(&header), Some("drop-1")).unwrap(),
        "u-17"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_balances_after_a_drop_and_flags_a_ledger_row_changed_by_hand() {
    let app = spawn_app().await;
    app.declare("rec", 20, 1).await;
    let results = release_buyers(&app.api, "rec", users("r", 30)).await;
    assert_eq!(won_ids(&results).len(), 20);
    app.drained("rec").await;
    let run = || {
        dropgate()
            .arg("reconcile")
            .env("DATABASE_URL", &app.probe.database_url)
            .env("DROPGATE_KEY_PREFIX", &app.probe.prefix)
            .output()
            .unwrap()
    };
    let out = run();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{table}");
    assert!(table.contains("rec") && table.contains(" ok"), "{table}");

    sqlx::query("UPDATE issuances SET quantity = 2 WHERE claim_id = (SELECT claim_id FROM issuances LIMIT 1)")
        .execute(&app.db)
        .await
        .unwrap();
    let out = run();
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{table}");
    assert!(table.contains("MISMATCH"), "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_json_logs_every_line_is_json_and_a_claims_decision_carries_its_claim_id() {
    use dropgate::config::{
        ENV_ADMIN_TOKEN, ENV_ADMISSION_SECRET, ENV_DATABASE_URL, ENV_KEY_PREFIX, ENV_LISTEN,
        ENV_LOG_JSON,
    };
    use serde_json::Value;
    use tokio::io::{AsyncBufReadExt, BufReader};

    let iso = Isolation::new();
    let mut serve = tokio::process::Command::from(dropgate());
    serve
        .arg("serve")
        .env(ENV_LOG_JSON, "1")
        .env("RUST_LOG", "info,dropgate=debug")
        .env(ENV_LISTEN, "127.0.0.1:0")
        .env(ENV_DATABASE_URL, &iso.database_url)
        .env(ENV_KEY_PREFIX, &iso.prefix)
        .env(ENV_ADMISSION_SECRET, SECRET)
        .env(ENV_ADMIN_TOKEN, ADMIN)
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = serve.spawn().unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    // Reads log lines until one matches; each line on the way must be a JSON object.
    let mut until = async |pred: &dyn Fn(&Value) -> bool| -> Value {
        let read = async {
            loop {
                let line = lines
                    .next_line()
                    .await
                    .unwrap()
                    .expect("the gateway kept running");
                let v: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
                assert!(
                    v["timestamp"].is_string() && v["level"].is_string(),
                    "{line}"
                );
                assert!(v["fields"]["message"].is_string(), "{line}");
                if pred(&v) {
                    return v;
                }
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(30), read)
            .await
            .expect("the expected log line came within 30 s")
    };

    let listening = until(&|v| {
        v["fields"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("listening on "))
    })
    .await;
    let addr =
        listening["fields"]["message"].as_str().unwrap()["listening on ".len()..].to_string();
    let api = Api::new(format!("http://{addr}"));
    assert_eq!(api.declare("logged", 1, 1).await.status(), 201);
    let won: Value = api
        .claim("logged", "u-1", 1, None)
        .await
        .json()
        .await
        .unwrap();
    let claim_id = won["claim_id"].as_str().unwrap().to_string();

    let decided = until(&|v| v["fields"]["claim_id"] == claim_id.as_str()).await;
    assert_eq!(decided["level"], "DEBUG");
    assert_eq!(decided["fields"]["message"], "claim decided");
    assert_eq!(decided["fields"]["sku"], "logged");
    assert_eq!(decided["fields"]["outcome"], "won");
    child.kill().await.unwrap();
}

/// Runs `cmd` with its stdout a pipe whose reader is already gone (`| head` that exited).
fn with_stdout_closed(mut cmd: Command) -> std::process::Output {
    use std::process::Stdio;
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    child.wait_with_output().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_and_reconcile_end_quietly_when_the_reader_goes_away() {
    let mut token = dropgate();
    token
        .args(["token", "--user", "u", "--count", "5000"])
        .env("DROPGATE_ADMISSION_SECRET", SECRET);
    let out = with_stdout_closed(token);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.is_empty(), "{err}");

    let app = spawn_app().await;
    app.declare("piped", 3, 1).await;
    let mut reconcile = dropgate();
    reconcile
        .arg("reconcile")
        .env("DATABASE_URL", &app.probe.database_url)
        .env("DROPGATE_KEY_PREFIX", &app.probe.prefix);
    let out = with_stdout_closed(reconcile);
    let err = String::from_utf8_lossy(&out.stderr);
    // The verdict stands: the books balance.
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        !err.contains("panicked") && !err.contains("Broken pipe"),
        "{err}"
    );
}

/// The options of a `--help`: (flag, its description without the `[env: ]` / `[default: ]`
/// parts), on the flag's line (short layout) or the lines below it (long layout).
fn options(help: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in help.lines() {
        let t = line.trim_start();
        let indent = line.len() - t.len();
        if (2..=6).contains(&indent) && t.starts_with('-') {
            let flag = t
                .split([' ', ','])
                .find(|w| w.starts_with("--"))
                .unwrap_or(t);
            let about = t.split_once("  ").map_or("", |(_, a)| a.trim());
            out.push((flag.to_string(), about.to_string()));
        } else if let Some(last) = out.last_mut() {
            if indent > 6 {
                last.1.push(' ');
                last.1.push_str(t);
            }
        }
    }
    for (_, about) in &mut out {
        while let Some(start) = about.find('[') {
            let end = about[start..]
                .find(']')
                .map_or(about.len(), |e| start + e + 1);
            about.replace_range(start..end, "");
        }
    }
    out
}

fn help(args: &[&str]) -> String {
    let out = dropgate()
        .args(args)
        .arg("--help")
        .env(
            "DATABASE_URL",
            "postgres://app:pg-pass-4711@db.internal/dropgate",
        )
        .env("REDIS_URL", "redis://:redis-pass-4711@cache.internal:6379")
        .env("DROPGATE_ADMISSION_SECRET", "admission-secret-4711-abcdef")
        .env("DROPGATE_ADMIN_TOKEN", "admin-token-4711-abcdefgh")
        .env("DROPGATE_NATS_URL", "nats://u:nats-pass-4711@nats:4222")
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn help_describes_every_flag_with_its_unit_and_shows_no_secret() {
    for cmd in [
        &["serve"][..],
        &["demo"],
        &["reconcile"],
        &["token"],
        &["events", "tail"],
    ] {
        let text = help(cmd);
        assert!(!text.contains("4711"), "{cmd:?} printed a secret:\n{text}");
        let opts = options(&text);
        assert!(opts.len() > 2, "{cmd:?}: {text}");
        for (flag, about) in &opts {
            if flag == "--help" || flag == "--version" {
                continue;
            }
            assert!(
                !about.trim().is_empty(),
                "{cmd:?} {flag} has no description:\n{text}"
            );
            if flag.ends_with("-ms") {
                assert!(about.contains("Milliseconds"), "{flag}: {about}");
            }
            if flag.ends_with("-secs") {
                assert!(about.contains("Seconds"), "{flag}: {about}");
            }
        }
    }
    // Each command lists its own flags, not serve's.
    let names =
        |cmd: &[&str]| -> Vec<String> { options(&help(cmd)).into_iter().map(|(f, _)| f).collect() };
    let reconcile = names(&["reconcile"]);
    for own in ["--sku", "--database-url", "--redis-url", "--key-prefix"] {
        assert!(reconcile.iter().any(|f| f == own), "{own}: {reconcile:?}");
    }
    let demo = names(&["demo"]);
    assert!(demo.iter().any(|f| f == "--buyers"), "{demo:?}");
    for foreign in [
        "--listen",
        "--admin-token",
        "--admission-secret",
        "--max-queue",
    ] {
        assert!(
            !reconcile.iter().any(|f| f == foreign),
            "reconcile {foreign}"
        );
        assert!(!demo.iter().any(|f| f == foreign), "demo {foreign}");
    }
    let serve = help(&["serve"]);
    assert!(serve.contains("[default: 250]") && serve.contains("DROPGATE_REDIS_TIMEOUT_MS"));
}

/// The `exp - iat`-free lifetime of a token: its `exp` minus now.
fn lifetime(token: &str) -> i64 {
    let mut v = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::HS256);
    v.set_required_spec_claims(&["exp"]);
    let data = jsonwebtoken::decode::<serde_json::Value>(
        token.trim(),
        &jsonwebtoken::DecodingKey::from_secret(SECRET.as_bytes()).unwrap(),
        &v,
    )
    .unwrap();
    data.claims["exp"].as_i64().unwrap() - chrono::Utc::now().timestamp()
}

#[test]
fn token_takes_a_human_ttl_and_refuses_what_serve_would_refuse() {
    let mint = |args: &[&str], secret: &str| {
        dropgate()
            .arg("token")
            .args(args)
            .env("DROPGATE_ADMISSION_SECRET", secret)
            .output()
            .unwrap()
    };
    for (ttl, secs) in [("90s", 90), ("1h", 3600), ("120", 120)] {
        let out = mint(&["--user", "u", "--ttl", ttl], SECRET);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let left = lifetime(&String::from_utf8(out.stdout).unwrap());
        assert!((secs - 5..=secs).contains(&left), "--ttl {ttl}: {left} s");
    }
    let out = mint(&["--user", "u"], "short-secret");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(out.stdout.is_empty());
    assert!(
        err.contains("DROPGATE_ADMISSION_SECRET") && err.contains("16 bytes"),
        "{err}"
    );
    assert!(!err.contains("short-secret"), "{err}");
    let out = mint(&["--user", "u", "--sku", "not a sku"], SECRET);
    assert_eq!(out.status.code(), Some(64));
    let out = mint(&["--user", "u", "--ttl", "soon"], SECRET);
    assert_eq!(out.status.code(), Some(2), "clap refuses the value");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_with_a_wrong_key_prefix_says_no_state_exists_under_it() {
    let app = spawn_app().await;
    app.declare("rec-prefix", 5, 1).await;
    let wrong = format!("{}x", app.probe.prefix);
    let out = dropgate()
        .arg("reconcile")
        .env("DATABASE_URL", &app.probe.database_url)
        .env("DROPGATE_KEY_PREFIX", &wrong)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("no state exists under the key prefix \"{wrong}\"")),
        "{err}"
    );
    // The right prefix balances and says nothing of the kind.
    let out = dropgate()
        .arg("reconcile")
        .env("DATABASE_URL", &app.probe.database_url)
        .env("DROPGATE_KEY_PREFIX", &app.probe.prefix)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(!String::from_utf8_lossy(&out.stderr).contains("no state exists"));
}

#[test]
fn serve_names_the_listen_flag_not_the_variable_when_the_flag_is_wrong() {
    let out = dropgate()
        .args(["serve", "--listen", "nope"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--listen \"nope\""), "{err}");
    assert!(!err.contains("DROPGATE_LISTEN=\"nope\""), "{err}");
}
