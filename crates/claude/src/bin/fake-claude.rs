//! `fake-claude`: a scripted stand-in for the Claude Code CLI, for this
//! crate's tests (built with the `fake-agent` feature).
//!
//! It takes the same arguments as the real CLI and replays a script given
//! as JSON in `FAKE_CLAUDE_SCRIPT`:
//!
//! ```json
//! {"fresh":   {"start": [ACTION, ...], "turns": [[ACTION, ...], ...]},
//!  "resumed": {"start": [...], "turns": [...]}}
//! ```
//!
//! `resumed` runs when `--resume <id>` was given, `fresh` otherwise (either
//! falls back to the other; a script without both keys is used for both).
//! `start` runs before stdin is read; then each stdin line (a user turn,
//! checked to be `{"type":"user","message":{"role":"user","content":"…"}}`)
//! runs the next entry of `turns` (the last one again when they run out).
//! At the end of stdin it exits 0.
//!
//! Actions, one key each:
//! - `{"out": "line"}`: a stdout line; `{session_id}`, `{resume_id}`,
//!   `{cwd}`, `{turn}`, `{pid}` and `{content}` (the turn's message,
//!   JSON-escaped) are replaced;
//! - `{"err": "line"}`: a stderr line (same placeholders);
//! - `{"exit": code}`; `{"sleep_ms": n}`; `{"stall": true}` (sleep for
//!   ever);
//! - `{"ignore_term": true}`: block SIGTERM (only SIGKILL ends it then);
//! - `{"grandchild": "plain" | "ignore_term"}`: start `sleep 600` (through
//!   `sh` with `trap '' TERM` for `ignore_term`) in the process group;
//! - `{"garbage": n}`: n lines that are not JSON; `{"big_line": n}`: one
//!   line of n bytes.
//!
//! The session id is a UUID, like the real CLI's: `FRESH_ID`
//! (`00000000-0000-4000-8000-000000000001`) for a fresh run and the resume
//! id with its last group plus one for a resumed one (a resume forks the
//! id, as the real CLI does).
//!
//! When `FAKE_CLAUDE_RECORD` names a file, one JSON line is appended per
//! event: `{"event":"start","pid","pgid","args","cwd","env"}`,
//! `{"event":"stdin","line"}`, `{"event":"grandchild","pid"}`.

use std::io::{BufRead, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{SigSet, SigmaskHow, Signal, sigprocmask};
use serde_json::{Value, json};

/// The session id of a fresh run.
const FRESH_ID: &str = "00000000-0000-4000-8000-000000000001";

/// The id a resume of `id` announces: its last group plus one
/// (`<id>-fork` for an id that does not end in 12 hex digits).
fn fork(id: &str) -> String {
    match id.rsplit_once('-') {
        Some((head, last)) if last.len() == 12 => match u64::from_str_radix(last, 16) {
            Ok(n) => format!("{head}-{:012x}", n.wrapping_add(1) & 0xffff_ffff_ffff),
            Err(_) => format!("{id}-fork"),
        },
        _ => format!("{id}-fork"),
    }
}

struct Fake {
    session_id: String,
    resume_id: String,
    cwd: String,
    turn: usize,
    content: String,
    record: Option<std::path::PathBuf>,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let resume = args
        .iter()
        .position(|a| a == "--resume")
        .and_then(|i| args.get(i + 1))
        .cloned();
    let script: Value = std::env::var("FAKE_CLAUDE_SCRIPT")
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or_else(|| json!({}));
    let program = match (&resume, script.get("resumed"), script.get("fresh")) {
        (Some(_), Some(p), _) | (None, _, Some(p)) => p.clone(),
        (_, Some(p), None) | (_, None, Some(p)) => p.clone(),
        (_, None, None) => script.clone(),
    };
    let cwd = std::env::current_dir()
        .map(|d| d.display().to_string())
        .unwrap_or_default();
    let mut fake = Fake {
        session_id: match &resume {
            Some(id) => fork(id),
            None => FRESH_ID.to_owned(),
        },
        resume_id: resume.clone().unwrap_or_default(),
        cwd: cwd.clone(),
        turn: 0,
        content: String::new(),
        record: std::env::var_os("FAKE_CLAUDE_RECORD").map(Into::into),
    };
    let env: serde_json::Map<String, Value> = [
        "IS_SANDBOX",
        "CLAUDE_CODE_TMPDIR",
        "XDG_RUNTIME_DIR",
        "HOME",
        "FAKE_EXTRA",
    ]
    .iter()
    .filter_map(|k| std::env::var(k).ok().map(|v| ((*k).to_owned(), json!(v))))
    .collect();
    fake.record(json!({
        "event": "start",
        "pid": std::process::id(),
        "pgid": nix::unistd::getpgrp().as_raw(),
        "args": args,
        "cwd": cwd,
        "env": env,
    }));

    let empty = Vec::new();
    let start = program
        .get("start")
        .and_then(Value::as_array)
        .unwrap_or(&empty);
    fake.run(start);
    let turns = program
        .get("turns")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let parsed: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
        fake.record(json!({"event": "stdin", "line": parsed}));
        let content = match (
            parsed.get("type").and_then(Value::as_str),
            parsed.pointer("/message/role").and_then(Value::as_str),
            parsed.pointer("/message/content").and_then(Value::as_str),
        ) {
            (Some("user"), Some("user"), Some(content)) => content.to_owned(),
            _ => {
                eprintln!("fake-claude: unexpected stdin line");
                std::process::exit(2);
            }
        };
        fake.turn += 1;
        fake.content = content;
        let actions = turns
            .get(fake.turn - 1)
            .or_else(|| turns.last())
            .and_then(Value::as_array)
            .unwrap_or(&empty);
        fake.run(actions);
    }
    std::process::exit(0);
}

impl Fake {
    fn record(&self, event: Value) {
        let Some(path) = &self.record else { return };
        let mut line = event.to_string();
        line.push('\n');
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = f.write_all(line.as_bytes());
        }
    }

    fn fill(&self, template: &str) -> String {
        let content = serde_json::to_string(&self.content).unwrap_or_default();
        let content = content
            .strip_prefix('"')
            .and_then(|c| c.strip_suffix('"'))
            .unwrap_or_default();
        template
            .replace("{session_id}", &self.session_id)
            .replace("{resume_id}", &self.resume_id)
            .replace("{cwd}", &self.cwd)
            .replace("{turn}", &self.turn.to_string())
            .replace("{pid}", &std::process::id().to_string())
            .replace("{content}", content)
    }

    fn out(&self, line: &str) {
        let mut stdout = std::io::stdout().lock();
        if writeln!(stdout, "{line}")
            .and_then(|()| stdout.flush())
            .is_err()
        {
            std::process::exit(1);
        }
    }

    fn run(&self, actions: &[Value]) {
        for action in actions {
            if let Some(line) = action.get("out").and_then(Value::as_str) {
                self.out(&self.fill(line));
            } else if let Some(line) = action.get("err").and_then(Value::as_str) {
                let mut stderr = std::io::stderr().lock();
                let _ = writeln!(stderr, "{}", self.fill(line));
            } else if let Some(code) = action.get("exit").and_then(Value::as_i64) {
                std::process::exit(i32::try_from(code).unwrap_or(1));
            } else if let Some(ms) = action.get("sleep_ms").and_then(Value::as_u64) {
                std::thread::sleep(Duration::from_millis(ms));
            } else if action.get("stall").is_some() {
                loop {
                    std::thread::sleep(Duration::from_secs(3600));
                }
            } else if action.get("ignore_term").is_some() {
                let mut set = SigSet::empty();
                set.add(Signal::SIGTERM);
                if sigprocmask(SigmaskHow::SIG_BLOCK, Some(&set), None).is_err() {
                    std::process::exit(3);
                }
            } else if let Some(kind) = action.get("grandchild").and_then(Value::as_str) {
                // The grandchild says "ready" once its trap is set, so a
                // SIGTERM never lands before it.
                let script = if kind == "ignore_term" {
                    "trap '' TERM; echo ready; exec sleep 600"
                } else {
                    "echo ready; exec sleep 600"
                };
                let child = Command::new("sh")
                    .args(["-c", script])
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null())
                    .spawn();
                let Ok(mut child) = child else {
                    std::process::exit(4);
                };
                let mut ready = String::new();
                if let Some(stdout) = child.stdout.take() {
                    let _ = std::io::BufReader::new(stdout).read_line(&mut ready);
                }
                if ready.trim() != "ready" {
                    std::process::exit(4);
                }
                self.record(json!({"event": "grandchild", "pid": child.id()}));
                // Never waited for: it must die with the group.
                drop(child);
            } else if let Some(n) = action.get("garbage").and_then(Value::as_u64) {
                for i in 0..n {
                    self.out(&format!("npm WARN noise line {i} (not json)"));
                }
            } else if let Some(n) = action.get("big_line").and_then(Value::as_u64) {
                self.out(&"x".repeat(usize::try_from(n).unwrap_or(0)));
            }
        }
    }
}
