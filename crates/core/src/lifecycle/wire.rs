//! A lifecycle event as clients receive it: one type per event, each the
//! `data` of an SSE event named [`LifecycleEvent::name`] on `warden
//! serve`'s `GET /v1/events` (and a `--json` line of the demo). Durations
//! are whole milliseconds in `…_ms` fields, an attempt is `turn` +
//! `attempt` (`failed_attempt` for the one that failed), an error code is
//! `code`, a conversation id `conversation`. No prompt or reply text.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{AttemptOutcome, LifecycleEvent};
use crate::names;
use crate::store::turn_event::Timed;

mod convert;

/// The turn an event is about, for the events of a turn (`of_turn` in
/// `events!`).
trait OfTurn {
    /// Its turn's number.
    fn turn(&self) -> Option<u64>;
    /// Where its turn's id goes.
    fn turn_id_mut(&mut self) -> Option<&mut Option<String>>;
}

/// Declares the wire struct of each event, with `key` first; one marked
/// `of_turn` is an event of a turn: `turn_id` (the server's id of the turn,
/// set by `LifecycleData::set_turn_id`) comes next, and it declares its
/// `turn` itself.
macro_rules! events {
    () => {};
    (
        $(#[$doc:meta])*
        $name:ident of_turn { $( $(#[$fdoc:meta])* $field:ident : $ty:ty ),* $(,)? }
        $($rest:tt)*
    ) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
        #[non_exhaustive]
        pub struct $name {
            /// The session's key.
            pub key: String,
            /// The turn's id on a `warden serve` server, once it knows it.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub turn_id: Option<String>,
            $( $(#[$fdoc])* pub $field: $ty, )*
        }

        impl OfTurn for $name {
            fn turn(&self) -> Option<u64> {
                Some(self.turn)
            }

            fn turn_id_mut(&mut self) -> Option<&mut Option<String>> {
                Some(&mut self.turn_id)
            }
        }

        events! { $($rest)* }
    };
    (
        $(#[$doc:meta])*
        $name:ident { $( $(#[$fdoc:meta])* $field:ident : $ty:ty ),* $(,)? }
        $($rest:tt)*
    ) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
        #[non_exhaustive]
        pub struct $name {
            /// The session's key.
            pub key: String,
            $( $(#[$fdoc])* pub $field: $ty, )*
        }

        impl OfTurn for $name {
            fn turn(&self) -> Option<u64> {
                None
            }

            fn turn_id_mut(&mut self) -> Option<&mut Option<String>> {
                None
            }
        }

        events! { $($rest)* }
    };
}

events! {
    /// `session_spawned`: a session actor started.
    SessionSpawned {}
    /// `session_stopped`: a session actor stopped.
    SessionStopped {
        /// Why, when known.
        reason: Option<String>,
        /// Whether it crashed (panic or error) rather than stopped.
        abnormal: bool,
    }
    /// `session_restarted`: the supervisor restarted it after a failure.
    SessionRestarted {
        /// Restarts inside the current intensity window.
        restarts_in_window: u32,
        /// The failure that caused it.
        cause: String,
    }
    /// `supervisor_escalated`: restart intensity exceeded; the supervisor
    /// gave the session up.
    SupervisorEscalated {
        /// The original failure.
        cause: String,
    }
    /// `agent_session_id`: the agent announced (or changed) its
    /// conversation id.
    AgentSessionId {
        /// The conversation id.
        conversation: String,
    }
    /// `resume_failed`: the stored conversation could not be resumed.
    ResumeFailed {
        /// The conversation that failed.
        conversation: String,
        /// Why (`context_overflow`, `conversation_not_found`, …).
        cause: String,
    }
    /// `fresh_fallback`: the session restarted without it, its messages
    /// re-delivered.
    FreshFallback {
        /// The conversation left behind.
        conversation: String,
        /// Messages re-delivered to the fresh session.
        redelivered: u64,
    }
    /// `session_failed`: the session is given up for good (reset it).
    SessionFailed {
        /// Why.
        reason: String,
    }
    /// `session_reaped`: stopped for idleness (the next message resumes it).
    SessionReaped {
        /// How long it was idle, in milliseconds.
        idle_ms: u64,
        /// Its context size then.
        context_tokens: Option<u64>,
    }
    /// `context_usage`: how full its context window is.
    ContextUsage {
        /// Tokens in context.
        tokens: u64,
        /// The model's context window, in tokens.
        window: u64,
        /// Percent, rounded (over 100 past the window).
        percent: u32,
        /// The agent's own estimate, when the self-report track is on.
        self_reported: Option<u32>,
    }
    /// `store_failed`: its record could not be written.
    StoreFailed {
        /// The store's error.
        error: String,
    }
    /// `turn_started`: a turn began.
    TurnStarted of_turn {
        /// The turn's number in the session.
        turn: u64,
    }
    /// `attempt_queued`: an attempt waits for a stream slot.
    AttemptQueued of_turn {
        /// Which turn of the session (its message's number, from 1).
        turn: u64,
        /// Which attempt of the turn (1 first; a retry or a continuation counts).
        attempt: u32,
        /// The pool it waits in.
        pool: String,
    }
    /// `attempt_admitted`: it got its slot.
    AttemptAdmitted of_turn {
        /// Which turn of the session (its message's number, from 1).
        turn: u64,
        /// Which attempt of the turn (1 first; a retry or a continuation counts).
        attempt: u32,
        /// How long it waited, in milliseconds.
        waited_ms: u64,
    }
    /// `attempt_started`: an attempt began streaming.
    AttemptStarted of_turn {
        /// Which turn of the session (its message's number, from 1).
        turn: u64,
        /// Which attempt of the turn (1 first; a retry or a continuation counts).
        attempt: u32,
        /// The watchdog's silence allowance for it, in milliseconds.
        timeout_ms: u64,
    }
    /// `stream_timed_out`: the watchdog killed a silent stream.
    StreamTimedOut of_turn {
        /// Which turn of the session (its message's number, from 1).
        turn: u64,
        /// Which attempt of the turn (1 first; a retry or a continuation counts).
        attempt: u32,
        /// How long it had been silent, in milliseconds.
        silent_ms: u64,
    }
    /// `retry_scheduled`: a failed attempt is retried from the start.
    RetryScheduled of_turn {
        /// Which turn of the session (its message's number, from 1).
        turn: u64,
        /// The attempt that failed.
        failed_attempt: u32,
        /// The backoff, in milliseconds.
        delay_ms: u64,
        /// Why it failed.
        code: String,
    }
    /// `continue_scheduled`: a broken reply is continued by the next attempt.
    ContinueScheduled of_turn {
        /// Which turn of the session (its message's number, from 1).
        turn: u64,
        /// The attempt that broke.
        failed_attempt: u32,
        /// The backoff, in milliseconds.
        delay_ms: u64,
        /// Why it broke.
        code: String,
        /// Bytes of reply kept.
        kept_bytes: u64,
    }
    /// `attempt_ended`: an attempt's stream ended (one per
    /// `attempt_started`).
    AttemptEnded of_turn {
        /// Which turn of the session (its message's number, from 1).
        turn: u64,
        /// Which attempt of the turn (1 first; a retry or a continuation counts).
        attempt: u32,
        /// How it ended.
        outcome: AttemptOutcome,
        /// The error's code when it failed.
        code: Option<String>,
    }
    /// `turn_finished`: a turn ended (`code` set when it failed).
    TurnFinished of_turn {
        /// Which turn of the session (its message's number, from 1).
        turn: u64,
        /// Attempts used.
        attempts: u32,
        /// The error code when it failed.
        code: Option<String>,
    }
}

/// `workspace_normalized`: a workspace path was normalized (before there
/// is a session).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct WorkspaceNormalized {
    /// The path as given.
    pub original: String,
    /// The path its session is keyed by.
    pub normalized: String,
}

impl OfTurn for WorkspaceNormalized {
    fn turn(&self) -> Option<u64> {
        None
    }

    fn turn_id_mut(&mut self) -> Option<&mut Option<String>> {
        None
    }
}

/// `reset` (first on a `/v1/events` stream that cannot replay from the
/// client's `Last-Event-ID`): refetch what you show.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct LifecycleReset {
    /// Why.
    pub reason: ResetReason,
}

impl LifecycleReset {
    /// A reset because of `reason`.
    pub fn new(reason: ResetReason) -> Self {
        Self { reason }
    }
}

/// Why a `/v1/events` reader was reset: the one list of reasons, on the
/// wire and in the API document.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ResetReason {
    /// It missed more events than the server keeps.
    Missed,
    /// Its `Last-Event-ID` is from an earlier run of the server.
    Restarted,
}

/// `lagged`: the server's event window fell behind the bus; events were
/// lost.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct Lagged {
    /// How many.
    pub missed: u64,
}

impl Lagged {
    /// `missed` events were lost.
    pub fn new(missed: u64) -> Self {
        Self { missed }
    }
}

/// `LifecycleData` (a variant per published row, of the wire type of its
/// name), its schemas and its turn accessors, from the one table
/// (`names::table!`).
macro_rules! lifecycle_data {
    ($(
        #[doc = $doc:literal]
        $konst:ident = $name:literal, $traced:ident, $transition:ident
        $(=> $event:ident $($before_session:ident)?)?;
    )*) => {
        /// One lifecycle event's fields, by type.
        #[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
        #[serde(untagged)]
        #[non_exhaustive]
        #[allow(missing_docs)] // each variant is its type, documented there
        pub enum LifecycleData {
            $($($event($event),)?)*
        }

        impl LifecycleData {
            /// The schema of each event's fields, by its name, the
            /// definitions added to `generator`: for an API document.
            pub fn schemas(
                generator: &mut schemars::SchemaGenerator,
            ) -> Vec<(&'static str, schemars::Schema)> {
                vec![$($((names::$konst, generator.subschema_for::<Timed<$event>>()),)?)*]
            }

            /// Sets the turn's id (`warden serve`'s) on the events of a turn.
            pub fn set_turn_id(&mut self, id: String) {
                let slot = match self {
                    $($(Self::$event(e) => e.turn_id_mut(),)?)*
                };
                if let Some(slot) = slot {
                    *slot = Some(id);
                }
            }

            /// The turn it is about, for the events of a turn.
            pub fn turn(&self) -> Option<u64> {
                match self {
                    $($(Self::$event(e) => e.turn(),)?)*
                }
            }

            /// Its event's name (the transition's one name).
            #[cfg(test)]
            pub(crate) fn name(&self) -> &'static str {
                match self {
                    $($(Self::$event(_) => names::$konst,)?)*
                }
            }
        }
    };
}

names::table!(lifecycle_data);
