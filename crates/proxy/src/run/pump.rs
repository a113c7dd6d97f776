//! The loop of a watched request's [`Pump`]: each pull opens, reads and
//! recovers attempts (`attempt`, `recover`) until there is a chunk for
//! whoever sends the response; a clean end gives the upstream connection
//! back.

use axum::http::HeaderMap;
use bytes::Bytes;
use futures_util::{FutureExt as _, StreamExt as _};
use tracing::Instrument as _;

use super::state::{Current, Pump, Step};
use crate::access::Outcome;

/// How long the end of an upstream body may take after the reply's last
/// event (the chunked body's terminator, usually in the same read) for
/// its connection to go back to the pool.
const RELEASE_WITHIN: std::time::Duration = std::time::Duration::from_secs(1);

/// The most frames read after the reply's last event before the rest is
/// left to a task of its own.
const RELEASE_NOW: usize = 16;

/// After the reply's last event: the rest of the upstream body is read
/// (at once when it is there, usually; else in a task of its own), so
/// that a connection whose answer ends cleanly goes back to the pool
/// (`client`) before the client has its end; one whose end does not come
/// soon is closed with it.
fn release(current: Current) {
    let mut frames = current.frames;
    for _ in 0..RELEASE_NOW {
        match frames.next().now_or_never() {
            Some(Some(Ok(_))) => {}
            // Its end (or a break): the body is done with.
            Some(_) => return,
            None => break,
        }
    }
    tokio::spawn(async move {
        let drained = async { while let Some(Ok(_)) = frames.next().await {} };
        let _ = tokio::time::timeout(RELEASE_WITHIN, drained).await;
    });
}

/// The most capacity a stream's output buffer keeps between chunks.
const OUT_KEEP: usize = 16 * 1024;

impl Pump {
    /// The next chunk of the stream (or its head, or a whole answer, or
    /// its end): attempts opened, read, and recovered until there is one.
    pub(super) async fn next(&mut self) -> Step {
        loop {
            if self.done {
                return Step::End;
            }
            if let Some(failure) = self.pending.take() {
                if let Some(step) = self.failed(failure).await {
                    return step;
                }
                continue;
            }
            if self.current.is_none() {
                match self.open().await {
                    Ok(Some(current)) => {
                        self.headed = true;
                        self.current = Some(current);
                    }
                    Ok(None) => continue,
                    Err(answer) => return answer,
                }
            }
            let span = self
                .current
                .as_ref()
                .map_or_else(tracing::Span::none, |c| c.span.clone());
            let (out, failure) = self.read().instrument(span.clone()).await;
            let headers = match (&self.current, self.sent) {
                (Some(c), false) => c.headers.clone(),
                _ => HeaderMap::new(),
            };
            if let Some(failure) = failure {
                span.record("warden.outcome", failure.error.code());
                self.current = None;
                if out.is_empty() {
                    if let Some(step) = self.failed(failure).await {
                        return step;
                    }
                    continue;
                }
                self.pending = Some(failure);
            }
            if self.splice.done() {
                span.record("warden.outcome", "complete");
                if let Some(current) = self.current.take() {
                    release(current);
                }
                self.end(Outcome::Complete);
            }
            if out.is_empty() {
                self.out = out;
                continue;
            }
            // One allocation of the exact size per chunk; the buffer the
            // events were written into keeps its capacity for the next.
            let bytes = Bytes::copy_from_slice(out.as_bytes());
            // Kept unless an unusually large chunk grew it: an open stream
            // must not hold a big buffer for the rest of its life.
            if out.capacity() <= OUT_KEEP {
                self.out = out;
                self.out.clear();
            }
            if self.sent {
                return Step::Chunk(bytes);
            }
            self.sent = true;
            self.record().status = 200;
            return Step::Head(headers, bytes);
        }
    }
}
