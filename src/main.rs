//! The `dropgate` binary: parse the command line, set up logging, run the subcommand, and
//! turn its failure into one message on stderr and an exit status of its own (docs/cli.md).

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use dropgate::cli::{Cli, Command};
use dropgate::config::ENV_LOG_JSON;
use dropgate::startup::{explain, Exit};
use tracing_subscriber::EnvFilter;

/// mimalloc instead of glibc malloc: the hot path allocates small buffers per request, and
/// glibc's malloc/free was ~11% of the gateway's CPU in a `perf record` of a wrk run.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_purge_delay` in mimalloc.h (its 16th option, v2 and v3 alike): how long freed
/// memory waits before it goes back to the OS.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Keeps freed memory instead of purging it (mimalloc 3 purges what stayed free for a second).
/// The writer's and the journal reader's batch buffers (`parse_entries`, `Batch::dedup`'s
/// sort) are large and come and go; purged in between, they came back as fresh page faults,
/// often a 2 MiB transparent huge page zeroed whole: 17.7-19.3k faults against 606-738 over
/// 1.3 M claims, and 2.6-5 % less gateway CPU per claim without purging, in three side-by-side
/// runs, both orders (docs/performance.md, "Freed memory kept"). The process keeps its peak
/// heap; `MIMALLOC_PURGE_DELAY`, when set, is left to mimalloc.
fn keep_freed_memory() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: an option setter; mimalloc reads the option at each purge decision.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) }
    }
}

fn main() -> ExitCode {
    keep_freed_memory();
    let cli = Cli::parse();
    let json = std::env::var(ENV_LOG_JSON).is_ok_and(|v| v == "1");
    if matches!(cli.command, Command::Demo(_) | Command::Events(_)) {
        // Their output is a stream a reader may stop reading (`demo | head -3`): the default
        // SIGPIPE ends them quietly, as it ends `cat`, instead of a panic in `println!`.
        // Sockets are unaffected (Rust writes to them with MSG_NOSIGNAL).
        // SAFETY: called first thing, before any other thread exists.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    // demo's summary is what a person at a terminal came for: its gateway's INFO lines
    // (~19 of them) would bury it, so on a terminal only warnings show unless RUST_LOG asks.
    let default_level =
        if matches!(cli.command, Command::Demo(_)) && std::io::stderr().is_terminal() {
            "warn"
        } else {
            "info"
        };
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    // Logs go to stderr, always: stdout carries only the command's output (demo's summary,
    // reconcile's table, tokens, events), so it can be piped. Colour only on a terminal that
    // does not ask for none.
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colour);
    if json {
        subscriber.json().init();
    } else {
        subscriber.init();
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => return fail(Exit::Other, &format!("cannot start the runtime: {e}"), json),
    };
    let result = match cli.command {
        Command::Token(t) => dropgate::cli::token::run(&t).map_err(anyhow::Error::from),
        Command::Serve(raw) => match raw.validate() {
            Err(e) => Err(e.into()),
            Ok(config) => runtime.block_on(dropgate::cli::serve(config)),
        },
        Command::Demo(args) => runtime.block_on(dropgate::demo::run(args)),
        Command::Events(args) => runtime.block_on(dropgate::cli::events(args)),
        Command::Reconcile(args) => match runtime.block_on(dropgate::cli::reconcile(args)) {
            Ok(true) => Ok(()),
            Ok(false) => return ExitCode::from(Exit::Mismatch.code()),
            Err(e) => Err(e),
        },
    };
    // Dropping the runtime here would wait for tasks still blocked on a dead connection.
    runtime.shutdown_background();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let (exit, message) = explain(&e);
            fail(exit, &message, json)
        }
    }
}

/// Says a failure once: as a JSON log line for a log shipper, else as plain text.
fn fail(exit: Exit, message: &str, json: bool) -> ExitCode {
    if json {
        tracing::error!(exit = exit.code(), "{message}");
    } else {
        eprintln!("error: {message}");
    }
    ExitCode::from(exit.code())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_memory_is_kept_unless_the_environment_sets_a_purge_delay() {
        assert!(std::env::var_os("MIMALLOC_PURGE_DELAY").is_none());
        keep_freed_memory();
        // SAFETY: an option getter.
        assert_eq!(
            unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) },
            -1
        );
    }
}
