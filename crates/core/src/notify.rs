//! Telling the user: the [`Notifier`] trait.
//!
//! A chat bridge implements it to post into the user's channel. warden
//! calls it when a session had to start fresh, when a session failed for
//! good, and to deliver the answer of a message recovered after a crash
//! (whose original caller is gone).

use crate::error::{ResumeCause, TurnError};
use crate::source::SessionKey;

/// Something the user should be told.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Notice {
    /// The stored conversation could not be resumed; the session started
    /// fresh and the user's message was re-delivered to it.
    FreshStart {
        /// The id that failed.
        failed_session_id: String,
        /// Why the conversation could not be resumed.
        cause: ResumeCause,
        /// The text to show the user.
        message: String,
    },
    /// The session failed for good (the fresh start failed too).
    SessionFailed {
        /// Both causes.
        reason: String,
        /// The text to show the user.
        message: String,
    },
    /// The answer to a message accepted before a crash or restart, whose
    /// original caller is gone.
    RecoveredReply {
        /// The pending message's id.
        message_id: u64,
        /// The relayed text (with the context indicator), or the error.
        result: Result<String, TurnError>,
    },
}

impl Notice {
    /// The user-facing text of a fresh start caused by `cause`, followed by
    /// the source's `note` about what survives a fresh start (for Claude
    /// Code: "Project context is preserved in CLAUDE.md."), if it has one
    /// ([`EventSource::fresh_start_note`](crate::EventSource::fresh_start_note)).
    pub fn fresh_start_message(cause: ResumeCause, note: Option<&str>) -> String {
        let what = match cause {
            ResumeCause::PromptTooLong | ResumeCause::BlockingLimit => {
                "Session context was too large to resume — starting fresh."
            }
            ResumeCause::UnknownSession => {
                "The previous conversation could not be found — starting fresh."
            }
            ResumeCause::OperatorReset => {
                "The session was stuck and has been restarted — starting fresh."
            }
        };
        match note {
            Some(note) => format!("{what} {note}"),
            None => what.to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fresh_start_text_names_the_cause_and_adds_only_the_sources_note() {
        let plain = Notice::fresh_start_message(ResumeCause::UnknownSession, None);
        assert_eq!(
            plain,
            "The previous conversation could not be found — starting fresh."
        );
        let noted = Notice::fresh_start_message(
            ResumeCause::PromptTooLong,
            Some("Project context is preserved in CLAUDE.md."),
        );
        assert_eq!(
            noted,
            "Session context was too large to resume — starting fresh. Project context is preserved in CLAUDE.md."
        );
        assert!(
            Notice::fresh_start_message(ResumeCause::BlockingLimit, None).contains("too large")
        );
    }
}

/// Delivers [`Notice`]s to the user. Must not block.
pub trait Notifier: Send + Sync + 'static {
    /// Delivers `notice` for session `key`.
    fn notify(&self, key: &SessionKey, notice: Notice);
}

/// A [`Notifier`] that only logs (the default).
#[derive(Debug, Clone, Copy, Default)]
pub struct LogNotifier;

impl Notifier for LogNotifier {
    fn notify(&self, key: &SessionKey, notice: Notice) {
        match notice {
            Notice::FreshStart { message, .. } | Notice::SessionFailed { message, .. } => {
                tracing::warn!(session.key = %key, "{message}");
            }
            Notice::RecoveredReply { message_id, result } => {
                tracing::info!(session.key = %key, message_id, ok = result.is_ok(), "recovered message answered");
            }
        }
    }
}

/// A [`Notifier`] sending every notice on a channel.
impl Notifier for tokio::sync::mpsc::UnboundedSender<(SessionKey, Notice)> {
    fn notify(&self, key: &SessionKey, notice: Notice) {
        let _ = self.send((key.clone(), notice));
    }
}
