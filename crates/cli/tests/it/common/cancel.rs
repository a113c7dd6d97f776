//! One check for every agent CLI: a turn cancelled through `warden serve`
//! while the CLI waits on a stalled model stream ends every process of the
//! CLI at once, and nothing is retried.

use std::path::Path;
use std::time::{Duration, Instant};

use warden_mock::{MockConfig, MockServer, Scenario};

use super::{arg, post_workspace_turn, serve_logged, test_dirs};

/// The processes whose command line has `needle` in one of its arguments.
pub(crate) fn processes_naming(needle: &Path) -> Vec<u32> {
    let wanted = needle.as_os_str().as_encoded_bytes();
    processes_where(|pid| {
        std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|line| {
            line.split(|b| *b == 0)
                .any(|arg| arg.windows(wanted.len()).any(|w| w == wanted))
        })
    })
}

/// The processes whose environment has `var` (`NAME=value`) exactly.
pub(crate) fn processes_with_env(var: &str) -> Vec<u32> {
    processes_where(|pid| {
        std::fs::read(format!("/proc/{pid}/environ"))
            .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == var.as_bytes()))
    })
}

fn processes_where(keep: impl Fn(u32) -> bool) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| keep(*pid))
        .collect()
}

/// An agent CLI under `warden serve` for [`a_cancelled_turn_ends_every_process`].
pub(crate) struct Cancelled<'a> {
    /// How the CLI is named in messages.
    pub(crate) name: &'a str,
    /// `warden serve`'s agent flags (`--agent X`, a model).
    pub(crate) serve_args: &'a [&'a str],
    /// The environment naming the CLI's binary, without `HOME`.
    pub(crate) env: &'a [(&'a str, &'a str)],
    /// The API path the CLI's model requests take on the mock.
    pub(crate) path: &'a str,
    /// How long the CLI may take to send its first request.
    pub(crate) reach_within: Duration,
    /// The fewest processes the CLI runs at once (Qwen Code: its entry and
    /// `cli.js`).
    pub(crate) at_least: usize,
    /// The CLI's processes, given the data and workspace directories.
    pub(crate) processes: fn(data: &Path, workspace: &Path) -> Vec<u32>,
}

/// A turn against a mock whose stream stalls, cancelled with `DELETE
/// /v1/turns/{id}` once the CLI's request reached it: every process of the
/// CLI gone within 10 s (any left are killed, then the test fails), one
/// request, nothing retried.
pub(crate) async fn a_cancelled_turn_ends_every_process(cli: Cancelled<'_>) {
    let mock = MockServer::start(MockConfig::default().with_sequence([Scenario::Stall]))
        .await
        .expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let (data, workspace, home) = test_dirs(dir.path());
    let mut env = cli.env.to_vec();
    env.extend([("HOME", arg(&home)), ("WARDEN_STREAM_TIMEOUT", "120000")]);
    let mut args = cli.serve_args.to_vec();
    args.extend(["--grace", "1"]);
    let (mut node, base, token, _) = serve_logged(&data, &mock.base_url(), &args, &env).await;
    let client = reqwest::Client::new();
    let (response, id) = post_workspace_turn(&client, &base, &token, &workspace, "hello").await;
    let reached = tokio::time::timeout(cli.reach_within, async {
        while mock.requests_to(cli.path) == 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(reached.is_ok(), "{} reached the mock in time", cli.name);
    let processes = || (cli.processes)(&data, &workspace);
    let running = processes();
    assert!(
        running.len() >= cli.at_least,
        "{} runs at least {} process(es): {running:?}",
        cli.name,
        cli.at_least
    );

    let cancelled = client
        .delete(format!("{base}/v1/turns/{id}"))
        .bearer_auth(&token)
        .send()
        .await
        .expect("delete");
    assert!(cancelled.status().is_success(), "{}", cancelled.status());
    let started = Instant::now();
    let gone = tokio::time::timeout(Duration::from_secs(10), async {
        while !processes().is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let left = processes();
    for pid in &left {
        let _ = std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status();
    }
    assert!(
        gone.is_ok(),
        "every process of {} ended: {running:?} ran, {left:?} left",
        cli.name
    );
    eprintln!(
        "{} cancelled: {} process(es) gone after {:?}",
        cli.name,
        running.len(),
        started.elapsed()
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(mock.requests_to(cli.path), 1, "nothing retried");
    drop(response);
    node.start_kill().expect("SIGKILL");
    let _ = tokio::time::timeout(Duration::from_secs(30), node.wait()).await;
    mock.shutdown().await;
}
