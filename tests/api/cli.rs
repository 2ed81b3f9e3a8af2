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
