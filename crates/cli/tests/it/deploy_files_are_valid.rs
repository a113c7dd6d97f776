//! The packaging under `deploy/` holds together, as far as this machine
//! allows: the systemd unit passes `systemd-analyze verify` with no
//! diagnostic and scores at most 3.0 in `systemd-analyze security` (CI
//! installs systemd; `WARDEN_REQUIRE_SYSTEMD=1` makes a missing
//! `systemd-analyze` a failure), and both the unit and the container image
//! are configured by `WARDEN_*` variables alone (no flag that would shadow
//! one). The container image itself cannot be built here (no Docker
//! engine): its definition is linted — two stages, a locked release build,
//! a non-root user, a healthcheck on `/healthz` (liveness, not `/readyz`),
//! the dependencies in a layer of their own, a `.dockerignore` leaving
//! `target/`, `node_modules` and `.git` out, and a documented `docker run`
//! that names the node and outwaits the grace — and its entrypoint is run
//! as the container would run it, on the image's `ENV` lines overridden by
//! a node's environment, which must win. Every flag of `warden serve` names
//! its `WARDEN_*` variable in `--help`, and the unit leaves room for
//! `--max-connections` descriptors and the grace.

use crate::common;

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
    assert_eq!(
        exec.trim(),
        "/usr/local/bin/warden serve",
        "no flag: a flag would shadow the environment file's variable"
    );
    // Its defaults and the example file set only variables warden reads.
    let help = serve_flags().await;
    let (_, env) = deploy("systemd/warden-node.env.example");
    let defaults = unit.lines().filter_map(|l| l.strip_prefix("Environment="));
    let examples = env.lines().filter(|l| l.starts_with("WARDEN_"));
    for setting in defaults.chain(examples) {
        let var = setting.split('=').next().unwrap_or_default();
        assert!(
            help.contains(&format!("[env: {var}=")),
            "{var} is not a variable of warden serve"
        );
    }
    assert!(env.contains("WARDEN_STORE="), "the database URL");
    let line_of = |prefix: &str| unit.lines().position(|l| l.starts_with(prefix));
    assert!(
        line_of("Environment=") < line_of("EnvironmentFile="),
        "the environment file is read after the defaults, so it wins"
    );
    assert!(!unit.contains("example.invalid"), "a real Documentation=");

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
    let mut cmd = tokio::process::Command::new(&analyze);
    cmd.arg("verify").arg(&installed);
    let out = output(cmd, std::time::Duration::from_secs(60)).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let said = format!("{}{}", stdout(&out), stderr(&out));
    assert!(said.trim().is_empty(), "systemd-analyze verify: {said}");
    // Hardened as the docs say: an exposure of at most 3.0 ("OK").
    let mut cmd = tokio::process::Command::new(&analyze);
    cmd.args(["security", "--offline=yes", "--threshold=30"])
        .arg(&installed);
    let out = output(cmd, std::time::Duration::from_secs(60)).await;
    assert_eq!(
        code(&out),
        0,
        "systemd-analyze security scores the unit above 3.0:\n{}",
        stdout(&out)
    );
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
    let probe = health.lines().find(|l| l.contains("CMD")).expect("CMD");
    assert!(
        probe.contains("/healthz") && !probe.contains("/readyz"),
        "liveness, not readiness (a database outage would make every container unhealthy at once): {probe}"
    );
    let entry = dockerfile
        .lines()
        .find(|l| l.starts_with("ENTRYPOINT"))
        .expect("an ENTRYPOINT");
    assert!(
        flags(entry).is_empty(),
        "a flag in the entrypoint shadows its WARDEN_* variable: {entry}"
    );
    let help = serve_flags().await;
    for (var, _) in image_env(&dockerfile) {
        assert!(
            help.contains(&format!("[env: {var}=")),
            "{var} is not a variable of warden serve"
        );
    }
}

/// The image's `ENV NAME=VALUE` lines.
fn image_env(dockerfile: &str) -> Vec<(String, String)> {
    dockerfile
        .lines()
        .filter_map(|l| l.strip_prefix("ENV "))
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

/// The entrypoint run as the container runs it: the image's `ENV` lines,
/// then a node's own environment (an `--env-file`, `-e`), which must win
/// over them — here a loopback port, a data directory and a token file of
/// the test's. It listens where the node's variables say, keeps its data
/// and token there, and answers `/healthz` (the image's healthcheck).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_container_entrypoint_honours_the_nodes_environment() {
    let (_, dockerfile) = deploy("container/Dockerfile");
    let entry = dockerfile
        .lines()
        .find_map(|l| l.strip_prefix("ENTRYPOINT"))
        .expect("an ENTRYPOINT");
    let argv: Vec<String> = entry
        .trim()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .split(',')
        .map(|a| a.trim().trim_matches('"').to_owned())
        .collect();
    assert_eq!(argv[0], "/usr/local/bin/warden", "{argv:?}");
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let token = dir.path().join("token");
    let args: Vec<&str> = argv[1..].iter().map(String::as_str).collect();
    let mut cmd = command(&args);
    for (var, value) in image_env(&dockerfile) {
        cmd.env(var, value);
    }
    cmd.env("WARDEN_LISTEN", "127.0.0.1:0")
        .env("WARDEN_DATA_DIR", &data)
        .env("WARDEN_TOKEN_FILE", &token)
        .env("WARDEN_BASE_URL", "http://127.0.0.1:9");
    let (mut child, base, _) = spawn_listening(cmd, std::time::Duration::from_secs(30)).await;
    assert!(
        base.starts_with("http://127.0.0.1:") && !base.ends_with(":8700"),
        "WARDEN_LISTEN of the node's environment: {base}"
    );
    assert!(
        token.exists(),
        "WARDEN_TOKEN_FILE of the node's environment"
    );
    assert!(data.exists(), "WARDEN_DATA_DIR of the node's environment");
    let addr = base.trim_start_matches("http://");
    let mut stream = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        tokio::net::TcpStream::connect(addr),
    )
    .await
    .expect("connect in time")
    .expect("connect");
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .expect("write");
    let mut answer = String::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        stream.read_to_string(&mut answer),
    )
    .await
    .expect("an answer in time")
    .expect("read");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    child.kill().await.expect("kill");
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
    // A setting is a default `Environment=NAME=VALUE` of the unit.
    let flag = |name: &str| {
        let var = format!("WARDEN_{}=", name.to_uppercase().replace('-', "_"));
        unit.lines()
            .filter_map(|l| l.strip_prefix("Environment="))
            .find_map(|kv| kv.strip_prefix(&var))
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
