//! How each [`Transition`] is emitted: its span, its log event, its
//! lifecycle event. One arm per transition in each.

use tracing::field::Empty;

use crate::lifecycle::LifecycleEvent;
use crate::source::SessionKey;
use crate::spans::{self, names};

use super::{At, Incarnation, Transition, millis};

impl Transition<'_> {
    /// The transition's span, not yet parented.
    pub(super) fn span(&self, at: At<'_>) -> tracing::Span {
        let key = at.key.as_str();
        let conv = at.conversation.unwrap_or("");
        match *self {
            Self::Incarnated {
                incarnation,
                restart_count,
                ..
            } => {
                // Span names are static metadata: one call site per name.
                macro_rules! anchor {
                    ($name:expr) => {
                        tracing::info_span!(
                            $name,
                            warden.session.key = key,
                            gen_ai.conversation.id = Empty,
                            warden.workspace = Empty,
                            warden.restart_count = restart_count,
                        )
                    };
                }
                let span = match incarnation {
                    Incarnation::Spawn => anchor!(names::SESSION_SPAWN),
                    Incarnation::Resume => anchor!(names::SESSION_RESUME),
                    Incarnation::FreshFallback => anchor!(names::SESSION_FRESH_FALLBACK),
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
            Self::AttemptQueued { attempt, pool } => tracing::info_span!(
                names::STREAM_QUEUED,
                warden.session.key = key,
                gen_ai.conversation.id = conv,
                warden.turn = attempt.turn,
                warden.attempt = attempt.attempt,
                warden.pool = pool,
                warden.wait_ms = Empty,
            ),
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
                phase,
                silent_for,
                timeout,
            } => tracing::info_span!(
                names::STREAM_TIMEOUT,
                warden.session.key = key,
                gen_ai.conversation.id = conv,
                warden.attempt = attempt.attempt,
                stream.phase = phase.as_str(),
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
            Self::ContinueScheduled {
                failed,
                delay,
                error_code,
                kept_bytes,
                retries,
            } => {
                let span = tracing::info_span!(
                    names::STREAM_CONTINUE,
                    warden.session.key = key,
                    gen_ai.conversation.id = conv,
                    warden.attempt = failed.attempt + 1,
                    warden.delay_ms = millis(delay),
                    warden.kept_bytes = kept_bytes,
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
            Self::TurnDeadline { turn, after } => tracing::warn_span!(
                names::SESSION_TURN_DEADLINE,
                warden.session.key = key,
                gen_ai.conversation.id = conv,
                warden.turn = turn,
                warden.deadline_ms = millis(after),
                error.r#type = "ETURN_DEADLINE",
                otel.status_code = "ERROR",
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
            | Self::AttemptAdmitted { .. }
            | Self::ContextUsage(_)
            | Self::TurnFinished { .. }
            | Self::SessionStopped { .. }
            | Self::FreshFallback { .. }
            | Self::SessionFailed { .. }
            | Self::StoreFailed { .. } => tracing::Span::none(),
        }
    }

    /// Records what a transition without its own span adds to its parent:
    /// a finished turn's outcome onto `session.turn`, an admission's wait
    /// onto `stream.queued`.
    pub(super) fn finish_onto(&self, turn_span: &tracing::Span, conversation: Option<&str>) {
        if let Self::AttemptAdmitted { waited, .. } = *self {
            turn_span.record("warden.wait_ms", millis(waited));
            return;
        }
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
    pub(super) fn log(&self, key: &SessionKey) {
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
            Self::AttemptQueued { attempt, pool } => tracing::info!(
                event, session.key = %key, turn = attempt.turn, attempt = attempt.attempt, pool,
                "waiting for admission"
            ),
            Self::AttemptAdmitted { attempt, waited } => tracing::info!(
                event, session.key = %key, turn = attempt.turn, attempt = attempt.attempt,
                wait_ms = millis(waited), "admitted"
            ),
            Self::WatchdogKill { watch_id, .. } => {
                tracing::debug!(event, session.key = %key, watch_id, "watchdog killed the stream")
            }
            Self::StreamTimedOut {
                attempt,
                silent_for,
                phase,
                ..
            } => tracing::warn!(
                event, session.key = %key, turn = attempt.turn, attempt = attempt.attempt,
                stream.phase = phase.as_str(),
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
            Self::ContinueScheduled {
                failed,
                delay,
                error_code,
                kept_bytes,
                ..
            } => tracing::info!(
                event, session.key = %key, turn = failed.turn, attempt = failed.attempt,
                delay_ms = millis(delay), error.r#type = error_code, kept_bytes,
                "continuing the broken reply"
            ),
            Self::TurnCancelled { turn } => {
                tracing::info!(event, session.key = %key, turn, "turn cancelled by user")
            }
            Self::TurnDeadline { turn, after } => tracing::warn!(
                event, session.key = %key, turn, deadline_ms = millis(after),
                error.r#type = "ETURN_DEADLINE", "turn exceeded its deadline; stopped"
            ),
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
    pub(super) fn lifecycle(&self, key: &SessionKey) -> Option<LifecycleEvent> {
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
            Self::AttemptQueued { attempt, pool } => LifecycleEvent::AttemptQueued {
                key,
                attempt,
                pool: pool.to_owned(),
            },
            Self::AttemptAdmitted { attempt, waited } => LifecycleEvent::AttemptAdmitted {
                key,
                attempt,
                waited,
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
            Self::ContinueScheduled {
                failed,
                delay,
                error_code,
                kept_bytes,
                ..
            } => LifecycleEvent::ContinueScheduled {
                key,
                failed,
                delay,
                error_code,
                kept_bytes,
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
            Self::WatchdogKill { .. } | Self::TurnCancelled { .. } | Self::TurnDeadline { .. } => {
                return None;
            }
        })
    }
}
