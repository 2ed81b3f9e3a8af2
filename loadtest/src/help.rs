//! `dropgate-loadtest --help`: this tool's own settings first (the gateway, its secrets, the
//! scenarios and their knobs, with the defaults they really take), then goose's options.

use std::fmt::Write;

use clap::CommandFactory;
use goose::config::GooseConfiguration;

use crate::scenarios::{Kind, HOT_UNITS_PER_USER};
use crate::settings::*;

/// Whether the command line asks for help (goose's `-h` / `--help`).
pub fn asked() -> bool {
    std::env::args().skip(1).any(|a| a == "-h" || a == "--help")
}

/// The whole help text.
pub fn text() -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "dropgate-loadtest: goose scenarios against a running dropgate gateway, then its invariants.\n\n\
         Usage: dropgate-loadtest [GOOSE OPTIONS]\n\
         \x20 e.g. DROPGATE_ADMISSION_SECRET=... DROPGATE_ADMIN_TOKEN=... dropgate-loadtest --scenarios hot_sku_drop --users 200 --run-time 20s --report-file r.html\n\n\
         Exit status: 0 every invariant held, 1 one failed, 2 the run could not be done, {EXIT_CONFIG} bad configuration.\n\n\
         Settings (environment variables):"
    );
    let rows: [(&str, String); 15] = [
        (ENV_URL, format!("the gateway [default: {DEFAULT_URL}]; goose's --host overrides it; loopback only unless {ENV_ALLOW_REMOTE}=1")),
        (ENV_ADMISSION_SECRET, "the gateway's admission secret, to mint buyers' tokens [required, at least 16 bytes; never printed]".into()),
        (ENV_ADMIN_TOKEN, "the gateway's admin token, to declare SKUs and read their views [required, at least 16 bytes; never printed]".into()),
        (ENV_DATABASE_URL, "the gateway's PostgreSQL, read by checkout's and queue_drop's checks after the run [required by checkout; queue_drop checks its ledger only with it]".into()),
        (ENV_SCENARIO, format!("scenarios, comma-separated, as --scenarios [default: {}]", Kind::DEFAULT.map(Kind::name).join(","))),
        (ENV_STOCK, format!("units per SKU [default: hot_sku_drop {HOT_UNITS_PER_USER} per goose user; many_skus users/20; retry_storm buyers/2; checkout users/3; queue_drop users/4; at least 1]")),
        (ENV_SKU_COUNT, format!("SKUs many_skus spreads its buyers over [default: {DEFAULT_SKU_COUNT}; 1..=10000]")),
        (ENV_RETRY_FANOUT, format!("retry_storm: goose users sharing one buyer and its Idempotency-Key [default: {DEFAULT_RETRY_FANOUT}; 1..=64]")),
        (ENV_HOLD_SECS, format!("checkout: how long a won claim is held, in seconds [default: {DEFAULT_HOLD_SECS}; 1..=600]")),
        (ENV_OFFER_SECS, format!("checkout: how long a waitlist offer is held, in seconds [default: {DEFAULT_OFFER_SECS}; 1..=600]")),
        (ENV_ADMIT_PER_SECOND, format!("queue_drop: the waiting room's admissions per second [default: {DEFAULT_ADMIT_PER_SECOND} = a tenth of the visitors, at least 5; 0..=100000]")),
        (ENV_OPEN_SECS, format!("queue_drop: seconds from the declare to the opening (visitors join the pre-queue before) [default: {DEFAULT_OPEN_SECS}; 1..=600]")),
        (ENV_DRAIN_SECS, format!("how long to wait after the load for the writer to drain, in seconds [default: {DEFAULT_DRAIN_SECS}; 1..=3600]")),
        (ENV_RUN_ID, "names this run's SKUs lt-<run id>-... [default: the start time in milliseconds; at most 32 of A-Za-z0-9_-]".into()),
        (ENV_ALLOW_REMOTE, "set to 1 to load a gateway that is not on a loopback address [default: unset]".into()),
    ];
    for (name, what) in rows {
        let _ = writeln!(s, "  {name:<28} {what}");
    }
    let _ = writeln!(s, "\nScenarios:");
    for (kind, what) in [
        (Kind::HotSkuDrop, "one SKU, every goose user a stream of new buyers (one claim each, limit 1), so the drop sells its units under load and then refuses"),
        (Kind::ManySkus, "buyers spread over many SKUs, a random one per request"),
        (Kind::RetryStorm, "every buyer sends the same Idempotency-Key again and again, from several goose users at once"),
        (Kind::Checkout, "holds and a waitlist: buyers confirm, cancel or walk away; the sold-out join the line (needs DATABASE_URL)"),
        (Kind::QueueDrop, "a waiting room: visitors join before the opening, are admitted in waves, claim with their admission tokens; the line is told sold out"),
    ] {
        let _ = writeln!(s, "  {:<28} {what}", kind.name());
    }
    let _ = writeln!(
        s,
        "\nGoose options (this tool's defaults when left open: --host {ENV_URL}, --users {DEFAULT_USERS}, \
         --run-time {DEFAULT_RUN_TIME_SECS}s, --increase-rate = users (all started within a second), \
         --timeout {REQUEST_TIMEOUT_SECS}, --no-telnet, --no-reset-metrics):\n"
    );
    // One default per option: goose's own text says "one per CPU" for --users, which this
    // tool never takes.
    let goose = GooseConfiguration::command()
        .mut_arg("users", |a| {
            a.help(format!("Concurrent users [default: {DEFAULT_USERS}]"))
                .long_help(format!(
                    "How many users to start [default: {DEFAULT_USERS}]"
                ))
        })
        .name("dropgate-loadtest")
        .render_help()
        .to_string();
    for line in goose.lines() {
        let _ = writeln!(s, "{}", line.trim_end());
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_help_starts_with_this_tools_settings_and_their_defaults_then_gooses() {
        let help = text();
        let goose_at = help.find("Goose options").expect("goose's section");
        let ours = &help[..goose_at];
        for name in [
            ENV_URL,
            ENV_ADMISSION_SECRET,
            ENV_ADMIN_TOKEN,
            ENV_DATABASE_URL,
            ENV_SCENARIO,
            ENV_STOCK,
            ENV_SKU_COUNT,
            ENV_RETRY_FANOUT,
            ENV_HOLD_SECS,
            ENV_OFFER_SECS,
            ENV_DRAIN_SECS,
            ENV_RUN_ID,
            ENV_ALLOW_REMOTE,
        ] {
            assert!(ours.contains(name), "{name} is not in\n{ours}");
        }
        for default in [
            DEFAULT_URL.to_string(),
            format!("default: {DEFAULT_SKU_COUNT};"),
            format!("default: {DEFAULT_DRAIN_SECS};"),
            format!("hot_sku_drop {HOT_UNITS_PER_USER} per goose user"),
            "default: hot_sku_drop,many_skus,retry_storm".to_string(),
        ] {
            assert!(ours.contains(&default), "{default} is not in\n{ours}");
        }
        for kind in Kind::ALL {
            assert!(ours.contains(kind.name()));
        }
        // One default for --users: this tool's, not goose's "one per CPU".
        let users = help
            .lines()
            .find(|l| l.contains("--users <"))
            .expect("goose's --users line");
        assert!(
            users.contains(&format!("[default: {DEFAULT_USERS}]")),
            "{users}"
        );
        assert!(
            !help.contains("one per CPU"),
            "goose's own default is shown"
        );
        // goose's own flags come after.
        for flag in ["--users", "--run-time", "--report-file", "--scenarios"] {
            let at = help.rfind(flag).unwrap_or_else(|| panic!("{flag}"));
            assert!(
                at > goose_at,
                "goose's {flag} is not after this tool's settings"
            );
        }
        assert!(help.starts_with("dropgate-loadtest: "));
    }
}
