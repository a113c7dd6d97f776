//! The client packages (`clients/python`, `clients/typescript`) of this
//! tree against a real `warden serve` process on the mock: each one's suite
//! (a 20 s quiet pause upstream — the server's keep-alive comment reaches
//! the client mid-turn —, a stalled reply, a dropped connection
//! re-attached, a refused one, cancel, sessions, typed errors, lifecycle
//! replay; sync and async for Python) and its tests against canned
//! answers. The same suites run against the packages as their READMEs
//! install them in `clients_installed_as_their_readmes_say.rs`, with the
//! README examples.
//!
//! The dropped connection is real: the suites reach the server also
//! through a TCP relay here that cuts each turn's first event stream in the
//! middle of its reply.
//!
//! Needs a Python with the Python client's dependencies
//! (`WARDEN_CLIENT_PYTHON`; `.ci/run` pins httpx-sse 0.4.0, the version
//! whose empty events crashed the client on a keep-alive) and, for
//! TypeScript, Node 20+ with `clients/typescript`'s `npm ci` done; `.ci/run`
//! provides both. Without them a test says why and passes, unless
//! `WARDEN_REQUIRE_PY_CLIENT=1` / `WARDEN_REQUIRE_TS_CLIENT=1` (CI) make it
//! fail.

use crate::clients;

use std::path::PathBuf;
use std::time::Duration;

use clients::{Served, clients, run};

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

/// A suite's run: its quiet pause alone takes 20 s.
const SUITE_LIMIT: Duration = Duration::from_secs(240);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_passes_its_suite_against_a_real_server() {
    let Some(python) = python() else { return };
    let mut served = Served::start().await;
    let mut env = served.env();
    env.push((
        "PYTHONPATH",
        client_dir().to_str().expect("utf-8").to_owned(),
    ));
    let suite = run(
        &python,
        &["-m", "unittest", "discover", "-s", "tests", "-v"],
        &client_dir(),
        &env,
        SUITE_LIMIT,
    )
    .await;
    assert!(suite.0, "the Python client's suite failed:\n{}", suite.1);
    assert!(suite.1.contains("Ran 23 tests"), "{}", suite.1);
    let cut = served.cuts();
    assert!(
        cut >= 2,
        "the relay cut the streams of both flaky turns: {cut}"
    );
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
    let suite = run("npm", &["test"], &dir, &env, SUITE_LIMIT).await;
    assert!(
        suite.0,
        "the TypeScript client's suite failed:\n{}",
        suite.1
    );
    assert!(suite.1.contains("# pass 18"), "{}", suite.1);
    assert!(suite.1.contains("# fail 0"), "{}", suite.1);
    let cut = served.cuts();
    assert!(cut >= 1, "the relay cut the flaky turn's stream: {cut}");

    let _ = served.child.start_kill();
}
