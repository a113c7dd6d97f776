//! The response body: a script of [`Step`]s played frame by frame.
//!
//! Each [`Step::Frame`] becomes one HTTP body chunk (one SSE event). A
//! [`Step::Sleep`] makes the body pending, which is when hyper flushes what
//! it has: every frame reaches the socket before the next pause. A
//! [`Step::Hold`] stays pending forever (the `stall` scenario), and
//! [`Step::Abort`] fails the body, which makes hyper drop the connection
//! without the final chunk (`abrupt-close`).
//!
//! The [`Tracker`] inside a streaming body reports to the journal; if the
//! body is dropped before it finished, hyper gave up on the connection:
//! the client closed it (or the server is shutting down).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::{Body, Bytes, Frame, SizeHint};
use tokio::time::Sleep;

use crate::journal::{Journal, Outcome, RequestId};

/// Error type of the body; only [`Step::Abort`] produces one.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One step of a response body script.
#[derive(Debug)]
pub(crate) enum Step {
    /// Send these bytes as one chunk.
    Frame(Bytes),
    /// Wait (the body is pending, hyper flushes).
    Sleep(Duration),
    /// Be pending once so hyper flushes, then go on at once.
    Flush,
    /// Be pending forever, with the socket open.
    Hold,
    /// Fail the body: hyper closes the connection mid-response.
    Abort,
}

/// Reports one request's progress to the journal; reports `ClientClosed`
/// when dropped unfinished.
pub(crate) struct Tracker {
    journal: Arc<Journal>,
    id: RequestId,
    frames: usize,
    finished: bool,
    stalled: bool,
}

impl Tracker {
    pub(crate) fn new(journal: Arc<Journal>, id: RequestId) -> Self {
        Self {
            journal,
            id,
            frames: 0,
            finished: false,
            stalled: false,
        }
    }

    pub(crate) fn frame(&mut self) {
        self.frames += 1;
        self.journal.frame(self.id);
    }

    pub(crate) fn stalled(&mut self) {
        if !self.stalled && !self.finished {
            self.stalled = true;
            self.journal.outcome(self.id, Outcome::Stalled, self.frames);
        }
    }

    pub(crate) fn finish(&mut self, outcome: Outcome) {
        if !self.finished {
            self.finished = true;
            self.journal.outcome(self.id, outcome, self.frames);
        }
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        let outcome = if self.journal.is_shutting_down() {
            Outcome::Interrupted
        } else {
            Outcome::ClientClosed
        };
        self.finish(outcome);
    }
}

/// The body of every response the mock sends.
pub(crate) struct MockBody {
    steps: VecDeque<Step>,
    sleep: Option<Pin<Box<Sleep>>>,
    tracker: Option<Tracker>,
    exact_len: Option<u64>,
}

impl MockBody {
    /// A plain body sent with `content-length`.
    pub(crate) fn full(bytes: impl Into<Bytes>) -> Self {
        let bytes: Bytes = bytes.into();
        let exact_len = Some(bytes.len() as u64);
        let steps = if bytes.is_empty() {
            VecDeque::new()
        } else {
            VecDeque::from([Step::Frame(bytes)])
        };
        Self {
            steps,
            sleep: None,
            tracker: None,
            exact_len,
        }
    }

    /// A streamed (chunked) body played step by step and reported through
    /// `tracker`.
    pub(crate) fn stream(steps: Vec<Step>, mut tracker: Tracker) -> Self {
        if steps.is_empty() {
            tracker.finish(Outcome::Completed);
        }
        Self {
            steps: steps.into(),
            sleep: None,
            tracker: Some(tracker),
            exact_len: None,
        }
    }
}

impl Body for MockBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            if let Some(sleep) = this.sleep.as_mut() {
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                this.sleep = None;
            }
            let Some(step) = this.steps.pop_front() else {
                if let Some(t) = this.tracker.as_mut() {
                    t.finish(Outcome::Completed);
                }
                return Poll::Ready(None);
            };
            match step {
                Step::Frame(bytes) => {
                    if let Some(t) = this.tracker.as_mut() {
                        t.frame();
                        if this.steps.is_empty() {
                            // The terminal frame is out: the server is done.
                            t.finish(Outcome::Completed);
                        }
                    }
                    return Poll::Ready(Some(Ok(Frame::data(bytes))));
                }
                Step::Sleep(d) => {
                    if !d.is_zero() {
                        this.sleep = Some(Box::pin(tokio::time::sleep(d)));
                    }
                }
                Step::Flush => {
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                Step::Hold => {
                    this.steps.push_front(Step::Hold);
                    if let Some(t) = this.tracker.as_mut() {
                        t.stalled();
                    }
                    // Nothing will ever wake this body: the connection is
                    // only woken by the client (close) or a shutdown.
                    return Poll::Pending;
                }
                Step::Abort => {
                    this.steps.clear();
                    if let Some(t) = this.tracker.as_mut() {
                        t.finish(Outcome::ServerClosed);
                    }
                    let err = std::io::Error::other("warden-mock: abrupt-close scenario");
                    return Poll::Ready(Some(Err(Box::new(err))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.steps.is_empty() && self.sleep.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match self.exact_len {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}
