//! Each client package installed as its README says, then run against a
//! real `warden serve` on the mock: its suite (a 20 s quiet pause upstream,
//! a connection cut mid-reply, a refused one, typed errors…) and its
//! README's example, with the package so installed.
//!
//! The README cannot drift from what is tested: its first ```` ```sh ````
//! block (the install lines) runs verbatim with `sh -e`, and its first
//! ```` ```python ```` / ```` ```js ```` block is the example, as written.
//! The lines name the package by the path `../warden/clients/…` (a warden
//! checkout beside the user's project), so they run in `TMP/app`, a fresh
//! directory, beside `TMP/warden/clients/…`: a copy of this tree's
//! packages as a fresh clone has them (no `node_modules`, `dist`, `build`),
//! committed to a git repository of its own. Installing must leave that
//! checkout as it was: `git status` (ignored files too) shows nothing.
//!
//! Needs `python3` with `venv`, and `node` and `npm`, and the registries
//! (PyPI for httpx, npm for typescript and eventsource-parser); downloads
//! are cached under `${WARDEN_CACHE:-$HOME/.cache}` (`warden-pip`,
//! `warden-npm`). Without the tools a test says why and passes, unless
//! `WARDEN_REQUIRE_PY_CLIENT=1` / `WARDEN_REQUIRE_TS_CLIENT=1` (CI).

use crate::clients;

use std::path::{Path, PathBuf};
use std::time::Duration;

use clients::{Served, clients, fenced, run};

/// An install: venv, pip or npm with a cold cache.
const INSTALL_LIMIT: Duration = Duration::from_secs(600);
/// A suite's run: its quiet pause alone takes 20 s.
const SUITE_LIMIT: Duration = Duration::from_secs(240);
/// The README example: one turn.
const EXAMPLE_LIMIT: Duration = Duration::from_secs(60);

/// Whether `program ARGS` runs and succeeds here; else, unless `require`
/// is set to 1, the test is skipped with `why`.
fn available(program: &str, args: &[&str], require: &str, why: &str) -> bool {
    let ok = std::process::Command::new(program)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var(require).as_deref() != Ok("1"),
            "{require}=1 but {why}"
        );
        eprintln!("skipped: {why}");
    }
    ok
}

/// Where downloads are cached: `${WARDEN_CACHE:-$HOME/.cache}/NAME`.
fn cache(name: &str) -> String {
    let root = std::env::var("WARDEN_CACHE")
        .or_else(|_| std::env::var("HOME").map(|h| format!("{h}/.cache")))
        .unwrap_or_else(|_| "/tmp".to_owned());
    format!("{root}/{name}")
}

/// Copies the package `from` into `to` as a fresh clone has it: without
/// what a build or an install leaves (`node_modules`, `dist`, `build`,
/// `*.egg-info`, `__pycache__`).
fn copy_package(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read_dir") {
        let entry = entry.expect("entry");
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let left_by_a_build = ["node_modules", "dist", "build", "__pycache__"]
            .contains(&name.as_ref())
            || name.ends_with(".egg-info");
        if left_by_a_build {
            continue;
        }
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_package(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

/// `git ARGS` in `dir`, with no user or system configuration: its output.
async fn git(dir: &Path, args: &[&str]) -> String {
    let env = [
        ("GIT_CONFIG_GLOBAL", "/dev/null".to_owned()),
        ("GIT_CONFIG_NOSYSTEM", "1".to_owned()),
        ("GIT_AUTHOR_NAME", "warden tests".to_owned()),
        ("GIT_AUTHOR_EMAIL", "tests@warden.invalid".to_owned()),
        ("GIT_COMMITTER_NAME", "warden tests".to_owned()),
        ("GIT_COMMITTER_EMAIL", "tests@warden.invalid".to_owned()),
    ];
    let (ok, out) = run("git", args, dir, &env, EXAMPLE_LIMIT).await;
    assert!(ok, "git {args:?} failed:\n{out}");
    out
}

/// `TMP/warden/clients/WHICH` (a fresh copy, committed: `TMP/warden` is
/// the checkout) and `TMP/app` (empty), where the README's lines run.
async fn fresh_layout(which: &str) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let package = dir.path().join("warden/clients").join(which);
    copy_package(&clients(which), &package);
    let checkout = dir.path().join("warden");
    git(&checkout, &["init", "-q"]).await;
    git(&checkout, &["add", "-A"]).await;
    git(
        &checkout,
        &["commit", "-q", "--no-gpg-sign", "-m", "the package"],
    )
    .await;
    let app = dir.path().join("app");
    std::fs::create_dir_all(&app).expect("app dir");
    (dir, package, app)
}

/// Asserts that the checkout holding `package` (`TMP/warden`) is as it was
/// committed: nothing written, changed or removed, ignored files included
/// (a `build/`, `*.egg-info`, `node_modules` or `dist/`).
async fn assert_checkout_unchanged(package: &Path) {
    let checkout = package.ancestors().nth(2).expect("TMP/warden");
    let status = git(
        checkout,
        &[
            "status",
            "--porcelain",
            "--ignored",
            "--untracked-files=all",
        ],
    )
    .await;
    let lines: Vec<&str> = status.lines().collect();
    assert!(
        lines.is_empty(),
        "installing as the README says wrote into the checkout: {} paths, the first:\n{}",
        lines.len(),
        lines[..lines.len().min(20)].join("\n")
    );
}

/// Runs the README's first `sh` block verbatim in `app`: its output.
async fn install_as_the_readme_says(readme: &Path, app: &Path) -> String {
    let lines = fenced(readme, "sh", 0);
    assert!(lines.contains("install"), "the install lines: {lines}");
    let env = [
        ("PIP_CACHE_DIR", cache("warden-pip")),
        ("PIP_DISABLE_PIP_VERSION_CHECK", "1".to_owned()),
        ("npm_config_cache", cache("warden-npm")),
        ("npm_config_prefer_offline", "true".to_owned()),
        ("npm_config_audit", "false".to_owned()),
        ("npm_config_fund", "false".to_owned()),
    ];
    let (ok, out) = run("sh", &["-e", "-x", "-c", &lines], app, &env, INSTALL_LIMIT).await;
    assert!(
        ok,
        "the README's install lines failed:\n{lines}\n---\n{out}"
    );
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_installed_as_its_readme_says_passes_against_a_real_server() {
    let why = "python3 with venv is missing";
    if !available(
        "python3",
        &["-m", "venv", "--help"],
        "WARDEN_REQUIRE_PY_CLIENT",
        why,
    ) {
        return;
    }
    let (_dir, package, app) = fresh_layout("python").await;
    install_as_the_readme_says(&package.join("README.md"), &app).await;
    assert_checkout_unchanged(&package).await;
    let python = app.join(".venv/bin/python");
    let python = python.to_str().expect("utf-8");

    // The package the venv imports is the installed one, not a source tree.
    let (ok, out) = run(
        python,
        &["-c", "import warden_client; print(warden_client.__file__)"],
        &app,
        &[],
        EXAMPLE_LIMIT,
    )
    .await;
    assert!(
        ok && out.contains("/.venv/") && out.contains("site-packages"),
        "{out}"
    );

    let mut served = Served::start().await;
    let env = served.env();
    let tests = package.join("tests");
    let suite = run(
        python,
        &[
            "-m",
            "unittest",
            "discover",
            "-s",
            tests.to_str().expect("utf-8"),
            "-v",
        ],
        &app,
        &env,
        SUITE_LIMIT,
    )
    .await;
    assert!(
        suite.0,
        "the suite failed against the installed package:\n{}",
        suite.1
    );
    assert!(suite.1.contains("Ran 23 tests"), "{}", suite.1);
    assert!(
        served.cuts() >= 2,
        "the relay cut both flaky turns' streams"
    );

    let example = app.join("example.py");
    std::fs::write(&example, fenced(&package.join("README.md"), "python", 0)).expect("write");
    let ran = run(python, &["example.py"], &app, &env, EXAMPLE_LIMIT).await;
    assert!(ran.0, "the README example failed:\n{}", ran.1);
    assert!(ran.1.contains("Hello from warden-mock."), "{}", ran.1);
    let _ = served.child.start_kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_typescript_client_installed_as_its_readme_says_passes_against_a_real_server() {
    let why = "node or npm is missing";
    if !available("node", &["--version"], "WARDEN_REQUIRE_TS_CLIENT", why)
        || !available("npm", &["--version"], "WARDEN_REQUIRE_TS_CLIENT", why)
    {
        return;
    }
    let (_dir, package, app) = fresh_layout("typescript").await;
    install_as_the_readme_says(&package.join("README.md"), &app).await;
    assert_checkout_unchanged(&package).await;
    // A built copy in the consumer's node_modules, not a link to the checkout.
    let installed = app.join("node_modules/@warden/client");
    let kind = std::fs::symlink_metadata(&installed).expect("installed");
    assert!(kind.is_dir(), "a copy, not a link: {kind:?}");
    assert!(installed.join("dist/index.js").is_file(), "it is built");

    // The suite, as a module of the consumer: `@warden/client` is the
    // installed package.
    let tests = app.join("test");
    std::fs::create_dir_all(&tests).expect("mkdir");
    let mut files = Vec::new();
    for entry in std::fs::read_dir(package.join("test")).expect("the suite") {
        let path = entry.expect("entry").path();
        let name = path
            .file_stem()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        let copy = tests.join(format!("{name}.mjs"));
        std::fs::copy(&path, &copy).expect("copy a test");
        files.push(copy.to_str().expect("utf-8").to_owned());
    }
    files.sort();
    let mut args = vec!["--test"];
    args.extend(files.iter().map(String::as_str));
    let mut served = Served::start().await;
    let env = served.env();
    let suite = run("node", &args, &app, &env, SUITE_LIMIT).await;
    assert!(
        suite.0,
        "the suite failed against the installed package:\n{}",
        suite.1
    );
    assert!(suite.1.contains("# pass 18"), "{}", suite.1);
    assert!(suite.1.contains("# fail 0"), "{}", suite.1);
    assert!(served.cuts() >= 1, "the relay cut the flaky turn's stream");

    let example = app.join("example.mjs");
    std::fs::write(&example, fenced(&package.join("README.md"), "js", 0)).expect("write");
    let ran = run("node", &["example.mjs"], &app, &env, EXAMPLE_LIMIT).await;
    assert!(ran.0, "the README example failed:\n{}", ran.1);
    assert!(ran.1.contains("Hello from warden-mock."), "{}", ran.1);
    let _ = served.child.start_kill();
}
