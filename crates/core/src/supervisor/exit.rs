//! When a session stops: restart it or give it up per policy, tell its
//! stop once (`SessionStopped`), and stop every session at the shutdown.

use ractor::{ActorId, ActorProcessingErr, ActorRef};
use tokio::time::Instant;

use crate::policy::RestartDecision;
use crate::session::{SessionHandle, StopReason};
use crate::source::SessionKey;
use crate::spans::TraceAnchor;
use crate::store::{Durability, RecordStatus};
use crate::transition::{Parent, Transition};

use super::state::{SupervisorMsg, SupervisorState};

impl SupervisorState {
    /// A session exited; restart or give up per policy.
    pub(super) async fn on_exit(
        &mut self,
        myself: &ActorRef<SupervisorMsg>,
        id: ActorId,
        abnormal: bool,
        cause: String,
    ) -> Result<(), ActorProcessingErr> {
        let Some(key) = self.by_id.remove(&id) else {
            // Let go of before it exited (replaced, evicted, failed): it
            // stopped, and that is all.
            if let Some((key, h, _)) = self.stopping.remove(&id) {
                Transition::SessionStopped {
                    reason: &cause,
                    abnormal,
                }
                .record(self.at(&key, Parent::Anchor(h.anchor())));
            }
            return Ok(());
        };
        let mut anchor = TraceAnchor::default();
        if self
            .sessions
            .get(&key)
            .is_some_and(|h| h.actor().get_id() == id)
            && let Some(h) = self.sessions.remove(&key)
        {
            anchor = h.anchor().clone();
        }
        Transition::SessionStopped {
            reason: &cause,
            abnormal,
        }
        .record(self.at(&key, Parent::Anchor(&anchor)));
        let deliberate = StopReason::parse(&cause).is_some_and(StopReason::is_deliberate);
        // A newer incarnation already serves the key: nothing to restart.
        let replaced = self.sessions.contains_key(&key);
        let (restart, intensity) = self
            .policies
            .get(&key)
            .copied()
            .unwrap_or((self.config.restart, self.config.intensity));
        if deliberate || replaced || !restart.should_restart(abnormal) {
            return Ok(());
        }
        let decision = self
            .trackers
            .entry(key.clone())
            .or_default()
            .on_failure(intensity, Instant::now());
        match decision {
            RestartDecision::Restart(n) => {
                let wait = intensity.delay(n);
                if wait.is_zero() {
                    self.restart(myself, key, n, cause, anchor).await;
                } else {
                    drop(myself.send_after(wait, move || SupervisorMsg::Restart {
                        key,
                        n,
                        cause,
                        anchor,
                    }));
                }
            }
            RestartDecision::Escalate => self.give_up(key, cause, &anchor).await,
        }
        Ok(())
    }

    /// Restarts `key` (restart number `n` inside its window, for `cause`),
    /// unless something came first while its restart waited: a message
    /// started it again, it was given up or reset, or the sessions are
    /// being stopped.
    pub(super) async fn restart(
        &mut self,
        myself: &ActorRef<SupervisorMsg>,
        key: SessionKey,
        n: u32,
        cause: String,
        anchor: TraceAnchor,
    ) {
        if self.sessions.contains_key(&key)
            || self.given_up.contains_key(&key)
            || self.closing.is_cancelled()
        {
            return;
        }
        drop(
            Transition::Restarted {
                restarts_in_window: n,
                cause: &cause,
            }
            .record(self.at(&key, Parent::Anchor(&anchor))),
        );
        if let Err(e) = self
            .spawn_session(myself, key.clone(), None, Some(anchor.clone()))
            .await
        {
            self.give_up(key, format!("{cause}; restart failed: {e}"), &anchor)
                .await;
        }
    }

    /// Restart intensity exceeded: stop restarting `key` and mark its record
    /// failed (flushed), so an orchestrator restart does not bring it back
    /// until [`Supervisor::reset`](super::Supervisor::reset).
    pub(super) async fn give_up(&mut self, key: SessionKey, cause: String, anchor: &TraceAnchor) {
        self.persist_failed(&key, &cause).await;
        drop(Transition::GivenUp { cause: &cause }.record(self.at(&key, Parent::Anchor(anchor))));
        self.given_up.insert(key, cause);
    }

    /// Marks `key`'s record `Failed { reason }`, flushed. The session is not
    /// running: the supervisor is its record's only writer now.
    pub(super) async fn persist_failed(&self, key: &SessionKey, reason: &str) {
        match self.store.load(key).await {
            Ok(Some(mut record)) => {
                record.status = RecordStatus::Failed {
                    reason: reason.to_owned(),
                };
                if let Err(e) = self.store.save(&record, Durability::Flushed).await {
                    self.store_failed(key, &e);
                }
            }
            Ok(None) => {}
            Err(e) => {
                self.store_failed(key, &e);
            }
        }
    }
}

/// Stops every session still here (running, or let go of but not yet
/// exited) and waits for each (its stream released first); each publishes
/// its `SessionStopped`, its exit never reaching the supervisor now.
pub(super) async fn stop_sessions(myself: &ActorRef<SupervisorMsg>, state: &mut SupervisorState) {
    // First, before any session stops: a stopping session frees its
    // admission slot, and a session queued behind it could otherwise be
    // admitted and open its stream before its own stop is read (ractor
    // takes a ready message and a ready stop in either order).
    state.closing.cancel();
    state.by_id.clear();
    let mut sessions: Vec<(SessionKey, SessionHandle, StopReason)> = state
        .sessions
        .drain()
        .map(|(key, h)| (key, h, StopReason::Shutdown))
        .collect();
    sessions.extend(state.stopping.drain().map(|(_, held)| held));
    for (_, h, _) in &sessions {
        h.actor().unlink(myself.get_cell());
    }
    let wait = state.config.shutdown.session;
    let stops = sessions.iter().map(|(_, h, _)| {
        h.actor()
            .stop_and_wait(Some(StopReason::Shutdown.as_str().into()), Some(wait))
    });
    futures_util::future::join_all(stops).await;
    for (key, h, why) in &sessions {
        Transition::SessionStopped {
            reason: why.as_str(),
            abnormal: false,
        }
        .record(state.at(key, Parent::Anchor(h.anchor())));
    }
}
