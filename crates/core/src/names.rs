//! One name per transition, the one list every edge takes it from.
//!
//! Each thing that happens to a session has exactly one name, written in
//! `snake_case` as a fact (`stream_timed_out`). The same string is:
//!
//! - its **span**'s name in a trace, or, for a transition recorded onto
//!   another span, the `event` field of its log event (every transition also
//!   logs an event with `event = <name>` inside its span);
//! - [`LifecycleEvent::name`](crate::LifecycleEvent::name), so the `event:`
//!   of `warden serve`'s `GET /v1/events` and of a `--json` line of the demo,
//!   and the key of its schema in the API document;
//! - the `transition` label of `warden_transitions_total` on `/metrics`;
//! - its row in the table of `docs/runtime-semantics.md` ("Transitions").
//!
//! A name is the snake case of its [`LifecycleEvent`](crate::LifecycleEvent)
//! variant where it has one. Each transition is declared once, a row of one
//! table here (`table!`): its name, how it shows in a trace, its variant of
//! the recorded transition and, when published, of
//! [`LifecycleEvent`](crate::LifecycleEvent) and
//! [`LifecycleData`](crate::lifecycle::wire::LifecycleData). The constants
//! below, [`TRANSITIONS`], each event's name and session, the wire's list of
//! events (their schemas, in this order, in the API document) and which of
//! them are a turn's come from that row. Tests check each view against
//! [`TRANSITIONS`], the docs table included.

/// How a transition shows in a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Traced {
    /// A span of its own that ends at once: a point in time, with its
    /// fields as attributes.
    Span,
    /// A span of its own that stays open while what it began lasts (a turn,
    /// an attempt, a wait for admission).
    Lasting,
    /// A log event recorded onto an open span (no span of its own).
    Event,
}

impl Traced {
    /// The word the docs table uses: `span`, `lasting span` or `event`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Span => "span",
            Self::Lasting => "lasting span",
            Self::Event => "event",
        }
    }
}

/// One transition: its name and where it shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Transition {
    /// The name, as every edge writes it.
    pub name: &'static str,
    /// How it shows in a trace.
    pub traced: Traced,
    /// Whether it is a [`LifecycleEvent`](crate::LifecycleEvent): on the
    /// bus, on `GET /v1/events`, and counted by `warden_transitions_total`.
    pub published: bool,
    /// What happened, in a sentence.
    pub meaning: &'static str,
}

/// The one declaration of every transition, in the order of the API
/// document's lifecycle events (a session's transitions, then a turn's),
/// each unpublished one beside its kin. It hands its rows to `$callback`, a
/// `macro_rules!` of the module that derives something from them (this one's
/// constants and [`TRANSITIONS`]; `Transition::name`; `LifecycleEvent::name`
/// and `key`; `LifecycleData`, its schemas and its turn accessors). A row:
///
/// ```text
/// /// What happened, in a sentence (the docs row's last column).
/// CONST = "name", Traced, TransitionVariant [=> LifecycleVariant [before_session]];
/// ```
///
/// `=> LifecycleVariant` publishes it: a `LifecycleEvent` variant and a wire
/// type (`lifecycle::wire`), both of that name, on the bus, on
/// `GET /v1/events`, in the API document and counted on `/metrics`;
/// `before_session` marks the one that comes before there is a session
/// (no `key`). Whether an event belongs to a turn (`turn`, `turn_id`) is said
/// by its wire type's declaration (`of_turn` in `lifecycle/wire.rs`).
///
/// Places a new published transition needs: 16 before this table (the
/// name's row, the `Transition` variant and its `name` arm, its span, log
/// and lifecycle arms, the `LifecycleEvent` variant and its `name` and `key`
/// arms, the wire type, its `LifecycleData` variant, its schema entry, its
/// `set_turn_id` and `turn` arms, its `to_wire` arm, the docs row), 9 now:
/// this row, and what cannot come from a table because the fields differ on
/// purpose (the borrowed `Transition` variant, its span, log and lifecycle
/// arms; the owned `LifecycleEvent` variant; the wire type in milliseconds
/// and strings; its `to_wire` arm), and the docs row, which
/// `one_name_per_transition.rs` writes (`WARDEN_BLESS=1`) or prints to paste. A missing piece fails to
/// compile (every derived `match` is exhaustive) or fails a test: the
/// transition tests record every variant, the lifecycle view's tests convert
/// every published event.
macro_rules! table {
    ($callback:ident) => {
        $callback! {
            /// A session incarnation started: a first spawn, a resume of its stored conversation, or a fresh start after a resume failure (`warden.incarnation`); the anchor its turns link to and its session-level spans hang from.
            SESSION_SPAWNED = "session_spawned", Span, Incarnated => SessionSpawned;
            /// A session actor stopped, with its reason.
            SESSION_STOPPED = "session_stopped", Span, SessionStopped => SessionStopped;
            /// The supervisor restarted a crashed session.
            SESSION_RESTARTED = "session_restarted", Span, Restarted => SessionRestarted;
            /// The supervisor gave a session up: restart intensity exceeded.
            SUPERVISOR_ESCALATED = "supervisor_escalated", Span, GivenUp => SupervisorEscalated;
            /// The agent announced (or changed) its conversation id; stored durably.
            AGENT_SESSION_ID = "agent_session_id", Event, AgentSessionId => AgentSessionId;
            /// A stored conversation could not be resumed.
            RESUME_FAILED = "resume_failed", Span, ResumeFailed => ResumeFailed;
            /// The session restarted without its conversation, its unanswered messages re-delivered and the user told.
            FRESH_FALLBACK = "fresh_fallback", Span, FreshFallback => FreshFallback;
            /// A session failed for good (a root span).
            SESSION_FAILED = "session_failed", Span, SessionFailed => SessionFailed;
            /// An idle session was stopped (its record kept).
            SESSION_REAPED = "session_reaped", Span, Reaped => SessionReaped;
            /// Context in use at the end of a turn.
            CONTEXT_USAGE = "context_usage", Event, ContextUsage => ContextUsage;
            /// A workspace path was normalized to another spelling (a root span).
            WORKSPACE_NORMALIZED = "workspace_normalized", Span, WorkspaceNormalized => WorkspaceNormalized before_session;
            /// A session's record could not be read or written (under the incarnation's anchor when known, else a root).
            STORE_FAILED = "store_failed", Span, StoreFailed => StoreFailed;
            /// A turn began; its span, the root of a trace of its own linked to its incarnation's anchor and to the turn before it, lasts until the turn ends.
            TURN_STARTED = "turn_started", Lasting, TurnStarted => TurnStarted;
            /// A turn re-delivered after its session stopped without answering it (a crash, a node lost or drained, a database outage): a span under the root of its new trace saying what happened before — the cause (`warden.cause`, e.g. `ENODE_LOST`), the trace it was accepted in (`warden.previous_trace`, linked: the earlier incarnation's anchor), the events its clients already had (`warden.events_delivered`).
            TURN_REDELIVERED = "turn_redelivered", Span, TurnRedelivered;
            /// An attempt waits for admission (a concurrency limit or a shared backoff); its span lasts until it is admitted.
            ATTEMPT_QUEUED = "attempt_queued", Lasting, AttemptQueued => AttemptQueued;
            /// A queued attempt was admitted, after waiting `warden.wait_ms`.
            ATTEMPT_ADMITTED = "attempt_admitted", Event, AttemptAdmitted => AttemptAdmitted;
            /// An attempt's stream started; its span lasts until the stream ends.
            ATTEMPT_STARTED = "attempt_started", Lasting, AttemptStarted => AttemptStarted;
            /// The watchdog killed a silent stream (the stream's own view).
            WATCHDOG_KILLED = "watchdog_killed", Span, WatchdogKill;
            /// The session learned its attempt was killed for silence.
            STREAM_TIMED_OUT = "stream_timed_out", Span, StreamTimedOut => StreamTimedOut;
            /// A failed attempt will be retried from scratch, after a backoff.
            RETRY_SCHEDULED = "retry_scheduled", Span, RetryScheduled => RetryScheduled;
            /// A reply broken mid-text will be continued, not replayed.
            CONTINUE_SCHEDULED = "continue_scheduled", Span, ContinueScheduled => ContinueScheduled;
            /// An attempt's stream ended: completed, failed (with its code) or cancelled (by a cancel, a recover, the turn's caps or the session stopping); one per `attempt_started`.
            ATTEMPT_ENDED = "attempt_ended", Event, AttemptEnded => AttemptEnded;
            /// The user cancelled the turn.
            TURN_CANCELLED = "turn_cancelled", Span, TurnCancelled;
            /// The turn ran past its wall-clock cap and was stopped.
            TURN_DEADLINE_EXCEEDED = "turn_deadline_exceeded", Span, TurnDeadline;
            /// The turn's reply passed its size cap and was stopped.
            REPLY_TOO_LARGE = "reply_too_large", Span, TurnTooLarge;
            /// A turn ended, answered or not (recorded onto its turn's span).
            TURN_FINISHED = "turn_finished", Event, TurnFinished => TurnFinished;
        }
    };
}
pub(crate) use table;

/// `true` for a published row (one with a lifecycle event).
macro_rules! published {
    () => {
        false
    };
    ($event:ident) => {
        true
    };
}

/// Declares each name's constant and the list.
macro_rules! transitions {
    ($(
        #[doc = $doc:literal]
        $konst:ident = $name:literal, $traced:ident, $transition:ident
        $(=> $event:ident $($before_session:ident)?)?;
    )*) => {
        $(
            #[doc = $doc]
            pub const $konst: &str = $name;
        )*
        /// Every transition: a session's, then a turn's, in the order of the
        /// API document's lifecycle events.
        pub const TRANSITIONS: &[Transition] = &[$(Transition {
            name: $konst,
            traced: Traced::$traced,
            published: published!($($event)?),
            meaning: $doc,
        }),*];
    };
}

table!(transitions);

/// The transition named `name`, if there is one.
pub fn transition(name: &str) -> Option<&'static Transition> {
    TRANSITIONS.iter().find(|t| t.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_snake_case_facts() {
        let mut seen = std::collections::HashSet::new();
        for t in TRANSITIONS {
            assert!(seen.insert(t.name), "{} twice", t.name);
            assert!(
                t.name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{} is not snake case",
                t.name
            );
            assert!(!t.meaning.trim().is_empty(), "{} has no meaning", t.name);
        }
        assert_eq!(
            transition("stream_timed_out").map(|t| t.name),
            Some(STREAM_TIMED_OUT)
        );
        assert_eq!(transition("stream.timeout"), None);
    }
}
