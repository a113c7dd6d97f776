//! The packaging under `deploy/` holds together, as far as this machine
//! allows: the systemd unit passes `systemd-analyze verify` with no
//! diagnostic (CI installs systemd; `WARDEN_REQUIRE_SYSTEMD=1` makes a
//! missing `systemd-analyze` a failure), its variables are all in the
//! example environment file, and every flag the unit and the container
//! image pass exists in `warden serve --help`. The container image itself
//! cannot be built here (no Docker engine): its definition is linted —
//! two stages, a locked release build, a non-root user, a healthcheck on
//! `/readyz`, the dependencies in a layer of their own, a `.dockerignore`
//! leaving `target/`, `node_modules` and `.git` out, and a documented
//! `docker run` that names the node and outwaits the grace. Every flag of
//! `warden serve` names its `WARDEN_*` variable in `--help`, and the unit
//! leaves room for `--max-connections` descriptors and the grace.

mod common;

use std::path::{Path, PathBuf};

use common::*;

fn deploy(file: &str) -> (PathBuf, String) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy")
        .join(file);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    (path, text)
}

/// The `--flags` of `warden serve --help`.
async fn serve_flags() -> String {
    let out = run(&["serve", "--help"]).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    stdout(&out)
}

/// The `--flags` in `text`.
fn flags(text: &str) -> Vec<String> {
    text.split(|c: char| c.is_whitespace() || c == '"' || c == ',')
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_systemd_unit_verifies_and_passes_only_flags_that_exist() {
    let (_, unit) = deploy("systemd/warden-node.service");
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("an ExecStart");
    let help = serve_flags().await;
    for flag in flags(exec) {
        assert!(help.contains(&flag), "{flag} is not a flag of warden serve");
    }
    // Every ${VAR} it uses is in the example environment file.
    let (_, env) = deploy("systemd/warden-node.env.example");
    for var in exec.split("${").skip(1).filter_map(|r| r.split('}').next()) {
        assert!(
            env.lines().any(|l| l.starts_with(&format!("{var}="))),
            "{var} is not in warden-node.env.example"
        );
    }
    assert!(env.contains("WARDEN_STORE="), "the database URL");

    let Some(analyze) = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("systemd-analyze"))
            .find(|p| p.exists())
    }) else {
        assert!(
            std::env::var("WARDEN_REQUIRE_SYSTEMD").as_deref() != Ok("1"),
            "WARDEN_REQUIRE_SYSTEMD=1 but systemd-analyze is not on PATH"
        );
        eprintln!("skipped: systemd-analyze is not installed");
        return;
    };
    // The unit as installed, with this build's binary where it expects
    // /usr/local/bin/warden (verify checks that the command exists).
    let dir = tempfile::tempdir().expect("tempdir");
    let installed = dir.path().join("warden-node.service");
    std::fs::write(&installed, unit.replace("/usr/local/bin/warden", WARDEN)).expect("write");
    let mut cmd = tokio::process::Command::new(analyze);
    cmd.arg("verify").arg(&installed);
    let out = output(cmd, std::time::Duration::from_secs(60)).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let said = format!("{}{}", stdout(&out), stderr(&out));
    assert!(said.trim().is_empty(), "systemd-analyze verify: {said}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_container_image_definition_is_sound() {
    let (_, dockerfile) = deploy("container/Dockerfile");
    let froms: Vec<&str> = dockerfile
        .lines()
        .filter(|l| l.starts_with("FROM "))
        .collect();
    assert_eq!(
        froms.len(),
        2,
        "a build stage and a runtime stage: {froms:?}"
    );
    assert!(froms[0].ends_with(" AS build"), "{froms:?}");
    assert!(
        dockerfile.contains("cargo build --release --locked -p warden"),
        "a locked release build of the binary"
    );
    assert!(
        dockerfile.contains("COPY --from=build"),
        "only the binary is copied"
    );
    let user = dockerfile
        .lines()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("a USER");
    assert!(
        !user.starts_with("0") && !user.starts_with("root"),
        "non-root: {user}"
    );
    let health = dockerfile
        .split("HEALTHCHECK")
        .nth(1)
        .expect("a HEALTHCHECK");
    assert!(
        health.contains("/readyz"),
        "readiness, not liveness: {health}"
    );
    let entry = dockerfile
        .lines()
        .find(|l| l.starts_with("ENTRYPOINT"))
        .expect("an ENTRYPOINT");
    let help = serve_flags().await;
    for flag in flags(entry) {
        assert!(help.contains(&flag), "{flag} is not a flag of warden serve");
    }
}

/// Each `--flag` of `help` with the text under it, up to the next flag.
fn flag_blocks(help: &str) -> Vec<(String, String)> {
    let mut blocks: Vec<(String, String)> = Vec::new();
    for line in help.lines() {
        let trimmed = line.trim_start();
        let is_flag = line.starts_with("  ") && trimmed.starts_with("--")
            || trimmed.starts_with("-h, --help");
        if is_flag {
            let name = trimmed
                .trim_start_matches("-h, ")
                .split_whitespace()
                .next()
                .unwrap_or("")
                .to_owned();
            blocks.push((name, String::new()));
        } else if let Some((_, text)) = blocks.last_mut() {
            text.push_str(line);
            text.push('\n');
        }
    }
    blocks
}

/// A container or a unit is configured by its environment: every flag of
/// `warden serve` has a `WARDEN_*` variable, and `--help` names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_serve_flag_names_its_environment_variable() {
    let help = serve_flags().await;
    let blocks = flag_blocks(&help);
    assert!(blocks.len() > 15, "the flags of warden serve: {blocks:?}");
    let missing: Vec<&str> = blocks
        .iter()
        .filter(|(name, _)| name != "--help")
        .filter(|(_, text)| !text.contains("[env: WARDEN_"))
        .map(|(name, _)| name.as_str())
        .collect();
    assert!(
        missing.is_empty(),
        "flags without an environment variable: {missing:?}"
    );
    for var in [
        "WARDEN_NODE_ID",
        "WARDEN_ADVERTISE",
        "WARDEN_LEASE_TTL",
        "WARDEN_GRACE",
    ] {
        assert!(help.contains(&format!("[env: {var}=")), "{var} in --help");
    }
    // And the variable is read: a value out of range is refused as the
    // flag's would be.
    let mut cmd = command(&["serve", "--listen", "127.0.0.1:0"]);
    cmd.env("WARDEN_MAX_SESSIONS", "0");
    let out = output(cmd, std::time::Duration::from_secs(60)).await;
    assert_eq!(code(&out), 2, "a usage error: {}", stderr(&out));
    assert!(stderr(&out).contains("max-sessions"), "{}", stderr(&out));
}

/// The documented `docker run` names the node and its address and gives
/// the container more time to stop than the node gives its turns; the
/// build context leaves the build's leftovers out, and the dependencies
/// build in a layer of their own (a change of the sources does not
/// rebuild them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_container_is_run_as_documented_and_built_from_a_small_context() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let ignore = std::fs::read_to_string(root.join(".dockerignore")).expect("a .dockerignore");
    for left_out in ["target", "node_modules", ".git"] {
        assert!(
            ignore
                .lines()
                .any(|l| l.trim().trim_matches('/').trim_start_matches("**/") == left_out),
            "{left_out} is not in .dockerignore"
        );
    }

    let (_, dockerfile) = deploy("container/Dockerfile");
    let sources = dockerfile.find("COPY . .").expect("the sources are copied");
    let deps = dockerfile
        .find("COPY Cargo.toml Cargo.lock")
        .expect("the manifests first");
    assert!(
        deps < sources,
        "the manifests are copied before the sources"
    );
    assert!(
        dockerfile[deps..sources].contains("cargo build --release --locked"),
        "the dependencies are built before the sources are copied"
    );
    // Every member of the workspace has its manifest in that layer (a
    // crate added later and not listed would break the image's build).
    let (_, manifest) = (
        (),
        std::fs::read_to_string(root.join("Cargo.toml")).expect("Cargo.toml"),
    );
    let members = manifest
        .split("members = [")
        .nth(1)
        .and_then(|r| r.split(']').next())
        .expect("the workspace members");
    for member in members.split(',').map(|m| m.trim().trim_matches('"')) {
        if member == "." || member.is_empty() {
            continue;
        }
        assert!(
            dockerfile[deps..sources].contains(&format!("{member}/Cargo.toml")),
            "{member}'s manifest is not in the dependency layer"
        );
    }
    let grace = dockerfile
        .lines()
        .find_map(|l| l.strip_prefix("ENV WARDEN_GRACE="))
        .and_then(|g| g.trim().trim_end_matches('s').parse::<u64>().ok())
        .expect("the image sets its grace (ENV WARDEN_GRACE=Ns)");

    let docs = std::fs::read_to_string(root.join("docs/cluster.md")).expect("docs/cluster.md");
    let run = docs
        .split("docker run")
        .nth(1)
        .and_then(|r| r.split("```").next())
        .expect("a documented docker run");
    let stop = run
        .split("--stop-timeout")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|s| s.parse::<u64>().ok())
        .expect("docker run --stop-timeout N");
    assert!(
        stop > grace,
        "--stop-timeout {stop} must exceed the grace {grace}s"
    );
    for what in ["WARDEN_NODE_ID", "WARDEN_ADVERTISE"] {
        assert!(
            run.contains(what),
            "the documented docker run sets {what}: {run}"
        );
    }
}

/// The unit lets the node open more files than `--max-connections`
/// connections, and waits longer than `--grace` for it to stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_systemd_unit_gives_room_for_every_connection_and_the_grace() {
    let (_, unit) = deploy("systemd/warden-node.service");
    let value = |key: &str| {
        unit.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("{key} in the unit"))
            .to_owned()
    };
    let exec = value("ExecStart");
    let flag = |name: &str| {
        exec.split(&format!("--{name} "))
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .map(str::to_owned)
    };
    let max_connections: u64 =
        flag("max-connections").map_or(4096, |v| v.parse().expect("a number"));
    let files: u64 = value("LimitNOFILE")
        .parse()
        .expect("LimitNOFILE is a number");
    assert!(
        files > max_connections + 256,
        "LimitNOFILE {files} leaves no room above --max-connections {max_connections}"
    );
    let grace: u64 = flag("grace")
        .map(|g| g.trim_end_matches('s').parse().expect("seconds"))
        .unwrap_or(10);
    let stop: u64 = value("TimeoutStopSec")
        .trim_end_matches('s')
        .parse()
        .expect("seconds");
    assert!(
        stop > grace,
        "TimeoutStopSec {stop} must exceed --grace {grace}"
    );
}
