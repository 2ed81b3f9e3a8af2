//! The `dropgate` binary: parse the command line, set up logging, run the subcommand.

use std::process::ExitCode;

use clap::Parser;
use dropgate::cli::{Cli, Command};
use dropgate::config::{Secret, ENV_LOG_JSON, EXIT_CONFIG};
use tracing_subscriber::fmt::writer::BoxMakeWriter;
use tracing_subscriber::EnvFilter;

/// mimalloc instead of glibc malloc: the hot path allocates small buffers per request, and
/// glibc's malloc/free was ~11% of the gateway's CPU in a `perf record` of a wrk run.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let json = std::env::var(ENV_LOG_JSON).is_ok_and(|v| v == "1");
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // `events tail` writes events to stdout, one JSON line each: its log goes to stderr.
    let writer = if matches!(cli.command, Command::Events(_)) {
        BoxMakeWriter::new(std::io::stderr)
    } else {
        BoxMakeWriter::new(std::io::stdout)
    };
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    if json {
        subscriber.json().init();
    } else {
        subscriber.init();
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match cli.command {
        Command::Token(t) => match mint_tokens(&t) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("cannot mint a token: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Serve(raw) => match raw.validate() {
            Err(e) => {
                eprintln!("{e}");
                ExitCode::from(EXIT_CONFIG as u8)
            }
            Ok(config) => report(runtime.block_on(dropgate::cli::serve(config))),
        },
        Command::Demo(args) => report(runtime.block_on(dropgate::demo::run(args))),
        Command::Events(args) => report(runtime.block_on(dropgate::cli::events(args))),
        Command::Reconcile(args) => match runtime.block_on(dropgate::cli::reconcile(args)) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::from(1),
            Err(e) => {
                eprintln!("reconcile failed: {e:#}");
                ExitCode::from(2)
            }
        },
    }
}

fn report(r: anyhow::Result<()>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `dropgate token`: one token, or `--count` of them for distinct users.
fn mint_tokens(t: &dropgate::cli::TokenArgs) -> anyhow::Result<()> {
    use std::io::Write;
    let secret = Secret::new(t.admission_secret.clone());
    let Some(count) = t.count else {
        println!(
            "{}",
            dropgate::auth::mint(&secret, &t.user, t.sku.as_deref(), t.ttl)?
        );
        return Ok(());
    };
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for i in 0..count {
        let user = format!("{}-{i}", t.user);
        let token = dropgate::auth::mint(&secret, &user, t.sku.as_deref(), t.ttl)?;
        writeln!(out, "{user}\t{token}")?;
    }
    out.flush()?;
    Ok(())
}
