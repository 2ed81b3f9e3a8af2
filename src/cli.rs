//! The subcommands of the `dropgate` binary.

use clap::{Parser, Subcommand};

use crate::config::{RawConfig, StoreArgs};

mod reconcile;
pub mod token;

#[derive(Debug, Parser)]
#[command(
    name = "dropgate",
    version,
    about = "Flash-sale inventory gateway",
    after_help = "Every flag also reads the environment variable shown with it. Logs go to \
                  stderr (RUST_LOG filters them, DROPGATE_LOG_JSON=1 makes them JSON); stdout \
                  carries only a command's output. Exit statuses: docs/cli.md."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gateway (creates the database when missing and applies the migrations at start)
    Serve(Box<RawConfig>),
    /// Run a whole drop end to end on this machine and print a summary (needs no
    /// configuration: local Redis and PostgreSQL, a random secret)
    Demo(DemoArgs),
    /// Print an admission token signed with the admission secret (for tests and load runs)
    Token(TokenArgs),
    /// Print every SKU's accounting; exit 1 on any mismatch. Read-only: never creates or
    /// migrates a database
    Reconcile(ReconcileArgs),
    /// Claim events on NATS JetStream
    Events(EventsArgs),
}

#[derive(Debug, clap::Args)]
pub struct EventsArgs {
    #[command(subcommand)]
    pub command: EventsCommand,
}

#[derive(Debug, Subcommand)]
pub enum EventsCommand {
    /// Print claim events as JSON lines from a durable consumer (resumes where it stopped).
    Tail(crate::outbox::tail::TailArgs),
}

#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Buyers released together, each claiming one unit (with --seats: groups of 1-6 seats);
    /// 3000 by default, 20000 with --seats
    #[arg(long = "buyers")]
    pub buyers_asked: Option<usize>,
    /// Units in stock
    #[arg(long, default_value_t = 500)]
    pub units: i64,
    /// Seconds each won claim is held, then a checkout runs: most confirm, some cancel, the
    /// rest let their holds expire, and buyers who lost take the offers of the waitlist (0:
    /// claims are final at once)
    #[arg(long, default_value_t = 0)]
    pub hold_seconds: u64,
    /// With holds: percent of winners who confirm
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub confirm_percent: u8,
    /// With holds: percent of winners who cancel (the rest walk away and their holds expire)
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub cancel_percent: u8,
    /// Run the drop behind a waiting room: buyers join the pre-queue, the seed is published
    /// at the opening, the queue admits at --buyers/5 per second, the admitted claim with
    /// their admission tokens; the summary says how many were admitted, won, and were told
    /// sold out
    #[arg(long)]
    pub queue: bool,
    /// Sell a 5,000-seat arena (5 sections of 25 rows of 40) to groups of 1-6: most ask for
    /// the best available seats, some pick their own; the summary counts seats sold twice (0),
    /// the single seats left stranded beside what a naive first-fit leaves on the same buyers,
    /// and the ledger's balance, and the final map is written as an SVG (--map)
    #[arg(long, conflicts_with_all = ["queue", "hold_seconds"])]
    pub seats: bool,
    /// With --seats: where the final seat map is written (SVG)
    #[arg(long, default_value = "dropgate-arena.svg")]
    pub map: std::path::PathBuf,
    #[command(flatten)]
    pub stores: StoreArgs,
}

impl DemoArgs {
    /// The buyers of this drop: `--buyers`, else 3000 (20000 in the arena).
    pub fn buyers(&self) -> usize {
        self.buyers_asked
            .unwrap_or(if self.seats { 20_000 } else { 3000 })
    }
}

pub use token::TokenArgs;

#[derive(Debug, clap::Args)]
pub struct ReconcileArgs {
    /// Only this SKU [default: every SKU of the catalog]
    #[arg(long)]
    pub sku: Option<String>,
    #[command(flatten)]
    pub stores: StoreArgs,
}

/// `dropgate serve`: runs until SIGTERM or Ctrl-C, then shuts down gracefully.
///
/// # Errors
/// Startup failures.
pub async fn serve(config: crate::config::Config) -> anyhow::Result<()> {
    // The graceful stop takes at most a grace for the requests and one for the flush; past
    // that (a backend that hangs instead of failing), or at a second signal, the process
    // exits: a stop is never unbounded (issue 37.6).
    let bound = config.shutdown_grace * 2 + STOP_SLACK;
    let app = crate::app::Application::build(config).await?;
    let shutdown = tokio_util::sync::CancellationToken::new();
    let signal = shutdown.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutdown requested");
        signal.cancel();
        tokio::select! {
            _ = wait_for_signal() => tracing::error!("a second signal: exiting now"),
            _ = tokio::time::sleep(bound) => tracing::error!(
                bound_secs = bound.as_secs(),
                "the gateway did not stop within its bound: exiting now"
            ),
        }
        std::process::exit(1);
    });
    app.run_until_stopped(shutdown).await;
    Ok(())
}

/// Beyond the two grace periods, the time a stop may take before the process exits anyway.
const STOP_SLACK: std::time::Duration = std::time::Duration::from_secs(2);

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

pub use reconcile::reconcile;

/// `dropgate events ...`.
///
/// # Errors
/// The subcommand's failure.
pub async fn events(args: EventsArgs) -> anyhow::Result<()> {
    match args.command {
        EventsCommand::Tail(t) => crate::outbox::tail::run(t).await,
    }
}
