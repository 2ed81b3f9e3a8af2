//! CI's benchmark gate (`.ci/run`, benches/baselines/README.md): the claim script's instruction
//! counts from `benches/script_cost.rs` against the baseline kept in the repository, a line of
//! history per run, and the history's chart.
//!
//! ```text
//! benchgate check --current out.json   # compare, append the history, redraw the chart
//! benchgate save --current out.json --reason "why"   # move the baseline on purpose
//! benchgate chart                      # redraw the chart from the history alone
//! ```
//!
//! Exit codes: 0 within the threshold, 1 a case regressed past it (each named on stderr),
//! 2 the files could not be read or do not match (a case missing, another bench).

mod chart;
mod gate;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    about = "The claim script's instruction counts against the baseline kept in the repository"
)]
struct Cli {
    /// The baseline kept in the repository.
    #[arg(
        long,
        global = true,
        default_value = "benches/baselines/script_cost.json"
    )]
    baseline: PathBuf,
    /// The history CI appends to (one JSON object a line).
    #[arg(long, global = true, default_value = "benches/baselines/history.jsonl")]
    history: PathBuf,
    /// The chart of the history (SVG).
    #[arg(long, global = true, default_value = "benches/baselines/history.svg")]
    chart: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Compare a run against the baseline; append it to the history; redraw the chart.
    Check {
        /// The run's counts (`SCRIPT_COST_JSON` of benches/script_cost.rs).
        #[arg(long)]
        current: PathBuf,
        /// Fail when a case's instructions per claim grew by more than this many percent
        /// (default: the baseline's `threshold_pct`).
        #[arg(long)]
        threshold: Option<f64>,
        /// The commit the run measured (default: `git rev-parse --short HEAD`).
        #[arg(long)]
        commit: Option<String>,
    },
    /// Make a run the new baseline (a deliberate change of cost, said in --reason).
    Save {
        #[arg(long)]
        current: PathBuf,
        /// Why the cost moved; kept in the baseline file.
        #[arg(long)]
        reason: String,
        /// The threshold kept with the baseline, percent.
        #[arg(long, default_value_t = gate::DEFAULT_THRESHOLD_PCT)]
        threshold: f64,
    },
    /// Redraw the chart from the history.
    Chart,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Check {
            current,
            threshold,
            commit,
        } => {
            let baseline = gate::Baseline::read(&cli.baseline)?;
            let run = gate::Run::read(&current)?;
            let threshold = threshold.unwrap_or(baseline.threshold_pct);
            let report = gate::compare(&baseline, &run, threshold)?;
            print!("{}", report.table());
            let commit = commit.unwrap_or_else(gate::head_commit);
            gate::append_history(&cli.history, &commit, &run, report.passed())?;
            chart::draw(&cli.history, &baseline, &cli.chart)?;
            println!(
                "history: {} (chart: {})",
                cli.history.display(),
                cli.chart.display()
            );
            for line in report.regressions() {
                eprintln!("error: {line}");
            }
            if report.passed() {
                println!("benchgate: every case within {threshold} % of the baseline");
                Ok(ExitCode::SUCCESS)
            } else {
                eprintln!(
                    "to move the baseline on purpose: benches/baselines/save.sh \"<why>\" (benches/baselines/README.md)"
                );
                Ok(ExitCode::from(1))
            }
        }
        Command::Save {
            current,
            reason,
            threshold,
        } => {
            let run = gate::Run::read(&current)?;
            let baseline = gate::Baseline::from_run(run, gate::head_commit(), reason, threshold);
            baseline.write(&cli.baseline)?;
            println!("baseline saved: {}", cli.baseline.display());
            Ok(ExitCode::SUCCESS)
        }
        Command::Chart => {
            let baseline = gate::Baseline::read(&cli.baseline)?;
            chart::draw(&cli.history, &baseline, &cli.chart)?;
            println!("chart: {}", cli.chart.display());
            Ok(ExitCode::SUCCESS)
        }
    }
}
