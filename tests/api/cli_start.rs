//! `dropgate reconcile` is read-only: it never creates a database nor applies migrations, and
//! a database it cannot read as this version's is an error that names it (API.md).

use crate::cli::dropgate;
use crate::helpers::*;

/// Whether the server has a database of that name.
async fn database_exists(admin: &sqlx::PgPool, name: &str) -> bool {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
        .bind(name)
        .fetch_one(admin)
        .await
        .unwrap()
}

fn reconcile(database_url: &str) -> std::process::Output {
    dropgate()
        .arg("reconcile")
        .env("DATABASE_URL", database_url)
        .env("DROPGATE_KEY_PREFIX", "t-reconcile-readonly")
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_on_a_missing_database_names_it_creates_nothing_and_exits_66() {
    let admin = sqlx::PgPool::connect(&format!("{PG_BASE}/postgres"))
        .await
        .unwrap();
    let name = format!(
        "dg_test_missing_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    // A password in the URL (trust auth ignores it) must not be printed.
    let url = format!("postgres://postgres:hunter2-secret@127.0.0.1:5432/{name}");
    let out = reconcile(&url);
    let err = String::from_utf8_lossy(&out.stderr);
    let created = database_exists(&admin, &name).await;
    if created {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP DATABASE \"{name}\"")))
            .execute(&admin)
            .await
            .unwrap();
    }
    assert!(!created, "reconcile created the database {name}: {err}");
    assert_eq!(out.status.code(), Some(66), "{err}");
    assert!(err.contains(&name), "the database is named: {err}");
    assert!(!err.contains("hunter2"), "no password printed: {err}");
    assert!(out.stdout.is_empty(), "no table printed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_refuses_a_database_without_this_versions_schema_and_migrates_nothing() {
    let iso = Isolation::new();
    let name = iso.database_url.rsplit('/').next().unwrap().to_string();
    let admin = sqlx::PgPool::connect(&format!("{PG_BASE}/postgres"))
        .await
        .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
        .execute(&admin)
        .await
        .unwrap();
    let db = sqlx::PgPool::connect(&iso.database_url).await.unwrap();
    let tables = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'",
        )
        .fetch_one(&db)
        .await
        .unwrap()
    };

    // An empty database (a DATABASE_URL naming someone else's, or a fresh one): no schema.
    let out = reconcile(&iso.database_url);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(68), "{err}");
    assert!(
        err.contains(&name) && err.contains("dropgate serve"),
        "{err}"
    );
    assert_eq!(tables().await, 0, "reconcile created tables: {err}");

    // A schema older than this binary's: the newest migration is not applied.
    dropgate::db::migrate(&db).await.unwrap();
    let newest: i64 = sqlx::query_scalar("SELECT max(version) FROM _sqlx_migrations")
        .fetch_one(&db)
        .await
        .unwrap();
    sqlx::query("DELETE FROM _sqlx_migrations WHERE version = $1")
        .bind(newest)
        .execute(&db)
        .await
        .unwrap();
    let out = reconcile(&iso.database_url);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(68), "{err}");
    assert!(
        err.contains(&format!("{newest}")),
        "the missing migration is named: {err}"
    );
    let applied: i64 =
        sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations WHERE version = $1")
            .bind(newest)
            .fetch_one(&db)
            .await
            .unwrap();
    assert_eq!(applied, 0, "reconcile applied a migration: {err}");
}

/// `serve` with `env` (and a valid secret), expected to fail at start: (status, stderr).
fn serve_fails(env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut cmd = dropgate();
    cmd.arg("serve")
        .env("DROPGATE_ADMISSION_SECRET", SECRET)
        .env("DROPGATE_LISTEN", "127.0.0.1:0");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    assert!(out.stdout.is_empty(), "stdout carries no log");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The failure is said once, on one `error:` line.
fn said_once(err: &str, what: &str) {
    assert_eq!(err.matches("error:").count(), 1, "{err}");
    assert_eq!(err.matches(what).count(), 1, "`{what}` once: {err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_failures_say_once_what_failed_where_and_exit_with_a_status_of_their_own() {
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed_port = free.local_addr().unwrap().port();
    drop(free);

    let url = format!("postgres://postgres:pg-pass-4711@127.0.0.1:{closed_port}/dropgate");
    let (code, err) = serve_fails(&[("DATABASE_URL", url.as_str())]);
    assert_eq!(code, Some(69), "{err}");
    said_once(&err, "Connection refused");
    assert!(
        err.contains(&format!(
            "postgres://postgres@127.0.0.1:{closed_port}/dropgate"
        )),
        "{err}"
    );
    assert!(
        !err.contains("pg-pass-4711") && err.contains("DATABASE_URL"),
        "{err}"
    );

    let url = "postgres://nobody:pg-pass-4711@127.0.0.1:5432/dropgate";
    let (code, err) = serve_fails(&[("DATABASE_URL", url)]);
    assert_eq!(code, Some(67), "{err}");
    said_once(&err, r#"role "nobody" does not exist"#);
    assert!(!err.contains("pg-pass-4711"), "{err}");

    let iso = Isolation::new();
    let redis = format!("redis://:redis-pass-4711@127.0.0.1:{closed_port}");
    let (code, err) = serve_fails(&[
        ("DATABASE_URL", iso.database_url.as_str()),
        ("REDIS_URL", redis.as_str()),
    ]);
    assert_eq!(code, Some(70), "{err}");
    assert!(
        err.contains(&format!("redis://127.0.0.1:{closed_port}")),
        "{err}"
    );
    assert!(
        !err.contains("redis-pass-4711") && err.contains("REDIS_URL"),
        "{err}"
    );

    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let (code, err) = serve_fails(&[
        ("DATABASE_URL", iso.database_url.as_str()),
        ("DROPGATE_LISTEN", addr.as_str()),
    ]);
    assert_eq!(code, Some(72), "{err}");
    assert!(
        err.contains(&addr) && err.contains("DROPGATE_LISTEN"),
        "{err}"
    );

    let (code, err) = serve_fails(&[("DROPGATE_LISTEN", "gateway.example:8080")]);
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("IP address"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_listens_on_localhost_and_warns_when_the_admin_routes_are_closed() {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let iso = Isolation::new();
    let mut serve = tokio::process::Command::from(dropgate());
    serve
        .arg("serve")
        .env("DROPGATE_LISTEN", "localhost:0")
        .env("DATABASE_URL", &iso.database_url)
        .env("DROPGATE_KEY_PREFIX", &iso.prefix)
        .env("DROPGATE_ADMISSION_SECRET", SECRET)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = serve.spawn().unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut log = Vec::new();
    let addr = tokio::time::timeout(std::time::Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            assert!(!line.contains('\x1b'), "no colour off a terminal: {line:?}");
            if let Some(a) = line.split("listening on ").nth(1) {
                return a.trim().to_string();
            }
            log.push(line);
        }
        panic!("the gateway exited: {log:?}");
    })
    .await
    .expect("the gateway listens within 60 s");
    assert!(addr.starts_with("127.0.0.1:"), "{addr}");
    assert!(
        log.iter()
            .any(|l| l.contains("WARN") && l.contains("DROPGATE_ADMIN_TOKEN is not set")),
        "{log:?}"
    );
    let r = reqwest::get(format!("http://{addr}/healthz"))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    child.kill().await.unwrap();
    let mut stdout = String::new();
    use tokio::io::AsyncReadExt;
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .await
        .unwrap();
    assert!(
        stdout.is_empty(),
        "serve prints nothing on stdout: {stdout}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_prints_its_summary_alone_on_stdout_and_reconcile_names_an_unknown_sku() {
    let iso = Isolation::new();
    let out = dropgate()
        .args(["demo", "--buyers", "30", "--units", "10"])
        .env("DATABASE_URL", &iso.database_url)
        .env("DROPGATE_KEY_PREFIX", &iso.prefix)
        .env("DROPGATE_ADMISSION_SECRET", "short")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stderr.contains("listening on"),
        "the log is on stderr: {stderr}"
    );
    assert!(
        !stdout.contains('\x1b') && !stderr.contains('\x1b'),
        "no colour off a terminal"
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[0].starts_with("declared demo-"), "{stdout}");
    // Every buyer ends with an answer: a 429 or 503 is tried again with the same key, and what
    // was tried again is said.
    for prefix in [
        "won:        10",
        "sold out:   20",
        "other:      0",
        "retried:",
        "ledger:",
    ] {
        assert!(
            lines.iter().any(|l| l.starts_with(prefix)),
            "{prefix}: {stdout}"
        );
    }
    assert!(
        lines
            .iter()
            .all(|l| !l.contains("INFO") && !l.contains("WARN")),
        "no log line on stdout: {stdout}"
    );

    let out = dropgate()
        .args(["reconcile", "--sku", "nope"])
        .env("DATABASE_URL", &iso.database_url)
        .env("DROPGATE_KEY_PREFIX", &iso.prefix)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(65), "{err}");
    assert!(err.contains(r#"no SKU "nope""#), "{err}");
    assert!(!err.contains("UnknownSku"), "{err}");
}

/// On a terminal (a pseudo-terminal from util-linux's `script`) demo's summary is not buried
/// in its gateway's INFO lines; RUST_LOG still brings them back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_on_a_terminal_shows_warnings_only_unless_rust_log_asks() {
    crate::tools::require("script", "bsdutils");
    let iso = Isolation::new();
    let run = |rust_log: Option<&str>| {
        let mut cmd = std::process::Command::new("script");
        cmd.args(["-qec"])
            .arg(format!(
                "{} demo --buyers 20 --units 5",
                env!("CARGO_BIN_EXE_dropgate")
            ))
            .arg("/dev/null")
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("DATABASE_URL", &iso.database_url)
            .env("DROPGATE_KEY_PREFIX", &iso.prefix)
            .env("NO_COLOR", "1");
        if let Some(level) = rust_log {
            cmd.env("RUST_LOG", level);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let quiet = run(None);
    assert!(quiet.contains("won:        5"), "the summary: {quiet}");
    assert!(
        !quiet.contains(" INFO "),
        "no INFO line on a terminal: {quiet}"
    );
    let loud = run(Some("info"));
    assert!(
        loud.contains(" INFO ") && loud.contains("listening on"),
        "{loud}"
    );
}

/// `demo --seats`: an arena sold to groups over real HTTP; the summary says no seat was sold
/// twice, the crowd's map shows exactly the seats sold, the ledger balances, and the map is
/// drawn (docs/seats.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_seats_sells_an_arena_to_groups_with_no_seat_twice_and_draws_the_map() {
    let iso = Isolation::new();
    let svg = std::env::temp_dir().join(format!("{}-hall.svg", iso.prefix));
    let out = dropgate()
        .args(["demo", "--seats", "--buyers", "2200", "--map"])
        .arg(&svg)
        .env("DATABASE_URL", &iso.database_url)
        .env("DROPGATE_KEY_PREFIX", &iso.prefix)
        .env("DROPGATE_ADMISSION_SECRET", "short")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    for prefix in [
        "won:",
        "not seated:",
        "sold twice: 0 seats",
        "stranded:",
        "map:",
    ] {
        assert!(
            lines.iter().any(|l| l.starts_with(prefix)),
            "{prefix}: {stdout}"
        );
    }
    assert!(stdout.contains("-> consistent"), "{stdout}");
    let drawn = std::fs::read_to_string(&svg).unwrap();
    assert!(drawn.starts_with("<svg") && drawn.matches("<rect").count() == 5000);
    let _ = std::fs::remove_file(&svg);
}
