//! One typed [`Transition`] per thing that happens to a session, recorded
//! in one place.
//!
//! Recording a transition emits, together and from the same values:
//!
//! - its **span** (name from [`Transition::name`], one of
//!   [`crate::spans::names`]), parented per the trace shape in
//!   [`crate::spans`];
//! - its **log event**, inside that span, with `event = <name>`;
//! - its [`LifecycleEvent`] on the [`EventBus`], when it has one.
//!
//! The actors never call `tracing` or `EventBus::publish` for a transition
//! themselves, so the three views cannot drift apart. No variant carries
//! prompt or completion text.

use std::path::Path;
use std::time::Duration;

use opentelemetry::trace::SpanContext;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::error::{ResumeCause, StreamError};
use crate::event::Usage;
use crate::lifecycle::{EventBus, LifecycleEvent};
use crate::session::ContextReport;
use crate::source::{Diagnostics, SessionKey};
use crate::spans::{self, TraceAnchor, names};
use crate::store::StoreError;
use crate::stream::AttemptId;

/// Which incarnation of a session starts (its anchor span's name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Incarnation {
    /// A session with no stored conversation.
    Spawn,
    /// A session resuming its stored conversation.
    Resume,
    /// A fresh start after a resume failure.
    FreshFallback,
}

/// Something that happened to a session; see the module docs.
#[derive(Debug)]
pub(crate) enum Transition<'a> {
    /// A session incarnation started: its anchor span.
    Incarnated {
        /// Which kind.
        incarnation: Incarnation,
        /// The agent's working directory.
        workspace: Option<&'a Path>,
        /// Restarts so far.
        restart_count: u32,
        /// The model, when known.
        model: Option<&'a str>,
        /// The previous incarnation, linked from this one.
        previous: Option<&'a TraceAnchor>,
        /// Unanswered messages re-delivered from the record.
        recovered: usize,
    },
    /// A turn began (its span stays open while it runs).
    TurnStarted {
        /// Turn number.
        turn: u64,
        /// The source's provider name.
        provider: &'a str,
    },
    /// An attempt's stream started (its span stays open while it runs).
    AttemptStarted {
        /// The attempt.
        attempt: AttemptId,
        /// Its silence allowance.
        timeout: Duration,
        /// The source's provider name.
        provider: &'a str,
        /// The failed attempt this one retries, linked.
        retries: Option<&'a SpanContext>,
    },
    /// The watchdog killed a silent stream (the stream's own view).
    WatchdogKill {
        /// The watch entry.
        watch_id: u64,
        /// Silence observed.
        silent_for: Duration,
        /// The allowance.
        timeout: Duration,
    },
    /// The session learned its attempt was killed for silence.
    StreamTimedOut {
        /// The attempt.
        attempt: AttemptId,
        /// Silence observed.
        silent_for: Duration,
        /// The allowance.
        timeout: Duration,
    },
    /// A failed attempt will be retried from scratch.
    RetryScheduled {
        /// The failed attempt.
        failed: AttemptId,
        /// Backoff before the next one.
        delay: Duration,
        /// The failure's code.
        error_code: &'static str,
        /// The failed attempt's span, linked.
        retries: Option<&'a SpanContext>,
    },
    /// The user cancelled the turn.
    TurnCancelled {
        /// Turn number.
        turn: u64,
    },
    /// The agent announced (or changed) its session id; stored durably.
    AgentSessionId {
        /// The new id.
        session_id: &'a str,
        /// The id before, if any.
        previous: Option<&'a str>,
    },
    /// Context usage at the end of a turn.
    ContextUsage(ContextReport),
    /// A turn ended; recorded onto the turn's own span.
    TurnFinished {
        /// Turn number.
        turn: u64,
        /// Attempts used.
        attempts: u32,
        /// `None` on success.
        error_code: Option<&'static str>,
        /// The turn's last usage report.
        usage: Option<Usage>,
        /// Context in use.
        context: Option<ContextReport>,
    },
    /// An idle session stops itself.
    Reaped {
        /// How long it was idle.
        idle_for: Duration,
        /// Tokens in context, if known.
        context_tokens: Option<u64>,
        /// Its workspace.
        workspace: Option<&'a Path>,
    },
    /// A session actor stopped (published only; its spans are elsewhere).
    SessionStopped {
        /// Why.
        reason: &'a str,
        /// Whether it crashed.
        abnormal: bool,
    },
    /// The supervisor restarts a crashed session.
    Restarted {
        /// Restarts inside the intensity window.
        restarts_in_window: u32,
        /// The crash.
        cause: &'a str,
    },
    /// The supervisor gives a session up (restart intensity exceeded).
    GivenUp {
        /// The original failure.
        cause: &'a str,
    },
    /// A stored conversation could not be resumed.
    ResumeFailed {
        /// The id that failed.
        failed_id: &'a str,
        /// Why.
        cause: ResumeCause,
        /// The error.
        error: &'a StreamError,
        /// The agent's working directory.
        workspace: Option<&'a Path>,
        /// What the source knows.
        diagnostics: &'a Diagnostics,
    },
    /// The session restarted fresh with its unanswered messages.
    FreshFallback {
        /// The id that failed.
        failed_id: &'a str,
        /// Messages re-delivered.
        redelivered: usize,
    },
    /// The session failed for good.
    SessionFailed {
        /// Every cause.
        reason: &'a str,
    },
    /// The session's record could not be read or written.
    StoreFailed {
        /// The store's error.
        error: &'a StoreError,
    },
    /// A workspace path was normalized to another spelling.
    WorkspaceNormalized {
        /// As given.
        original: &'a Path,
        /// As used (also the session key).
        normalized: &'a Path,
    },
}

/// Where a transition's span hangs.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Parent<'a> {
    /// Under a session incarnation's anchor.
    Anchor(&'a TraceAnchor),
    /// Under an open span (a turn, an attempt).
    Span(&'a tracing::Span),
    /// A new trace (anchors, workspace normalization).
    Root,
}

/// The session a transition belongs to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct At<'a> {
    /// The session.
    pub(crate) key: &'a SessionKey,
    /// Its agent session id, once known.
    pub(crate) conversation: Option<&'a str>,
    /// Where the span hangs.
    pub(crate) parent: Parent<'a>,
    /// Where the lifecycle event goes (none for the stream's own view).
    pub(crate) bus: Option<&'a EventBus>,
}

impl Transition<'_> {
    /// The span name (and the log event's `event` field).
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Self::Incarnated { incarnation, .. } => match incarnation {
                Incarnation::Spawn => names::SESSION_SPAWN,
                Incarnation::Resume => names::SESSION_RESUME,
                Incarnation::FreshFallback => names::SESSION_FRESH_FALLBACK,
            },
            Self::TurnStarted { .. } => names::SESSION_TURN,
            Self::AttemptStarted { .. } => names::STREAM_ATTEMPT,
            Self::WatchdogKill { .. } => names::WATCHDOG_KILL,
            Self::StreamTimedOut { .. } => names::STREAM_TIMEOUT,
            Self::RetryScheduled { .. } => names::STREAM_RETRY,
            Self::TurnCancelled { .. } => names::STREAM_CANCEL,
            Self::AgentSessionId { .. } => names::SESSION_AGENT_ID,
            Self::ContextUsage(_) => names::CONTEXT_USAGE,
            Self::TurnFinished { .. } => names::SESSION_TURN_FINISHED,
            Self::Reaped { .. } => names::SESSION_REAP,
            Self::SessionStopped { .. } => names::SESSION_STOPPED,
            Self::Restarted { .. } => names::SUPERVISOR_RESTART,
            Self::GivenUp { .. } => names::SUPERVISOR_ESCALATE,
            Self::ResumeFailed { .. } => names::SESSION_RESUME_FAILED,
            Self::FreshFallback { .. } => names::SUPERVISOR_FRESH_START,
            Self::SessionFailed { .. } => names::SESSION_FAILED,
            Self::StoreFailed { .. } => names::STORE_FAILED,
            Self::WorkspaceNormalized { .. } => names::WORKSPACE_NORMALIZE,
        }
    }

    /// Emits the span, the log event and the lifecycle event. Returns the
    /// span (open until dropped; `Span::none()` for transitions that are
    /// not spans).
    pub(crate) fn record(self, at: At<'_>) -> tracing::Span {
        let span = self.span(at);
        if !span.is_none() {
            match at.parent {
                Parent::Anchor(anchor) => anchor.adopt(&span),
                Parent::Span(parent) => {
                    let _ = span.set_parent(parent.context());
                }
                // A new trace, whatever span is current.
                Parent::Root => {
                    let _ = span.set_parent(opentelemetry::Context::new());
                }
            }
        }
        if let (Self::TurnFinished { .. }, Parent::Span(turn)) = (&self, at.parent) {
            self.finish_onto(turn, at.conversation);
        }
        {
            let _entered = span.enter();
            self.log(at.key);
        }
        if let (Some(bus), Some(event)) = (at.bus, self.lifecycle(at.key)) {
            bus.publish(event);
        }
        span
    }

    /// The transition's span, not yet parented.
    fn span(&self, at: At<'_>) -> tracing::Span {
        let key = at.key.as_str();
        let conv = at.conversation.unwrap_or("");
        match *self {
            Self::Incarnated {
                incarnation,
                restart_count,
                ..
            } => {
                let span = match incarnation {
                    Incarnation::Spawn => tracing::info_span!(
                        names::SESSION_SPAWN,
                        warden.session.key = key,
                        gen_ai.conversation.id = Empty,
                        warden.workspace = Empty,
                        warden.restart_count = restart_count,
                    ),
                    Incarnation::Resume => tracing::info_span!(
                        names::SESSION_RESUME,
                        warden.session.key = key,
                        gen_ai.conversation.id = Empty,
                        warden.workspace = Empty,
                        warden.restart_count = restart_count,
                    ),
                    Incarnation::FreshFallback => tracing::info_span!(
                        names::SESSION_FRESH_FALLBACK,
                        warden.session.key = key,
                        gen_ai.conversation.id = Empty,
                        warden.workspace = Empty,
                        warden.restart_count = restart_count,
                    ),
                };
                if let Some(c) = at.conversation {
                    span.record("gen_ai.conversation.id", c);
                }
                if let Self::Incarnated {
                    workspace: Some(w), ..
                } = self
                {
                    span.record("warden.workspace", w.display().to_string());
                }
                if let Self::Incarnated {
                    previous: Some(p), ..
                } = self
                {
                    spans::link(&span, &p.span_context());
                }
                span
            }
            Self::TurnStarted { turn, provider } => tracing::info_span!(
                names::SESSION_TURN,
                warden.session.key = key,
                gen_ai.conversation.id = conv,
                gen_ai.operation.name = "chat",
                gen_ai.provider.name = provider,
                warden.turn = turn,
                warden.attempts = Empty,
                warden.ctx_pct = Empty,
                gen_ai.usage.input_tokens = Empty,
                gen_ai.usage.output_tokens = Empty,
                error.r#type = Empty,
                otel.status_code = Empty,
            ),
            Self::AttemptStarted {
                attempt,
                timeout,
                provider,
                retries,
            } => {
                let span = tracing::info_span!(
                    names::STREAM_ATTEMPT,
                    warden.session.key = key,
                    gen_ai.conversation.id = conv,
                    gen_ai.provider.name = provider,
                    warden.turn = attempt.turn,
                    warden.attempt = attempt.attempt,
                    warden.timeout_ms = millis(timeout),
                    error.r#type = Empty,
                    otel.status_code = Empty,
                );
                if let Some(prev) = retries {
                    spans::link(&span, prev);
                }
                span
            }
            Self::WatchdogKill {
                watch_id,
                silent_for,
                timeout,
            } => tracing::warn_span!(
                names::WATCHDOG_KILL,
                warden.session.key = key,
                gen_ai.conversation.id = conv,
                warden.watch_id = watch_id,
                warden.silent_ms = millis(silent_for),
                warden.timeout_ms = millis(timeout),
                error.r#type = "ESTREAM_TIMEOUT",
                otel.status_code = "ERROR",
            ),
            Self::StreamTimedOut {
                attempt,
                silent_for,
                timeout,
            } => tracing::info_span!(
                names::STREAM_TIMEOUT,
                warden.session.key = key,
                gen_ai.conversation.id = conv,
                warden.attempt = attempt.attempt,
                warden.silent_ms = millis(silent_for),
                warden.timeout_ms = millis(timeout),
                error.r#type = "ESTREAM_TIMEOUT",
                otel.status_code = "ERROR",
            ),
            Self::RetryScheduled {
                failed,
                delay,
                error_code,
                retries,
            } => {
                let span = tracing::info_span!(
                    names::STREAM_RETRY,
                    warden.session.key = key,
                    gen_ai.conversation.id = conv,
                    warden.attempt = failed.attempt + 1,
                    warden.delay_ms = millis(delay),
                    error.r#type = error_code,
                );
                if let Some(prev) = retries {
                    spans::link(&span, prev);
                }
                span
            }
            Self::TurnCancelled { turn } => tracing::info_span!(
                names::STREAM_CANCEL,
                warden.session.key = key,
                gen_ai.conversation.id = conv,
                warden.turn = turn,
            ),
            Self::Reaped {
                idle_for,
                context_tokens,
                ..
            } => tracing::info_span!(
                names::SESSION_REAP,
                warden.session.key = key,
                gen_ai.conversation.id = conv,
                warden.idle_ms = millis(idle_for),
                warden.context_tokens = context_tokens.unwrap_or(0),
            ),
            Self::Restarted {
                restarts_in_window, ..
            } => tracing::warn_span!(
                names::SUPERVISOR_RESTART,
                warden.session.key = key,
                warden.restarts_in_window = restarts_in_window,
                error.r#type = "ESESSION_FAILED",
            ),
            Self::GivenUp { .. } => tracing::error_span!(
                names::SUPERVISOR_ESCALATE,
                warden.session.key = key,
                error.r#type = "EESCALATED",
                otel.status_code = "ERROR",
            ),
            Self::ResumeFailed {
                failed_id,
                cause,
                error,
                workspace,
                diagnostics,
            } => tracing::error_span!(
                names::SESSION_RESUME_FAILED,
                warden.session.key = key,
                gen_ai.conversation.id = failed_id,
                warden.cause = cause.as_str(),
                warden.workspace = workspace
                    .map(|w| w.display().to_string())
                    .unwrap_or_default(),
                warden.transcript_bytes = diagnostics.transcript_bytes.unwrap_or(0),
                error.r#type = error.code(),
                otel.status_code = "ERROR",
            ),
            Self::WorkspaceNormalized {
                original,
                normalized,
            } => tracing::debug_span!(
                names::WORKSPACE_NORMALIZE,
                warden.session.key = key,
                warden.workspace.original = original.to_string_lossy().as_ref(),
                warden.workspace = normalized.to_string_lossy().as_ref(),
            ),
            Self::AgentSessionId { .. }
            | Self::ContextUsage(_)
            | Self::TurnFinished { .. }
            | Self::SessionStopped { .. }
            | Self::FreshFallback { .. }
            | Self::SessionFailed { .. }
            | Self::StoreFailed { .. } => tracing::Span::none(),
        }
    }

    /// Records a finished turn's outcome onto its span.
    fn finish_onto(&self, turn_span: &tracing::Span, conversation: Option<&str>) {
        let Self::TurnFinished {
            attempts,
            error_code,
            usage,
            context,
            ..
        } = *self
        else {
            return;
        };
        turn_span.record("warden.attempts", attempts);
        turn_span.record("gen_ai.conversation.id", conversation.unwrap_or(""));
        if let Some(u) = usage {
            turn_span.record("gen_ai.usage.output_tokens", u.output_tokens);
        }
        if let Some(c) = context {
            turn_span.record("gen_ai.usage.input_tokens", c.tokens);
            turn_span.record("warden.ctx_pct", c.percent);
        }
        if let Some(code) = error_code {
            spans::fail(turn_span, code);
        }
    }

    /// The log event (emitted inside the transition's span).
    fn log(&self, key: &SessionKey) {
        let event = self.name();
        match *self {
            Self::Incarnated {
                incarnation,
                workspace,
                model,
                recovered,
                ..
            } => match incarnation {
                Incarnation::FreshFallback => tracing::warn!(
                    event, session.key = %key, cwd = ?workspace, recovered,
                    "starting fresh after a resume failure"
                ),
                Incarnation::Resume => tracing::info!(
                    event, session.key = %key, cwd = ?workspace, recovered,
                    "resuming stored session"
                ),
                Incarnation::Spawn => tracing::info!(
                    event, session.key = %key, cwd = ?workspace, model, recovered,
                    "new session"
                ),
            },
            Self::TurnStarted { turn, .. } => {
                tracing::info!(event, session.key = %key, turn, "turn started")
            }
            Self::AttemptStarted {
                attempt, timeout, ..
            } => tracing::debug!(
                event, session.key = %key, turn = attempt.turn, attempt = attempt.attempt,
                timeout_ms = millis(timeout), "stream attempt started"
            ),
            Self::WatchdogKill { watch_id, .. } => {
                tracing::debug!(event, session.key = %key, watch_id, "watchdog killed the stream")
            }
            Self::StreamTimedOut {
                attempt,
                silent_for,
                ..
            } => tracing::warn!(
                event, session.key = %key, turn = attempt.turn, attempt = attempt.attempt,
                error.r#type = "ESTREAM_TIMEOUT", silent_ms = millis(silent_for),
                "Connection lost during streaming"
            ),
            Self::RetryScheduled {
                failed,
                delay,
                error_code,
                ..
            } => tracing::info!(
                event, session.key = %key, turn = failed.turn, attempt = failed.attempt,
                delay_ms = millis(delay), error.r#type = error_code,
                "retrying turn from scratch"
            ),
            Self::TurnCancelled { turn } => {
                tracing::info!(event, session.key = %key, turn, "turn cancelled by user")
            }
            Self::AgentSessionId {
                session_id,
                previous,
            } => tracing::info!(
                event, session.key = %key, gen_ai.conversation.id = session_id, previous,
                "agent session id stored"
            ),
            Self::ContextUsage(c) => tracing::info!(
                event, session.key = %key, input_tokens = c.tokens, sdk_pct = c.percent,
                self_reported_pct = ?c.self_reported,
                drift_pct = ?c.self_reported.map(|s| i64::from(s) - i64::from(c.percent)),
                "context usage"
            ),
            Self::TurnFinished {
                turn,
                attempts,
                error_code,
                ..
            } => tracing::info!(
                event, session.key = %key, turn, attempts,
                error.r#type = error_code.unwrap_or(""), "turn finished"
            ),
            Self::Reaped {
                idle_for,
                context_tokens,
                workspace,
            } => tracing::info!(
                event, session.key = %key, cwd = ?workspace, idle_ms = millis(idle_for),
                context_tokens, "reaping idle session"
            ),
            Self::SessionStopped { reason, abnormal } => {
                tracing::debug!(event, session.key = %key, reason, abnormal, "session stopped")
            }
            Self::Restarted {
                restarts_in_window,
                cause,
            } => tracing::warn!(
                event, session.key = %key, restarts_in_window, cause, "restarting session"
            ),
            Self::GivenUp { cause } => tracing::error!(
                event, session.key = %key, cause,
                "restart intensity exceeded; giving up on session"
            ),
            Self::ResumeFailed {
                failed_id,
                cause,
                error,
                workspace,
                diagnostics,
            } => tracing::error!(
                event, session.key = %key, gen_ai.conversation.id = failed_id,
                error.r#type = error.code(), error = %error, cause = cause.as_str(),
                cwd = ?workspace, stderr_tail = ?diagnostics.stderr_tail,
                transcript = ?diagnostics.transcript_path,
                transcript_bytes = ?diagnostics.transcript_bytes,
                "resume failed; starting fresh"
            ),
            Self::FreshFallback {
                failed_id,
                redelivered,
            } => tracing::warn!(
                event, session.key = %key, failed_id, redelivered,
                "session restarted fresh; messages re-delivered"
            ),
            Self::SessionFailed { reason } => {
                tracing::error!(event, session.key = %key, reason, "session failed")
            }
            Self::StoreFailed { error } => tracing::error!(
                event, session.key = %key, error = %error,
                "session record unusable; left untouched"
            ),
            Self::WorkspaceNormalized {
                original,
                normalized,
            } => tracing::debug!(
                event, original = %original.display(), normalized = %normalized.display(),
                "workspace normalized"
            ),
        }
    }

    /// The lifecycle event, if the transition has one.
    fn lifecycle(&self, key: &SessionKey) -> Option<LifecycleEvent> {
        let key = key.clone();
        Some(match *self {
            Self::Incarnated { .. } => LifecycleEvent::SessionSpawned { key },
            Self::TurnStarted { turn, .. } => LifecycleEvent::TurnStarted { key, turn },
            Self::AttemptStarted {
                attempt, timeout, ..
            } => LifecycleEvent::AttemptStarted {
                key,
                attempt,
                timeout,
            },
            Self::StreamTimedOut {
                attempt,
                silent_for,
                ..
            } => LifecycleEvent::StreamTimedOut {
                key,
                attempt,
                silent_for,
            },
            Self::RetryScheduled {
                failed,
                delay,
                error_code,
                ..
            } => LifecycleEvent::RetryScheduled {
                key,
                failed,
                delay,
                error_code,
            },
            Self::AgentSessionId { session_id, .. } => LifecycleEvent::AgentSessionId {
                key,
                session_id: session_id.to_owned(),
            },
            Self::ContextUsage(c) => LifecycleEvent::ContextUsage {
                key,
                tokens: c.tokens,
                window: c.window,
                percent: c.percent,
                self_reported: c.self_reported,
            },
            Self::TurnFinished {
                turn,
                attempts,
                error_code,
                ..
            } => LifecycleEvent::TurnFinished {
                key,
                turn,
                attempts,
                error_code,
            },
            Self::Reaped {
                idle_for,
                context_tokens,
                ..
            } => LifecycleEvent::SessionReaped {
                key,
                idle_for,
                context_tokens,
            },
            Self::SessionStopped { reason, abnormal } => LifecycleEvent::SessionStopped {
                key,
                reason: Some(reason.to_owned()),
                abnormal,
            },
            Self::Restarted {
                restarts_in_window,
                cause,
            } => LifecycleEvent::SessionRestarted {
                key,
                restarts_in_window,
                cause: cause.to_owned(),
            },
            Self::GivenUp { cause } => LifecycleEvent::SupervisorEscalated {
                key,
                cause: cause.to_owned(),
            },
            Self::ResumeFailed {
                failed_id, cause, ..
            } => LifecycleEvent::ResumeFailed {
                key,
                failed_id: failed_id.to_owned(),
                cause,
            },
            Self::FreshFallback {
                failed_id,
                redelivered,
            } => LifecycleEvent::FreshFallback {
                key,
                failed_id: failed_id.to_owned(),
                redelivered,
            },
            Self::SessionFailed { reason } => LifecycleEvent::SessionFailed {
                key,
                reason: reason.to_owned(),
            },
            Self::StoreFailed { error } => LifecycleEvent::StoreFailed {
                key,
                error: error.clone(),
            },
            Self::WorkspaceNormalized {
                original,
                normalized,
            } => LifecycleEvent::WorkspaceNormalized {
                original: original.to_path_buf(),
                normalized: normalized.to_path_buf(),
            },
            Self::WatchdogKill { .. } | Self::TurnCancelled { .. } => return None,
        })
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing::field::{Field, Visit};
    use tracing::span::Attributes;
    use tracing::{Event, Id, Subscriber};
    use tracing_subscriber::layer::{Context, Layer, SubscriberExt as _};

    use super::*;

    /// What one recording emitted.
    #[derive(Debug, Default)]
    struct Seen {
        spans: Vec<&'static str>,
        events: Vec<String>,
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

    impl<S: Subscriber> Layer<S> for Capture {
        fn on_new_span(&self, attrs: &Attributes<'_>, _: &Id, _: Context<'_, S>) {
            crate::util::lock(&self.0)
                .spans
                .push(attrs.metadata().name());
        }

        fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
            let mut name = EventName(None);
            event.record(&mut name);
            if let Some(n) = name.0 {
                crate::util::lock(&self.0).events.push(n);
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
            },
            Transition::AttemptStarted {
                attempt,
                timeout: d,
                provider: "p",
                retries: None,
            },
            Transition::WatchdogKill {
                watch_id: 1,
                silent_for: d,
                timeout: d,
            },
            Transition::StreamTimedOut {
                attempt,
                silent_for: d,
                timeout: d,
            },
            Transition::RetryScheduled {
                failed: attempt,
                delay: d,
                error_code: "ESTREAM_TIMEOUT",
                retries: None,
            },
            Transition::TurnCancelled { turn: 1 },
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

    #[test]
    fn every_transition_emits_its_span_log_and_lifecycle_event_under_one_name() {
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
        let turn_span = tracing::Span::none();
        let mut names = std::collections::HashSet::new();
        for t in all(attempt, &error, &store_error, &diagnostics, &anchor) {
            let name = t.name();
            let spans_expected = !matches!(
                t,
                Transition::AgentSessionId { .. }
                    | Transition::ContextUsage(_)
                    | Transition::TurnFinished { .. }
                    | Transition::SessionStopped { .. }
                    | Transition::FreshFallback { .. }
                    | Transition::SessionFailed { .. }
                    | Transition::StoreFailed { .. }
            );
            let published_expected = !matches!(
                t,
                Transition::WatchdogKill { .. } | Transition::TurnCancelled { .. }
            );
            let seen = Arc::new(Mutex::new(Seen::default()));
            let subscriber = tracing_subscriber::registry().with(Capture(seen.clone()));
            let mut rx = bus.subscribe();
            tracing::subscriber::with_default(subscriber, || {
                t.record(At {
                    key: &key,
                    conversation: Some("conv"),
                    parent: Parent::Span(&turn_span),
                    bus: Some(&bus),
                });
            });
            let seen = crate::util::lock(&seen);
            if spans_expected {
                assert_eq!(seen.spans, [name], "span of {name}");
            } else {
                assert!(seen.spans.is_empty(), "{name} is not a span: {seen:?}");
            }
            assert_eq!(seen.events, [name], "log event of {name}");
            assert_eq!(rx.try_recv().is_ok(), published_expected, "bus for {name}");
            assert!(rx.try_recv().is_err(), "{name} published once");
            // Names are unique, and come from `spans::names`.
            assert!(names.insert(name), "{name} used twice");
        }
        assert_eq!(names.len(), 21);
    }
}
