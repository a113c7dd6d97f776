//! A stored conversation that cannot be resumed: the supervisor clears the
//! id durably, starts fresh, re-delivers the message and tells the user; if
//! the fresh start fails too, the session is marked failed; no loop.

use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use warden_core::{
    AgentEvent, Frame, LifecycleEvent, MemoryStore, Notice, RecordStatus, ResumeCause, SessionKey,
    SessionRecord, SessionStore, StreamError, SupervisorError, TurnError, TurnEvent,
};

const OLD: &str = "11111111-1111-4111-8111-111111111111";
const NEW: &str = "22222222-2222-4222-8222-222222222222";

async fn store_with_old_id(key: &str) -> Arc<MemoryStore> {
    let store = Arc::new(MemoryStore::new());
    let mut r = SessionRecord::new(&SessionKey::new(key), None);
    r.set_agent_session_id(OLD);
    store
        .save(&r, warden_core::Durability::Flushed)
        .await
        .expect("save");
    store
}

fn too_long() -> StreamError {
    StreamError::ContextOverflow {
        reason: ResumeCause::PromptTooLong,
        message: "Prompt is too long".into(),
    }
}

fn unknown() -> StreamError {
    StreamError::UnknownSession {
        session_id: OLD.into(),
        message: format!("No conversation found with session ID: {OLD}"),
    }
}

async fn record(store: &MemoryStore, key: &str) -> SessionRecord {
    store
        .load(&SessionKey::new(key))
        .await
        .expect("load")
        .expect("record exists")
}

/// Drives the fallback; `fail` makes the resumed attempt fail.
async fn falls_back(
    fail: impl FnOnce(
        &Arc<warden_core::testing::ChannelSource>,
        Option<&warden_core::testing::AttemptControl>,
    ),
    at_start: bool,
    cause: &str,
) {
    let store = store_with_old_id("ws").await;
    let (sup, source, ctl, mut notices) = supervisor_with_store(config(), store.clone()).await;
    let mut events = sup.subscribe();
    let mut fail = Some(fail);
    if at_start && let Some(f) = fail.take() {
        f(&source, None);
    }
    let turn = sup.send("ws", "keep this message").await.expect("send");
    let mut first = None;
    if let Some(f) = fail.take() {
        let a = ctl
            .next_attempt()
            .within("the next attempt to open")
            .await
            .expect("resumed attempt");
        assert_eq!(a.request.resume_id.as_deref(), Some(OLD));
        f(&source, Some(&a));
        first = Some(a);
    }
    // The fresh session gets the same message, without a resume id.
    let fresh = ctl
        .next_attempt()
        .within("the next attempt to open")
        .await
        .expect("fresh attempt");
    assert_eq!(fresh.request.message, "keep this message");
    assert_eq!(fresh.request.resume_id, None);
    if let Some(a) = first {
        assert!(a.is_dropped());
    }
    // The id was cleared durably before the fresh start, and kept as past.
    let r = record(&store, "ws").await;
    assert_eq!(r.agent_session_id, None);
    assert_eq!(r.past_session_ids, [OLD]);
    assert_eq!(r.pending.len(), 1, "the message is still pending");

    fresh.send(Frame::Event(AgentEvent::SessionStarted {
        session_id: NEW.into(),
        model: None,
    }));
    fresh.text("answered fresh");
    fresh.finish();
    let (text, _) = turn
        .finish()
        .within("the turn to finish")
        .await
        .expect("the caller gets the fresh answer");
    assert_eq!(text, "answered fresh");

    let (key, notice) = notices
        .recv()
        .within("the next event")
        .await
        .expect("a notice");
    assert_eq!(key.as_str(), "ws");
    match notice {
        Notice::FreshStart {
            failed_session_id,
            cause: c,
            message,
        } => {
            assert_eq!(failed_session_id, OLD);
            assert_eq!(c.as_str(), cause);
            assert!(message.contains("starting fresh"), "{message}");
        }
        other => panic!("unexpected {other:?}"),
    }
    let ev = wait_for(&mut events, |e| {
        matches!(e, LifecycleEvent::FreshFallback { .. })
    })
    .await;
    assert!(matches!(
        ev,
        LifecycleEvent::FreshFallback { redelivered: 1, .. }
    ));
    settle().await;
    let r = record(&store, "ws").await;
    assert_eq!(r.agent_session_id.as_deref(), Some(NEW));
    assert!(r.pending.is_empty());
    assert_eq!(r.restart_count, 0, "a fresh start is not a restart");
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn an_unknown_id_at_start_falls_back_with_the_message_redelivered() {
    falls_back(|s, _| s.fail_next_open(unknown()), true, "unknown_session").await;
}

#[tokio::test(start_paused = true)]
async fn prompt_too_long_after_start_falls_back_and_notifies() {
    falls_back(
        |_, a| {
            let a = a.expect("attempt");
            a.text("partial that must not be relayed");
            a.fail(too_long());
        },
        false,
        "prompt_too_long",
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn blocking_limit_after_start_falls_back() {
    falls_back(
        |_, a| {
            a.expect("attempt").fail(StreamError::ContextOverflow {
                reason: ResumeCause::BlockingLimit,
                message: "Prompt is too long".into(),
            });
        },
        false,
        "blocking_limit",
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_failing_fresh_start_marks_the_session_failed_with_both_causes() {
    let store = store_with_old_id("ws").await;
    let (sup, source, ctl, mut notices) = supervisor_with_store(config(), store.clone()).await;
    let first = sup.send("ws", "first").await.expect("send");
    let resumed = ctl
        .next_attempt()
        .within("the next attempt to open")
        .await
        .expect("resumed attempt");
    let second = sup.send("ws", "second").await.expect("send");
    // The fresh start will fail as well.
    source.fail_next_open(StreamError::Unauthorized {
        message: "invalid x-api-key".into(),
    });
    resumed.fail(unknown());
    match first.finish().within("the turn to finish").await {
        Err(TurnError::Fatal(StreamError::Unauthorized { .. })) => {}
        other => panic!("unexpected {other:?}"),
    }
    match second.finish().within("the turn to finish").await {
        Err(TurnError::SessionFailed { reason }) => {
            assert!(
                reason.contains("unknown_session") || reason.contains("No conversation"),
                "{reason}"
            )
        }
        other => panic!("unexpected {other:?}"),
    }
    // Notices: the fresh start, then the failure with both causes.
    let mut saw_failed = None;
    while let Ok(Some((_, n))) = tokio::time::timeout(Duration::from_secs(1), notices.recv()).await
    {
        if let Notice::SessionFailed { reason, .. } = n {
            saw_failed = Some(reason);
        }
    }
    let reason = saw_failed.expect("user told of the failure");
    assert!(reason.contains("No conversation found"), "{reason}");
    assert!(reason.contains("invalid x-api-key"), "{reason}");
    let r = record(&store, "ws").await;
    assert!(
        matches!(r.status, RecordStatus::Failed { .. }),
        "{:?}",
        r.status
    );
    // No loop: no further attempt, and the key refuses until reset.
    assert!(
        tokio::time::timeout(Duration::from_secs(60), ctl.next_attempt())
            .await
            .is_err()
    );
    assert!(matches!(
        sup.send("ws", "third").await,
        Err(SupervisorError::SessionFailed { .. })
    ));
    sup.reset("ws").await.expect("reset");
    assert!(sup.session("ws").await.is_ok());
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn an_already_fresh_session_gets_no_fallback() {
    let store = Arc::new(MemoryStore::new());
    let (sup, _source, ctl, mut notices) = supervisor_with_store(config(), store).await;
    let mut turn = sup.send("ws", "hi").await.expect("send");
    let a = ctl
        .next_attempt()
        .within("the next attempt to open")
        .await
        .expect("attempt");
    assert_eq!(a.request.resume_id, None);
    a.fail(too_long());
    let mut restarted = false;
    let result = loop {
        match turn.recv().within("the next event").await.expect("event") {
            TurnEvent::Restarting { .. } => restarted = true,
            TurnEvent::Finished(r) => break r,
            _ => {}
        }
    };
    assert!(!restarted);
    assert!(matches!(
        result,
        Err(TurnError::Fatal(StreamError::ContextOverflow { .. }))
    ));
    assert!(notices.try_recv().is_err(), "no fresh-start notice");
    assert!(
        tokio::time::timeout(Duration::from_secs(60), ctl.next_attempt())
            .await
            .is_err(),
        "no fallback attempt"
    );
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn queued_messages_move_to_the_fresh_session_in_order() {
    let store = store_with_old_id("ws").await;
    let (sup, _source, ctl, _notices) = supervisor_with_store(config(), store.clone()).await;
    let t1 = sup.send("ws", "one").await.expect("send");
    let t2 = sup.send("ws", "two").await.expect("send");
    let a = ctl
        .next_attempt()
        .within("the next attempt to open")
        .await
        .expect("resumed");
    a.fail(unknown());
    for (expected, t) in [("one", t1), ("two", t2)] {
        let fresh = ctl
            .next_attempt()
            .within("the next attempt to open")
            .await
            .expect("fresh");
        assert_eq!(fresh.request.message, expected);
        assert_eq!(fresh.request.resume_id, None);
        fresh.text(expected);
        fresh.finish();
        assert_eq!(
            t.finish()
                .within("the turn to finish")
                .await
                .expect("answered")
                .0,
            expected
        );
    }
    sup.shutdown().await;
}

/// Every save of one store, in order: (agent session id, status).
#[derive(Default)]
struct RecordingStore {
    inner: MemoryStore,
    saves: std::sync::Mutex<Vec<(Option<String>, RecordStatus)>>,
}

impl SessionStore for RecordingStore {
    fn load(
        &self,
        key: &SessionKey,
    ) -> futures_util::future::BoxFuture<'_, Result<Option<SessionRecord>, warden_core::StoreError>>
    {
        self.inner.load(key)
    }

    fn save<'a>(
        &'a self,
        record: &'a SessionRecord,
        durability: warden_core::Durability,
    ) -> futures_util::future::BoxFuture<'a, Result<(), warden_core::StoreError>> {
        self.saves
            .lock()
            .expect("saves")
            .push((record.agent_session_id.clone(), record.status.clone()));
        self.inner.save(record, durability)
    }

    fn list(
        &self,
    ) -> futures_util::future::BoxFuture<
        '_,
        Result<Vec<Result<SessionRecord, warden_core::StoreError>>, warden_core::StoreError>,
    > {
        self.inner.list()
    }
}

/// The session is its record's only writer while it runs; once it escalates
/// the supervisor is. The escalated session must not write its own copy
/// (still carrying the failed id) when it stops: that would race the
/// supervisor's cleared id and could bring the dead conversation back.
#[tokio::test(start_paused = true)]
async fn an_escalated_session_never_writes_its_record_again() {
    let store = Arc::new(RecordingStore::default());
    let mut r = SessionRecord::new(&SessionKey::new("ws"), None);
    r.set_agent_session_id(OLD);
    store
        .inner
        .save(&r, warden_core::Durability::Flushed)
        .await
        .expect("seed");
    let (sup, _source, ctl, _notices) = supervisor_with_store(config(), store.clone()).await;
    let turn = sup.send("ws", "keep this message").await.expect("send");
    let resumed = ctl
        .next_attempt()
        .within("the resumed attempt")
        .await
        .expect("resumed attempt");
    resumed.fail(unknown());
    let fresh = ctl
        .next_attempt()
        .within("the fresh attempt")
        .await
        .expect("fresh attempt");
    fresh.text("fresh answer");
    fresh.finish();
    turn.finish().within("the turn").await.expect("answered");
    settle().await;
    sup.shutdown().await;
    let saves = store.saves.lock().expect("saves").clone();
    let cleared = saves
        .iter()
        .position(|(id, _)| id.is_none())
        .expect("the supervisor saved the cleared id");
    let late: Vec<_> = saves[cleared..]
        .iter()
        .filter(|(id, _)| id.as_deref() == Some(OLD))
        .collect();
    assert!(
        late.is_empty(),
        "the failed id written after it was cleared: {saves:?}"
    );
    let stale_stop = saves
        .iter()
        .filter(|(id, status)| id.as_deref() == Some(OLD) && *status == RecordStatus::Idle)
        .count();
    assert_eq!(
        stale_stop, 0,
        "the escalated session wrote its stale copy: {saves:?}"
    );
}
