//! Typed errors, one enum per boundary.
//!
//! Every variant says whether it is **retryable** (the session retries the
//! turn from scratch under its [`RetryPolicy`](crate::RetryPolicy)) or
//! **fatal** (the turn ends with that error).

use std::time::Duration;

/// Why one streaming attempt failed.
///
/// Produced by [`EventSource`](crate::EventSource) implementations and by the
/// [`StreamTask`](crate::stream::StreamTask) itself (for the watchdog's kill).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum StreamError {
    /// The stream was silent for longer than its timeout and the watchdog
    /// killed it. **Retryable.** Code `ESTREAM_TIMEOUT`.
    #[error(
        "Connection lost during streaming: no data for {:.1}s (timeout {:.1}s)",
        silent_for.as_secs_f64(),
        timeout.as_secs_f64()
    )]
    InactivityTimeout {
        /// How long the stream had been silent when it was killed.
        silent_for: Duration,
        /// The silence allowance that was exceeded.
        timeout: Duration,
    },
    /// The stream stayed alive (keep-alives, pings) but delivered no
    /// content (text, thinking, tool input) for its progress allowance
    /// ([`StreamOptions::progress_timeout`](crate::StreamOptions)).
    /// **Retryable.**
    #[error(
        "stream made no progress for {:.1}s (allowance {:.1}s); only keep-alives arrived",
        idle_for.as_secs_f64(),
        allowance.as_secs_f64()
    )]
    NoProgress {
        /// How long no content had arrived when it was killed.
        idle_for: Duration,
        /// The progress allowance that was exceeded.
        allowance: Duration,
    },
    /// Connecting failed or the connection broke (reset, refused, DNS).
    /// **Retryable.**
    #[error("connection error: {message}")]
    Connection {
        /// What the transport reported.
        message: String,
    },
    /// The stream ended before its terminal frame (`message_stop`,
    /// `[DONE]`, a `result` line). **Retryable.**
    #[error("stream ended before it was complete: {message}")]
    Truncated {
        /// What was missing.
        message: String,
    },
    /// The server answered with an HTTP error status or a mid-stream error
    /// event. Retryable when `retryable` is set (408, 409, 429, 5xx,
    /// `overloaded_error`, or what `x-should-retry` says); fatal otherwise.
    #[error("API error{}: {kind}: {message}", status.map(|s| format!(" (HTTP {s})")).unwrap_or_default())]
    Api {
        /// HTTP status, when there was one.
        status: Option<u16>,
        /// Provider error type, e.g. `overloaded_error`.
        kind: String,
        /// Provider message.
        message: String,
        /// Whether a retry may succeed.
        retryable: bool,
        /// Server-requested wait before retrying, already capped.
        retry_after: Option<Duration>,
    },
    /// The conversation no longer fits or cannot be resumed (prompt too
    /// long, blocking limit, unknown session id). **Fatal for the turn**; it
    /// feeds the supervisor's resume-failure path instead of a retry.
    #[error("context cannot be resumed ({reason}): {message}")]
    ContextOverflow {
        /// Machine-readable cause.
        reason: ResumeCause,
        /// What the agent said.
        message: String,
    },
    /// The agent has no conversation with the id it was asked to resume
    /// ("No conversation found with session ID"). **Fatal for the turn**; it
    /// feeds the supervisor's resume-failure path.
    #[error("no conversation found with session ID {session_id}: {message}")]
    UnknownSession {
        /// The id that was not found.
        session_id: String,
        /// What the agent said.
        message: String,
    },
    /// A frame was larger than the configured limit. **Fatal.**
    #[error("frame of {size} bytes exceeds the limit of {limit} bytes")]
    FrameTooLarge {
        /// Bytes seen before giving up.
        size: usize,
        /// The configured limit.
        limit: usize,
    },
    /// A frame could not be parsed. **Fatal** (retrying would replay the
    /// same bytes).
    #[error("malformed frame: {message}")]
    Malformed {
        /// Parser message; never the frame text itself.
        message: String,
    },
    /// Authentication or permission failure. **Fatal.**
    #[error("not authorized: {message}")]
    Unauthorized {
        /// Provider message.
        message: String,
    },
    /// A continuation could not be stitched onto the text the consumer has
    /// (the model started over, or the provider refused every way to
    /// continue): the turn restarts from scratch, and the consumer is told
    /// to discard. Retryable.
    #[error("continuation failed: {message}")]
    ContinuationFailed {
        /// Why.
        message: String,
    },
    /// The attempt was stopped on purpose to run the turn again
    /// ([`Supervisor::recover`](crate::Supervisor::recover) with
    /// [`Unstick::Retry`](crate::Unstick)): a stream that stays alive but
    /// never finishes. Retryable.
    #[error("stream interrupted: {reason}")]
    Interrupted {
        /// Who stopped it, and why.
        reason: String,
    },
    /// A layer under the session (the wire layer under an agent CLI)
    /// already made the retry policy's attempts for this attempt's request
    /// and gave up on `last`: those attempts are the turn's, so the session
    /// does not run the turn again (**not retryable**: the turn fails at
    /// once, [`TurnError::Fatal`]) — else the layers' retries would
    /// multiply (the wire's, the CLI's own and the session's). Everything a
    /// client reads of it is `last`'s: its [`code`](Self::code), its
    /// [`retry_after`](Self::retry_after) and its exit class (an outage:
    /// `5`, the turn worth sending again later).
    #[error(
        "{last} (a layer under the session made {attempts} attempt(s) and gave up; the turn is not run again)"
    )]
    RetriedBelow {
        /// The attempts the layer below made, the first included.
        attempts: u32,
        /// The error it gave up on.
        last: Box<StreamError>,
    },
    /// The stream's actor or reader task died unexpectedly (a bug in a
    /// source). **Fatal.**
    #[error("stream task failed: {message}")]
    Internal {
        /// What failed.
        message: String,
    },
}

impl StreamError {
    /// A stable, greppable code for this error (`ESTREAM_TIMEOUT`, ...).
    pub fn code(&self) -> &'static str {
        match self {
            Self::InactivityTimeout { .. } => "ESTREAM_TIMEOUT",
            Self::NoProgress { .. } => "ESTREAM_NO_PROGRESS",
            Self::Connection { .. } => "ECONNECTION",
            Self::Truncated { .. } => "ESTREAM_TRUNCATED",
            Self::Api { .. } => "EAPI",
            Self::ContextOverflow { .. } => "ECONTEXT_OVERFLOW",
            Self::UnknownSession { .. } => "EUNKNOWN_SESSION",
            Self::FrameTooLarge { .. } => "EFRAME_TOO_LARGE",
            Self::Malformed { .. } => "EMALFORMED",
            Self::Unauthorized { .. } => "EUNAUTHORIZED",
            Self::Interrupted { .. } => "ESTREAM_INTERRUPTED",
            Self::ContinuationFailed { .. } => "ECONTINUATION_FAILED",
            Self::Internal { .. } => "EINTERNAL",
            Self::RetriedBelow { last, .. } => last.code(),
        }
    }

    /// Whether retrying the turn from scratch may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::InactivityTimeout { .. }
            | Self::NoProgress { .. }
            | Self::Connection { .. }
            | Self::Truncated { .. }
            | Self::Interrupted { .. }
            | Self::ContinuationFailed { .. } => true,
            Self::Api { retryable, .. } => *retryable,
            Self::ContextOverflow { .. }
            | Self::UnknownSession { .. }
            | Self::FrameTooLarge { .. }
            | Self::Malformed { .. }
            | Self::Unauthorized { .. }
            | Self::RetriedBelow { .. }
            | Self::Internal { .. } => false,
        }
    }

    /// When this error means a stored conversation cannot be resumed, its
    /// cause: such errors go to the supervisor's resume-failure path
    /// instead of a retry.
    pub fn resume_failure_cause(&self) -> Option<ResumeCause> {
        match self {
            Self::ContextOverflow { reason, .. } => Some(*reason),
            Self::UnknownSession { .. } => Some(ResumeCause::UnknownSession),
            _ => None,
        }
    }

    /// The wait the server asked for before a retry, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Api { retry_after, .. } => *retry_after,
            Self::RetriedBelow { last, .. } => last.retry_after(),
            _ => None,
        }
    }
}

/// Why a stored conversation cannot be resumed.
///
/// Carried by [`StreamError::ContextOverflow`] and returned by
/// [`StreamError::resume_failure_cause`]; the supervisor starts such a
/// session fresh instead of retrying it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ResumeCause {
    /// The conversation no longer fits the context window ("Prompt is too
    /// long", HTTP 400 `prompt is too long`, `context_length_exceeded`).
    PromptTooLong,
    /// The agent refused to go on at its blocking context limit (Claude
    /// Code's `terminal_reason: blocking_limit`).
    BlockingLimit,
    /// The agent has no conversation with the stored id ("No conversation
    /// found with session ID").
    UnknownSession,
    /// An operator (or your code) dropped the conversation to unstick the
    /// session ([`Unstick::Fresh`](crate::Unstick)).
    OperatorReset,
}

impl ResumeCause {
    /// The stable machine name: `prompt_too_long`, `blocking_limit`,
    /// `unknown_session`, `operator_reset`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PromptTooLong => "prompt_too_long",
            Self::BlockingLimit => "blocking_limit",
            Self::UnknownSession => "unknown_session",
            Self::OperatorReset => "operator_reset",
        }
    }

    /// The cause named `name` ([`as_str`](Self::as_str) backwards), e.g.
    /// an agent's `terminal_reason`.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "prompt_too_long" => Some(Self::PromptTooLong),
            "blocking_limit" => Some(Self::BlockingLimit),
            "unknown_session" => Some(Self::UnknownSession),
            "operator_reset" => Some(Self::OperatorReset),
            _ => None,
        }
    }
}

impl std::fmt::Display for ResumeCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether an HTTP error status is worth a retry: 408 (timeout), 409
/// (conflict), 429 (rate limit) and every 5xx (529 overloaded included),
/// as the official SDKs decide. One rule for every source: the HTTP
/// sources apply it to response statuses (unless `x-should-retry` says
/// otherwise), the Claude Code source to the `api_error_status` the CLI
/// reports.
pub fn retryable_status(status: u16) -> bool {
    matches!(status, 408 | 409 | 429 | 500..=599)
}

/// How a turn ended when it did not succeed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum TurnError {
    /// The user cancelled the turn. Never retried.
    #[error("turn cancelled")]
    Cancelled,
    /// Every attempt failed with a retryable error; `last` is the final one.
    #[error("turn failed after {attempts} attempts: {last}")]
    RetriesExhausted {
        /// Attempts made, the first included.
        attempts: u32,
        /// The error of the last attempt.
        last: StreamError,
    },
    /// An attempt failed with a fatal error.
    #[error("turn failed: {0}")]
    Fatal(StreamError),
    /// The session stopped (shutdown, reap or crash) before the turn ended.
    /// The message stays pending: the session's next start (here, or on
    /// the node that takes it over) answers it again.
    #[error("session stopped before the turn ended: {reason}")]
    SessionStopped {
        /// Why the session stopped.
        reason: String,
    },
    /// The session failed for good (its conversation could not be resumed
    /// and a fresh start failed too) and is given up until reset: the turn
    /// is not answered.
    #[error("the session failed and was given up: {reason}")]
    SessionFailed {
        /// Both causes.
        reason: String,
    },
    /// An attempt failed after it had delivered complete tool calls, which
    /// your code may have run; a restart would issue them again, so the
    /// turn is not retried (unless
    /// [`RetryPolicy::with_repeat_tool_calls`](crate::RetryPolicy::with_repeat_tool_calls)).
    #[error(
        "turn failed after {completed} tool call(s) were delivered; not retried, a restart would repeat them: {last}"
    )]
    ToolCallsWouldRepeat {
        /// Tool calls the failed attempt delivered complete.
        completed: u32,
        /// The attempt's error.
        last: StreamError,
    },
    /// The turn ran past its wall-clock cap
    /// ([`SessionConfig::turn_deadline`](crate::SessionConfig)); its
    /// attempt was stopped. Not retried.
    #[error("turn exceeded its deadline of {:.1}s", after.as_secs_f64())]
    DeadlineExceeded {
        /// The cap.
        after: Duration,
    },
    /// The turn's reply passed its size cap
    /// ([`SessionConfig::max_reply_bytes`](crate::SessionConfig)): the
    /// attempt was stopped and the rest of the reply was not read (a
    /// runaway or hostile upstream cannot fill the process's memory). Not
    /// retried.
    #[error("the reply passed its size cap of {limit} bytes; the rest was not read")]
    ReplyTooLarge {
        /// The cap, in bytes of text, thinking and tool input.
        limit: usize,
    },
}

impl TurnError {
    /// The code of the underlying stream error, or a turn-level code.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Cancelled => "ECANCELLED",
            Self::RetriesExhausted { last, .. } => last.code(),
            Self::Fatal(e) => e.code(),
            Self::SessionStopped { .. } => "ESESSION_STOPPED",
            Self::SessionFailed { .. } => "ESESSION_FAILED",
            Self::DeadlineExceeded { .. } => "ETURN_DEADLINE",
            Self::ReplyTooLarge { .. } => "EREPLY_TOO_LARGE",
            Self::ToolCallsWouldRepeat { .. } => "ETOOL_CALLS_WOULD_REPEAT",
        }
    }
}

/// Invalid configuration, e.g. a bad `WARDEN_STREAM_TIMEOUT`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// An environment variable held a value warden cannot use.
    #[error("invalid {var}={value:?}: {reason}")]
    InvalidEnv {
        /// The variable's name.
        var: &'static str,
        /// The value found.
        value: String,
        /// What is wrong and what is accepted.
        reason: String,
    },
    /// A duration outside the accepted range.
    #[error("invalid {what}: {reason}")]
    InvalidValue {
        /// Which setting.
        what: &'static str,
        /// What is wrong and what is accepted.
        reason: String,
    },
}

/// Errors of the actor plumbing (spawning, messaging a stopped actor).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ActorError {
    /// An actor could not be spawned.
    #[error("could not spawn {what}: {message}")]
    Spawn {
        /// Which actor.
        what: &'static str,
        /// ractor's message.
        message: String,
    },
    /// The target actor has stopped.
    #[error("{what} is not running")]
    NotRunning {
        /// Which actor.
        what: &'static str,
    },
    /// Configuration was rejected.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inactivity_timeout_is_retryable_with_its_code_and_message() {
        let e = StreamError::InactivityTimeout {
            silent_for: Duration::from_secs(45),
            timeout: Duration::from_secs(45),
        };
        assert!(e.is_retryable());
        assert_eq!(e.code(), "ESTREAM_TIMEOUT");
        assert!(
            e.to_string()
                .starts_with("Connection lost during streaming")
        );
    }

    #[test]
    fn resume_causes_round_trip_their_names() {
        for c in [
            ResumeCause::PromptTooLong,
            ResumeCause::BlockingLimit,
            ResumeCause::UnknownSession,
            ResumeCause::OperatorReset,
        ] {
            assert_eq!(ResumeCause::from_name(c.as_str()), Some(c));
            assert_eq!(c.to_string(), c.as_str());
        }
        assert_eq!(ResumeCause::from_name("max_turns"), None);
        assert_eq!(
            StreamError::UnknownSession {
                session_id: "s".into(),
                message: "m".into()
            }
            .resume_failure_cause(),
            Some(ResumeCause::UnknownSession)
        );
    }

    #[test]
    fn retryable_statuses_are_the_sdks_set() {
        for s in [408, 409, 429, 500, 502, 503, 529, 599] {
            assert!(retryable_status(s), "{s}");
        }
        for s in [200, 301, 400, 401, 403, 404, 410, 413, 422, 499, 600] {
            assert!(!retryable_status(s), "{s}");
        }
    }

    #[test]
    fn classification_of_fatal_errors() {
        let fatal = [
            StreamError::ContextOverflow {
                reason: ResumeCause::PromptTooLong,
                message: "Prompt is too long".into(),
            },
            StreamError::Malformed {
                message: "x".into(),
            },
            StreamError::FrameTooLarge { size: 2, limit: 1 },
            StreamError::Unauthorized {
                message: "x".into(),
            },
            StreamError::Api {
                status: Some(400),
                kind: "invalid_request_error".into(),
                message: "bad".into(),
                retryable: false,
                retry_after: None,
            },
        ];
        for e in fatal {
            assert!(!e.is_retryable(), "{e:?} must be fatal");
        }
    }
}
