//! The real Codex CLI (`@openai/codex` 0.169.0) through warden against
//! warden's mock Responses endpoint, under the faults
//! `real_codex_through_warden.rs` does not cover: stdout that is not JSON
//! (a line cut mid-object, garbage lines between Codex's own, a flood of
//! them) and a context overflow on a resumed thread.
//!
//! The misbehaving CLI is a small `sh` script the test writes around the
//! real binary; warden executes it directly, as it does `codex` (never
//! through a shell of its own). The fixture is `common/codex.rs`
//! (`WARDEN_CODEX_BIN`, skipped with a printed reason without it unless
//! `WARDEN_REQUIRE_CODEX=1`). `kill -9` of warden mid-turn is
//! `crates/cli/tests/it/agent_turns_survive_a_kill_9_of_warden.rs` (it needs
//! the `warden` binary).
//!
//! A binary of its own, not a module of `tests/it`: it drives the real
//! CLI as child processes (seconds each), so it stays out of the fast
//! in-process binary and is run or skipped by its own name.

#[path = "common/codex.rs"]
mod codex;

use std::sync::Arc;
use std::time::Duration;

use codex::*;
use warden_core::{LifecycleEvent, MemoryStore, Notice, ResumeCause};
use warden_mock::{MockConfig, Scenario};

/// The error codes of the retries scheduled so far.
fn retry_codes(events: &mut tokio::sync::broadcast::Receiver<LifecycleEvent>) -> Vec<String> {
    let mut codes = Vec::new();
    while let Ok(ev) = events.try_recv() {
        if let LifecycleEvent::RetryScheduled { error_code, .. } = ev {
            codes.push(error_code.to_owned());
        }
    }
    codes
}

/// Codex's last stdout line (`turn.completed`) cut after 25 bytes, then
/// stdout ends with exit 0: the attempt fails typed
/// (`ESTREAM_TRUNCATED`, never a success), the retry resumes the thread
/// and answers, and the text already shown is discarded once: the reply
/// is relayed exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_cut_mid_object_is_a_typed_failure_retried_and_the_reply_relayed_once() {
    let Some(bin) = codex_bin("a_line_cut_mid_object_is_a_typed_failure") else {
        return;
    };
    let fx = Fixture::new(bin, MockConfig::default()).await;
    let wrapper = fx.wrapper(
        "codex-cut",
        "if [ ! -e \"$MARK\" ]; then : > \"$MARK\"; \"$CODEX\" \"$@\" | sed '$ s/^\\(.\\{25\\}\\).*/\\1/'; exit 0; fi\nexec \"$CODEX\" \"$@\"",
    );
    let store = Arc::new(MemoryStore::new());
    let (sup, mut notices) = fx
        .supervisor(
            config(RELAXED),
            store.clone(),
            fx.options().with_binary(&wrapper),
        )
        .await;
    let mut events = sup.subscribe();
    let (text, discards) = relayed(&sup, &fx.workspace, "hello").await;
    assert!(
        fx.dir.path().join("codex-cut.ran").exists(),
        "the cut run happened"
    );
    assert_eq!(text.as_deref(), Ok(REPLY), "nothing lost, nothing twice");
    assert_eq!(discards, 1, "the cut attempt's text discarded once");
    assert_eq!(retry_codes(&mut events), ["ESTREAM_TRUNCATED"]);
    assert_eq!(fx.mock.requests_to(RESPONSES), 2);
    let thread = stored(&store, &fx.key())
        .await
        .agent_session_id
        .expect("a thread id");
    assert_eq!(
        fx.threads(),
        [thread],
        "the retry resumed the cut run's thread"
    );
    assert!(notices.try_recv().is_err(), "a retry, not a fresh start");
    sup.shutdown().await;
    fx.mock.shutdown().await;
}

/// A line that is not JSON after each of Codex's lines (a noisy wrapper,
/// a library printing to stdout): each counts as liveness, the turn is
/// answered in one attempt with the reply once. Twenty-one in a row
/// before any JSON: `EMALFORMED`, fatal (a CLI printing only garbage will
/// not be fixed by a retry), the process group gone, nothing retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_lines_are_liveness_and_a_flood_of_them_is_a_fatal_typed_error() {
    let Some(bin) = codex_bin("garbage_lines_are_liveness") else {
        return;
    };
    let fx = Fixture::new(bin.clone(), MockConfig::default()).await;
    let noisy = fx.wrapper(
        "codex-noisy",
        "\"$CODEX\" \"$@\" | awk '{ print; print \"npm WARN this is not JSON\"; fflush() }'",
    );
    let (sup, _n) = fx
        .supervisor(
            config(RELAXED),
            Arc::new(MemoryStore::new()),
            fx.options().with_binary(&noisy),
        )
        .await;
    let mut events = sup.subscribe();
    let (text, discards) = relayed(&sup, &fx.workspace, "hello").await;
    assert_eq!(text.as_deref(), Ok(REPLY));
    assert_eq!(discards, 0);
    assert!(retry_codes(&mut events).is_empty(), "no retry");
    assert_eq!(fx.mock.requests_to(RESPONSES), 1);
    sup.shutdown().await;
    fx.mock.shutdown().await;

    let fx = Fixture::new(bin, MockConfig::default()).await;
    let flood = fx.wrapper(
        "codex-flood",
        "i=0; while [ $i -lt 30 ]; do echo \"garbage $i\"; i=$((i+1)); done\nexec \"$CODEX\" \"$@\"",
    );
    let (sup, _n) = fx
        .supervisor(
            config(RELAXED),
            Arc::new(MemoryStore::new()),
            fx.options().with_binary(&flood),
        )
        .await;
    let mut events = sup.subscribe();
    let turn = sup
        .send_to_workspace(&fx.workspace, "hello")
        .await
        .expect("send");
    let error = tokio::time::timeout(TURN, turn.finish())
        .await
        .expect("the turn ends in time")
        .expect_err("a CLI printing garbage is no success");
    assert!(error.to_string().contains("not JSON objects"), "{error}");
    assert!(retry_codes(&mut events).is_empty(), "nothing retried");
    let pid = fx.pid();
    if let Some(pid) = pid {
        assert!(
            eventually(Duration::from_secs(5), || group_gone(pid)).await,
            "the group is gone"
        );
    }
    assert_eq!(fx.mock.requests_to(RESPONSES), 0, "Codex never asked");
    sup.shutdown().await;
    fx.mock.shutdown().await;
}

/// A resumed thread the model has no room for: the mock answers
/// Responses with HTTP 400 `context_length_exceeded`; Codex reports it
/// (`error` / `turn.failed` "ran out of room in the model's context
/// window", exit 1) without retrying, warden takes it as a context
/// overflow: a fresh thread answers the same message, the user gets a
/// `FreshStart` notice naming the old thread, the overflow asked once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_overflow_falls_back_to_a_fresh_thread_with_the_message_and_a_notice() {
    let Some(bin) = codex_bin("a_context_overflow_falls_back_to_a_fresh_thread") else {
        return;
    };
    let fx = Fixture::new(
        bin,
        MockConfig::default().with_sequence([
            Scenario::Normal,
            Scenario::PromptTooLong,
            Scenario::Normal,
        ]),
    )
    .await;
    let store = Arc::new(MemoryStore::new());
    let (sup, mut notices) = fx
        .supervisor(config(RELAXED), store.clone(), fx.options())
        .await;
    ask(&sup, &fx.workspace, "hello").await;
    let first = stored(&store, &fx.key())
        .await
        .agent_session_id
        .expect("a thread id");
    let (text, discards) = relayed(&sup, &fx.workspace, "a long one").await;
    assert_eq!(text.as_deref(), Ok(REPLY), "the message answered once");
    assert_eq!(discards, 0, "nothing was shown before the overflow");
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
            assert_eq!(failed_session_id, first);
            assert_eq!(cause, ResumeCause::PromptTooLong);
        }
        other => panic!("expected FreshStart, got {other:?}"),
    }
    let fresh = stored(&store, &fx.key())
        .await
        .agent_session_id
        .expect("a thread id");
    assert_ne!(fresh, first);
    let mut threads = fx.threads();
    threads.sort();
    let mut expected = vec![first, fresh];
    expected.sort();
    assert_eq!(threads, expected, "the old thread and one fresh one");
    assert_eq!(fx.mock.requests_to(RESPONSES), 3, "the overflow asked once");
    sup.shutdown().await;
    fx.mock.shutdown().await;
}
