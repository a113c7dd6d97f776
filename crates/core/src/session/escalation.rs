//! The contract between a session and its supervisor: what a session
//! escalates ([`Escalation`]) with the turns it hands over ([`Handoff`]),
//! and the typed reasons a session stops ([`StopReason`]).

use std::path::PathBuf;
use std::sync::Arc;

use crate::error::{StreamError, TurnError};
use crate::source::{Diagnostics, SessionKey};
use crate::spans::TraceAnchor;
use crate::store::{PendingMessage, SessionRecord};

use super::handle::TurnSender;

/// A turn handed from a failed session to its replacement.
#[derive(Debug)]
pub(crate) struct Handoff {
    /// The pending message.
    pub(crate) message: PendingMessage,
    /// The caller's channel, if the caller is still there.
    pub(crate) reply: Option<TurnSender>,
}

/// A stored conversation could not be resumed.
#[derive(Debug)]
pub(crate) struct ResumeFailure {
    /// The session.
    pub(crate) key: SessionKey,
    /// The id that failed to resume.
    pub(crate) failed_id: String,
    /// The error.
    /// Why it cannot be resumed (the error's own cause, or
    /// [`ResumeCause::OperatorReset`] for a recovery).
    pub(crate) cause: crate::error::ResumeCause,
    pub(crate) error: StreamError,
    /// The workspace (the agent's cwd).
    pub(crate) cwd: Option<PathBuf>,
    /// What the source knows (stderr tail, transcript size).
    pub(crate) diagnostics: Diagnostics,
    /// The session's record as last written.
    pub(crate) record: SessionRecord,
    /// Every unanswered turn, the failed one first.
    pub(crate) handoff: Vec<Handoff>,
    /// The failed incarnation's trace anchor.
    pub(crate) anchor: TraceAnchor,
}

/// What a session escalates to its supervisor.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // sent at most twice in a session's life
pub(crate) enum Escalation {
    /// Resume failed: start fresh and re-deliver.
    ResumeFailed(Box<ResumeFailure>),
    /// A fresh start after a resume failure failed too.
    FreshStartFailed {
        /// The session.
        key: SessionKey,
        /// The resume failure that led to the fresh start.
        first_cause: String,
        /// Why the fresh start failed.
        error: TurnError,
    },
}

/// Receives a session's escalations (the supervisor's mailbox).
pub(crate) type EscalationSink = Arc<dyn Fn(Escalation) + Send + Sync + 'static>;

/// Why a session actor stopped on its own, as its supervisor reads it.
///
/// ractor carries a stop reason as text; this is the one place that text
/// is written and read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StopReason {
    /// Idle for its idle timeout: never restarted, resumed on demand.
    Reaped,
    /// Handed its turns to the supervisor ([`Escalation`]): the supervisor
    /// owns what happens next.
    Escalated,
    /// Stopped by the supervisor's shutdown or a user.
    Shutdown,
    /// Its record is no longer this process's to write (the store refused a
    /// write with [`StoreError::LeaseLost`](crate::StoreError::LeaseLost),
    /// or [`Supervisor::evict`](crate::Supervisor::evict)): another node
    /// runs it. Never restarted here.
    Evicted,
}

impl StopReason {
    /// The text given to ractor.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Reaped => "reaped: idle",
            Self::Escalated => "escalated to supervisor",
            Self::Shutdown => "shutdown",
            Self::Evicted => "evicted: another node owns the session",
        }
    }

    /// The reason a stop text stands for, if it is one of these.
    pub(crate) fn parse(text: &str) -> Option<Self> {
        [Self::Reaped, Self::Escalated, Self::Shutdown, Self::Evicted]
            .into_iter()
            .find(|r| r.as_str() == text)
    }

    /// Whether the session stopped deliberately (never restarted).
    pub(crate) fn is_deliberate(self) -> bool {
        matches!(self, Self::Reaped | Self::Escalated | Self::Evicted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_reasons_read_back_what_they_wrote() {
        for r in [
            StopReason::Reaped,
            StopReason::Escalated,
            StopReason::Shutdown,
            StopReason::Evicted,
        ] {
            assert_eq!(StopReason::parse(r.as_str()), Some(r));
        }
        assert_eq!(StopReason::parse("boom"), None);
        assert!(StopReason::Reaped.is_deliberate());
        assert!(StopReason::Escalated.is_deliberate());
        assert!(!StopReason::Shutdown.is_deliberate());
        assert!(StopReason::Evicted.is_deliberate());
    }
}
