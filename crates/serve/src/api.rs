//! The contract of `warden serve`: every request and response body, and
//! (re-exported from core, which makes them) every event a stream carries.
//!
//! The routes send and take exactly these types; the OpenAPI document at
//! `/openapi.json` is derived from them ([`schemars`]), and the Python and
//! TypeScript clients are generated from (or checked against) that
//! document. A field added here reaches every edge in one change.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

mod cluster;
mod error_type;
mod trace;

pub use crate::agent::Agent;
pub use cluster::{
    ClusterNode, ClusterView, FailoverTimings, MemberState, MoveCount, MoveKind, SessionMove,
};
pub use error_type::ErrorType;
pub use trace::{SpanLog, SpanReference, TraceSpan, TraceTag, TurnTrace};
pub use warden_core::lifecycle::wire::{Lagged, LifecycleData, LifecycleReset, ResetReason};
pub use warden_core::store::turn_event::{
    AttemptFailed, ContextFill, Delta, Done, EventTime, Failed, Queued, Restarting, Started, Timed,
    Tool, ToolState,
};

/// The body of `POST /v1/turns`. Exactly one of `workspace` (an absolute
/// directory) or `key` (a name).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct NewTurn {
    /// The session's workspace: an absolute directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
    /// The session's name (instead of a workspace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The user's message (not empty).
    pub message: String,
    /// This turn's model (the next turn may ask for another); default: the
    /// server's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The agent the session runs: a new session is started with it (one
    /// of the server's; default: the server's first); another than an
    /// existing session's is a 409.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<Agent>,
}

/// `202` to `POST /v1/turns`: the message is stored; follow the turn by its
/// id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct TurnCreated {
    /// The turn's id (`/v1/turns/{id}/events`).
    pub id: String,
    /// Its session.
    pub key: String,
}

/// The answer to `DELETE /v1/turns/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct TurnCancelled {
    /// The turn's id (`t_…`), as `POST /v1/turns` gave it.
    pub id: String,
    /// Its session.
    pub key: String,
    /// Whether it was still queued or running (false: it had ended).
    pub cancelled: bool,
}

/// Where a session runs, on a cluster node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct SessionPlacement {
    /// The node holding its lease, if any.
    pub owner: Option<String>,
    /// Where that node is reached, when known.
    pub advertise: Option<String>,
    /// The lease's epoch (how many times the session changed hands, plus
    /// one).
    pub epoch: u64,
    /// Seconds left on the lease (negative: expired that long ago); `null`
    /// when none is held.
    pub lease_remaining_secs: Option<f64>,
    /// Whether the node answering holds it.
    pub here: bool,
}

/// A session's lifecycle status, as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SessionState {
    /// Created, no turn run yet.
    New,
    /// Running (or its process died without stopping it).
    Active,
    /// Not running; the next message resumes it.
    Idle,
    /// Given up (see `failure`); reset it to use it again.
    Failed,
    /// A status this server does not know (written by a newer warden).
    Unknown,
}

impl SessionState {
    /// Its wire name (`new`, `active`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::New => "new",
            Self::Active => "active",
            Self::Idle => "idle",
            Self::Failed => "failed",
            Self::Unknown => "unknown",
        }
    }
}

/// What a running session's turn is doing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct RunningTurn {
    /// The turn's number (its message's id in the session).
    pub id: Option<u64>,
    /// The turn's id (for `/v1/turns/{id}/events`) while this node relays
    /// it.
    pub turn_id: Option<String>,
    /// The attempt streaming now.
    pub streaming_attempt: Option<u32>,
    /// Waiting out a backoff before its next attempt.
    pub backing_off: bool,
    /// Waiting for a stream slot.
    pub waiting_for_admission: bool,
    /// How long it has run, in milliseconds.
    pub running_ms: Option<u64>,
}

/// A session's record and, while it runs, what it is doing. Fields of the
/// record are absent for a session running but not stored yet.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct SessionDetail {
    /// Whether it runs on this node now.
    pub running: bool,
    /// Its workspace directory, for a workspace session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
    /// The agent it runs (kept from its first turn).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<Agent>,
    /// The agent's conversation id it resumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation: Option<String>,
    /// The model of its last turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Its stored status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<SessionState>,
    /// Why it was given up (`status` `failed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// Messages accepted and not answered yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<u64>,
    /// How many times it was restarted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restarts: Option<u32>,
    /// How full its context window is, once any usage is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<ContextFill>,
    /// When it was last active, Unix milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_active_ms: Option<u64>,
    /// While it runs: its turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<RunningTurn>,
    /// While it runs: messages waiting behind its turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued: Option<u64>,
    /// While it runs: turns it finished in this incarnation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turns_finished: Option<u64>,
    /// While it runs with tracing on: the trace of its incarnation's anchor
    /// (each of its turns is a trace of its own, linked to it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
}

/// `GET /v1/sessions/{key}`: one session.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct Session {
    /// Its key.
    pub key: String,
    /// Its record and state.
    #[serde(flatten)]
    pub detail: SessionDetail,
}

/// A session in `GET /v1/sessions`: its key; on a cluster node where it
/// runs; with `?detail=full` its record and state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct SessionSummary {
    /// Its key.
    pub key: String,
    /// Where it runs (cluster nodes).
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<SessionPlacement>,
    /// Its record and state (`?detail=full`).
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<SessionDetail>,
}

/// `GET /v1/sessions`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct SessionList {
    /// The sessions, by key.
    pub sessions: Vec<SessionSummary>,
}

/// How a turn kept by the server stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TurnOutcome {
    /// Answered (`text`).
    Done,
    /// Failed (`code`, `message`, `exit`).
    Error,
    /// Streaming.
    Running,
    /// Accepted, no event yet.
    Pending,
    /// Its log ended without a last event: it moved to another node, or
    /// stopped here with its message still pending (it is re-delivered).
    Moved,
}

/// A turn in `GET /v1/sessions/{key}/turns`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct TurnSummary {
    /// The turn's id.
    pub id: String,
    /// The id of the message it answers.
    pub message_id: u64,
    /// How it stands.
    pub outcome: TurnOutcome,
    /// `done`: the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// `done`: attempts used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u64>,
    /// `error`: its code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// `error`: what happened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// `error`: its exit-code class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<i32>,
    /// When its last event was made (`done`, `error`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<EventTime>,
    /// When it was accepted (its log opened).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<EventTime>,
    /// Its message's first 2,048 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// The model it asked for, if it named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The trace it ran in (its own, rooted at its `turn_started`; after a
    /// re-delivery, the latest), with tracing on:
    /// `{jaeger_url}/trace/{trace_id}`. Before it starts, its session
    /// incarnation's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    /// Every trace it ran in, oldest first, while the node running it
    /// keeps it: one, or two when it started again in a fresh session
    /// after a resume failure (the first holds its failed start);
    /// `trace_id` is the last. Left out before it starts and for a turn
    /// read from the store (its `trace_id` then names where it was
    /// accepted or ran). A turn re-delivered after a crash runs in one new
    /// trace, whose `turn_redelivered` span links to where it was accepted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trace_ids: Vec<String>,
}

/// `GET /v1/turns/{id}`: one turn, as kept.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct Turn {
    /// Its session.
    pub key: String,
    /// Its id, state, answer and traces.
    #[serde(flatten)]
    pub turn: TurnSummary,
}

/// `GET /v1/sessions/{key}/turns`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct TurnList {
    /// The session's key, as the path gave it.
    pub key: String,
    /// Its turns still kept, newest first.
    pub turns: Vec<TurnSummary>,
}

/// How `POST /v1/sessions/{key}/recover` unsticks a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RecoverHow {
    /// Stop the running attempt as failed so it is retried (the
    /// conversation kept).
    Retry,
    /// Restart the session without its stored conversation (the user is
    /// told).
    Fresh,
}

/// The answer to `POST /v1/sessions/{key}/recover`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct SessionRecovered {
    /// The session's key, as the path gave it.
    pub key: String,
    /// The way asked for: the running attempt retried, or the session
    /// restarted fresh.
    pub how: RecoverHow,
    /// False: nothing was stuck (no turn running, or one waiting for
    /// admission or its stream).
    pub recovered: bool,
}

/// The answer to `POST /v1/sessions/{key}/reset`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct SessionReset {
    /// The session's key, as the path gave it.
    pub key: String,
    /// Always true.
    pub reset: bool,
}

/// `GET /v1/server`: what a client needs to know of this server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct ServerInfo {
    /// warden's version.
    pub version: String,
    /// The agent a new session runs unless its first turn names another.
    pub agent: Option<Agent>,
    /// Every agent its sessions may run, the default first.
    pub agents: Vec<Agent>,
    /// The watchdog's default silence allowance per stream, in
    /// milliseconds.
    pub stream_timeout_ms: u64,
    /// Whether it is a cluster node.
    pub cluster: bool,
    /// Its node id, on a cluster.
    pub node: Option<String>,
    /// Where traces are looked at (`--jaeger-url`):
    /// `{jaeger_url}/trace/{trace_id}`.
    pub jaeger_url: Option<String>,
    /// The file holding the bearer token the server checks (its path on
    /// the server's machine).
    pub token_file: Option<String>,
}

/// An error answer: `{"error": {...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct Error {
    /// What went wrong.
    pub error: ErrorBody,
}

impl Error {
    /// An error of type `kind` saying `message`, with no other field: for
    /// the answers made before any routing (`warden serve`'s `503
    /// too_many_connections` and `408 request_timeout`).
    #[must_use]
    pub fn new(kind: ErrorType, message: impl Into<String>) -> Self {
        Self {
            error: ErrorBody {
                kind: kind.as_str().to_owned(),
                message: message.into(),
                ..ErrorBody::default()
            },
        }
    }

    /// Its JSON text.
    #[must_use]
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// What went wrong: `type` names it (docs/serve.md's catalogue); some types
/// add fields.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct ErrorBody {
    /// The error's type: one of [`ErrorType`] (`invalid_request`,
    /// `session_elsewhere`, …), kept a string so a client reads a type a
    /// newer server adds.
    #[serde(rename = "type")]
    pub kind: String,
    /// What happened and what to do, for a human.
    pub message: String,
    /// `turn_recovering`, `idempotency_key_reused`: the turn named.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `too_many_sessions`: the live-session bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    /// `session_elsewhere`, `workspace_unavailable`: the node running the
    /// session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// `session_elsewhere`: where that node is reached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advertise: Option<String>,
    /// `agent_mismatch`: the agent the session runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<Agent>,
    /// `agent_mismatch`: the agent the request asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested: Option<Agent>,
    /// `workspace_unavailable`: the directory missing on this node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
}
