//! Where streams come from: the [`EventSource`] trait.
//!
//! A source opens one stream per *attempt* of a turn. warden calls
//! [`EventSource::open`] only after the attempt is admitted
//! ([`Admission`](crate::Admission)) and its stream registered with the
//! watchdog, so connecting and waiting for the first byte are covered by the
//! silence allowance too (a wait for admission is not). To adapt another
//! client's stream without implementing the trait, see
//! [`source_fn`](crate::source_fn); to change how a source opens while
//! keeping the rest, [`WrappedSource`](crate::adapter::WrappedSource). Real sources (Anthropic/OpenAI SSE over HTTP, the
//! Claude Code CLI) live in `warden-llm`; `testing::ChannelSource` (feature `testing`)
//! is an in-process source for tests.

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use derive_setters::Setters;
use futures_util::Stream;
use futures_util::future::BoxFuture;

use crate::error::StreamError;
use crate::event::Frame;

/// The frames of one attempt. Ends with `None` after a complete turn; a
/// source reports an incomplete end (EOF before the terminal frame) as
/// `Some(Err(StreamError::Truncated { .. }))`.
pub type EventStream = Pin<Box<dyn Stream<Item = Result<Frame, StreamError>> + Send>>;

/// The key of a session: a normalized workspace path or any stable name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionKey(Arc<str>);

impl SessionKey {
    /// A key from any string.
    pub fn new(key: impl AsRef<str>) -> Self {
        Self(Arc::from(key.as_ref()))
    }

    /// The key's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for SessionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for SessionKey {
    fn from(s: &str) -> Self {
        Self::new(s)
    }
}

impl From<String> for SessionKey {
    fn from(s: String) -> Self {
        Self::new(s)
    }
}

/// What one attempt of a turn asks the agent for.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct TurnRequest {
    /// The session.
    pub session_key: SessionKey,
    /// Turn number within the session, from 1.
    pub turn_id: u64,
    /// Attempt number within the turn, from 1.
    pub attempt: u32,
    /// The user's message.
    pub message: String,
    /// The model this turn asks for; `None`: the source's own.
    pub model: Option<String>,
    /// The agent session id to resume, if any.
    pub resume_id: Option<String>,
    /// The workspace directory the agent works in, if any.
    pub workspace: Option<PathBuf>,
    /// Text to append to the agent's system prompt, if any (the context
    /// self-report instruction).
    pub append_system_prompt: Option<String>,
    /// Set when this attempt continues a reply that broke mid-text (only
    /// for sources that [`continue`](EventSource::continues)): the stream
    /// must yield only the text after
    /// [`partial_text`](crate::Continuation::partial_text).
    pub continuation: Option<crate::Continuation>,
}

impl TurnRequest {
    /// A first-attempt request for `message` in session `key`.
    pub fn new(session_key: SessionKey, turn_id: u64, message: impl Into<String>) -> Self {
        Self {
            session_key,
            turn_id,
            attempt: 1,
            message: message.into(),
            model: None,
            resume_id: None,
            workspace: None,
            append_system_prompt: None,
            continuation: None,
        }
    }
}

/// A way to run turns: opens one stream per attempt.
pub trait EventSource: Send + Sync + 'static {
    /// Opens the stream of one attempt (send the request, start reading).
    /// The returned stream owns its connection: dropping it must close it.
    fn open(&self, request: TurnRequest) -> BoxFuture<'static, Result<EventStream, StreamError>>;

    /// Whether this source continues a reply that broke mid-text instead of
    /// replaying it: when `true`, an attempt after such a break gets
    /// [`TurnRequest::continuation`], and its stream must yield only the
    /// text that follows the partial text — with whatever the model repeats
    /// trimmed ([`crate::continuation::Stitcher`]) — or fail with
    /// [`StreamError::ContinuationFailed`], after which the turn restarts
    /// from scratch. Default `false`: every retry starts from scratch.
    fn continues(&self) -> bool {
        false
    }

    /// Whether tools run *inside* this source's stream, between
    /// `ToolUseStarted` and `ToolUseFinished` (an agent CLI running a
    /// command), so the stream may be silent for the longer
    /// [`StreamOptions::tool_timeout`](crate::StreamOptions::tool_timeout).
    /// Default `true`. An HTTP API source says `false`: its `tool_use`
    /// block is the model still writing the call, silence there is a
    /// stall like any other.
    fn tools_run_in_stream(&self) -> bool {
        true
    }

    /// Whether restarting a turn from scratch issues again the tool calls a
    /// failed attempt delivered (an HTTP API: your code runs them, and a
    /// new request asks for them anew). Default `true`; a source whose
    /// agent runs tools itself and keeps their results across a retry (the
    /// Claude Code CLI resuming its session) says `false`. When `true`, a
    /// failure after complete tool calls ends the turn
    /// [`TurnError::ToolCallsWouldRepeat`](crate::TurnError) unless the
    /// policy allows repeats.
    fn restarts_repeat_tool_calls(&self) -> bool {
        true
    }

    /// Whether this source's agent works in the session's workspace (an
    /// agent CLI editing files there): such a session must have one — from
    /// [`Supervisor::send_to_workspace`](crate::Supervisor::send_to_workspace),
    /// a key made by [`SessionKey::for_workspace`] or
    /// [`SessionSpec::with_workspace`] — and is refused
    /// ([`SupervisorError::NoWorkspace`](crate::SupervisorError)) without,
    /// never run in the orchestrator's own directory. Default `false`.
    fn runs_in_workspace(&self) -> bool {
        false
    }

    /// The provider's name for telemetry (`anthropic`, `openai`, ...).
    fn provider(&self) -> &str {
        "unknown"
    }

    /// The context window of `model` (as the agent reported it in
    /// `SessionStarted`), when the source knows it better than the default
    /// of [`DEFAULT_WINDOW`](crate::context::DEFAULT_WINDOW) tokens. A window
    /// the agent reports with a turn (`TurnComplete::context_window`) and
    /// [`ContextConfig::window`](crate::ContextConfig) take precedence.
    fn context_window(&self, model: Option<&str>) -> Option<u64> {
        let _ = model;
        None
    }

    /// A sentence telling the user what survives when a session whose
    /// conversation cannot be resumed starts fresh (appended to
    /// [`Notice::FreshStart`](crate::Notice)'s text), if the agent keeps
    /// anything.
    fn fresh_start_note(&self) -> Option<String> {
        None
    }

    /// What the source knows about a failed resume of `session_id` (the
    /// agent's stderr tail, the transcript file and its size). Called once
    /// per resume failure; the default knows nothing.
    fn diagnostics(&self, session_id: &str, workspace: Option<&std::path::Path>) -> Diagnostics {
        let _ = (session_id, workspace);
        Diagnostics::default()
    }
}

/// Source-specific facts about a failure, for the logs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Diagnostics {
    /// The last lines the agent wrote to stderr.
    pub stderr_tail: Option<String>,
    /// Where the agent's transcript for the session should be.
    pub transcript_path: Option<PathBuf>,
    /// Its size, when it exists.
    pub transcript_bytes: Option<u64>,
}

/// What a new session is made of: where its streams come from, and the
/// settings in which it differs from its supervisor's (a planner that
/// retries more than its workers, a worker that is never restarted). Every
/// setting left `None` is the supervisor's.
#[derive(Clone, Setters)]
#[setters(prefix = "with_", strip_option)]
#[non_exhaustive]
pub struct SessionSpec {
    /// The session's source.
    #[setters(skip)]
    pub source: Arc<dyn EventSource>,
    /// Its session configuration (retries, timeouts, idle reap, context),
    /// instead of [`SupervisorConfig::session`](crate::SupervisorConfig).
    pub config: Option<crate::SessionConfig>,
    /// Its restart kind, instead of the supervisor's.
    pub restart: Option<crate::Restart>,
    /// Its restart intensity, instead of the supervisor's.
    pub intensity: Option<crate::RestartIntensity>,
    /// The admission pool its streams count against (limits and shared
    /// backoff), instead of its source's
    /// [`provider`](EventSource::provider). Give sessions that use
    /// different API keys different pools.
    #[setters(into)]
    pub pool: Option<String>,
    /// The directory the session's agent works in, when the session's key
    /// and its first send name none (normalized when the session starts).
    #[setters(into)]
    pub workspace: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for SessionSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionSpec")
            .field("provider", &self.source.provider())
            .field("config", &self.config)
            .field("restart", &self.restart)
            .field("intensity", &self.intensity)
            .field("pool", &self.pool)
            .field("workspace", &self.workspace)
            .finish()
    }
}

impl SessionSpec {
    /// A session from `source` with the supervisor's settings.
    pub fn new(source: Arc<dyn EventSource>) -> Self {
        Self {
            source,
            config: None,
            restart: None,
            intensity: None,
            pool: None,
            workspace: None,
        }
    }

    /// Whether `other` asks for the same session: the same source (one
    /// `Arc`) and the same settings.
    pub(crate) fn same_as(&self, other: &SessionSpec) -> bool {
        Arc::ptr_eq(&self.source, &other.source)
            && self.config == other.config
            && self.restart == other.restart
            && self.intensity == other.intensity
            && self.pool == other.pool
            && self.workspace == other.workspace
    }
}

/// Makes the [`EventSource`] of a new session, and optionally its own
/// settings ([`SourceFactory::spec_for`]). A closure
/// `Fn(&SessionKey) -> Arc<dyn EventSource>` is a factory; wrap a closure
/// returning [`SessionSpec`]s in [`specs`].
pub trait SourceFactory: Send + Sync + 'static {
    /// The source for session `key`.
    fn source_for(&self, key: &SessionKey) -> Arc<dyn EventSource>;

    /// Everything session `key` is made of. Default: its source with the
    /// supervisor's settings.
    fn spec_for(&self, key: &SessionKey) -> SessionSpec {
        SessionSpec::new(self.source_for(key))
    }
}

impl<F> SourceFactory for F
where
    F: Fn(&SessionKey) -> Arc<dyn EventSource> + Send + Sync + 'static,
{
    fn source_for(&self, key: &SessionKey) -> Arc<dyn EventSource> {
        self(key)
    }
}

/// A factory from a closure returning each session's [`SessionSpec`].
pub fn specs<F>(f: F) -> impl SourceFactory
where
    F: Fn(&SessionKey) -> SessionSpec + Send + Sync + 'static,
{
    SpecFactory(f)
}

struct SpecFactory<F>(F);

impl<F> SourceFactory for SpecFactory<F>
where
    F: Fn(&SessionKey) -> SessionSpec + Send + Sync + 'static,
{
    fn source_for(&self, key: &SessionKey) -> Arc<dyn EventSource> {
        (self.0)(key).source
    }

    fn spec_for(&self, key: &SessionKey) -> SessionSpec {
        (self.0)(key)
    }
}

/// Identifies one attempt of one turn within a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AttemptId {
    /// Turn number within the session.
    pub turn: u64,
    /// Attempt number within the turn, from 1.
    pub attempt: u32,
}
