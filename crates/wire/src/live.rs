//! A CLI's source that is also live while the wire sends its CLI its
//! model stream, and whose run ends when the wire spent the retry
//! policy's attempts on one of its requests.

use futures_util::StreamExt as _;
use futures_util::future::BoxFuture;
use std::sync::Arc;
use tokio::sync::watch;
use tokio::time::Instant;
use warden_core::{Diagnostics, EventSource, EventStream, Frame, StreamError, TurnRequest};

use crate::routes::{Route, RouteHold, Spent};

/// A CLI's source whose streams also yield liveness
/// ([`Frame::KeepAlive`]) for each chunk the wire sends the CLI on its
/// route, and end with [`StreamError::RetriedBelow`] as soon as the wire
/// hands a request of the run back after the retry policy's attempts
/// (dropping the stream ends the CLI's process group, so the CLI's own
/// retries of it never go out, and the session does not run the turn
/// again: about the policy's attempts upstream in all).
pub(super) struct Live {
    pub(super) inner: Arc<dyn EventSource>,
    /// The route its CLI's model traffic comes on.
    pub(super) route: Arc<Route>,
    /// The session's route, removed when its last source goes.
    pub(super) _hold: Option<RouteHold>,
    /// The wire, kept running while a source made from it is.
    pub(super) _wire: Arc<dyn std::any::Any + Send + Sync>,
}

impl EventSource for Live {
    fn open(&self, request: TurnRequest) -> BoxFuture<'static, Result<EventStream, StreamError>> {
        // A run starts with nothing spent: what the wire notes from now on
        // is this run's.
        self.route.spent.send_replace(None);
        let watching = Watching {
            sent: Some(self.route.sent.subscribe()),
            spent: Some(self.route.spent.subscribe()),
            started: Instant::now(),
        };
        let opening = self.inner.open(request);
        Box::pin(async move {
            let stream = opening.await?;
            let mut watching = watching;
            if let Some(sent) = watching.sent.as_mut() {
                sent.mark_unchanged();
            }
            Ok(Box::pin(with_liveness(stream, watching)) as EventStream)
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

/// What a run's stream watches of its route besides the CLI's output.
struct Watching {
    /// The chunks sent on the route; `None` once the wire is gone.
    sent: Option<watch::Receiver<u64>>,
    /// The request the wire spent the policy's attempts on; `None` once
    /// the wire is gone.
    spent: Option<watch::Receiver<Option<Spent>>>,
    /// When the run started.
    started: Instant,
}

/// The next change of `rx`'s value; `None` (and `rx` unset) when its
/// sender is gone; never when `rx` is unset.
async fn changed<T: Clone>(rx: &mut Option<watch::Receiver<T>>) -> Option<T> {
    let Some(watching) = rx.as_mut() else {
        return std::future::pending().await;
    };
    match watching.changed().await {
        Ok(()) => Some(watching.borrow_and_update().clone()),
        Err(_) => {
            *rx = None;
            None
        }
    }
}

/// `stream`'s items, and a [`Frame::KeepAlive`] whenever a chunk is sent
/// on the route, until `stream` ends — or, when the wire spends the
/// policy's attempts on a request of the run, that as the run's error,
/// then the end.
fn with_liveness(
    stream: EventStream,
    watching: Watching,
) -> impl futures_util::Stream<Item = Result<Frame, StreamError>> + Send {
    futures_util::stream::unfold(Some((stream, watching)), |state| async move {
        let (mut stream, mut watching) = state?;
        loop {
            tokio::select! {
                biased;
                spent = changed(&mut watching.spent) => {
                    if let Some(Some(spent)) = spent {
                        let error = spent.error(watching.started.elapsed());
                        return Some((Err(error), None));
                    }
                }
                item = stream.next() => {
                    return item.map(|item| (item, Some((stream, watching))));
                }
                // The wire gone: the CLI's own output only.
                sent = changed(&mut watching.sent) => {
                    if sent.is_some() {
                        return Some((Ok(Frame::KeepAlive), Some((stream, watching))));
                    }
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use warden_core::{ExitClass, SessionKey, TurnError};
    use warden_proxy::RecoveryEvent;

    use super::*;
    use crate::routes::Routes;

    /// A CLI that prints nothing and never exits.
    struct Silent;

    impl EventSource for Silent {
        fn open(&self, _: TurnRequest) -> BoxFuture<'static, Result<EventStream, StreamError>> {
            Box::pin(async { Ok(Box::pin(futures_util::stream::pending()) as EventStream) })
        }
    }

    fn handed_back(attempts: u32) -> RecoveryEvent {
        RecoveryEvent::HandedBack {
            upstream: "openai",
            path: "/v1/chat/completions".to_owned(),
            request: 7,
            attempts,
            status: 503,
            code: "EAPI",
            reason: "API error (HTTP 503)".to_owned(),
        }
    }

    async fn next(stream: &mut EventStream, what: &str) -> Option<Result<Frame, StreamError>> {
        tokio::time::timeout(Duration::from_secs(1), stream.next())
            .await
            .unwrap_or_else(|_| panic!("no item within 1 s: {what}"))
    }

    #[tokio::test(start_paused = true)]
    async fn a_run_ends_at_once_with_the_wires_last_error_when_the_wire_spent_the_policys_attempts()
    {
        let route = Arc::clone(&Routes::default().root);
        let live = Live {
            inner: Arc::new(Silent),
            route: Arc::clone(&route),
            _hold: None,
            _wire: Arc::new(()),
        };
        // An earlier run's note is not this run's.
        route.note_spent(&handed_back(4), 4);
        let mut stream = live
            .open(TurnRequest::new(SessionKey::new("/w"), 1, "hi"))
            .await
            .expect("opens");
        // Handed back at once (Claude Code, Codex): the CLI's own retries
        // take it up, the run goes on.
        route.note_spent(&handed_back(1), 4);
        route.sent.send_modify(|n| *n += 1);
        assert!(
            matches!(
                next(&mut stream, "liveness").await,
                Some(Ok(Frame::KeepAlive))
            ),
            "the run goes on"
        );
        tokio::time::advance(Duration::from_secs(3)).await;
        route.note_spent(&handed_back(4), 4);
        let error = next(&mut stream, "the wire's give-up")
            .await
            .expect("an item")
            .expect_err("the run's error");
        let StreamError::RetriedBelow { attempts, last } = &error else {
            panic!("{error:?}");
        };
        assert_eq!(*attempts, 4);
        assert!(
            matches!(
                **last,
                StreamError::Api {
                    status: Some(503),
                    retryable: true,
                    ..
                }
            ),
            "{last:?}"
        );
        let said = error.to_string();
        for part in ["4 attempts", "#7", "HTTP 503", "3.0s into the run"] {
            assert!(said.contains(part), "{part}: {said}");
        }
        assert_eq!(error.code(), "EAPI");
        assert_eq!(ExitClass::of(&TurnError::Fatal(error)).code(), 5);
        assert!(
            next(&mut stream, "the end").await.is_none(),
            "the run ends after it"
        );
    }
}
