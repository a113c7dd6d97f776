//! The packaging under `deploy/` holds together, as far as this machine
//! allows: the systemd unit passes `systemd-analyze verify` with no
//! diagnostic (CI installs systemd; `WARDEN_REQUIRE_SYSTEMD=1` makes a
//! missing `systemd-analyze` a failure), its variables are all in the
//! example environment file, and every flag the unit and the container
//! image pass exists in `warden serve --help`. The container image itself
//! cannot be built here (no Docker engine): its definition is linted —
//! two stages, a locked release build, a non-root user, a healthcheck on
//! `/readyz`.

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
