//! A watched request's state: the [`Pump`] that its handlers share (the
//! attempt being read, the splice, the access record), what a pull of it
//! gives ([`Step`]), and an attempt's frames and failure. The handlers
//! (`attempt`, `recover`, `pump`'s loop, `whole`, the entry in `watched`)
//! sit above it and return what happens next; this file calls none of
//! them.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use futures_util::{Stream, StreamExt as _};
use serde_json::Value;
use tokio::time::Instant;
use warden_core::StreamError;
use warden_core::watchdog::{Stopped, WatchError, Watched};
use warden_llm::sse::{Parsed, SseParser};

use super::passthrough::Logged;
use super::{Inner, past_deadline, shutting_down};
use crate::access::{AccessRecord, Outcome};
use crate::splice::Splice;
use crate::upstream::{Protocol, Upstream};

/// What the next pull of a watched request gives.
pub(super) enum Step {
    /// The first bytes of the stream, and the response's headers.
    Head(HeaderMap, Bytes),
    /// More bytes of the stream.
    Chunk(Bytes),
    /// A whole answer instead of a stream (only before any byte was sent).
    Answer(Response),
    /// The stream is over.
    End,
}

/// A watched request's attempts, pulled one chunk at a time by whoever
/// sends the response.
pub(super) struct Pump {
    pub(super) inner: Arc<Inner>,
    pub(super) upstream: Upstream,
    pub(super) url: String,
    pub(super) headers: HeaderMap,
    pub(super) original: Value,
    pub(super) original_bytes: Bytes,
    /// The next attempt's request body.
    pub(super) body: Bytes,
    pub(super) splice: Box<dyn Splice>,
    /// Its API, whose decoder judges each attempt's progress.
    pub(super) protocol: Protocol,
    /// The client has bytes of the stream (and its head).
    pub(super) sent: bool,
    pub(super) done: bool,
    pub(super) attempts: u32,
    pub(super) current: Option<Current>,
    /// A break found after output that was returned first.
    pub(super) pending: Option<Failure>,
    /// What [`read`](Self::read) writes the client's bytes into; empty
    /// between reads, its capacity kept (no growth per event).
    pub(super) out: String,
    pub(super) rng: rand::rngs::SmallRng,
    /// When the request must be over (`ProxyConfig::deadline`), if ever.
    pub(super) deadline: Option<Instant>,
    /// The next request sent is a continuation (counted when it is sent:
    /// a client gone during the backoff before it leaves none).
    pub(super) continuing: bool,
    /// The protocol of an answer assembled here (a client that asked for
    /// no stream): the client sees none of it until it is whole, so a
    /// stream that cannot be continued is started over unseen.
    pub(super) assembled: Option<Protocol>,
    /// The current attempt's response head came (an event stream).
    pub(super) headed: bool,
    /// The current attempt carried content (the progress rule's: text,
    /// thinking, a tool call, the reply's end).
    pub(super) content: bool,
    /// Attempts killed for silence after their head, before any content:
    /// when they are all of them, the whole answer may be asked for
    /// without a stream (`fallback`).
    pub(super) silent: u32,
    pub(super) logged: Logged,
}

impl Pump {
    pub(super) fn record(&mut self) -> &mut AccessRecord {
        self.logged.record.get_or_insert_with(|| AccessRecord {
            id: 0,
            upstream: "",
            method: String::new(),
            path: String::new(),
            status: 0,
            duration_ms: 0,
            attempts: 0,
            kills: 0,
            continuations: 0,
            outcome: Outcome::ClientGone,
            code: None,
        })
    }

    pub(super) fn end(&mut self, outcome: Outcome) {
        self.done = true;
        self.current = None;
        let r = self.record();
        r.outcome = outcome;
        if r.status == 0 {
            r.status = 200;
        }
    }
}

/// The attempt being read.
pub(super) struct Current {
    pub(super) frames: Watched<Frames, Parsed>,
    /// The progress rule, as a session's decoder judges this stream.
    pub(super) progress: warden_llm::Progress,
    pub(super) headers: HeaderMap,
    pub(super) span: tracing::Span,
}

/// Why an attempt broke.
pub(super) struct Failure {
    pub(super) error: StreamError,
    /// The watchdog killed it (silence or no progress).
    pub(super) killed: bool,
    /// The upstream's own error answer, if it gave one.
    pub(super) answer: Option<Box<(StatusCode, HeaderMap, Bytes)>>,
    /// The upstream could not be reached and its circuit is open: the
    /// request ends now, naming the cause.
    pub(super) circuit_open: bool,
}

impl Failure {
    pub(super) fn of(error: StreamError) -> Self {
        Self {
            error,
            killed: false,
            answer: None,
            circuit_open: false,
        }
    }

    /// The watch stopped the attempt.
    pub(super) fn stopped(stop: Stopped) -> Self {
        match stop {
            Stopped::Expired(_) | Stopped::NoProgress(_) => Self {
                error: stop.error().unwrap_or_else(shutting_down),
                killed: true,
                answer: None,
                circuit_open: false,
            },
            Stopped::Deadline => Self::of(past_deadline()),
            // The proxy's token: it is shutting down.
            Stopped::Cancelled => Self::of(shutting_down()),
            other => Self::of(other.error().unwrap_or_else(shutting_down)),
        }
    }

    pub(super) fn watch(error: WatchError) -> Self {
        match error {
            WatchError::Source(e) => Self::of(e),
            WatchError::Stopped(stop) => Self::stopped(stop),
        }
    }
}

/// An upstream body as SSE frames: the parser fed chunk by chunk, frames
/// completed before a break still given, then the break.
pub(super) struct Frames {
    body: crate::client::UpstreamBody,
    parser: SseParser,
    parsed: VecDeque<Parsed>,
    error: Option<StreamError>,
}

impl Frames {
    /// The frames of `body`, none larger than `max_frame_bytes`.
    pub(super) fn new(body: crate::client::UpstreamBody, max_frame_bytes: usize) -> Self {
        Self {
            body,
            parser: SseParser::new(max_frame_bytes),
            parsed: VecDeque::new(),
            error: None,
        }
    }

    /// Frames already parsed and not yet given.
    pub(super) fn buffered(&self) -> usize {
        self.parsed.len()
    }
}

impl Stream for Frames {
    type Item = Result<Parsed, StreamError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if let Some(frame) = this.parsed.pop_front() {
                return Poll::Ready(Some(Ok(frame)));
            }
            if let Some(error) = this.error.take() {
                return Poll::Ready(Some(Err(error)));
            }
            match std::task::ready!(this.body.poll_next_unpin(cx)) {
                Some(Ok(bytes)) => {
                    if let Err(e) = this.parser.feed(&bytes, &mut this.parsed) {
                        this.error = Some(e);
                    }
                }
                Some(Err(why)) => {
                    this.error = Some(StreamError::Connection { message: why });
                }
                None => {
                    this.error = Some(StreamError::Truncated {
                        message: "the upstream closed the stream before its last event".to_owned(),
                    });
                }
            }
        }
    }
}
