//! dropgate-loadtest: goose scenarios against a running gateway, then the invariants.
//!
//! ```text
//! DROPGATE_URL=http://127.0.0.1:8080 DROPGATE_ADMISSION_SECRET=... DROPGATE_ADMIN_TOKEN=... \
//!   dropgate-loadtest --scenarios hot_sku_drop --users 200 --run-time 20s --report-file r.html
//! ```
//!
//! Order: read the configuration → declare the scenarios' SKUs (before any load) → goose runs
//! the load and prints its summary → wait for the writer to drain and check the invariants →
//! write the verdict at the top of the HTML report and inline ECharts into it. Exit 0 when every invariant holds, 1 when one fails,
//! 2 when the run could not be done, 64 on bad configuration.
//!
//! Modules: [`settings`] (environment), [`help`] (`--help`: these settings, then goose's),
//! [`admin`] (admin API, tokens), [`scenarios`] (what
//! the goose users do), [`checkout`] (the journeys of `checkout`), [`tally`] (what the buyers
//! saw), [`verify`] (the invariants), [`holds_check`] (those of holds and the waitlist, from
//! the ledger), [`queue_drop`] (the visitors of `queue_drop`) and [`queue_check`] (its
//! checks), [`report`] (offline charts).
#![forbid(unsafe_code)]

mod admin;
mod book;
mod checkout;
mod decided;
mod help;
mod holds_check;
mod line;
mod queue_check;
mod queue_drop;
mod report;
mod scenarios;
mod settings;
mod tally;
mod verify;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::SystemTime;

use anyhow::Context;
use goose::config::{GooseConfiguration, Scenarios};
use goose::prelude::*;

use crate::admin::Admin;
use crate::scenarios::Drop;
use crate::settings::{
    Settings, DEFAULT_RUN_TIME_SECS, DEFAULT_USERS, EXIT_CONFIG, REQUEST_TIMEOUT_SECS,
};

#[tokio::main]
async fn main() -> ExitCode {
    if help::asked() {
        // A closed pipe, as `| head` leaves, is not an error.
        use std::io::Write;
        let _ = std::io::stdout().lock().write_all(help::text().as_bytes());
        return ExitCode::SUCCESS;
    }
    let config = GooseConfiguration::parse_args_default_or_exit();
    let settings = match Settings::from_env(&settings::ProcessEnv) {
        Ok(s) => s,
        Err(errors) => {
            for e in errors {
                eprintln!("dropgate-loadtest: {e}");
            }
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    match run(settings, config).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) if e.is::<ConfigError>() => ExitCode::from(EXIT_CONFIG),
        Err(e) => {
            eprintln!("dropgate-loadtest: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// A configuration problem already reported on stderr (exit 64).
#[derive(Debug)]
struct ConfigError;

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("bad configuration")
    }
}

impl std::error::Error for ConfigError {}

/// Returns whether every invariant held.
async fn run(settings: Settings, mut config: GooseConfiguration) -> anyhow::Result<bool> {
    if config.scenarios_list {
        let mut attack = GooseAttack::initialize_with_config(config)?;
        for kind in scenarios::Kind::ALL {
            attack = attack.register_scenario(Scenario::new(kind.name()));
        }
        attack.execute().await?;
        return Ok(true);
    }

    // --scenarios (or DROPGATE_SCENARIO) picks the scenarios; goose is handed their goose
    // spelling, so `hot_sku_drop` works as well as `hotskudrop`.
    let patterns: Vec<String> = match (&config.scenarios, &settings.scenarios) {
        (Some(s), _) => s.active.clone(),
        (None, Some(env)) => env.split(',').map(str::to_string).collect(),
        (None, None) => Vec::new(),
    };
    let kinds = scenarios::select(&patterns).map_err(anyhow::Error::msg)?;
    if kinds.contains(&scenarios::Kind::Checkout) && settings.database_url.is_none() {
        eprintln!(
            "dropgate-loadtest: checkout checks the ledger after the run: set {} (the gateway's database)",
            settings::ENV_DATABASE_URL
        );
        return Err(ConfigError.into());
    }
    config.scenarios = Some(Scenarios {
        active: kinds.iter().map(|k| k.machine_name()).collect(),
    });

    let host = config.host.clone().unwrap_or_else(|| settings.url.clone());
    settings::check_loopback(&host, settings.allow_remote).map_err(anyhow::Error::msg)?;
    let admin = Admin::new(&host, &settings.admin_token)?;
    admin.ready().await.context("the gateway is not ready")?;

    let users = config.users.unwrap_or(DEFAULT_USERS);
    let per_scenario = users.div_ceil(kinds.len());
    let mut drops = Vec::new();
    for kind in &kinds {
        let drop = Arc::new(Drop::plan(*kind, &settings, per_scenario));
        drop.declare(&admin)
            .await
            .with_context(|| format!("declaring the SKUs of {}", kind.name()))?;
        println!(
            "{}: declared {} SKU(s) x {} units for {} buyers (run id {})",
            kind.name(),
            drop.skus.len(),
            drop.stock,
            drop.buyers,
            settings.run_id
        );
        drops.push(drop);
    }

    let mut attack = with_defaults(
        GooseAttack::initialize_with_config(config.clone())?,
        &config,
        &host,
        users,
    )?;
    for drop in &drops {
        attack = attack.register_scenario(drop.scenario());
    }

    // checkout: units come back during the whole run (a restock every few seconds goes to the
    // head of the line as offers), not only from the first wave's cancels and expiries.
    let restockers: Vec<_> = drops
        .iter()
        .filter(|d| d.kind == scenarios::Kind::Checkout)
        .map(|d| {
            let admin = Admin::unpooled(&host, &settings.admin_token);
            let drop = d.clone();
            tokio::spawn(async move {
                let Ok(admin) = admin else { return };
                drop.restock_periodically(&admin).await;
            })
        })
        .collect();

    let started = SystemTime::now();
    let executed = attack.execute().await.context("running the load");
    for r in restockers {
        r.abort();
    }
    executed?;

    println!(
        "\nnote: hot_sku_drop, many_skus and retry_storm judge each claim before goose records \
         it, so their decided 409s (sold_out, limit_reached) are not in goose's ERRORS table; in \
         checkout and queue_drop goose lists a decided 409 (also hold_expired, in_stock) as it \
         arrived, then it is marked a success, as the # fails column shows."
    );
    let mut verdicts = Vec::new();
    for drop in &drops {
        let v = if drop.kind == scenarios::Kind::Checkout {
            holds_check::check(&admin, drop, settings.database_url.as_ref(), settings.drain).await
        } else if drop.kind == scenarios::Kind::QueueDrop {
            let db = settings.database_url.as_ref();
            queue_check::check(&admin, drop, &host, db, settings.drain).await
        } else {
            verify::check(&admin, drop, settings.drain).await
        };
        verdicts.push((drop.kind.name(), v.failures));
    }
    let all_ok = verdicts.iter().all(|(_, f)| f.is_empty());
    println!(
        "\n{}",
        if all_ok {
            "invariants: PASS"
        } else {
            "invariants: FAIL"
        }
    );

    // The HTML report carries the verdict at its top, and renders offline.
    let mut report_ok = true;
    for path in report::html_reports(&config, started) {
        match report::finish_file(&path, &verdicts) {
            Ok(()) => println!(
                "report: {} carries the invariants' verdict and renders offline (ECharts inlined)",
                path.display()
            ),
            Err(e) => {
                eprintln!("report: {e}");
                report_ok = false;
            }
        }
    }
    if !report_ok {
        anyhow::bail!("the HTML report could not be made to render offline");
    }
    Ok(all_ok)
}

/// Goose defaults for what the command line leaves open: the target, a bounded run, all users
/// started within about a second (a drop opens at once), and no telnet controller (it binds a
/// fixed port that parallel runs would fight over).
fn with_defaults(
    attack: GooseAttack,
    config: &GooseConfiguration,
    host: &str,
    users: usize,
) -> Result<GooseAttack, GooseError> {
    let mut attack = *attack
        .set_default(GooseDefault::Host, host)?
        .set_default(GooseDefault::NoTelnet, true)?;
    if config.timeout.is_none() {
        // A request the gateway never answers fails after this, not after goose's 60 s.
        attack = *attack.set_default(GooseDefault::Timeout, REQUEST_TIMEOUT_SECS)?;
    }
    // A test plan sets its own shape, and refuses these.
    let planned = std::env::args().any(|a| a == "--test-plan" || a.starts_with("--test-plan="));
    if planned {
        return Ok(attack);
    }
    attack = *attack.set_default(GooseDefault::Users, DEFAULT_USERS)?;
    // Keep the opening seconds in the summary: that is when a drop sells out.
    attack = *attack.set_default(GooseDefault::NoResetMetrics, true)?;
    if config.iterations.is_none() && config.run_time.is_none() {
        attack = *attack.set_default(GooseDefault::RunTime, DEFAULT_RUN_TIME_SECS)?;
    }
    if config.increase_time.is_none() && config.increase_rate.is_none() {
        let rate = users.max(1).to_string();
        attack = *attack.set_default(GooseDefault::IncreaseRate, rate.as_str())?;
    }
    Ok(attack)
}
