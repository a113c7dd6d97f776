//! The real Codex CLI (`@openai/codex` 0.169.0) driven through warden
//! against warden's mock Responses endpoint: a turn and a resume, resume
//! failures (an unknown thread, an id Codex would silently not resume)
//! falling back fresh with a notice, the CLI killed mid-turn, a stalled
//! upstream (warden's watchdog against Codex's own idle timeout), and a
//! cancel.
//!
//! The fixture (binary, mock, `HOME`, helpers) is `common/codex.rs`.
//!
//! A binary of its own, not a module of `tests/it`: it drives the real
//! CLI as child processes (seconds each), so it stays out of the fast
//! in-process binary and is run or skipped by its own name.

#[path = "common/codex.rs"]
mod codex;

use std::sync::Arc;
use std::time::{Duration, Instant};

use codex::*;
use warden_core::{LifecycleEvent, MemoryStore, Notice, ResumeCause};
use warden_mock::{MockConfig, Scenario};

/// A turn, then a second one in a new `codex exec resume <thread>` process:
/// the same thread, the context indicator from the last request (not the
/// cumulative usage Codex prints).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_and_a_resume_keep_one_thread_and_report_the_last_requests_context() {
    let Some(bin) = codex_bin("a_turn_and_a_resume_keep_one_thread") else {
        return;
    };
    let fx = Fixture::new(bin, MockConfig::default()).await;
    let store = Arc::new(MemoryStore::new());
    let (sup, mut notices) = fx
        .supervisor(config(RELAXED), store.clone(), fx.options())
        .await;
    let t0 = Instant::now();
    let (text, first) = ask(&sup, &fx.workspace, "hello").await;
    eprintln!("codex turn 1: {:?}", t0.elapsed());
    assert!(text.contains(REPLY), "{text}");
    let thread = stored(&store, &fx.key())
        .await
        .agent_session_id
        .expect("a thread id");
    assert_eq!(fx.threads(), std::slice::from_ref(&thread));
    let t1 = Instant::now();
    let (text, second) = ask(&sup, &fx.workspace, "again").await;
    eprintln!("codex turn 2 (resume): {:?}", t1.elapsed());
    assert!(text.contains(REPLY), "{text}");
    assert_eq!(second.attempts, 1);
    assert_eq!(
        stored(&store, &fx.key()).await.agent_session_id,
        Some(thread.clone())
    );
    assert_eq!(fx.threads(), [thread], "resumed, not a new thread");
    let (u1, u2) = (
        first.usage.expect("usage 1"),
        second.usage.expect("usage 2"),
    );
    let context = |u: warden_core::Usage| u.input_tokens + u.cache_read_input_tokens;
    // The second request re-sends the first turn: more context, but far
    // less than the cumulative sum of both requests.
    assert!(context(u2) > context(u1), "{u1:?} {u2:?}");
    assert!(context(u2) < 2 * context(u1), "{u1:?} {u2:?}");
    let report = second.context.expect("a context report");
    assert_eq!(report.window, 258_400, "{report:?}");
    assert!(notices.try_recv().is_err(), "no notice on plain turns");
    sup.shutdown().await;
    fx.mock.shutdown().await;
}

/// Stored thread ids Codex cannot resume: an unknown UUID (exit 1, "no
/// rollout found") and a non-UUID (Codex would silently start a new
/// thread): each falls back to a fresh thread, the message re-delivered
/// and a `FreshStart` notice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unresumable_threads_fall_back_to_a_fresh_one_with_a_notice() {
    let Some(bin) = codex_bin("unresumable_threads_fall_back_to_a_fresh_one_with_a_notice") else {
        return;
    };
    for gone in ["11111111-2222-4333-8444-555555555555", "sess-not-a-uuid"] {
        let fx = Fixture::new(bin.clone(), MockConfig::default()).await;
        let store = store_with(&fx, gone).await;
        let (sup, mut notices) = fx
            .supervisor(config(RELAXED), store.clone(), fx.options())
            .await;
        let (text, _) = ask(&sup, &fx.workspace, "are you there?").await;
        assert!(text.contains(REPLY), "{gone}: {text}");
        let (_, notice) = tokio::time::timeout(Duration::from_secs(5), notices.recv())
            .await
            .expect("a notice in time")
            .expect("notifier open");
        match notice {
            Notice::FreshStart {
                failed_session_id,
                cause,
                ..
            } => {
                assert_eq!(failed_session_id, gone);
                assert_eq!(cause, ResumeCause::UnknownSession);
            }
            other => panic!("expected FreshStart, got {other:?}"),
        }
        assert_eq!(
            fx.mock.requests_to(RESPONSES),
            1,
            "{gone}: only the fresh run asked"
        );
        let fresh = stored(&store, &fx.key())
            .await
            .agent_session_id
            .expect("an id");
        assert_ne!(fresh, gone);
        assert_eq!(fx.threads(), [fresh]);
        sup.shutdown().await;
        fx.mock.shutdown().await;
    }
}

/// Codex killed (SIGKILL) mid-turn: the attempt fails, the retry resumes
/// the thread the killed run announced and answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_killed_mid_turn_is_retried_on_its_thread() {
    let Some(bin) = codex_bin("the_cli_killed_mid_turn_is_retried_on_its_thread") else {
        return;
    };
    let fx = Fixture::new(
        bin,
        MockConfig::default().with_sequence([Scenario::Stall, Scenario::Normal]),
    )
    .await;
    let store = Arc::new(MemoryStore::new());
    let (sup, _notices) = fx
        .supervisor(config(RELAXED), store.clone(), fx.options())
        .await;
    let (turn, pid, _) = stalled_turn(&fx, &sup).await;
    // SIGKILL to the CLI alone (not its group), as an OOM killer would.
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(killed.success());
    let (text, summary) = tokio::time::timeout(TURN, turn.finish())
        .await
        .expect("in time")
        .expect("ok");
    assert!(text.contains(REPLY), "{text}");
    assert_eq!(summary.attempts, 2);
    let thread = stored(&store, &fx.key())
        .await
        .agent_session_id
        .expect("an id");
    assert_eq!(
        fx.threads(),
        [thread],
        "the retry resumed the killed run's thread"
    );
    assert!(eventually(Duration::from_secs(5), || group_gone(pid)).await);
    sup.shutdown().await;
    fx.mock.shutdown().await;
}

/// A stalled upstream with Codex's defaults (300 s idle timeout): warden's
/// 3 s watchdog ends it first, the process group goes, the retry answers.
/// With the provider's `stream_idle_timeout_ms` at 1 s, Codex's own
/// reconnect ends it first (a `ProviderRetry`, no watchdog kill).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_is_ended_by_the_watchdog_or_by_codexs_own_shorter_idle_timeout() {
    let Some(bin) = codex_bin("a_stall_is_ended_by_the_watchdog") else {
        return;
    };
    let allowance = Duration::from_secs(3);
    for own_timeout in [None, Some(1000)] {
        let fx = Fixture::new(
            bin.clone(),
            MockConfig::default().with_sequence([Scenario::Stall, Scenario::Normal]),
        )
        .await;
        let store = Arc::new(MemoryStore::new());
        let mut options = fx.options();
        if let Some(ms) = own_timeout {
            options = options.with_stream_idle_timeout_ms(ms);
        }
        let (sup, _notices) = fx
            .supervisor(config(allowance), store.clone(), options)
            .await;
        let mut events = sup.subscribe();
        let (turn, pid, t0) = stalled_turn(&fx, &sup).await;
        let (text, summary) = tokio::time::timeout(TURN, turn.finish())
            .await
            .expect("in time")
            .expect("ok");
        eprintln!(
            "stall, codex idle timeout {own_timeout:?}: answered after {:?}",
            t0.elapsed()
        );
        assert!(text.contains(REPLY), "{text}");
        let mut timed_out = false;
        while let Ok(ev) = events.try_recv() {
            timed_out |= matches!(ev, LifecycleEvent::StreamTimedOut { .. });
        }
        if own_timeout.is_none() {
            assert!(timed_out, "the watchdog ended the stall");
            assert_eq!(summary.attempts, 2);
            assert!(
                eventually(Duration::from_secs(5), || group_gone(pid)).await,
                "group gone"
            );
        } else {
            assert!(
                !timed_out,
                "codex reconnected by itself before the watchdog fired"
            );
            assert_eq!(summary.attempts, 1);
            assert_eq!(
                fx.mock.requests_to(RESPONSES),
                2,
                "one codex run, two requests"
            );
        }
        sup.shutdown().await;
        fx.mock.shutdown().await;
    }
}

/// Cancelling a stalled turn ends Codex's whole process group and nothing
/// is retried (the mock sees one request).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_ends_the_process_group_and_nothing_is_retried() {
    let Some(bin) = codex_bin("a_cancel_ends_the_process_group") else {
        return;
    };
    let fx = Fixture::new(bin, MockConfig::default().with_sequence([Scenario::Stall])).await;
    let store = Arc::new(MemoryStore::new());
    let (sup, _notices) = fx
        .supervisor(config(RELAXED), store.clone(), fx.options())
        .await;
    let (turn, pid, _) = stalled_turn(&fx, &sup).await;
    assert!(turn.cancel().await.expect("session alive"));
    let result = tokio::time::timeout(TURN, turn.finish())
        .await
        .expect("ends in time");
    assert!(result.is_err(), "a cancelled turn does not succeed");
    assert!(
        eventually(Duration::from_secs(5), || group_gone(pid)).await,
        "codex's group is gone"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(fx.mock.requests_to(RESPONSES), 1, "nothing retried");
    sup.shutdown().await;
    fx.mock.shutdown().await;
}
