//! `warden demo --agents`: one session per agent CLI installed here, two
//! turns each against the built-in mock, the second resuming the first's
//! conversation; a CLI that is not installed is skipped with the reason.
//! CI installs the pinned Claude Code, Codex and Gemini CLIs
//! (`WARDEN_*_BIN`, `WARDEN_REQUIRE_*=1`); without them the test checks
//! the skips.

use crate::common;

use std::time::Duration;

use common::*;

/// The agents, their binary's variable and the variable CI sets to
/// require it.
const AGENTS: [(&str, &str, &str); 3] = [
    ("claude-code", "WARDEN_CLAUDE_BIN", "WARDEN_REQUIRE_CLAUDE"),
    ("codex", "WARDEN_CODEX_BIN", "WARDEN_REQUIRE_CODEX"),
    ("gemini", "WARDEN_GEMINI_BIN", "WARDEN_REQUIRE_GEMINI"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_installed_agent_answers_twice_in_one_conversation_and_the_others_are_skipped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cmd = command(&["demo", "--agents", "--data-dir", arg(dir.path())]);
    let installed: Vec<bool> = AGENTS
        .iter()
        .map(|(_, var, require)| {
            let there = std::env::var_os(var).is_some_and(|p| std::path::Path::new(&p).exists());
            assert!(
                there || std::env::var(require).as_deref() != Ok("1"),
                "{require}=1 but {var} is not an installed CLI"
            );
            there
        })
        .collect();
    for ((_, var, _), there) in AGENTS.iter().zip(&installed) {
        if !there {
            // Not found on PATH either, whatever this machine has.
            cmd.env(var, "/nonexistent/warden-test-cli");
        }
    }
    let out = output(cmd, Duration::from_secs(600)).await;
    let said = stdout(&out);
    assert_eq!(code(&out), 0, "{said}\n{}", stderr(&out));
    for ((name, _, _), there) in AGENTS.iter().zip(&installed) {
        let line = said
            .lines()
            .find(|l| l.trim_start().starts_with(name))
            .unwrap_or_else(|| panic!("no line for {name}: {said}"));
        if *there {
            assert!(
                line.contains("answered twice in one conversation"),
                "{line}"
            );
        } else {
            assert!(
                line.contains("skipped:") && line.contains("not found"),
                "{line}"
            );
        }
    }
}

/// A CLI that is installed but fails is a failure of the demo (exit 1),
/// named, not a skip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_installed_cli_that_fails_fails_the_demo() {
    let dir = tempfile::tempdir().expect("tempdir");
    // `false` is installed everywhere and never answers.
    let broken = which("false");
    let mut cmd = command(&["demo", "--agents", "--data-dir", arg(dir.path())]);
    cmd.env("WARDEN_CODEX_BIN", &broken)
        .env("WARDEN_CLAUDE_BIN", "/nonexistent/warden-test-cli")
        .env("WARDEN_GEMINI_BIN", "/nonexistent/warden-test-cli");
    let out = output(cmd, Duration::from_secs(300)).await;
    let said = stdout(&out);
    assert_eq!(code(&out), 1, "{said}\n{}", stderr(&out));
    assert!(
        said.lines()
            .any(|l| l.contains("codex") && l.contains("FAILED")),
        "{said}"
    );
}

fn which(program: &str) -> std::path::PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join(program))
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("{program} is not on PATH"))
}
