//! Every transition emits its span, log event and lifecycle event under
//! one name.

use std::sync::Arc;

use parking_lot::Mutex;

use tracing::field::{Field, Visit};
use tracing::span::Attributes;
use tracing::{Event, Id, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt as _};

use super::*;
use crate::LifecycleEvent;

/// What one recording emitted.
#[derive(Debug, Default)]
struct Seen {
    spans: Vec<&'static str>,
    events: Vec<String>,
    /// The span each event was emitted in.
    within: Vec<Option<&'static str>>,
}

struct Capture(Arc<Mutex<Seen>>);

struct EventName(Option<String>);

impl Visit for EventName {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "event" {
            self.0 = Some(value.to_owned());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "event" {
            self.0 = Some(format!("{value:?}").trim_matches('"').to_owned());
        }
    }
}

impl<S: Subscriber + for<'l> tracing_subscriber::registry::LookupSpan<'l>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, _: &Id, _: Context<'_, S>) {
        self.0.lock().spans.push(attrs.metadata().name());
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut name = EventName(None);
        event.record(&mut name);
        if let Some(n) = name.0 {
            let within = ctx.event_span(event).map(|s| s.name());
            let mut seen = self.0.lock();
            seen.events.push(n);
            seen.within.push(within);
        }
    }
}

fn all<'a>(
    attempt: AttemptId,
    error: &'a StreamError,
    store_error: &'a StoreError,
    diagnostics: &'a Diagnostics,
    anchor: &'a TraceAnchor,
) -> Vec<Transition<'a>> {
    let d = Duration::from_secs(1);
    let ws = Path::new("/work/repo");
    let report = ContextReport {
        tokens: 1,
        window: 2,
        percent: 50,
        self_reported: None,
    };
    let mut v: Vec<Transition<'a>> = [
        Incarnation::Spawn,
        Incarnation::Resume,
        Incarnation::FreshFallback,
    ]
    .into_iter()
    .map(|incarnation| Transition::Incarnated {
        incarnation,
        workspace: Some(ws),
        restart_count: 0,
        model: None,
        previous: Some(anchor),
        recovered: 0,
    })
    .collect();
    v.extend([
        Transition::TurnStarted {
            turn: 1,
            provider: "p",
            anchor,
            follows: None,
            recovered: true,
            previous: Some(anchor),
        },
        Transition::TurnRedelivered {
            turn: 1,
            cause: "ENODE_LOST",
            previous_trace: None,
            previous: None,
            events_delivered: 3,
            node: None,
        },
        Transition::AttemptStarted {
            attempt,
            timeout: d,
            provider: "p",
            retries: None,
        },
        Transition::AttemptQueued { attempt, pool: "p" },
        Transition::AttemptAdmitted { attempt, waited: d },
        Transition::WatchdogKill {
            watch_id: 1,
            silent_for: d,
            timeout: d,
        },
        Transition::StreamTimedOut {
            attempt,
            phase: crate::continuation::StreamPhase::Text,
            silent_for: d,
            timeout: d,
        },
        Transition::AttemptEnded {
            attempt,
            outcome: AttemptOutcome::Failed,
            error_code: Some("ESTREAM_TIMEOUT"),
        },
        Transition::RetryScheduled {
            failed: attempt,
            delay: d,
            error_code: "ESTREAM_TIMEOUT",
            retries: None,
        },
        Transition::ContinueScheduled {
            failed: attempt,
            delay: d,
            error_code: "ESTREAM_TIMEOUT",
            kept_bytes: 10,
            retries: None,
        },
        Transition::TurnCancelled { turn: 1 },
        Transition::TurnDeadline { turn: 1, after: d },
        Transition::TurnTooLarge { turn: 1, limit: 10 },
        Transition::AgentSessionId {
            session_id: "s",
            previous: None,
        },
        Transition::ContextUsage(report),
        Transition::TurnFinished {
            turn: 1,
            attempts: 1,
            error_code: None,
            usage: None,
            context: Some(report),
        },
        Transition::Reaped {
            idle_for: d,
            context_tokens: None,
            workspace: Some(ws),
        },
        Transition::SessionStopped {
            reason: "x",
            abnormal: false,
        },
        Transition::Restarted {
            restarts_in_window: 1,
            cause: "x",
        },
        Transition::GivenUp { cause: "x" },
        Transition::ResumeFailed {
            failed_id: "s",
            cause: ResumeCause::UnknownSession,
            error,
            workspace: Some(ws),
            diagnostics,
        },
        Transition::FreshFallback {
            failed_id: "s",
            redelivered: 1,
        },
        Transition::SessionFailed { reason: "x" },
        Transition::StoreFailed { error: store_error },
        Transition::WorkspaceNormalized {
            original: Path::new("/work/repo/"),
            normalized: ws,
        },
    ]);
    v
}

/// `SupervisorEscalated { .. }` → `supervisor_escalated`.
fn snake_case_of_variant(event: &LifecycleEvent) -> String {
    let debug = format!("{event:?}");
    let variant: String = debug.chars().take_while(|c| c.is_alphanumeric()).collect();
    let mut out = String::new();
    for c in variant.chars() {
        if c.is_uppercase() && !out.is_empty() {
            out.push('_');
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

#[test]
fn every_transition_emits_its_span_log_and_lifecycle_event_under_its_one_name() {
    let attempt = AttemptId {
        turn: 1,
        attempt: 1,
    };
    let error = StreamError::UnknownSession {
        session_id: "s".into(),
        message: "gone".into(),
    };
    let store_error = StoreError::Backend {
        message: "disk".into(),
    };
    let diagnostics = Diagnostics::default();
    let anchor = TraceAnchor::default();
    let key = SessionKey::new("ws");
    let bus = EventBus::new(64);
    let mut seen_names = std::collections::HashSet::new();
    for t in all(attempt, &error, &store_error, &diagnostics, &anchor) {
        let name = t.name();
        let listed = names::transition(name)
            .unwrap_or_else(|| panic!("{name} is not in names::TRANSITIONS"));
        let seen = Arc::new(Mutex::new(Seen::default()));
        let subscriber = tracing_subscriber::registry().with(Capture(seen.clone()));
        let mut rx = bus.subscribe();
        tracing::subscriber::with_default(subscriber, || {
            let parent = tracing::info_span!("parent");
            // Whatever span is current (an actor's) is not where it goes.
            let _current = tracing::info_span!("current").entered();
            t.record(At {
                key: &key,
                conversation: Some("conv"),
                parent: Parent::Span(&parent),
                bus: Some(&bus),
            });
        });
        let seen = seen.lock();
        assert_eq!(seen.spans[..2], ["parent", "current"]);
        let own = &seen.spans[2..];
        match listed.traced {
            names::Traced::Span | names::Traced::Lasting => {
                assert_eq!(own, [name], "span of {name}");
                assert_eq!(seen.within, [Some(name)], "{name} logged in its span");
            }
            _ => {
                assert!(own.is_empty(), "{name} is not a span: {seen:?}");
                assert_eq!(
                    seen.within,
                    [Some("parent")],
                    "{name} logged in the span it belongs to"
                );
            }
        }
        assert_eq!(seen.events, [name], "log event of {name}");
        match rx.try_recv() {
            Ok(event) => {
                assert!(listed.published, "{name} is listed as not published");
                assert_eq!(event.name(), name, "the lifecycle event of {name}");
                assert_eq!(snake_case_of_variant(&event), name, "{event:?}");
            }
            Err(_) => assert!(!listed.published, "{name} was not published"),
        }
        assert!(rx.try_recv().is_err(), "{name} published once");
        seen_names.insert(name);
    }
    let unrecorded: Vec<_> = names::TRANSITIONS
        .iter()
        .filter(|t| !seen_names.contains(t.name))
        .map(|t| t.name)
        .collect();
    assert!(
        unrecorded.is_empty(),
        "listed, never recorded: {unrecorded:?}"
    );
}

/// Captures the level of every log event.
struct Levels(Arc<Mutex<Vec<tracing::Level>>>);

impl<S: Subscriber> Layer<S> for Levels {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        self.0.lock().push(*event.metadata().level());
    }
}

/// A lease lost (to another node, or given up in an outage, which the node
/// warns of once) is the cluster doing its job: information, never an
/// error or a warning per session; a record that cannot be read is an
/// error.
#[test]
fn a_lost_lease_is_information_and_a_broken_record_an_error() {
    let key = SessionKey::new("ws");
    for (error, level) in [
        (
            StoreError::LeaseLost {
                key: "ws".into(),
                epoch: 3,
            },
            tracing::Level::INFO,
        ),
        (
            StoreError::Backend {
                message: "disk".into(),
            },
            tracing::Level::ERROR,
        ),
    ] {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let subscriber = tracing_subscriber::registry().with(Levels(seen.clone()));
        tracing::subscriber::with_default(subscriber, || {
            Transition::StoreFailed { error: &error }.record(At {
                key: &key,
                conversation: None,
                parent: Parent::Root,
                bus: None,
            });
        });
        assert_eq!(*seen.lock(), [level], "{error}");
    }
}
