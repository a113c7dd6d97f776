//! `warden mock`: the fault-injecting mock LLM server, for testing other
//! clients.

use std::time::Duration;

use warden_mock::{MockConfig, MockServer, SCENARIO_HEADER, Scenario};

use crate::exit::{CliError, Exit};

/// The `--help` text listing every scenario.
fn scenarios_help() -> String {
    let mut help = String::from("Scenarios:\n");
    for s in Scenario::all() {
        help.push_str(&format!("  {:<16} {}\n", s.name(), s.description()));
    }
    help.push_str(&format!(
        "\nA request picks its scenario, first match wins: the header `{SCENARIO_HEADER}: NAME`;
a model named `mock-NAME` or ending in `:NAME`; a path prefix `/scenario/NAME/`; else
--scenario. Endpoints: POST /v1/messages (Anthropic), POST /v1/chat/completions
(OpenAI), GET /v1/models.

Examples:
  warden mock --port 8080 --scenario stall &
  warden stream http://127.0.0.1:8080/v1/messages --timeout 2000
  warden mock --port 8080 --scenario stall,normal &   # the first request stalls, the rest are answered"
    ));
    help
}

/// The scenarios of requests that do not choose one: one, or a script.
#[derive(Debug, Clone)]
struct Script(Vec<Scenario>);

/// One scenario, or a comma-separated script of them (`stall,normal`).
fn parse_script(names: &str) -> Result<Script, String> {
    names
        .split(',')
        .map(|name| name.trim().parse::<Scenario>().map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, _>>()
        .map(Script)
}

/// Arguments of `warden mock`.
#[derive(Debug, clap::Args)]
#[command(after_help = scenarios_help())]
pub(crate) struct MockArgs {
    /// The port on 127.0.0.1; 0 picks a free one (printed on start).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// The scenario of requests that do not choose one; a comma-separated
    /// list is a script: the first such request plays the first, the
    /// second the second, and every later one the last (`stall,normal`:
    /// the first attempt stalls, every retry is answered).
    #[arg(long, value_name = "NAME[,NAME…]", default_value = "normal", value_parser = parse_script)]
    scenario: Script,
    /// How long `thinking-pings` thinks, in milliseconds.
    #[arg(long, value_name = "MS", default_value = "10000", value_parser = crate::units::millis)]
    thinking_pause: Duration,
    /// The interval of pings while thinking, in milliseconds.
    #[arg(long, value_name = "MS", default_value = "1000", value_parser = crate::units::millis)]
    ping_interval: Duration,
    /// The `retry-after` of `rate-limited`, in milliseconds.
    #[arg(long, value_name = "MS", default_value = "1000", value_parser = crate::units::millis)]
    retry_after: Duration,
}

/// Runs `warden mock` until Ctrl-C or SIGTERM.
pub(crate) async fn run(args: MockArgs) -> Result<Exit, CliError> {
    if args.ping_interval < Duration::from_millis(1) {
        return Err(CliError::usage("--ping-interval must be at least 1 ms"));
    }
    let script = args.scenario.0;
    let mut config = MockConfig::default();
    config = match script.as_slice() {
        [one] => config.with_default_scenario(*one),
        _ => config.with_sequence(script.iter().copied()),
    };
    let mut config = config
        .with_thinking_pause(args.thinking_pause)
        .with_ping_interval(args.ping_interval)
        .with_retry_after(args.retry_after);
    if args.port != 0 {
        config = config.with_port(args.port);
    }
    let server = MockServer::start(config).await.map_err(|e| {
        CliError::failure(format!(
            "cannot start the mock server on 127.0.0.1:{}: {e}",
            args.port
        ))
    })?;
    let names: Vec<&str> = script.iter().map(|s| s.name()).collect();
    println!(
        "warden mock listening on {} (default scenario: {}; Ctrl-C to stop)",
        server.base_url(),
        names.join(",")
    );
    wait_for_stop().await;
    let served = server.request_count();
    server.shutdown().await;
    eprintln!("warden mock: stopped after {served} request(s)");
    Ok(Exit::Ok)
}

async fn wait_for_stop() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
