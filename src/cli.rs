//! The subcommands of the `dropgate` binary.

use clap::{Parser, Subcommand};

use crate::config::RawConfig;

#[derive(Debug, Parser)]
#[command(name = "dropgate", version, about = "Flash-sale inventory gateway")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gateway (migrations are applied at start).
    Serve(RawConfig),
    /// Run a whole drop end to end on this machine and print a summary.
    Demo(DemoArgs),
    /// Print an admission token signed with the configured secret.
    Token(TokenArgs),
    /// Print every SKU's accounting; exit non-zero on any mismatch.
    Reconcile(ReconcileArgs),
    /// Claim events on NATS JetStream.
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
    /// Buyers released together, each claiming one unit.
    #[arg(long, default_value_t = 3000)]
    pub buyers: usize,
    /// Units in stock.
    #[arg(long, default_value_t = 500)]
    pub units: i64,
    /// Hold each won claim this long, then run a checkout: most confirm, some cancel, the rest
    /// let their holds expire, and buyers who lost take the offers of the waitlist.
    #[arg(long, default_value_t = 0)]
    pub hold_seconds: u64,
    /// With holds: percent of winners who confirm.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub confirm_percent: u8,
    /// With holds: percent of winners who cancel (the rest walk away and their holds expire).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub cancel_percent: u8,
    #[command(flatten)]
    pub config: RawConfig,
}

#[derive(Debug, clap::Args)]
pub struct TokenArgs {
    #[arg(long)]
    pub user: String,
    /// Mint tokens for `<user>-0` .. `<user>-<count - 1>` instead, one `user<TAB>token` line
    /// each (the load tools' distinct buyers).
    #[arg(long)]
    pub count: Option<u32>,
    #[arg(long)]
    pub sku: Option<String>,
    #[arg(long, default_value_t = 3600)]
    pub ttl: u64,
    #[arg(long, env = crate::config::ENV_ADMISSION_SECRET, hide_env_values = true)]
    pub admission_secret: String,
}

#[derive(Debug, clap::Args)]
pub struct ReconcileArgs {
    #[arg(long)]
    pub sku: Option<String>,
    #[command(flatten)]
    pub config: RawConfig,
}

/// `dropgate serve`: runs until SIGTERM or Ctrl-C, then shuts down gracefully.
///
/// # Errors
/// Startup failures.
pub async fn serve(config: crate::config::Config) -> anyhow::Result<()> {
    let app = crate::app::Application::build(config).await?;
    let shutdown = tokio_util::sync::CancellationToken::new();
    let signal = shutdown.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutdown requested");
        signal.cancel();
    });
    app.run_until_stopped(shutdown).await;
    Ok(())
}

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

/// `dropgate reconcile`: prints the table; `Ok(false)` when any SKU does not balance.
///
/// # Errors
/// Connection failures.
pub async fn reconcile(args: ReconcileArgs) -> anyhow::Result<bool> {
    let mut raw = args.config;
    // Reconcile reads; it needs no admission secret.
    raw.admission_secret
        .get_or_insert_with(|| "reconcile-needs-no-secret".into());
    let config = raw.validate()?;
    let db = crate::db::connect_and_migrate(&config.database_url).await?;
    let store =
        crate::store::Store::connect(&config.redis_url, &config.key_prefix, config.redis_timeout)
            .await?;
    let catalog = crate::catalog::Catalog::new(db);
    let views = crate::ledger::accounting(&store, &catalog, args.sku.as_deref()).await?;
    print!("{}", crate::ledger::table(&views));
    Ok(views.iter().all(|v| v.consistent))
}

/// `dropgate events ...`.
///
/// # Errors
/// The subcommand's failure.
pub async fn events(args: EventsArgs) -> anyhow::Result<()> {
    match args.command {
        EventsCommand::Tail(t) => crate::outbox::tail::run(t).await,
    }
}
