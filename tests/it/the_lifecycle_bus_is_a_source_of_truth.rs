//! The lifecycle bus as an orchestrator counts on it: every stop of a
//! session is told once (`SessionStopped`, with its reason), also the ones
//! a shutdown makes and the old incarnation of a resume failure; each
//! attempt that started is told ended; and a subscriber's loop ends on its
//! own after the shutdown's last event. Each case runs 200 times, as the
//! misses were races (2 of 14 runs of the escalation path).

use std::collections::HashMap;
use std::sync::Arc;

use crate::common::*;
use tokio::sync::broadcast::error::RecvError;
use warden_core::lifecycle::{AttemptOutcome, Received, Subscription};
use warden_core::{
    LifecycleEvent, MemoryStore, SessionKey, SessionRecord, SessionStore, StreamError,
};

const RUNS: usize = 200;

/// Everything `events` receives until it ends (it must, within the limit).
async fn drain(mut events: Subscription) -> Vec<LifecycleEvent> {
    drain_within(&mut events, LIMIT).await
}

/// [`drain`], bounded by `limit`.
async fn drain_within(
    events: &mut Subscription,
    limit: std::time::Duration,
) -> Vec<LifecycleEvent> {
    let mut seen = Vec::new();
    let all = async {
        while let Some(r) = events.recv().await {
            match r {
                Received::Event(e) => seen.push(e),
                Received::Lagged(n) => panic!("lagged by {n}: the bus holds 1,024"),
                _ => {}
            }
        }
    };
    bounded(limit, "the subscription to end after the shutdown", all).await;
    seen
}

/// `SessionStopped` events per session: (reason, abnormal).
fn stops(events: &[LifecycleEvent]) -> HashMap<String, Vec<(String, bool)>> {
    let mut out: HashMap<String, Vec<(String, bool)>> = HashMap::new();
    for e in events {
        if let LifecycleEvent::SessionStopped {
            key,
            reason,
            abnormal,
        } = e
        {
            out.entry(key.as_str().to_owned())
                .or_default()
                .push((reason.clone().unwrap_or_default(), *abnormal));
        }
    }
    out
}

/// Every `AttemptStarted` has its one `AttemptEnded`, after it.
fn every_attempt_ends_once(events: &[LifecycleEvent]) {
    let mut open = HashMap::new();
    for e in events {
        match e {
            LifecycleEvent::AttemptStarted { key, attempt, .. } => {
                assert!(
                    open.insert((key.clone(), *attempt), ()).is_none(),
                    "{attempt:?} of {key} started twice"
                );
            }
            LifecycleEvent::AttemptEnded { key, attempt, .. } => {
                assert!(
                    open.remove(&(key.clone(), *attempt)).is_some(),
                    "{attempt:?} of {key} ended without starting, or twice: {events:#?}"
                );
            }
            _ => {}
        }
    }
    assert!(open.is_empty(), "attempts never told ended: {open:?}");
}

#[tokio::test(start_paused = true)]
async fn a_shutdown_tells_each_sessions_stop_once_and_ends_every_subscriber() {
    for run in 0..RUNS {
        let (sup, ctl) = supervisor_with(config()).await;
        let events = sup.events();
        let mut legacy = sup.subscribe();
        // Two answered, one cancelled, two still streaming at the shutdown.
        for key in ["answered-1", "answered-2"] {
            let turn = sup.send(key, "hi").await.expect("send");
            let a = ctl.next_attempt().within("an attempt").await.expect("open");
            a.text("ok");
            a.finish();
            turn.finish().within("the answer").await.expect("answered");
        }
        let cancelled = sup.send("cancelled", "hi").await.expect("send");
        let a = ctl.next_attempt().within("an attempt").await.expect("open");
        a.text("partial");
        assert!(cancelled.cancel().await.expect("cancel"));
        let _ = cancelled.finish().within("the cancel").await;
        // Their turns and streams stay open until the shutdown ends them.
        let mut running = Vec::new();
        for key in ["running-1", "running-2"] {
            let turn = sup.send(key, "hi").await.expect("send");
            let a = ctl.next_attempt().within("an attempt").await.expect("open");
            a.text("half");
            running.push((turn, a));
        }
        sup.shutdown().within("the shutdown").await;
        let seen = drain(events).await;

        let stops = stops(&seen);
        for key in [
            "answered-1",
            "answered-2",
            "cancelled",
            "running-1",
            "running-2",
        ] {
            assert_eq!(
                stops.get(key).map(Vec::as_slice),
                Some(&[("shutdown".to_owned(), false)][..]),
                "run {run}: {key}'s stops"
            );
        }
        every_attempt_ends_once(&seen);
        let ended: Vec<(String, AttemptOutcome)> = seen
            .iter()
            .filter_map(|e| match e {
                LifecycleEvent::AttemptEnded { key, outcome, .. } => {
                    Some((key.as_str().to_owned(), *outcome))
                }
                _ => None,
            })
            .collect();
        assert!(
            ended.contains(&("answered-1".into(), AttemptOutcome::Completed))
                && ended.contains(&("cancelled".into(), AttemptOutcome::Cancelled))
                && ended.contains(&("running-1".into(), AttemptOutcome::Cancelled)),
            "run {run}: {ended:?}"
        );
        // The plain receiver ends too, after the same events.
        let mut legacy_stops = 0;
        loop {
            match legacy.recv().within("the receiver to end").await {
                Ok(LifecycleEvent::SessionStopped { .. }) => legacy_stops += 1,
                Ok(_) => {}
                Err(RecvError::Closed) => break,
                Err(RecvError::Lagged(n)) => panic!("lagged by {n}"),
            }
        }
        assert_eq!(legacy_stops, 5, "run {run}");
        // A subscriber after the shutdown ends at once.
        assert!(
            sup.events()
                .recv()
                .within("a late subscriber")
                .await
                .is_none()
        );
        drop(running);
    }
}

/// On real threads: the old incarnation's exit and the supervisor's
/// handling of its resume failure race there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_failure_tells_the_old_incarnations_stop_once() {
    const OLD: &str = "11111111-1111-4111-8111-111111111111";
    for run in 0..RUNS {
        let store = Arc::new(MemoryStore::new());
        let mut r = SessionRecord::new(&SessionKey::new("ws"), None);
        r.set_agent_session_id(OLD);
        store
            .save(&r, warden_core::Durability::Flushed)
            .await
            .expect("save");
        let (sup, source, ctl, _notices) = supervisor_with_store(config(), store).await;
        let events = sup.events();
        source.fail_next_open(StreamError::UnknownSession {
            session_id: OLD.into(),
            message: format!("No conversation found with session ID: {OLD}"),
        });
        let turn = sup.send("ws", "keep this").await.expect("send");
        let fresh = ctl
            .next_attempt()
            .patiently("the fresh attempt")
            .await
            .expect("fresh");
        assert_eq!(fresh.request.resume_id, None);
        fresh.text("answered fresh");
        fresh.finish();
        turn.finish()
            .patiently("the answer")
            .await
            .expect("answered");
        sup.shutdown().patiently("the shutdown").await;
        let mut events = events;
        let seen = drain_within(&mut events, PATIENCE).await;
        assert!(
            seen.iter()
                .any(|e| matches!(e, LifecycleEvent::FreshFallback { .. })),
            "run {run}"
        );
        let stops = stops(&seen);
        let ws = stops.get("ws").cloned().unwrap_or_default();
        assert_eq!(
            ws.len(),
            2,
            "run {run}: the failed incarnation's stop and the fresh one's at shutdown: {ws:?}"
        );
        // The failed incarnation stopped escalated (told when it exited,
        // or by the shutdown if it came first), the fresh one at shutdown.
        let mut reasons: Vec<&str> = ws.iter().map(|(r, _)| r.as_str()).collect();
        reasons.sort_unstable();
        assert_eq!(
            reasons,
            ["escalated to supervisor", "shutdown"],
            "run {run}: {ws:?}"
        );
        every_attempt_ends_once(&seen);
    }
}
