//! `warden`: the command-line face of the warden framework.
//!
//! - `warden demo` runs an orchestrator against the built-in mock LLM server
//!   with faults injected and shows every recovery;
//! - `warden chat` sends one message to a workspace's session;
//! - `warden stream` is a watchdog-protected streaming client;
//! - `warden sessions` lists stored sessions;
//! - `warden mock` runs the fault-injecting mock server.
//!
//! Errors are one line on stderr (`warden: error: …`) and a documented exit
//! code ([`exit::EXIT_CODES`]), never a panic or a backtrace.

mod allocator;
mod chat;
mod client;
mod cluster;
mod connections;
mod demo;
mod exit;
mod input;
mod mock;
mod paths;
mod proxy;
mod relay;
mod serve;
mod serve_agents;
mod sessions;
mod signal;
mod sources;
mod stream;
mod terminal;
mod units;
mod wire;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use warden_telemetry::TelemetryConfig;

use crate::exit::{CliError, EXIT_CODES, Exit};

/// Keeps long-lived LLM agent sessions and their streams alive.
#[derive(Debug, Parser)]
#[command(name = "warden", version, after_help = EXIT_CODES)]
#[command(
    long_about = "Keeps long-lived LLM agent sessions and their streams alive.

A watchdog kills streams that go silent (WARDEN_STREAM_TIMEOUT ms, default 45000) and
the session retries them; sessions live in a sled database, resume their conversation,
and fall back to a fresh one when it cannot be resumed. Spans are exported over
OTLP/gRPC when OTEL_EXPORTER_OTLP_ENDPOINT is set; RUST_LOG turns on console logs."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run several workspace sessions against the built-in mock LLM server with
    /// faults injected (stall, thinking pause, 429, resume failures, idle reap)
    /// and show how each recovers.
    Demo(demo::DemoArgs),
    /// Send one message to the session of a workspace and stream the reply.
    Chat(chat::ChatArgs),
    /// Stream one request with the watchdog and retries on.
    Stream(stream::StreamArgs),
    /// List the stored sessions.
    Sessions(sessions::SessionsArgs),
    /// Run the fault-injecting mock LLM server.
    Mock(mock::MockArgs),
    /// Serve the workspace sessions over HTTP + SSE (for orchestrators in
    /// any language).
    // Boxed: its flags make it by far the largest variant.
    Serve(Box<serve::ServeArgs>),
    /// Put the watchdog, retries and continuation in front of unmodified
    /// clients: a local Anthropic/OpenAI-compatible proxy.
    Proxy(proxy::ProxyArgs),
    /// Inspect a cluster of `warden serve` nodes sharing one PostgreSQL.
    Cluster(cluster::ClusterArgs),
}

/// mimalloc, not glibc's malloc: see [`allocator`].
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    allocator::tune();
    // A bug must still be one line, not a backtrace.
    std::panic::set_hook(Box::new(|info| {
        let place = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        // The payload may quote stream text (a dependency's panic on a
        // malformed stream did): shown only when logs are asked for.
        if std::env::var_os("RUST_LOG").is_some() {
            let message = info
                .payload()
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| info.payload().downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            eprintln!("warden: internal error{place}: {message} (please report this)");
        } else {
            eprintln!(
                "warden: internal error{place} (please report this; RUST_LOG=debug shows its message)"
            );
        }
    }));
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(&CliError::failure(format!("cannot start the runtime: {e}"))),
    };
    let result = runtime.block_on(run(cli));
    runtime.shutdown_timeout(Duration::from_secs(3));
    match result {
        Ok(exit) => exit.into(),
        Err(e) => fail(&e),
    }
}

/// How long a command may take to wind down after SIGINT or SIGTERM before
/// it is abandoned (the cancel itself takes milliseconds).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Runs a command that relays a turn: SIGINT and SIGTERM are handled from
/// the start (before the turn exists) and cancel the turn; a cancel caused
/// by SIGTERM exits 143 instead of 130. A command still running
/// [`SHUTDOWN_GRACE`] after the signal is abandoned, so a signal can never
/// be swallowed.
async fn with_signals(
    command: impl std::future::Future<Output = Result<Exit, CliError>>,
) -> Result<Exit, CliError> {
    signal::install()?;
    let backstop = async {
        let which = signal::shutdown_signal().await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
        which
    };
    let result = tokio::select! {
        result = command => result,
        which = backstop => Err(CliError::new(
            which.exit(),
            format!(
                "stopped by {}: the command did not wind down within {} s",
                match which {
                    signal::Shutdown::Interrupt => "SIGINT",
                    signal::Shutdown::Terminate => "SIGTERM",
                },
                SHUTDOWN_GRACE.as_secs()
            ),
        )),
    };
    result.map_err(|mut e| {
        if e.exit == Exit::Cancelled {
            if let Some(which) = signal::received() {
                e.exit = which.exit();
            }
        }
        e
    })
}

fn fail(error: &CliError) -> ExitCode {
    eprintln!("warden: error: {error}");
    error.exit.into()
}

async fn run(cli: Cli) -> Result<Exit, CliError> {
    // Console logs only when asked for (RUST_LOG): stdout and stderr belong
    // to the command's own output — except a server's warnings and errors
    // (a damaged turn log, a store that fails), which an operator must see
    // without asking. OTLP export when the endpoint is set.
    let mut telemetry = TelemetryConfig::from_env();
    if std::env::var_os("RUST_LOG").is_none() {
        telemetry = match cli.command {
            // The connection pool warns of every failed connection in a
            // database outage; the node says it once itself, and its end
            // (with its joins, takeovers and rebalancing) at info.
            Command::Serve(_) => {
                telemetry.with_console_filter("warn,deadpool=error,warden_pg::cluster=info")
            }
            _ => telemetry.with_console(false),
        };
    }
    let guard = warden_telemetry::init(telemetry)
        .map_err(|e| CliError::usage(format!("telemetry: {e}")))?;
    let result = match cli.command {
        Command::Demo(args) => demo::run(args, guard.is_exporting()).await,
        Command::Chat(args) => with_signals(chat::run(args)).await,
        Command::Stream(args) => with_signals(stream::run(args)).await,
        Command::Sessions(args) => sessions::run(args).await,
        Command::Mock(args) => mock::run(args).await,
        Command::Serve(args) => {
            signal::install()?;
            serve::run(*args).await
        }
        Command::Cluster(args) => cluster::run(args).await,
        Command::Proxy(args) => {
            signal::install()?;
            proxy::run(args).await
        }
    };
    // Export what is left before the runtime goes away.
    tokio::task::spawn_blocking(move || drop(guard)).await.ok();
    result
}
