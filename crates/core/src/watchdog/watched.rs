//! One watched stream: [`Watch`] and [`Watched`], the engine a session's
//! attempt ([`StreamTask`](crate::stream::StreamTask)) and `warden proxy`'s
//! attempts both read through.
//!
//! A [`Watch`] is armed before the request is sent (so connecting and the
//! first byte are covered): one watchdog entry for silence, a second for
//! the progress allowance if one is set, an optional deadline and an
//! optional cancellation token. [`Watch::until`] races any future (opening
//! the stream, waiting for the consumer) against it; [`Watch::stream`]
//! wraps the opened stream in a [`Watched`], which beats the silence entry
//! on every item, beats the progress entry on items its rule calls
//! progress (or when the reader says so: [`Watched::progressed`]), and ends
//! in one typed way, a [`Stopped`]: silence past the allowance, no
//! progress, the deadline, a cancel, or an interrupt.
//!
//! A stop wins over an item that is ready at the same poll: a stream
//! killed by the watchdog yields nothing more. Per poll the check costs one
//! atomic load (plus the deadline's timer when one is set); the token is
//! watched by a waker of its own, never polled on the hot path.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures_util::Stream;
use futures_util::task::{ArcWake, AtomicWaker};
use parking_lot::Mutex;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use super::{Expiry, Heartbeat, WatchGuard, WatchId, WatchdogHandle};
use crate::error::{ActorError, StreamError};

/// Why a watched stream was stopped before it ended on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Stopped {
    /// Silent past its allowance: the watchdog killed it.
    Expired(Expiry),
    /// Frames arrived, but nothing the progress rule counts, for the
    /// progress allowance.
    NoProgress(Expiry),
    /// Its deadline passed.
    Deadline,
    /// Cancelled: by [`Stopper::cancel`] or the watch's token.
    Cancelled,
    /// Interrupted by [`Stopper::interrupt`] to be run again.
    Interrupted,
}

impl Stopped {
    /// The error a stream stopped this way ends with (retryable but for a
    /// cancel, which is `None`: the owner says what a cancel means).
    pub fn error(self) -> Option<StreamError> {
        match self {
            Self::Expired(expiry) => Some(expiry.into()),
            Self::NoProgress(expiry) => Some(StreamError::NoProgress {
                idle_for: expiry.silent_for,
                allowance: expiry.timeout,
            }),
            Self::Deadline => Some(StreamError::Interrupted {
                reason: "the deadline passed".to_owned(),
            }),
            Self::Interrupted => Some(StreamError::Interrupted {
                reason: "interrupted to run the turn again".to_owned(),
            }),
            Self::Cancelled => None,
        }
    }
}

/// An item a [`Watched`] stream could not give: its own error `E` (a
/// [`StreamError`] for warden's sources; an `io::Error`, a `reqwest::Error`
/// or any other for a stream of yours), or the watch's stop.
#[derive(Debug, Clone, PartialEq)]
pub enum WatchError<E = StreamError> {
    /// The stream's own error (the stream may go on; most end there).
    Source(E),
    /// The watch stopped the stream; it yields nothing more.
    Stopped(Stopped),
}

impl From<StreamError> for WatchError {
    fn from(e: StreamError) -> Self {
        Self::Source(e)
    }
}

/// How a [`Watch`] judges its stream.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct WatchOptions {
    /// Silence allowance; `None`: the watchdog's default (45 s or
    /// `WARDEN_STREAM_TIMEOUT`).
    pub timeout: Option<Duration>,
    /// Progress allowance; `None` (default): not judged.
    pub progress: Option<Duration>,
    /// When the stream must be over, if ever.
    pub deadline: Option<Instant>,
    /// Cancelling this token stops the stream as [`Stopped::Cancelled`].
    pub cancel: Option<CancellationToken>,
}

impl WatchOptions {
    /// The silence allowance.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The progress allowance, if any.
    pub fn progress(mut self, allowance: Option<Duration>) -> Self {
        self.progress = allowance;
        self
    }

    /// The deadline, if any.
    pub fn deadline(mut self, at: Option<Instant>) -> Self {
        self.deadline = at;
        self
    }

    /// Stops the stream as cancelled when `token` is cancelled.
    pub fn cancel_on(mut self, token: CancellationToken) -> Self {
        self.cancel = Some(token);
        self
    }
}

/// The stop slot the watchdog, the stoppers and the token share.
#[derive(Debug, Default)]
struct Control {
    /// The first stop request; later ones are ignored.
    stop: Mutex<Option<Stopped>>,
    /// Whether `stop` is set: one load per poll on the hot path.
    stopping: AtomicBool,
    /// The reader's waker, woken when `stop` is set.
    wake: AtomicWaker,
}

impl Control {
    fn request(&self, stop: Stopped) {
        let mut slot = self.stop.lock();
        if slot.is_none() {
            *slot = Some(stop);
            drop(slot);
            self.stopping.store(true, Ordering::Release);
            self.wake.wake();
        }
    }

    fn requested(&self) -> Option<Stopped> {
        if self.stopping.load(Ordering::Acquire) {
            *self.stop.lock()
        } else {
            None
        }
    }
}

/// Stops a watched stream from anywhere; cloning refers to the same one.
#[derive(Debug, Clone)]
pub struct Stopper(Arc<Control>);

impl Stopper {
    /// Stops it as [`Stopped::Cancelled`] (unless something stopped it
    /// first).
    pub fn cancel(&self) {
        self.0.request(Stopped::Cancelled);
    }

    /// Stops it as [`Stopped::Interrupted`] (unless something stopped it
    /// first).
    pub fn interrupt(&self) {
        self.0.request(Stopped::Interrupted);
    }

    /// How it was stopped, if it was.
    pub fn stopped(&self) -> Option<Stopped> {
        self.0.requested()
    }
}

/// Wakes on the token's cancel: the token is polled once, at arming, with
/// this as its waker, and never again.
struct OnCancel(Weak<Control>);

impl ArcWake for OnCancel {
    fn wake_by_ref(this: &Arc<Self>) {
        if let Some(control) = this.0.upgrade() {
            control.request(Stopped::Cancelled);
        }
    }
}

/// A stream's watch, armed before its request is sent: a silence entry, a
/// progress entry if an allowance is set, a deadline and a token, any of
/// which stops the stream in one typed way ([`Stopped`]). Dropping it
/// unwatches.
pub struct Watch {
    control: Arc<Control>,
    guard: WatchGuard,
    beat: Heartbeat,
    progress: Option<(WatchGuard, Heartbeat)>,
    deadline: Option<Pin<Box<Sleep>>>,
    /// Kept registered with the token (see [`OnCancel`]).
    _cancel: Option<Pin<Box<WaitForCancellationFutureOwned>>>,
    registered: Option<Waker>,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("id", &self.guard.id())
            .field("stopped", &self.control.requested())
            .finish_non_exhaustive()
    }
}

impl Watch {
    /// Registers with `watchdog` now. Fails only if the watchdog is not
    /// running (or an allowance is invalid).
    pub fn arm(watchdog: &WatchdogHandle, options: WatchOptions) -> Result<Self, ActorError> {
        let control = Arc::new(Control::default());
        let on_expire = Arc::downgrade(&control);
        let guard = watchdog.watch(options.timeout, move |expiry| {
            if let Some(control) = on_expire.upgrade() {
                control.request(Stopped::Expired(expiry));
            }
        })?;
        let progress = match options.progress {
            Some(allowance) => {
                let on_expire = Arc::downgrade(&control);
                let guard = watchdog.watch(Some(allowance), move |expiry| {
                    if let Some(control) = on_expire.upgrade() {
                        control.request(Stopped::NoProgress(expiry));
                    }
                })?;
                let beat = guard.heartbeat();
                Some((guard, beat))
            }
            None => None,
        };
        let cancel = options.cancel.map(|token| {
            let mut cancelled = Box::pin(token.cancelled_owned());
            let waker = futures_util::task::waker(Arc::new(OnCancel(Arc::downgrade(&control))));
            if cancelled
                .as_mut()
                .poll(&mut Context::from_waker(&waker))
                .is_ready()
            {
                control.request(Stopped::Cancelled);
            }
            cancelled
        });
        Ok(Self {
            beat: guard.heartbeat(),
            control,
            guard,
            progress,
            deadline: options
                .deadline
                .map(|at| Box::pin(tokio::time::sleep_until(at))),
            _cancel: cancel,
            registered: None,
        })
    }

    /// The silence entry.
    pub fn id(&self) -> WatchId {
        self.guard.id()
    }

    /// Stops the stream from elsewhere.
    pub fn stopper(&self) -> Stopper {
        Stopper(Arc::clone(&self.control))
    }

    /// The silence entry's heartbeat: beat it while waiting on something
    /// that is not the stream's fault; change its allowance while a tool
    /// runs.
    pub fn heartbeat(&self) -> &Heartbeat {
        &self.beat
    }

    /// The progress entry's heartbeat, if a progress allowance is set.
    pub fn progress(&self) -> Option<&Heartbeat> {
        self.progress.as_ref().map(|(_, beat)| beat)
    }

    /// Whether the watch has stopped, and how: ready once it has.
    fn poll_stopped(&mut self, cx: &mut Context<'_>) -> Poll<Stopped> {
        if let Some(stop) = self.control.requested() {
            return Poll::Ready(stop);
        }
        if !self
            .registered
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()))
        {
            self.control.wake.register(cx.waker());
            self.registered = Some(cx.waker().clone());
            // A stop requested before the registration would be missed.
            if let Some(stop) = self.control.requested() {
                return Poll::Ready(stop);
            }
        }
        if let Some(deadline) = self.deadline.as_mut()
            && deadline.as_mut().poll(cx).is_ready()
        {
            self.control.request(Stopped::Deadline);
            if let Some(stop) = self.control.requested() {
                return Poll::Ready(stop);
            }
        }
        Poll::Pending
    }

    /// `fut`, unless the watch stops first.
    pub fn until<F: Future>(&mut self, fut: F) -> Until<'_, F> {
        Until { watch: self, fut }
    }

    /// Watches `stream` from now on: every item beats the silence entry,
    /// and items `rule` calls progress beat the progress entry (with no
    /// rule, only [`Watched::progressed`] does). Its items are results with
    /// any error type; a stream of plain items is watched as
    /// `stream.map(Ok::<_, Infallible>)`.
    pub fn stream<S, T, E>(self, stream: S, rule: Option<fn(&T) -> bool>) -> Watched<S, T>
    where
        S: Stream<Item = Result<T, E>>,
    {
        Watched {
            watch: self,
            stream,
            rule,
            ended: false,
        }
    }
}

pin_project_lite::pin_project! {
    /// A future raced against a [`Watch`]: see [`Watch::until`].
    pub struct Until<'a, F> {
        watch: &'a mut Watch,
        #[pin]
        fut: F,
    }
}

impl<F: Future> Future for Until<'_, F> {
    type Output = Result<F::Output, Stopped>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(stop) = this.watch.poll_stopped(cx) {
            return Poll::Ready(Err(stop));
        }
        this.fut.poll(cx).map(Ok)
    }
}

pin_project_lite::pin_project! {
    /// A stream under a [`Watch`]: every item beats its silence entry,
    /// progress beats its progress entry, and a stop wins over a ready
    /// item. It ends
    /// after yielding a [`WatchError::Stopped`], or when the stream ends.
    pub struct Watched<S, T> {
        watch: Watch,
        #[pin]
        stream: S,
        rule: Option<fn(&T) -> bool>,
        ended: bool,
    }
}

impl<S, T> Watched<S, T> {
    /// Its watchdog entry: what it was registered with, for a caller
    /// that also beats or cancels it by hand.
    pub fn watch(&self) -> &Watch {
        &self.watch
    }

    /// The watch, to race another wait against it ([`Watch::until`]).
    pub fn watch_mut(&mut self) -> &mut Watch {
        &mut self.watch
    }

    /// The stream inside.
    pub fn get_ref(&self) -> &S {
        &self.stream
    }

    /// Counts as progress now (for a reader that knows an item was content
    /// only after decoding it).
    pub fn progressed(&self) {
        if let Some(p) = self.watch.progress() {
            p.beat();
        }
    }
}

impl<S, T, E> Stream for Watched<S, T>
where
    S: Stream<Item = Result<T, E>>,
{
    type Item = Result<T, WatchError<E>>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.project();
        if *this.ended {
            return Poll::Ready(None);
        }
        if let Poll::Ready(stop) = this.watch.poll_stopped(cx) {
            *this.ended = true;
            return Poll::Ready(Some(Err(WatchError::Stopped(stop))));
        }
        match this.stream.poll_next(cx) {
            Poll::Ready(Some(Ok(item))) => {
                this.watch.beat.beat();
                if let (Some(rule), Some((_, progress))) = (this.rule, &this.watch.progress)
                    && rule(&item)
                {
                    progress.beat();
                }
                Poll::Ready(Some(Ok(item)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(WatchError::Source(e)))),
            Poll::Ready(None) => {
                *this.ended = true;
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl WatchdogHandle {
    /// `stream` under this watchdog: killed after `allowance` of silence
    /// (ending with [`Stopped::Expired`]). The shortest way in for a
    /// library user; [`Watch::arm`] with [`WatchOptions`] sets the rest.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// use std::time::Duration;
    ///
    /// use futures_util::StreamExt as _;
    /// use warden_core::StreamError;
    /// use warden_core::watchdog::{Stopped, WatchError, WatchdogActor, WatchdogConfig};
    ///
    /// let (watchdog, _) = WatchdogActor::spawn(WatchdogConfig::default()).await.unwrap();
    /// // One frame, then silence with the connection open (a NAT mapping
    /// // dropped during a long pause: no FIN, no RST).
    /// let stream = futures_util::stream::iter([Ok::<_, StreamError>("hello")])
    ///     .chain(futures_util::stream::pending());
    /// let mut watched = watchdog.watch_stream(stream, Duration::from_secs(45)).unwrap();
    /// assert_eq!(watched.next().await, Some(Ok("hello")));
    /// // 45 s later (on tokio's paused clock, at once) it ends, typed.
    /// assert!(matches!(
    ///     watched.next().await,
    ///     Some(Err(WatchError::Stopped(Stopped::Expired(_))))
    /// ));
    /// # }
    /// ```
    pub fn watch_stream<S, T, E>(
        &self,
        stream: S,
        allowance: Duration,
    ) -> Result<Watched<S, T>, ActorError>
    where
        S: Stream<Item = Result<T, E>>,
    {
        Ok(Watch::arm(self, WatchOptions::default().timeout(allowance))?.stream(stream, None))
    }
}

#[cfg(test)]
#[path = "watched_tests.rs"]
mod tests;
