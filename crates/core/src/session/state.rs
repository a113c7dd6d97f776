//! The session actor's state: the record, the queue, the running turn and
//! its resources (stream, timers, spans).

use std::collections::VecDeque;

use opentelemetry::trace::SpanContext;
use ractor::MessagingErr;
use rand::rngs::SmallRng;
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;

use crate::admission::AdmissionPermit;
use crate::event::Usage;
use crate::spans::TraceAnchor;
use crate::store::SessionRecord;
use crate::stream::{Credit, StreamHandle};
use crate::transition::{At, Parent};

use super::actor::SessionArgs;
use super::handle::{SessionMsg, TurnEvent, TurnSender};
use super::turn::TurnMachine;

/// A timer task that dies with the state that owns it.
pub(super) type Timer = AbortOnDropHandle<Result<(), MessagingErr<SessionMsg>>>;

/// A message waiting for its turn, with its caller's channel.
pub(super) struct Queued {
    pub(super) message: crate::store::PendingMessage,
    pub(super) reply: Option<TurnSender>,
    /// A recovered turn's relay's answer: the reply text its callers have,
    /// to continue (see [`crate::ContinueFrom`]).
    pub(super) continue_from: Option<tokio::sync::oneshot::Receiver<Option<crate::Continuation>>>,
    /// Re-delivered from the record: its session stopped (a crash, a node
    /// lost) before answering it.
    pub(super) recovered: bool,
}

/// An attempt waiting for admission.
pub(super) struct Admitting {
    /// Awaits the admission ticket; dropping it leaves the queue.
    pub(super) _task: AbortOnDropHandle<()>,
    /// `attempt_queued`, open while it waits.
    pub(super) span: crate::spans::Lasting,
    /// Since when.
    pub(super) since: Instant,
}

/// The running turn: its rules ([`TurnMachine`]) and its resources.
pub(super) struct Turn {
    pub(super) machine: TurnMachine,
    pub(super) queued: Queued,
    /// When the turn started.
    pub(super) started: Instant,
    /// The attempt waiting for admission, if one waits.
    pub(super) admitting: Option<Admitting>,
    /// The running attempt's admission; its slot is freed when dropped.
    pub(super) permit: Option<AdmissionPermit>,
    /// The turn's wall-clock cap; dropping it disarms it.
    pub(super) _deadline: Option<Timer>,
    /// `turn_started`, open while the turn runs.
    pub(super) span: crate::spans::Lasting,
    /// `attempt_started` of the running attempt.
    pub(super) attempt_span: Option<super::attempt::RunningAttempt>,
    /// The span of the last failed attempt, linked from the next one.
    pub(super) last_attempt: Option<SpanContext>,
    /// The running attempt's stream.
    pub(super) stream: Option<StreamHandle>,
    /// The pending retry; dropping it cancels the retry.
    pub(super) backoff: Option<Timer>,
    /// Last usage report of the attempt.
    pub(super) usage: Option<Usage>,
    /// Last usage report carrying context (input side) tokens.
    pub(super) context_usage: Option<Usage>,
    pub(super) context_window: Option<u64>,
    pub(super) text: String,
    /// Bytes of text, thinking and tool input streamed so far, every
    /// attempt counted (for [`SessionConfig::max_reply_bytes`](super::SessionConfig)).
    pub(super) reply_bytes: usize,
}

impl Turn {
    pub(super) fn send(&self, ev: TurnEvent) {
        self.send_with(ev, Credit::none());
    }

    pub(super) fn send_with(&self, ev: TurnEvent, credit: Credit) {
        if let Some(r) = &self.queued.reply {
            r.send_with(ev, credit);
        }
    }
}

/// State of the session actor.
pub(crate) struct SessionState {
    pub(super) args: SessionArgs,
    pub(super) record: SessionRecord,
    pub(super) queue: VecDeque<Queued>,
    pub(super) turn: Option<Turn>,
    pub(super) turns_finished: u64,
    pub(super) rng: SmallRng,
    /// Bumped on every activity; an idle check for an older value is stale.
    pub(super) activity: u64,
    pub(super) last_active: Instant,
    pub(super) idle_timer: Option<Timer>,
    /// Set once the session escalated: it answers nothing more and writes
    /// nothing more (the supervisor owns the record now).
    pub(super) escalated: bool,
    pub(super) anchor: TraceAnchor,
    /// The span of this incarnation's last turn, linked from the next.
    pub(super) last_turn: Option<opentelemetry::trace::SpanContext>,
}

impl SessionState {
    /// Where a transition of this session is recorded.
    pub(super) fn at<'a>(&'a self, parent: Parent<'a>) -> At<'a> {
        At {
            key: &self.args.key,
            conversation: self.record.agent_session_id.as_deref(),
            parent,
            bus: Some(&self.args.bus),
        }
    }
}
