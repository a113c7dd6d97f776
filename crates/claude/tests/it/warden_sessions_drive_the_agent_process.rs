//! Under warden's supervisor: a silent agent is killed by the watchdog and
//! the retry resumes in a fresh process; an unknown stored id falls back to
//! a fresh conversation that still gets the message; an id that is not one
//! (a NUL in it) is never kept and never wedges the workspace.

use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use serde_json::json;
use warden_claude::ClaudeSourceFactory;
use warden_core::{
    Durability, MemoryStore, RetryPolicy, SessionConfig, SessionKey, SessionRecord, SessionStore,
    StreamOptions, Supervisor, SupervisorConfig, normalize_workspace,
};

/// A stored id the agent CLI no longer knows.
const GONE: &str = "9753c268-0000-4000-8000-00000000dead";

fn config(stream_timeout: Duration) -> SupervisorConfig {
    SupervisorConfig::default().with_session(
        SessionConfig::default()
            .with_stream(StreamOptions::default().with_timeout(stream_timeout))
            .with_retry(
                RetryPolicy::default()
                    .with_jitter(0.0)
                    .with_backoff(Duration::from_millis(10), Duration::from_millis(10)),
            ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_agent_is_killed_by_the_watchdog_and_the_retry_resumes_its_id() {
    let fx = Fixture::new();
    let script = json!({
        "fresh": {"turns": [[out(INIT), {"stall": true}]]},
        "resumed": {"turns": [echo_turn()]},
    });
    let factory = ClaudeSourceFactory::new(fx.options(script));
    // The allowance must cover spawning the agent and its first line on a
    // loaded machine (300 ms did not): 2 s of silence after `init` is the
    // kill, and the turn as a whole is bounded by PATIENCE.
    let sup = Supervisor::start(config(Duration::from_secs(2)), Arc::new(factory))
        .await
        .expect("supervisor");
    let turn = sup
        .send_to_workspace(&fx.workspace, "hello")
        .await
        .expect("send");
    let (text, summary) = tokio::time::timeout(PATIENCE, turn.finish())
        .await
        .expect("in time")
        .expect("the retry succeeds");
    assert!(text.starts_with("echo hello"), "{text}");
    assert_eq!(summary.attempts, 2);
    let pids = fx.agent_pids();
    assert_eq!(pids.len(), 2);
    assert!(reaped(pids[0]), "the silent agent was killed and reaped");
    assert!(fx.args(1).windows(2).any(|w| w == ["--resume", SESS_1]));
    sup.shutdown().await;
    assert!(
        eventually(GRACE + Duration::from_secs(2), || reaped(pids[1])).await,
        "the session's shutdown ends its process"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_stored_id_falls_back_to_a_fresh_conversation_with_the_same_message() {
    let fx = Fixture::new();
    let workspace = normalize_workspace(&fx.workspace).expect("normalize");
    let key = SessionKey::new(workspace.to_string_lossy());
    let store = Arc::new(MemoryStore::new());
    let mut record = SessionRecord::new(&key, Some(workspace.clone()));
    record.set_agent_session_id(GONE);
    store
        .save(&record, Durability::Flushed)
        .await
        .expect("save");

    let script = json!({
        "resumed": {"start": [
            err("No conversation found with session ID: {resume_id}"),
            out(r#"{"type":"result","subtype":"error_during_execution","is_error":true,"errors":["No conversation found with session ID: {resume_id}"]}"#),
            {"exit": 1},
        ]},
        "fresh": {"turns": [echo_turn()]},
    });
    let sup = Supervisor::builder(Arc::new(ClaudeSourceFactory::new(fx.options(script))))
        .config(config(Duration::from_secs(30)))
        .store(store.clone())
        .start()
        .await
        .expect("supervisor");
    let turn = sup
        .send_to_workspace(&fx.workspace, "keep this")
        .await
        .expect("send");
    let (text, _) = tokio::time::timeout(PATIENCE, turn.finish())
        .await
        .expect("in time")
        .expect("the fresh conversation answers");
    assert!(text.starts_with("echo keep this"), "{text}");
    assert!(fx.args(0).windows(2).any(|w| w == ["--resume", GONE]));
    assert!(!fx.args(1).iter().any(|a| a == "--resume"));
    let stored = store.load(&key).await.expect("load").expect("record");
    assert_eq!(stored.agent_session_id.as_deref(), Some(SESS_1));
    sup.shutdown().await;
}

/// Starts a supervisor over the fake running `script`, storing in `store`.
async fn supervisor(
    fx: &Fixture,
    script: serde_json::Value,
    store: Arc<MemoryStore>,
) -> Supervisor {
    Supervisor::builder(Arc::new(ClaudeSourceFactory::new(fx.options(script))))
        .config(config(Duration::from_secs(30)))
        .store(store)
        .start()
        .await
        .expect("supervisor")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_announced_id_with_a_nul_is_never_kept_and_every_later_turn_answers() {
    let fx = Fixture::new();
    let key = SessionKey::new(
        normalize_workspace(&fx.workspace)
            .expect("normalize")
            .to_string_lossy(),
    );
    let store = Arc::new(MemoryStore::new());
    let init = r#"{"type":"system","subtype":"init","cwd":"{cwd}","session_id":"9753c268\u0000-x","model":"claude-x"}"#;
    let script = json!({ "turns": [[out(init), out(ECHO), out(RESULT)]] });
    let sup = supervisor(&fx, script, store.clone()).await;
    for message in ["one", "two", "three"] {
        let turn = sup
            .send_to_workspace(&fx.workspace, message)
            .await
            .expect("send");
        let (text, _) = tokio::time::timeout(PATIENCE, turn.finish())
            .await
            .expect("in time")
            .unwrap_or_else(|e| panic!("turn {message:?} failed: {e}"));
        assert!(text.starts_with(&format!("echo {message}")), "{text}");
        let stored = store.load(&key).await.expect("load").expect("record");
        assert_eq!(
            stored.agent_session_id, None,
            "the id with a NUL is not kept"
        );
    }
    let pids = fx.agent_pids();
    for n in 0..pids.len() {
        assert!(
            !fx.args(n).iter().any(|a| a == "--resume"),
            "{:?}",
            fx.args(n)
        );
    }
    sup.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_id_with_a_nul_falls_back_to_a_fresh_conversation_with_the_same_message() {
    let fx = Fixture::new();
    let workspace = normalize_workspace(&fx.workspace).expect("normalize");
    let key = SessionKey::new(workspace.to_string_lossy());
    let store = Arc::new(MemoryStore::new());
    let mut record = SessionRecord::new(&key, Some(workspace.clone()));
    record.set_agent_session_id("9753c268\0-x");
    store
        .save(&record, Durability::Flushed)
        .await
        .expect("save");
    let sup = supervisor(&fx, echo_script(), store.clone()).await;
    let turn = sup
        .send_to_workspace(&fx.workspace, "keep this")
        .await
        .expect("send");
    let (text, _) = tokio::time::timeout(PATIENCE, turn.finish())
        .await
        .expect("in time")
        .expect("the fresh conversation answers");
    assert!(text.starts_with("echo keep this"), "{text}");
    assert!(!fx.args(0).iter().any(|a| a == "--resume"));
    let stored = store.load(&key).await.expect("load").expect("record");
    assert_eq!(stored.agent_session_id.as_deref(), Some(SESS_1));
    sup.shutdown().await;
}
