//! Sources without a hand-written [`EventSource`]: [`source_fn`] wraps any
//! stream (another LLM client crate's, mapped to [`AgentEvent`]s) with
//! warden's watchdog, retries and admission; [`WrappedSource`] changes how
//! another source opens its streams while forwarding everything else.

use std::future::Future;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use futures_util::{Stream, StreamExt as _, stream};

use crate::error::StreamError;
use crate::event::{AgentEvent, Frame};
use crate::source::{Diagnostics, EventSource, EventStream, TurnRequest};

impl From<AgentEvent> for Frame {
    fn from(event: AgentEvent) -> Self {
        Frame::Event(event)
    }
}

/// How a [`source_fn`] stream may end.
///
/// warden's own sources end every complete turn with
/// [`AgentEvent::TurnComplete`] and report an end without it as
/// [`StreamError::Truncated`] (retried): a connection that closes early is
/// otherwise indistinguishable from a finished reply. A foreign stream may
/// not say when it is complete; choose what its end means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Ending {
    /// The stream must yield `TurnComplete` (map the client's finish
    /// reason or final chunk to it); an end without it is
    /// `StreamError::Truncated` and the turn is retried. The default.
    #[default]
    RequireTurnComplete,
    /// The end of the stream completes the turn (warden adds the
    /// `TurnComplete`). Use only with a client whose stream ends early
    /// solely by returning an error.
    EndCompletes,
}

/// A source from a closure that opens one attempt's stream; see
/// [`source_fn`].
pub struct FnSource<F> {
    provider: String,
    open: F,
    ending: Ending,
}

impl<F> std::fmt::Debug for FnSource<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FnSource")
            .field("provider", &self.provider)
            .field("ending", &self.ending)
            .finish_non_exhaustive()
    }
}

/// A source from `open`, a closure that starts one attempt of a turn and
/// returns its stream of events — any `futures::Stream` of
/// `Result<T, StreamError>` where `T` is an [`AgentEvent`] or a [`Frame`]
/// (use [`Frame::KeepAlive`] for a client's pings). warden registers the
/// attempt with the watchdog before calling `open` (the first byte is
/// watched), kills it on silence, and retries per the session's policy; the
/// closure is called again for every attempt.
///
/// The stream must end with [`AgentEvent::TurnComplete`]: an end without it
/// is reported as [`StreamError::Truncated`] and retried, unless
/// [`FnSource::ending`] says the end completes the turn. Map the client's
/// errors to [`StreamError`] (`Api { retryable, retry_after, .. }` for HTTP
/// errors) so retries and shared backoff can tell them apart.
///
/// ```
/// use futures_util::stream;
/// use warden_core::prelude::*;
///
/// let source = warden_core::source_fn("my-llm", |request: TurnRequest| async move {
///     // Call your client here; this one echoes the message.
///     Ok(stream::iter([
///         Ok(AgentEvent::TextDelta(request.message)),
///         Ok(AgentEvent::TurnComplete { context_window: None, duration: None }),
///     ]))
/// });
/// assert_eq!(source.provider(), "my-llm");
/// ```
pub fn source_fn<F, Fut, S, T>(provider: impl Into<String>, open: F) -> FnSource<F>
where
    F: Fn(TurnRequest) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<S, StreamError>> + Send + 'static,
    S: Stream<Item = Result<T, StreamError>> + Send + 'static,
    T: Into<Frame> + Send + 'static,
{
    FnSource {
        provider: provider.into(),
        open,
        ending: Ending::default(),
    }
}

impl<F> FnSource<F> {
    /// Sets what the end of the stream means (default
    /// [`Ending::RequireTurnComplete`]).
    pub fn ending(mut self, ending: Ending) -> Self {
        self.ending = ending;
        self
    }
}

impl<F, Fut, S, T> EventSource for FnSource<F>
where
    F: Fn(TurnRequest) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<S, StreamError>> + Send + 'static,
    S: Stream<Item = Result<T, StreamError>> + Send + 'static,
    T: Into<Frame> + Send + 'static,
{
    fn open(&self, request: TurnRequest) -> BoxFuture<'static, Result<EventStream, StreamError>> {
        let opened = (self.open)(request);
        let ending = self.ending;
        Box::pin(async move {
            let inner = opened.await?;
            Ok(Box::pin(checked(inner, ending)) as EventStream)
        })
    }

    fn provider(&self) -> &str {
        &self.provider
    }
}

/// `inner`'s items as frames; at its end, per `ending`: nothing more after
/// a `TurnComplete`, else a `Truncated` error or an added `TurnComplete`.
fn checked<S, T>(inner: S, ending: Ending) -> impl Stream<Item = Result<Frame, StreamError>>
where
    S: Stream<Item = Result<T, StreamError>> + Send + 'static,
    T: Into<Frame> + Send + 'static,
{
    struct St<S> {
        inner: std::pin::Pin<Box<S>>,
        complete: bool,
        done: bool,
    }
    stream::unfold(
        St {
            inner: Box::pin(inner),
            complete: false,
            done: false,
        },
        move |mut st| async move {
            if st.done {
                return None;
            }
            match st.inner.next().await {
                Some(item) => {
                    let item = item.map(Into::into);
                    if let Ok(Frame::Event(AgentEvent::TurnComplete { .. })) = &item {
                        st.complete = true;
                    }
                    Some((item, st))
                }
                None => {
                    st.done = true;
                    match (st.complete, ending) {
                        (true, _) => None,
                        (false, Ending::EndCompletes) => Some((
                            Ok(Frame::Event(AgentEvent::TurnComplete {
                                context_window: None,
                                duration: None,
                            })),
                            st,
                        )),
                        (false, Ending::RequireTurnComplete) => Some((
                            Err(StreamError::Truncated {
                                message: "the stream ended without TurnComplete".into(),
                            }),
                            st,
                        )),
                    }
                }
            }
        },
    )
}

/// Another source with its own way of opening streams (add a header, log,
/// rewrite the request, pace the connection) and **everything else
/// forwarded**: [`provider`](EventSource::provider),
/// [`context_window`](EventSource::context_window),
/// [`fresh_start_note`](EventSource::fresh_start_note) and
/// [`diagnostics`](EventSource::diagnostics) are the inner source's, so a
/// wrapper cannot lose them by forgetting one.
///
/// ```
/// use std::sync::Arc;
/// use warden_core::prelude::*;
/// use warden_core::adapter::WrappedSource;
/// use warden_core::testing::ChannelSource;
///
/// let (inner, _control) = ChannelSource::new();
/// let wrapped = WrappedSource::new(inner, |inner, mut request| {
///     request.message = format!("[from the planner] {}", request.message);
///     inner.open(request)
/// });
/// assert_eq!(wrapped.provider(), "channel");
/// ```
pub struct WrappedSource<F> {
    inner: Arc<dyn EventSource>,
    open: F,
}

impl<F> std::fmt::Debug for WrappedSource<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WrappedSource")
            .field("provider", &self.inner.provider())
            .finish_non_exhaustive()
    }
}

impl<F> WrappedSource<F>
where
    F: Fn(
            &Arc<dyn EventSource>,
            TurnRequest,
        ) -> BoxFuture<'static, Result<EventStream, StreamError>>
        + Send
        + Sync
        + 'static,
{
    /// Wraps `inner`; `open` is called instead of `inner.open` for every
    /// attempt, with `inner` to delegate to.
    pub fn new(inner: Arc<dyn EventSource>, open: F) -> Self {
        Self { inner, open }
    }

    /// The wrapped source.
    pub fn inner(&self) -> &Arc<dyn EventSource> {
        &self.inner
    }
}

impl<F> EventSource for WrappedSource<F>
where
    F: Fn(
            &Arc<dyn EventSource>,
            TurnRequest,
        ) -> BoxFuture<'static, Result<EventStream, StreamError>>
        + Send
        + Sync
        + 'static,
{
    fn open(&self, request: TurnRequest) -> BoxFuture<'static, Result<EventStream, StreamError>> {
        (self.open)(&self.inner, request)
    }

    fn provider(&self) -> &str {
        self.inner.provider()
    }

    fn continues(&self) -> bool {
        self.inner.continues()
    }

    fn restarts_repeat_tool_calls(&self) -> bool {
        self.inner.restarts_repeat_tool_calls()
    }

    fn tools_run_in_stream(&self) -> bool {
        self.inner.tools_run_in_stream()
    }

    fn context_window(&self, model: Option<&str>) -> Option<u64> {
        self.inner.context_window(model)
    }

    fn fresh_start_note(&self) -> Option<String> {
        self.inner.fresh_start_note()
    }

    fn diagnostics(&self, session_id: &str, workspace: Option<&std::path::Path>) -> Diagnostics {
        self.inner.diagnostics(session_id, workspace)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    async fn frames(source: &dyn EventSource) -> Vec<Result<Frame, StreamError>> {
        let request = TurnRequest::new("k".into(), 1, "hi");
        let s = source.open(request).await.expect("opened");
        tokio::time::timeout(Duration::from_secs(5), s.collect::<Vec<_>>())
            .await
            .expect("the stream ends")
    }

    fn complete() -> AgentEvent {
        AgentEvent::TurnComplete {
            context_window: None,
            duration: None,
        }
    }

    #[tokio::test]
    async fn a_stream_ending_with_turn_complete_passes_through_unchanged() {
        let source = source_fn("x", |r: TurnRequest| async move {
            Ok(stream::iter([
                Ok(Frame::KeepAlive),
                Ok(Frame::Event(AgentEvent::TextDelta(r.message))),
                Ok(Frame::Event(complete())),
            ]))
        });
        let got = frames(&source).await;
        assert_eq!(
            got,
            [
                Ok(Frame::KeepAlive),
                Ok(Frame::Event(AgentEvent::TextDelta("hi".into()))),
                Ok(Frame::Event(complete())),
            ]
        );
    }

    #[tokio::test]
    async fn an_end_without_turn_complete_is_truncated_unless_the_end_completes() {
        let open =
            |_: TurnRequest| async { Ok(stream::iter([Ok(AgentEvent::TextDelta("par".into()))])) };
        let strict = frames(&source_fn("x", open)).await;
        assert!(
            matches!(strict.last(), Some(Err(StreamError::Truncated { .. }))),
            "{strict:?}"
        );
        let lenient = frames(&source_fn("x", open).ending(Ending::EndCompletes)).await;
        assert_eq!(lenient.last(), Some(&Ok(Frame::Event(complete()))));
        assert_eq!(lenient.len(), 2);
    }

    #[tokio::test]
    async fn an_open_error_is_the_attempts_error() {
        let source = source_fn("x", |_: TurnRequest| async {
            Err::<stream::Empty<Result<AgentEvent, StreamError>>, _>(StreamError::Connection {
                message: "refused".into(),
            })
        });
        let err = source
            .open(TurnRequest::new("k".into(), 1, "hi"))
            .await
            .err();
        assert!(matches!(err, Some(StreamError::Connection { .. })));
    }

    struct Knowing;

    impl EventSource for Knowing {
        fn open(&self, _: TurnRequest) -> BoxFuture<'static, Result<EventStream, StreamError>> {
            Box::pin(async { Ok(Box::pin(stream::empty()) as EventStream) })
        }
        fn provider(&self) -> &str {
            "knowing"
        }
        fn context_window(&self, model: Option<&str>) -> Option<u64> {
            model.map(|_| 1_000_000)
        }
        fn fresh_start_note(&self) -> Option<String> {
            Some("note".into())
        }
        fn diagnostics(&self, id: &str, _: Option<&std::path::Path>) -> Diagnostics {
            Diagnostics {
                stderr_tail: Some(id.to_owned()),
                ..Diagnostics::default()
            }
        }
    }

    #[tokio::test]
    async fn a_wrapped_source_forwards_everything_but_open() {
        let wrapped = WrappedSource::new(Arc::new(Knowing), |inner, mut r| {
            r.message.push('!');
            inner.open(r)
        });
        assert_eq!(wrapped.provider(), "knowing");
        assert_eq!(wrapped.context_window(Some("m")), Some(1_000_000));
        assert_eq!(wrapped.fresh_start_note().as_deref(), Some("note"));
        assert_eq!(
            wrapped.diagnostics("s1", None).stderr_tail.as_deref(),
            Some("s1")
        );
        assert!(frames(&wrapped).await.is_empty());
    }
}
