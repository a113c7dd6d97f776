//! The session actor's state: the record, the queue, the running turn and
//! its resources (stream, timers, spans).

use std::collections::VecDeque;
use std::sync::Arc;

use opentelemetry::trace::SpanContext;
use ractor::{ActorRef, MessagingErr};
use rand::rngs::SmallRng;
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;

use crate::admission::{Admission, AdmissionPermit};
use crate::event::Usage;
use crate::lifecycle::EventBus;
use crate::notify::Notifier;
use crate::source::{EventSource, SessionKey};
use crate::spans::TraceAnchor;
use crate::store::{SessionRecord, SessionStore};
use crate::stream::{Credit, StreamHandle};
use crate::transition::{At, Parent};
use crate::watchdog::WatchdogHandle;

use super::SessionConfig;
use super::escalation::EscalationSink;
use super::handle::{SessionMsg, TurnEvent, TurnSender};
use super::turn::{StartMode, TurnMachine};

/// What a session needs to start.
#[derive(Clone)]
pub(crate) struct SessionArgs {
    /// The session's key.
    pub(crate) key: SessionKey,
    /// Its stored record (a new one for a new session).
    pub(crate) record: SessionRecord,
    /// Where its turns' streams come from.
    pub(crate) source: Arc<dyn EventSource>,
    /// The watchdog its streams register with.
    pub(crate) watchdog: WatchdogHandle,
    /// Admits its streams (limits, shared backoff).
    pub(crate) admission: Admission,
    /// The admission pool its streams count against.
    pub(crate) pool: Arc<str>,
    /// Configuration.
    pub(crate) config: SessionConfig,
    /// Where lifecycle events go.
    pub(crate) bus: EventBus,
    /// Where records are written.
    pub(crate) store: Arc<dyn SessionStore>,
    /// Tells the user about recovered replies.
    pub(crate) notifier: Arc<dyn Notifier>,
    /// Where escalations go; without one, a resume failure ends the turn
    /// with a fatal error.
    pub(crate) escalate: Option<EscalationSink>,
    /// Where the turns of messages recovered at start go (their callers
    /// are gone); without it they are answered through the notifier.
    pub(crate) recovered: Option<tokio::sync::mpsc::UnboundedSender<crate::RecoveredTurn>>,
    /// How to start.
    pub(crate) mode: StartMode,
    /// The previous incarnation's trace anchor, linked from this one's.
    pub(crate) previous: Option<TraceAnchor>,
    /// Cancelled when the supervisor starts stopping its sessions: from
    /// then on no attempt opens a stream (an attempt admitted during a
    /// shutdown stays pending, for the next start).
    pub(crate) closing: tokio_util::sync::CancellationToken,
}

/// What the actor's loop does after a handler ran: handlers say it
/// instead of calling the files that start turns and attempts, so the
/// loop is the one place a turn moves on from.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Next {
    /// Nothing more now: a message, a timer or a stream report comes next.
    Wait,
    /// Begin the running turn's next attempt.
    StartAttempt,
    /// The turn ended: start the next queued one, or arm the idle check.
    StartNextTurn,
}

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
    /// Whether `text` is the whole reply (a recovered turn's offered text
    /// whose upstream had finished it): the next continuation says so
    /// ([`Continuation::complete`](crate::Continuation::complete)).
    pub(super) complete: bool,
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
    /// Notes activity: the idle clock starts again and an armed idle
    /// check goes stale.
    pub(super) fn touch(&mut self) {
        self.activity += 1;
        self.last_active = Instant::now();
        self.idle_timer = None;
    }

    /// Arms the idle check when nothing runs or waits.
    pub(super) fn arm_idle(&mut self, myself: &ActorRef<SessionMsg>) {
        let idle = self.args.config.idle_timeout;
        if idle.is_zero() || self.turn.is_some() || !self.queue.is_empty() {
            return;
        }
        let activity = self.activity;
        let timer = myself.send_after(idle, move || SessionMsg::IdleCheck(activity));
        self.idle_timer = Some(AbortOnDropHandle::new(timer));
    }

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
