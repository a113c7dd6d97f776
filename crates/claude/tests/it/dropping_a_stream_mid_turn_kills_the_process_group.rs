//! Dropping a turn's stream before its result (the watchdog's kill)
//! terminates the agent's whole process group: SIGTERM, the grace period,
//! SIGKILL; the agent is reaped, nothing is orphaned, and the next attempt
//! resumes in a fresh process.

use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::json;
use warden_claude::ClaudeSource;
use warden_core::{AgentEvent, EventSource};

/// A grace period long enough that "still alive before it ends" holds on a
/// loaded 2-core machine: the SIGTERM effects are awaited for at most a
/// third of it each, leaving a third as margin before the SIGKILL.
const SLOW_GRACE: Duration = Duration::from_secs(4);

/// A turn that announces its session, then hangs.
fn stalling(extra: &[serde_json::Value]) -> serde_json::Value {
    let mut actions: Vec<serde_json::Value> = extra.to_vec();
    actions.push(out(INIT));
    actions.push(json!({"stall": true}));
    json!(actions)
}

#[tokio::test]
async fn dropping_the_stream_kills_the_agent_and_its_grandchildren_and_reaps_the_agent() {
    let fx = Fixture::new();
    let script = json!({"turns": [stalling(&[
        json!({"grandchild": "plain"}),
        json!({"grandchild": "ignore_term"}),
    ])]});
    let source = ClaudeSource::new(fx.options(script).with_grace_period(SLOW_GRACE));
    let mut stream = source.open(fx.request(1, "x", None)).await.expect("open");
    read_until(&mut stream, is_started).await;
    let agent = fx.agent_pids()[0];
    let grandchildren = fx.grandchild_pids();
    assert_eq!(grandchildren.len(), 2);
    for pid in std::iter::once(agent).chain(grandchildren.iter().copied()) {
        assert!(!dead(pid), "{pid} runs before the drop");
    }
    assert_eq!(
        source.pid(&fx.request(1, "", None).session_key),
        Some(agent)
    );

    let dropped = Instant::now();
    drop(stream);
    // The agent exits on SIGTERM: reaped well before the grace period ends.
    assert!(
        eventually(SLOW_GRACE / 3, || reaped(agent)).await,
        "agent reaped after SIGTERM"
    );
    // The grandchild that ignores SIGTERM needs the SIGKILL after the grace
    // period; the other one is gone at once.
    assert!(
        eventually(SLOW_GRACE / 3, || dead(grandchildren[0])).await,
        "the plain grandchild died of SIGTERM: state {:?} after {:?}",
        proc_state(grandchildren[0]),
        dropped.elapsed()
    );
    assert!(
        !dead(grandchildren[1]) && dropped.elapsed() < SLOW_GRACE,
        "a SIGTERM-ignoring member lives until the grace period ends"
    );
    assert!(
        eventually(SLOW_GRACE + Duration::from_secs(2), || dead(
            grandchildren[1]
        ))
        .await,
        "SIGKILL took the whole group"
    );
    assert!(
        dropped.elapsed() >= SLOW_GRACE,
        "SIGKILL came after the grace period"
    );
    assert_eq!(source.pid(&fx.request(1, "", None).session_key), None);
}

#[tokio::test]
async fn an_agent_ignoring_sigterm_is_killed_after_the_grace_period_and_reaped() {
    let fx = Fixture::new();
    let script = json!({"turns": [stalling(&[json!({"ignore_term": true})])]});
    let source = ClaudeSource::new(fx.options(script).with_grace_period(SLOW_GRACE));
    let mut stream = source.open(fx.request(1, "x", None)).await.expect("open");
    read_until(&mut stream, is_started).await;
    let agent = fx.agent_pids()[0];

    let dropped = Instant::now();
    drop(stream);
    tokio::time::sleep(SLOW_GRACE / 4).await;
    assert!(
        !dead(agent) && dropped.elapsed() < SLOW_GRACE,
        "SIGTERM alone does not end it"
    );
    assert!(
        eventually(SLOW_GRACE + Duration::from_secs(2), || reaped(agent)).await,
        "killed and reaped"
    );
    assert!(dropped.elapsed() >= SLOW_GRACE);
}

#[tokio::test]
async fn an_agent_that_exits_on_sigterm_does_not_wait_for_the_grace_period() {
    let fx = Fixture::new();
    let script = json!({"turns": [stalling(&[])]});
    let long_grace = Duration::from_secs(30);
    let source = ClaudeSource::new(fx.options(script).with_grace_period(long_grace));
    let mut stream = source.open(fx.request(1, "x", None)).await.expect("open");
    read_until(&mut stream, is_started).await;
    let agent = fx.agent_pids()[0];
    drop(stream);
    assert!(eventually(Duration::from_secs(3), || reaped(agent)).await);
    // The group is known gone: a shutdown returns at once.
    let shut = Instant::now();
    source.shutdown().await;
    assert!(shut.elapsed() < Duration::from_secs(3));
}

#[tokio::test]
async fn the_next_attempt_after_a_kill_resumes_the_newest_id_in_a_fresh_process() {
    let fx = Fixture::new();
    // Fresh: completes turn 1. Resumed (the retry): stalls on its first
    // turn, then completes.
    let script = json!({
        "fresh": {"turns": [echo_turn()]},
        "resumed": {"turns": [stalling(&[])]},
    });
    let source = ClaudeSource::new(fx.options(script.clone()));
    let (frames, error) = run(source.open(fx.request(1, "one", None)).await.expect("open")).await;
    assert_eq!(error, None);
    assert_eq!(text(&frames), "echo one");

    // Turn 2 resumes SESS_1, the id the idle process announced: reused.
    let mut stream = source
        .open(fx.request(2, "two", Some(SESS_1)))
        .await
        .expect("open");
    let (frames, error) = run(stream).await;
    assert_eq!(error, None, "the idle process serves turn 2");
    assert_eq!(text(&frames), "echo two");
    assert_eq!(fx.agent_pids().len(), 1);

    // Turn 3 asks for another id: a new process resumes it, and stalls.
    stream = source
        .open(fx.request(3, "three", Some("00000000-0000-4000-8000-0000000000a0")))
        .await
        .expect("open");
    let frames = read_until(&mut stream, is_started).await;
    assert_eq!(
        events(&frames)[0],
        AgentEvent::SessionStarted {
            session_id: "00000000-0000-4000-8000-0000000000a1".into(),
            model: Some("claude-x".into())
        }
    );
    let pids = fx.agent_pids();
    assert_eq!(pids.len(), 2);
    assert!(reaped(pids[0]), "the idle process was replaced, not kept");
    drop(stream); // the watchdog's kill

    // The retry carries no id: the source resumes the id the killed
    // attempt announced, in a fresh process.
    let mut retry = fx.request(3, "three", None);
    retry.attempt = 2;
    let mut stream = source.open(retry).await.expect("open");
    assert!(
        reaped(pids[1]),
        "the killed process is gone before the next starts"
    );
    let frames = read_until(&mut stream, is_started).await;
    let args = fx.args(2);
    assert!(
        args.windows(2)
            .any(|w| w == ["--resume", "00000000-0000-4000-8000-0000000000a1"]),
        "{args:?}"
    );
    // Resuming forked the id again: that is the newest now.
    assert!(matches!(
        &events(&frames)[0],
        AgentEvent::SessionStarted { session_id, .. } if session_id == "00000000-0000-4000-8000-0000000000a2"
    ));
    drop(stream);
    assert_eq!(
        source.newest_session_id(&fx.request(1, "", None).session_key),
        Some("00000000-0000-4000-8000-0000000000a2".to_owned())
    );
}
