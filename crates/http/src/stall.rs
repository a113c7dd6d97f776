//! A request body that stalls: one that sends nothing for the header
//! timeout while the application waits for it.
//!
//! hyper's header-read timeout ends with the head; past it a client may
//! declare a body (`Content-Length: 100`) and never send it, and the
//! handler reading it waits for ever, its connection slot held. Every
//! request body is read through [`Watched`]: while the application waits
//! for the next frame and none comes within the timeout, the read fails
//! with [`BodyStalled`] and the request's [`Stall`] flag is raised; the
//! server answers the request `408` instead of whatever the application
//! was doing, and the connection closes.
//!
//! The timer runs only while the application waits for the body (a body
//! nobody reads stalls nothing) and restarts at each frame: a slow upload
//! that keeps sending is not cut off.

use std::future::Future as _;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;

/// The error a stalled body's read ends with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct BodyStalled;

impl std::fmt::Display for BodyStalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the request body sent nothing within the header timeout")
    }
}

impl std::error::Error for BodyStalled {}

/// Raised when a request's body stalled.
pub(crate) type Stall = CancellationToken;

/// A request body whose reads fail with [`BodyStalled`] after `timeout`
/// without a frame.
pub(crate) struct Watched {
    body: Incoming,
    timeout: Duration,
    /// Armed while a read waits; `None` until the first wait.
    timer: Option<Pin<Box<Sleep>>>,
    /// Whether `timer` runs for the read under way.
    armed: bool,
    stall: Stall,
}

impl Watched {
    pub(crate) fn new(body: Incoming, timeout: Duration, stall: Stall) -> Self {
        Self {
            body,
            timeout,
            timer: None,
            armed: false,
            stall,
        }
    }
}

impl Body for Watched {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if this.stall.is_cancelled() {
            return Poll::Ready(Some(Err(Box::new(BodyStalled))));
        }
        if let Poll::Ready(frame) = Pin::new(&mut this.body).poll_frame(cx) {
            this.armed = false;
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        let deadline = Instant::now() + this.timeout;
        let timer = this
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if !this.armed {
            timer.as_mut().reset(deadline);
            this.armed = true;
        }
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => {
                this.stall.cancel();
                Poll::Ready(Some(Err(Box::new(BodyStalled))))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
