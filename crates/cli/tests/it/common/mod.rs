//! Running the real `warden` binary from the tests.

#![allow(dead_code)]

pub(crate) mod agent_chat;
pub(crate) mod cancel;
pub(crate) mod cluster;
pub(crate) mod console;
pub(crate) mod postgres;

pub(crate) use postgres::{
    OwnServer, database_away, database_away_for, database_back, fresh_db, restart, server_down_for,
};

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

/// The rest of a child's stdout, line by line.
pub(crate) type StdoutLines = tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>;

/// Spawns `cmd` (`warden serve`, `warden proxy`) and waits at most `limit`
/// for its first stdout line, `listening on URL`: the child, the URL and
/// the rest of its stdout.
pub(crate) async fn spawn_listening(
    mut cmd: tokio::process::Command,
    limit: Duration,
) -> (tokio::process::Child, String, StdoutLines) {
    use tokio::io::AsyncBufReadExt as _;
    let mut child = cmd.spawn().expect("warden starts");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let first = tokio::time::timeout(limit, lines.next_line())
        .await
        .expect("a first line in time")
        .expect("read")
        .expect("a line");
    let base = first
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("first line: {first:?}"))
        .to_owned();
    (child, base, lines)
}

/// The binary under test.
pub(crate) const WARDEN: &str = env!("CARGO_BIN_EXE_warden");

/// `warden ARGS` with a clean environment for what warden reads.
pub(crate) fn command(args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(WARDEN);
    cmd.args(args)
        .env_remove("WARDEN_STREAM_TIMEOUT")
        .env_remove("WARDEN_DATA_DIR")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .env_remove("RUST_LOG")
        .env_remove("ANTHROPIC_BASE_URL")
        .env_remove("OPENAI_BASE_URL")
        .env("NO_PROXY", "127.0.0.1,localhost")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// Runs `cmd` to the end (at most `limit`).
pub(crate) async fn output(mut cmd: tokio::process::Command, limit: Duration) -> Output {
    let out = tokio::time::timeout(limit, cmd.output())
        .await
        .expect("warden finished in time")
        .expect("warden ran");
    check_no_panic(&out);
    out
}

/// `warden ARGS`, run to the end within 60 s.
pub(crate) async fn run(args: &[&str]) -> Output {
    output(command(args), Duration::from_secs(60)).await
}

/// Stdout as text.
pub(crate) fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Stderr as text.
pub(crate) fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The exit code (a signal death is a test failure).
pub(crate) fn code(out: &Output) -> i32 {
    out.status.code().unwrap_or_else(|| {
        panic!(
            "warden died of a signal: {:?}\nstderr: {}",
            out.status,
            stderr(out)
        )
    })
}

/// No user-caused error may surface as a panic or a backtrace.
pub(crate) fn check_no_panic(out: &Output) {
    let err = stderr(out);
    assert!(
        !err.contains("panicked")
            && !err.contains("RUST_BACKTRACE")
            && !err.contains("internal error"),
        "warden panicked:\n{err}"
    );
}

/// The attempts of the default retry policy: what a turn may ask the
/// upstream in all when every attempt fails.
pub(crate) const POLICY_ATTEMPTS: usize = 4;

/// A turn under an agent CLI whose upstream answers every request `503`
/// (an outage longer than the wire's attempts), ended by the wire layer
/// once it spent the retry policy's attempts: exit 5 (Unavailable), the
/// error naming the wire's attempts, one model request from the CLI on the
/// wire (neither the CLI's own retries nor a re-run of the turn), the
/// upstream asked [`POLICY_ATTEMPTS`] times, `took` well under a minute.
pub(crate) fn assert_the_wire_ended_the_outage(
    out: &Output,
    took: Duration,
    upstream_requests: usize,
) {
    check_no_panic(out);
    let said = stderr(out);
    assert_eq!(code(out), 5, "Unavailable: {said}");
    assert_one_line_error(out, "the wire layer made 4 attempts at model request #");
    assert!(said.contains("the turn is not run again"), "{said}");
    let requests: std::collections::HashSet<&str> = said
        .lines()
        .filter(|l| l.starts_with("warden: wire layer:"))
        .filter_map(|l| l.split_once('#')?.1.split(':').next())
        .collect();
    assert_eq!(
        requests.len(),
        1,
        "one model request from the CLI: neither its own retries nor a re-run: {said}"
    );
    assert_eq!(
        upstream_requests, POLICY_ATTEMPTS,
        "the retry policy's attempts upstream, not the layers' product: {said}"
    );
    assert!(
        took < Duration::from_secs(60),
        "the wire's backoff (0.5 + 1 + 2 s, jittered) and the CLI's start-up: {took:?}"
    );
}

/// Asserts the error is one line `warden: error: …` containing `needle`.
pub(crate) fn assert_one_line_error(out: &Output, needle: &str) {
    let err = stderr(out);
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("warden: error:"))
        .collect();
    assert_eq!(lines.len(), 1, "expected one error line, got:\n{err}");
    assert!(
        lines[0].contains(needle),
        "{needle:?} not in {:?}",
        lines[0]
    );
}

/// A path argument as `&str`.
pub(crate) fn arg(path: &Path) -> &str {
    path.to_str().expect("utf-8 temp path")
}

/// A test's directories under `dir`: warden's data directory (`data`,
/// left for warden to make), and the workspace (`repo`) and the agent
/// CLI's `HOME` (`home`), both made.
pub(crate) fn test_dirs(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let (data, workspace, home) = (dir.join("data"), dir.join("repo"), dir.join("home"));
    for d in [&workspace, &home] {
        std::fs::create_dir_all(d).expect("mkdir");
    }
    (data, workspace, home)
}

/// `POST /v1/turns` of `message` in `workspace` on `warden serve` at
/// `base`, asking for the event stream: the `200` answer, unread, and the
/// turn's id (`x-warden-turn-id`).
pub(crate) async fn post_workspace_turn(
    client: &reqwest::Client,
    base: &str,
    token: &str,
    workspace: &Path,
    message: &str,
) -> (reqwest::Response, String) {
    let body = serde_json::json!({"workspace": arg(workspace), "message": message});
    let response = client
        .post(format!("{base}/v1/turns"))
        .bearer_auth(token)
        .header("accept", "text/event-stream")
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("post");
    assert_eq!(response.status(), 200);
    let id = response.headers()["x-warden-turn-id"]
        .to_str()
        .expect("ascii")
        .to_owned();
    (response, id)
}

/// `warden serve` on data directory `data`, its agent's API at `base_url`,
/// with `extra` flags and `env`: the child, its URL and its token (read
/// from `data/token`). Its stderr is read (see [`serve_logged`]), so its
/// warnings never fill the pipe and stop it.
pub(crate) async fn serve_on(
    data: &Path,
    base_url: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> (tokio::process::Child, String, String) {
    let (child, base, token, _) = serve_logged(data, base_url, extra, env).await;
    (child, base, token)
}

/// The lines a child wrote to stderr so far.
pub(crate) type Logged = std::sync::Arc<parking_lot::Mutex<Vec<String>>>;

/// [`serve_on`], and the lines the server writes to stderr (its warnings
/// and errors: `warden serve` logs them without `RUST_LOG`), as they come.
pub(crate) async fn serve_logged(
    data: &Path,
    base_url: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> (tokio::process::Child, String, String, Logged) {
    use tokio::io::AsyncBufReadExt as _;
    let mut args = vec!["serve", "--data-dir", arg(data), "--base-url", base_url];
    // A free port unless the caller names one (a restart on the same).
    if !extra.contains(&"--listen") {
        args.extend(["--listen", "127.0.0.1:0"]);
    }
    args.extend(extra);
    let mut cmd = command(&args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let (mut child, base, _stdout) = spawn_listening(cmd, Duration::from_secs(30)).await;
    let logged = Logged::default();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().expect("stderr")).lines();
    let keep = std::sync::Arc::clone(&logged);
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            keep.lock().push(line);
        }
    });
    let token = std::fs::read_to_string(data.join("token"))
        .expect("the token file")
        .trim()
        .to_owned();
    (child, base, token, logged)
}

/// The next SSE event (`id`, `event`, `data`) from `body`, `None` at its
/// end; keep-alive comments are skipped. Waits at most until `deadline`.
pub(crate) async fn next_event<B: AsRef<[u8]>>(
    body: &mut (impl futures_util::Stream<Item = reqwest::Result<B>> + Unpin),
    buf: &mut String,
    deadline: tokio::time::Instant,
) -> Result<Option<(u64, String, serde_json::Value)>, String> {
    use futures_util::StreamExt as _;
    loop {
        if let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            let (mut id, mut kind, mut data) = (None, String::new(), String::new());
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id: ") {
                    id = v.parse().ok();
                } else if let Some(v) = line.strip_prefix("event: ") {
                    kind = v.to_owned();
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data.push_str(v);
                }
            }
            let Some(id) = id else { continue };
            let data = serde_json::from_str(&data).map_err(|e| format!("data: {e}"))?;
            return Ok(Some((id, kind, data)));
        }
        match tokio::time::timeout_at(deadline, body.next()).await {
            Err(_) => return Err("no end before the bound (keep-alives only)".into()),
            Ok(Some(Ok(b))) => buf.push_str(&String::from_utf8_lossy(b.as_ref())),
            Ok(Some(Err(_)) | None) => return Ok(None),
        }
    }
}
