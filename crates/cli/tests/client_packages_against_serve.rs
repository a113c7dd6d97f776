//! The client packages (`clients/python`, `clients/typescript`) against a
//! real `warden serve` process on the mock: each one's suite (a stalled
//! reply, a dropped connection re-attached, cancel, sessions, typed errors,
//! lifecycle replay; async for Python), then its README's example as
//! written.
//!
//! The dropped connection is real: the suites reach the server also
//! through a TCP relay here that cuts each turn's first event stream in the
//! middle of its reply.
//!
//! Needs a Python with the Python client's dependencies
//! (`WARDEN_CLIENT_PYTHON`) and, for TypeScript, Node 20+ with
//! `clients/typescript`'s `npm ci` done; `.ci/run` provides both (pinned).
//! Without them a test says why and passes, unless `WARDEN_REQUIRE_PY_CLIENT=1`
//! / `WARDEN_REQUIRE_TS_CLIENT=1` (CI) make it fail.

mod common;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use warden_mock::{MockConfig, MockServer, Scenario};

fn python() -> Option<String> {
    match std::env::var("WARDEN_CLIENT_PYTHON") {
        Ok(p) => Some(p),
        Err(_) => {
            assert!(
                std::env::var("WARDEN_REQUIRE_PY_CLIENT").as_deref() != Ok("1"),
                "WARDEN_REQUIRE_PY_CLIENT=1 but WARDEN_CLIENT_PYTHON is unset"
            );
            eprintln!("skipped: set WARDEN_CLIENT_PYTHON to a Python with httpx and httpx-sse");
            None
        }
    }
}

fn client_dir() -> PathBuf {
    clients("python")
}

fn clients(which: &str) -> PathBuf {
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
/// mid-text; watchdog 1 s) and the flaky relay in front of it.
struct Served {
    _mock: MockServer,
    _dir: tempfile::TempDir,
    child: tokio::process::Child,
    base: String,
    flaky: String,
    cut: Arc<Mutex<HashSet<String>>>,
    token: String,
    workspace: String,
}

impl Served {
    async fn start() -> Self {
        let mock = MockServer::start(
            MockConfig::default()
                .with_sequence([Scenario::Stall, Scenario::Normal])
                .with_frame_interval(Duration::from_millis(100))
                .with_fault_after_frames(6),
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

    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("WARDEN_URL", self.base.clone()),
            ("WARDEN_FLAKY_URL", self.flaky.clone()),
            ("WARDEN_TOKEN", self.token.clone()),
            ("WARDEN_WORKSPACE", self.workspace.clone()),
        ]
    }

    fn cuts(&self) -> usize {
        self.cut.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// The first ```LANG block of `readme`.
fn example(readme: &Path, lang: &str) -> String {
    let text = std::fs::read_to_string(readme).expect("README");
    text.split(&format!("```{lang}\n"))
        .nth(1)
        .and_then(|rest| rest.split("\n```").next())
        .unwrap_or_else(|| panic!("a {lang} example in {}", readme.display()))
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_passes_its_suite_against_a_real_server() {
    let Some(python) = python() else { return };
    let mut served = Served::start().await;
    let env = served.env();
    let suite = run(
        &python,
        &["-m", "unittest", "discover", "-s", "tests", "-v"],
        &client_dir(),
        &env,
    )
    .await;
    assert!(suite.0, "the Python client's suite failed:\n{}", suite.1);
    assert!(suite.1.contains("Ran 11 tests"), "{}", suite.1);
    let cut = served.cuts();
    assert!(
        cut >= 2,
        "the relay cut the streams of both flaky turns: {cut}"
    );

    // The README's example, as written.
    let dir = tempfile::tempdir().expect("tempdir");
    let example_file = dir.path().join("example.py");
    std::fs::write(
        &example_file,
        example(&client_dir().join("README.md"), "python"),
    )
    .expect("write the example");
    let ran = run(
        &python,
        &[example_file.to_str().expect("utf-8")],
        &client_dir(),
        &env,
    )
    .await;
    assert!(ran.0, "the README example failed:\n{}", ran.1);
    assert!(ran.1.contains("Hello from warden-mock."), "{}", ran.1);
    let _ = served.child.start_kill();
}

/// `node` and `npm`, when the TypeScript client can be tested here.
fn node() -> Option<()> {
    let installed = clients("typescript")
        .join("node_modules/typescript")
        .is_dir();
    let node = std::process::Command::new("node")
        .arg("--version")
        .output()
        .is_ok();
    if installed && node {
        return Some(());
    }
    assert!(
        std::env::var("WARDEN_REQUIRE_TS_CLIENT").as_deref() != Ok("1"),
        "WARDEN_REQUIRE_TS_CLIENT=1 but node or clients/typescript/node_modules is missing"
    );
    eprintln!("skipped: needs node and `npm ci` in clients/typescript");
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_typescript_client_passes_its_suite_against_a_real_server() {
    let Some(()) = node() else { return };
    let dir = clients("typescript");
    let mut served = Served::start().await;
    let env = served.env();
    let suite = run("npm", &["test"], &dir, &env).await;
    assert!(
        suite.0,
        "the TypeScript client's suite failed:\n{}",
        suite.1
    );
    assert!(suite.1.contains("# pass 7"), "{}", suite.1);
    assert!(suite.1.contains("# fail 0"), "{}", suite.1);
    let cut = served.cuts();
    assert!(cut >= 1, "the relay cut the flaky turn's stream: {cut}");

    // The README's example, as written (a module of the package, so its
    // `@warden/client` import resolves to it).
    let example_file = dir.join(format!("readme-example-{}.mjs", std::process::id()));
    std::fs::write(&example_file, example(&dir.join("README.md"), "js")).expect("write");
    let ran = run("node", &[example_file.to_str().expect("utf-8")], &dir, &env).await;
    let _ = std::fs::remove_file(&example_file);
    assert!(ran.0, "the README example failed:\n{}", ran.1);
    assert!(ran.1.contains("Hello from warden-mock."), "{}", ran.1);
    let _ = served.child.start_kill();
}

/// Runs `program ARGS` in `dir` with `env`: whether it succeeded, and
/// its stdout and stderr.
async fn run(program: &str, args: &[&str], dir: &Path, env: &[(&str, String)]) -> (bool, String) {
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .current_dir(dir)
        .env("PYTHONPATH", client_dir())
        .env("NO_PROXY", "127.0.0.1,localhost")
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(Duration::from_secs(240), cmd.output())
        .await
        .expect("python finishes in time")
        .expect("python runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}
