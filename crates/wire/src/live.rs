//! A CLI's source that is also live while the wire sends its CLI its
//! model stream.

use futures_util::StreamExt as _;
use futures_util::future::BoxFuture;
use std::sync::Arc;
use tokio::sync::watch;
use warden_core::{Diagnostics, EventSource, EventStream, Frame, StreamError, TurnRequest};

use crate::routes::RouteHold;

/// A CLI's source whose streams also yield liveness
/// ([`Frame::KeepAlive`]) for each chunk the wire sends the CLI.
pub(super) struct Live {
    pub(super) inner: Arc<dyn EventSource>,
    pub(super) sent: watch::Receiver<u64>,
    /// The session's route, removed when its last source goes.
    pub(super) _hold: Option<RouteHold>,
    /// The wire, kept running while a source made from it is.
    pub(super) _wire: Arc<dyn std::any::Any + Send + Sync>,
}

impl EventSource for Live {
    fn open(&self, request: TurnRequest) -> BoxFuture<'static, Result<EventStream, StreamError>> {
        let opening = self.inner.open(request);
        let mut sent = self.sent.clone();
        Box::pin(async move {
            let stream = opening.await?;
            sent.mark_unchanged();
            Ok(Box::pin(with_liveness(stream, sent)) as EventStream)
        })
    }

    fn continues(&self) -> bool {
        self.inner.continues()
    }

    fn tools_run_in_stream(&self) -> bool {
        self.inner.tools_run_in_stream()
    }

    fn restarts_repeat_tool_calls(&self) -> bool {
        self.inner.restarts_repeat_tool_calls()
    }

    fn runs_in_workspace(&self) -> bool {
        self.inner.runs_in_workspace()
    }

    fn provider(&self) -> &str {
        self.inner.provider()
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

/// `stream`'s items, and a [`Frame::KeepAlive`] whenever `sent` changes,
/// until `stream` ends.
fn with_liveness(
    stream: EventStream,
    sent: watch::Receiver<u64>,
) -> impl futures_util::Stream<Item = Result<Frame, StreamError>> + Send {
    futures_util::stream::unfold((stream, Some(sent)), |(mut stream, mut sent)| async move {
        loop {
            let Some(watching) = sent.as_mut() else {
                let item = stream.next().await?;
                return Some((item, (stream, sent)));
            };
            tokio::select! {
                biased;
                item = stream.next() => return item.map(|item| (item, (stream, sent))),
                changed = watching.changed() => match changed {
                    Ok(()) => return Some((Ok(Frame::KeepAlive), (stream, sent))),
                    // The wire is gone: the CLI's own output only.
                    Err(_) => sent = None,
                },
            }
        }
    })
}
