//! What the client package tests share: a real `warden serve` on the mock
//! with a relay that cuts streams ([`Served`]), the README's fenced blocks
//! ([`fenced`]) and running a program ([`run`]).

#![allow(dead_code)]

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use warden_mock::{MockConfig, MockServer, Scenario};

use crate::common::serve_on;

/// How long the mock holds a reply quiet (pings only) for a turn whose
/// model is [`QUIET_MODEL`]: past the server's 15 s keep-alive, so the
/// clients see an SSE comment mid-turn.
pub(crate) const QUIET: Duration = Duration::from_secs(20);

/// The model that selects the mock's `thinking-pings` scenario.
pub(crate) const QUIET_MODEL: &str = "mock-thinking-pings";

/// `clients/WHICH` in this checkout.
pub(crate) fn clients(which: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../clients")
        .join(which)
        .canonicalize()
        .unwrap_or_else(|e| panic!("clients/{which}: {e}"))
}

/// A relay to `upstream` that cuts the first `GET /v1/turns/{id}/events`
/// connection of each turn once some of its text has been relayed (a
/// dropped connection mid-reply); everything else passes untouched. Its
/// address, and the turns whose stream it cut.
async fn flaky_relay(upstream: String) -> (String, Arc<Mutex<HashSet<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let cut: Arc<Mutex<HashSet<String>>> = Arc::default();
    let seen = Arc::clone(&cut);
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let upstream = upstream.clone();
            let cut = Arc::clone(&cut);
            tokio::spawn(async move {
                let _ = relay(client, &upstream, &cut).await;
            });
        }
    });
    (format!("http://{addr}"), seen)
}

async fn relay(
    client: TcpStream,
    upstream: &str,
    cut: &Arc<Mutex<HashSet<String>>>,
) -> std::io::Result<()> {
    use std::sync::atomic::{AtomicBool, Ordering};
    let server = TcpStream::connect(upstream).await?;
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    // Set when a request on this connection (kept alive: any of them)
    // follows the events of a turn whose stream was not cut yet.
    let cutting = Arc::new(AtomicBool::new(false));
    let up = {
        let (cutting, cut) = (Arc::clone(&cutting), Arc::clone(cut));
        tokio::spawn(async move {
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                let n = cr.read(&mut buf).await?;
                if n == 0 {
                    return Ok::<_, std::io::Error>(());
                }
                let text = String::from_utf8_lossy(&buf[..n]);
                for (at, _) in text.match_indices("GET /v1/turns/") {
                    let rest = &text[at + "GET /v1/turns/".len()..];
                    if let Some((id, _)) = rest.split_once("/events") {
                        if cut
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert(id.to_owned())
                        {
                            cutting.store(true, Ordering::SeqCst);
                        }
                    }
                }
                sw.write_all(&buf[..n]).await?;
            }
        })
    };
    let mut buf = vec![0u8; 16 * 1024];
    let mut texts = 0;
    loop {
        let n = sr.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        cw.write_all(&buf[..n]).await?;
        if cutting.load(Ordering::SeqCst) {
            texts += String::from_utf8_lossy(&buf[..n])
                .matches("event: text")
                .count();
            if texts >= 2 {
                break; // both sides dropped here: the connection is cut mid-reply
            }
        }
    }
    up.abort();
    Ok(())
}

/// A `warden serve` process on the mock (whose first request stalls
/// mid-text, watchdog 1 s; a turn with [`QUIET_MODEL`] is held quiet for
/// [`QUIET`] with pings) and the flaky relay in front of it.
pub(crate) struct Served {
    _mock: MockServer,
    _dir: tempfile::TempDir,
    pub(crate) child: tokio::process::Child,
    base: String,
    flaky: String,
    cut: Arc<Mutex<HashSet<String>>>,
    token: String,
    workspace: String,
}

impl Served {
    pub(crate) async fn start() -> Self {
        let mock = MockServer::start(
            MockConfig::default()
                .with_sequence([Scenario::Stall, Scenario::Normal])
                .with_frame_interval(Duration::from_millis(100))
                .with_fault_after_frames(6)
                .with_thinking_pause(QUIET)
                .with_ping_interval(Duration::from_millis(250)),
        )
        .await
        .expect("mock");
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("data");
        let workspace = dir.path().join("ws");
        std::fs::create_dir_all(&workspace).expect("workspace");
        let (child, base, token) = serve_on(
            &data,
            &mock.base_url(),
            &[],
            &[("WARDEN_STREAM_TIMEOUT", "1000")],
        )
        .await;
        let (flaky, cut) = flaky_relay(base.trim_start_matches("http://").to_owned()).await;
        Self {
            _mock: mock,
            child,
            base,
            flaky,
            cut,
            token,
            workspace: workspace.to_str().expect("utf-8").to_owned(),
            _dir: dir,
        }
    }

    /// What the suites and the README examples read: `WARDEN_URL`,
    /// `WARDEN_FLAKY_URL`, `WARDEN_TOKEN`, `WARDEN_WORKSPACE`,
    /// `WARDEN_QUIET_MODEL`.
    pub(crate) fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("WARDEN_URL", self.base.clone()),
            ("WARDEN_FLAKY_URL", self.flaky.clone()),
            ("WARDEN_TOKEN", self.token.clone()),
            ("WARDEN_WORKSPACE", self.workspace.clone()),
            ("WARDEN_QUIET_MODEL", QUIET_MODEL.to_owned()),
        ]
    }

    /// How many turns' streams the relay cut.
    pub(crate) fn cuts(&self) -> usize {
        self.cut.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// The `n`-th (from 0) fenced block of `readme` whose info string is
/// `lang`, as written.
pub(crate) fn fenced(readme: &Path, lang: &str, n: usize) -> String {
    let text = std::fs::read_to_string(readme).expect("README");
    text.split(&format!("```{lang}\n"))
        .nth(n + 1)
        .and_then(|rest| rest.split("\n```").next())
        .unwrap_or_else(|| panic!("a {lang} block number {n} in {}", readme.display()))
        .to_owned()
}

/// Runs `program ARGS` in `dir` with `env` (at most `limit`): whether it
/// succeeded, and its stdout and stderr.
pub(crate) async fn run(
    program: &str,
    args: &[&str],
    dir: &Path,
    env: &[(&str, String)],
    limit: Duration,
) -> (bool, String) {
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .current_dir(dir)
        .env("NO_PROXY", "127.0.0.1,localhost")
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(limit, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("{program} {args:?} finished within {limit:?}"))
        .unwrap_or_else(|e| panic!("{program} runs: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}
