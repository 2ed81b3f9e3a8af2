//! The binary's subcommands as an operator runs them.

use std::process::Command;

use crate::helpers::*;

fn dropgate() -> Command {
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
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = serve.spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
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
