//! Resume failure → fresh session: the supervisor's half of the
//! escalation contract (`docs/runtime-semantics.md`, "Resume failure →
//! fresh session").

use ractor::ActorRef;

use crate::error::TurnError;
use crate::notify::Notice;
use crate::session::{Handoff, ResumeFailure, SessionActor, StartMode, StopReason, TurnEvent};
use crate::source::SessionKey;
use crate::store::{Durability, RecordStatus};
use crate::transition::{Parent, Transition};

use super::state::{SupervisorMsg, SupervisorState};

impl SupervisorState {
    /// A session could not resume its stored conversation: clear the id
    /// durably, start the session fresh with every unanswered turn, and
    /// tell the user.
    pub(super) async fn on_resume_failure(
        &mut self,
        myself: &ActorRef<SupervisorMsg>,
        f: ResumeFailure,
    ) {
        let ResumeFailure {
            key,
            failed_id,
            cause,
            error,
            cwd,
            diagnostics,
            mut record,
            handoff,
            anchor,
        } = f;
        drop(
            Transition::ResumeFailed {
                failed_id: &failed_id,
                cause,
                error: &error,
                workspace: cwd.as_deref(),
                diagnostics: &diagnostics,
            }
            .record(self.at(&key, Parent::Anchor(&anchor))),
        );
        self.forget(&key, StopReason::Escalated);
        // A fresh start is not a restart: `restart_count` counts crashes
        // restarted; the failed id moves to `past_session_ids`.
        record.clear_agent_session_id();
        record.status = RecordStatus::Active;
        if let Err(e) = self.store.save(&record, Durability::Flushed).await {
            let err = self.store_failed(&key, &e);
            fail_handoff(handoff, &format!("{error}; and {err}"));
            self.given_up
                .insert(key, format!("resume failed: {error}; {e}"));
            return;
        }
        let redelivered = handoff.len();
        let args = self.session_args(
            myself,
            key.clone(),
            record,
            StartMode::FreshFallback {
                cause,
                error: error.to_string(),
            },
            Some(anchor),
        );
        let note = args.source.fresh_start_note();
        match SessionActor::spawn(args, handoff, Some(myself.get_cell())).await {
            Ok((handle, _)) => {
                self.register(&key, &handle);
                Transition::FreshFallback {
                    failed_id: &failed_id,
                    redelivered,
                }
                .record(self.at(&key, Parent::Anchor(handle.anchor())));
                self.notifier.notify(
                    &key,
                    Notice::FreshStart {
                        message: Notice::fresh_start_message(cause, note.as_deref()),
                        failed_session_id: failed_id,
                        cause,
                    },
                );
            }
            Err(e) => {
                // The handoff went with the failed spawn: its callers see the
                // channel close; the messages stay pending in the record.
                let reason = format!("resume failed: {error}; fresh start failed: {e}");
                self.mark_failed(key, reason).await;
            }
        }
    }

    /// The session failed for good: mark its record failed (flushed), tell
    /// the user, refuse the key until reset.
    pub(super) async fn mark_failed(&mut self, key: SessionKey, reason: String) {
        self.forget(&key, StopReason::Escalated);
        self.persist_failed(&key, &reason).await;
        Transition::SessionFailed { reason: &reason }.record(self.at(&key, Parent::Root));
        self.notifier.notify(
            &key,
            Notice::SessionFailed {
                message: format!("This session could not be started and was stopped: {reason}"),
                reason: reason.clone(),
            },
        );
        self.given_up.insert(key, reason);
    }
}

/// Ends every handed-over turn with `SessionFailed { reason }`: the
/// session is given up.
fn fail_handoff(handoff: Vec<Handoff>, reason: &str) {
    for h in handoff {
        if let Some(r) = h.reply {
            r.send(TurnEvent::Finished(Err(TurnError::SessionFailed {
                reason: reason.to_owned(),
            })));
        }
    }
}
