//! One long-lived process serves a session's consecutive turns over stdin,
//! each ending with its own result line; a turn that cannot use it gets a
//! new process, and idle processes end with their source.

use std::time::Duration;

use crate::common::*;
use serde_json::json;
use warden_claude::{ClaudeSource, ClaudeSourceFactory};
use warden_core::{AgentEvent, EventSource, SessionKey, SourceFactory};

#[tokio::test]
async fn two_turns_over_stdin_use_one_process_and_each_ends_with_its_own_result() {
    let fx = Fixture::new();
    let source = ClaudeSource::new(fx.options(echo_script()));
    let (first, error) = run(source.open(fx.request(1, "one", None)).await.expect("open")).await;
    assert_eq!(error, None);
    assert_eq!(text(&first), "echo one");
    assert!(matches!(
        events(&first).last(),
        Some(AgentEvent::TurnComplete { .. })
    ));
    let pid = fx.agent_pids()[0];
    assert!(!dead(pid), "the process waits for the next turn");

    // warden resumes the id the first turn announced.
    let (second, error) = run(source
        .open(fx.request(2, "two", Some(SESS_1)))
        .await
        .expect("open"))
    .await;
    assert_eq!(error, None);
    assert_eq!(text(&second), "echo two");
    assert!(matches!(
        events(&second).last(),
        Some(AgentEvent::TurnComplete { .. })
    ));
    assert_eq!(fx.agent_pids(), [pid], "one process for both turns");
    let stdin = fx.recorded("stdin");
    assert_eq!(stdin.len(), 2);
    assert_eq!(stdin[1]["line"]["message"]["content"], "two");
}

#[tokio::test]
async fn a_turn_for_another_id_workspace_or_prompt_gets_a_new_process() {
    let fx = Fixture::new();
    let other_ws = fx.dir.path().join("other");
    std::fs::create_dir_all(&other_ws).expect("mkdir");
    let source = ClaudeSource::new(fx.options(echo_script()));
    let mut turn = 0;
    let mut next = |resume: Option<&str>, ws: Option<&std::path::Path>, prompt: Option<&str>| {
        turn += 1;
        let mut r = fx.request(turn, "m", resume);
        if let Some(ws) = ws {
            r.workspace = Some(ws.to_path_buf());
        }
        r.append_system_prompt = prompt.map(str::to_owned);
        r
    };
    let requests = [
        next(None, None, None),                                   // new: SESS_1
        next(Some(SESS_1), None, None),                           // reused
        next(None, None, None),                                   // fresh start wanted: new
        next(Some(SESS_1), Some(&other_ws), None),                // other workspace: new
        next(Some(SESS_1_FORK), Some(&other_ws), Some("p")),      // other prompt: new
        next(Some(SESS_1_FORK_FORK), Some(&other_ws), Some("p")), // reused
    ];
    for r in requests {
        let (_, error) = run(source.open(r).await.expect("open")).await;
        assert_eq!(error, None);
    }
    let pids = fx.agent_pids();
    assert_eq!(pids.len(), 4, "{pids:?}");
    for old in &pids[..3] {
        assert!(reaped(*old), "a replaced process is terminated");
    }
    assert!(!fx.args(1).iter().any(|a| a == "--resume"));
    assert!(fx.args(2).windows(2).any(|w| w == ["--resume", SESS_1]));
    assert_eq!(
        fx.recorded("start")[2]["cwd"],
        other_ws.display().to_string()
    );
    assert!(
        fx.args(3)
            .windows(2)
            .any(|w| w == ["--resume", SESS_1_FORK])
    );
    assert!(
        fx.args(3)
            .windows(2)
            .any(|w| w == ["--append-system-prompt", "p"])
    );
}

#[tokio::test]
async fn a_process_that_exited_while_idle_is_replaced_by_a_resumed_one() {
    let fx = Fixture::new();
    let script = json!({"turns": [[out(INIT), out(ECHO), out(RESULT), {"exit": 0}]]});
    let source = ClaudeSource::new(fx.options(script));
    let (_, error) = run(source.open(fx.request(1, "one", None)).await.expect("open")).await;
    assert_eq!(error, None);
    let first = fx.agent_pids()[0];
    assert!(eventually(PATIENCE, || reaped(first)).await);
    let (frames, error) = run(source
        .open(fx.request(2, "two", Some(SESS_1)))
        .await
        .expect("open"))
    .await;
    assert_eq!(error, None);
    assert_eq!(text(&frames), "echo two");
    assert_eq!(fx.agent_pids().len(), 2);
    assert!(fx.args(1).windows(2).any(|w| w == ["--resume", SESS_1]));
}

#[tokio::test]
async fn dropping_the_source_terminates_its_idle_process() {
    let fx = Fixture::new();
    let source = ClaudeSource::new(fx.options(echo_script()));
    let (_, error) = run(source.open(fx.request(1, "one", None)).await.expect("open")).await;
    assert_eq!(error, None);
    let pid = fx.agent_pids()[0];
    assert!(!dead(pid));
    drop(source);
    assert!(
        eventually(GRACE + Duration::from_secs(2), || reaped(pid)).await,
        "terminated and reaped"
    );
}

#[tokio::test]
async fn shutdown_and_close_session_wait_until_the_process_group_is_gone() {
    let fx = Fixture::new();
    let script =
        json!({"turns": [[out(INIT), out(ECHO), {"grandchild": "ignore_term"}, out(RESULT)]]});
    let source = ClaudeSource::new(fx.options(script));
    let (_, error) = run(source.open(fx.request(1, "one", None)).await.expect("open")).await;
    assert_eq!(error, None);
    let pid = fx.agent_pids()[0];
    let grandchild = fx.grandchild_pids()[0];
    source.close_session(&SessionKey::new("ws")).await;
    assert!(
        reaped(pid),
        "close_session returns once the agent is reaped"
    );
    assert!(
        eventually(PATIENCE, || dead(grandchild)).await,
        "and its group is killed"
    );

    let (_, error) = run(source.open(fx.request(2, "two", None)).await.expect("open")).await;
    assert_eq!(error, None);
    let pid = fx.agent_pids()[1];
    source.shutdown().await;
    assert!(reaped(pid));
}

#[tokio::test]
async fn end_session_ends_that_sessions_idle_process_at_once_and_forgets_it() {
    let fx = Fixture::new();
    let source = ClaudeSource::new(fx.options(echo_script()));
    let (_, error) = run(source.open(fx.request(1, "one", None)).await.expect("open")).await;
    assert_eq!(error, None);
    let pid = fx.agent_pids()[0];
    let key = SessionKey::new("ws");
    source.end_session(&SessionKey::new("another"));
    assert!(!dead(pid), "another session's end leaves it");
    source.end_session(&key);
    assert_eq!(source.pid(&key), None, "the session is forgotten");
    assert!(
        eventually(GRACE + Duration::from_secs(2), || reaped(pid)).await,
        "its process terminated and reaped while its source lives"
    );
}

#[tokio::test]
async fn the_factory_gives_each_session_its_own_source_and_process() {
    let fx = Fixture::new();
    let factory = ClaudeSourceFactory::new(fx.options(echo_script()));
    let a = factory.source_for(&SessionKey::new("a"));
    let b = factory.source_for(&SessionKey::new("b"));
    assert_eq!(a.provider(), "claude-code");
    for source in [&a, &b] {
        let (_, error) = run(source.open(fx.request(1, "m", None)).await.expect("open")).await;
        assert_eq!(error, None);
    }
    let pids = fx.agent_pids();
    assert_eq!(pids.len(), 2);
    // A session's shutdown drops its source: its process goes, the other stays.
    drop(a);
    assert!(eventually(GRACE + Duration::from_secs(2), || reaped(pids[0])).await);
    assert!(!dead(pids[1]));
}
