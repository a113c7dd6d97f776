//! The trace a turn runs in — its own, rooted at its `turn_started` span,
//! set each time it starts (again in a fresh session after a resume
//! failure) — and what a re-delivered turn says there of its life before
//! ([`Redelivery`], the `turn_redelivered` span).

use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::source::SessionKey;
use crate::spans::TraceAnchor;
use crate::transition::{At, Parent, Transition};

/// The root span of the trace a turn runs in, once it started, and every
/// trace it ran in, oldest first.
#[derive(Debug)]
pub(super) struct RanIn {
    root: watch::Sender<Option<SpanContext>>,
    all: Mutex<Vec<TraceId>>,
}

impl RanIn {
    pub(super) fn new() -> Self {
        Self {
            root: watch::channel(None).0,
            all: Mutex::default(),
        }
    }

    /// The turn (again) runs under `root`, its `turn_started` span (an
    /// invalid one without an OpenTelemetry layer: it started, untraced).
    pub(super) fn set(&self, root: &SpanContext) {
        if root.is_valid() {
            let mut all = self.all.lock();
            if all.last() != Some(&root.trace_id()) {
                all.push(root.trace_id());
            }
        }
        self.root.send_replace(Some(root.clone()));
    }

    /// The latest trace, hex.
    pub(super) fn trace_id(&self) -> Option<String> {
        self.all.lock().last().map(TraceId::to_string)
    }

    /// Every trace, oldest first, hex.
    pub(super) fn trace_ids(&self) -> Vec<String> {
        self.all.lock().iter().map(TraceId::to_string).collect()
    }

    /// The root span once the turn started (invalid when untraced).
    async fn started(&self) -> SpanContext {
        let mut rx = self.root.subscribe();
        let root = match rx.wait_for(Option::is_some).await {
            Ok(root) => root.clone(),
            // Never: `self` holds the sender.
            Err(_) => None,
        };
        root.unwrap_or_else(SpanContext::empty_context)
    }

    /// Records `before` under the turn's root once it started (a
    /// `turn_redelivered` span); nothing without an OpenTelemetry layer.
    pub(super) async fn record(&self, key: &SessionKey, turn: u64, before: &Redelivery) {
        let root = self.started().await;
        if !root.is_valid() {
            return;
        }
        let previous = before.previous();
        let span = Transition::TurnRedelivered {
            turn,
            cause: &before.cause,
            previous_trace: before.previous_trace.as_deref(),
            previous: previous.as_ref(),
            events_delivered: before.events_delivered,
            node: before.node.as_deref(),
        }
        .record(At {
            key,
            conversation: None,
            parent: Parent::Anchor(&TraceAnchor::under(root)),
            bus: None,
        });
        drop(span);
    }
}

/// What happened to a turn before it was re-delivered (its session
/// stopped without answering it: a crash, a node lost or drained, a
/// database outage), said in its new trace by
/// [`TurnCanceller::record_redelivery`](crate::TurnCanceller::record_redelivery).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Redelivery {
    /// Why (`ENODE_LOST`, `ENODE_DRAINED`, `ESTORE_UNREACHABLE`): the code
    /// its clients were told.
    pub cause: String,
    /// The trace it was accepted in (hex): its earlier incarnation's.
    pub previous_trace: Option<String>,
    /// That trace's span it hung from (hex): the incarnation's anchor.
    pub previous_span: Option<String>,
    /// How many events its clients already had.
    pub events_delivered: u64,
    /// The node that re-delivers it, on a cluster.
    pub node: Option<String>,
}

impl Redelivery {
    /// Re-delivered for `cause`, its clients holding `events_delivered`
    /// events.
    pub fn new(cause: impl Into<String>, events_delivered: u64) -> Self {
        Self {
            cause: cause.into(),
            previous_trace: None,
            previous_span: None,
            events_delivered,
            node: None,
        }
    }

    /// Accepted under span `span` of trace `trace` (hex ids), linked.
    pub fn after(mut self, trace: Option<String>, span: Option<String>) -> Self {
        self.previous_trace = trace;
        self.previous_span = span;
        self
    }

    /// Re-delivered by `node`.
    pub fn on_node(mut self, node: Option<String>) -> Self {
        self.node = node;
        self
    }

    /// The span it was accepted under, when both ids are known and valid.
    fn previous(&self) -> Option<SpanContext> {
        let trace = TraceId::from_hex(self.previous_trace.as_deref()?).ok()?;
        let span = SpanId::from_hex(self.previous_span.as_deref()?).ok()?;
        let context = SpanContext::new(
            trace,
            span,
            TraceFlags::SAMPLED,
            true,
            TraceState::default(),
        );
        context.is_valid().then_some(context)
    }
}
