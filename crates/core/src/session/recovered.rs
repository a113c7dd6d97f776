//! A turn recovered when its session starts with it still pending (after
//! a restart or a takeover): [`RecoveredTurn`], handed to whoever relays
//! it, and [`ContinueFrom`], its offer port for the text its callers
//! already have.

use std::time::Duration;

use crate::source::SessionKey;

use super::handle::TurnHandle;

/// A message accepted before a restart or a takeover, re-delivered by a
/// session that starts with it still pending, handed to the
/// [`SupervisorBuilder::recovered_turns`](crate::SupervisorBuilder::recovered_turns)
/// channel: its original caller is gone, so whoever takes this handle
/// relays its events (a server re-attaching its clients to the same turn).
/// A turn handed out this way is answered through its handle, not the
/// [`Notifier`](crate::Notifier)'s `RecoveredReply`.
#[derive(Debug)]
#[non_exhaustive]
pub struct RecoveredTurn {
    /// The session.
    pub key: SessionKey,
    /// The pending message's id (also the turn number of its canceller).
    pub message_id: u64,
    /// The key its sender stored with it
    /// ([`SendOptions::idempotency_key`](crate::SendOptions)).
    pub idempotency_key: Option<String>,
    /// The turn's events, as for a message sent now.
    pub handle: TurnHandle,
    /// Where the relay may offer the reply text the turn's callers already
    /// have (what an earlier node streamed of it before it died), so the
    /// turn continues that text instead of starting over.
    pub continue_from: ContinueFrom,
}

/// How long a session waits for a relay's answer on its
/// [`ContinueFrom`] before it starts a recovered turn from scratch.
pub(crate) const CONTINUE_FROM_WAIT: Duration = Duration::from_secs(5);

/// A recovered turn's offer port: [`offer`](Self::offer) the reply text its
/// callers already have, or drop it (the turn then starts from scratch).
/// The session waits for one or the other (at most 5 s) before the turn's
/// first attempt.
#[derive(Debug)]
pub struct ContinueFrom {
    tx: Option<tokio::sync::oneshot::Sender<Option<crate::Continuation>>>,
}

impl ContinueFrom {
    /// A port to a session that continues broken replies (its source
    /// [`continues`](crate::EventSource::continues)), or, for `None`, to
    /// one that does not (every offer is refused).
    pub(crate) fn new(
        tx: Option<tokio::sync::oneshot::Sender<Option<crate::Continuation>>>,
    ) -> Self {
        Self { tx }
    }

    /// Whether an offer can still be taken: the session's source
    /// continues broken replies and it has not started the turn without
    /// one (it waited too long).
    pub fn accepts(&self) -> bool {
        self.tx.as_ref().is_some_and(|tx| !tx.is_closed())
    }

    /// Offers `continuation`, the reply text the turn's callers have and
    /// the attempt that left it: `true` when the session takes it — the
    /// turn's first attempt then continues that text (callers keep it and
    /// receive only what follows, and the answer's text includes it) —
    /// `false` when it starts from scratch (callers discard what they had).
    pub fn offer(mut self, continuation: crate::Continuation) -> bool {
        self.tx
            .take()
            .is_some_and(|tx| tx.send(Some(continuation)).is_ok())
    }
}
