//! One attempt of a watched request: admitted, sent and read on
//! warden_core's watched stream ([`Watch`], [`Watched`]), as a session's
//! attempt is. The watch is armed before the request leaves (connecting
//! and the first byte are covered); every SSE frame beats it; the splice
//! says which events are content, which is progress; the proxy's shutdown
//! token and the request's deadline stop it in the same typed way.

use axum::http::StatusCode;
use axum::response::Response;
use bytes::Bytes;
use futures_util::StreamExt as _;
use tracing::Instrument as _;
use warden_core::StreamError;
use warden_core::watchdog::{Watch, WatchOptions};
use warden_llm::sse::Parsed;

use super::recover::answer;
use super::shutting_down;
use super::state::{Current, Failure, Frames, Pump, Step};
use crate::access::Outcome;
use crate::circuit::Pass;
use crate::headers;
use crate::spans::PROXY_ATTEMPT;
use crate::upstream;

impl Pump {
    /// Starts an attempt: `Ok(Some)` streaming, `Ok(None)` broke (already
    /// handled: go on), `Err` with a whole answer for the client.
    pub(super) async fn open(&mut self) -> Result<Option<Current>, Step> {
        self.attempts += 1;
        let span = tracing::info_span!(
            PROXY_ATTEMPT,
            otel.name = PROXY_ATTEMPT,
            warden.attempt = self.attempts,
            warden.outcome = tracing::field::Empty,
        );
        let pool = self.upstream.name();
        let admitted = tokio::select! {
            permit = self.inner.admission.admit(pool) => Some(permit),
            () = self.inner.stopping.cancelled() => None,
        };
        let Some(permit) = admitted else {
            return Err(self.give_up(&shutting_down(), None));
        };
        drop(permit);
        // An attempt after a backoff asks the circuit like a new request
        // (the first was asked at the door): once it is open, nothing goes
        // upstream but its probe — this request's own, when it is one.
        if self.attempts > 1 && self.logged.probe.is_none() {
            match self.inner.circuit(self.upstream).pass() {
                Pass::Go => {}
                Pass::Probe(probe) => self.logged.probe = Some(probe),
                Pass::Refuse { cause, .. } => {
                    span.record("warden.outcome", super::UNREACHABLE);
                    return Err(self.give_up(&StreamError::Connection { message: cause }, None));
                }
            }
        }
        // Neither the client nor the proxy has any of the reply yet.
        let fresh = !self.sent && !self.continuing;
        let opened = self.send().instrument(span.clone()).await;
        match opened {
            Ok(Ok(mut current)) => {
                current.span = span;
                Ok(Some(current))
            }
            Ok(Err(answer)) => {
                span.record("warden.outcome", "answered");
                self.record().status = answer.status().as_u16();
                self.end(Outcome::UpstreamError);
                Err(Step::Answer(answer))
            }
            Err(failure) => {
                span.record("warden.outcome", failure.error.code());
                let config = &self.inner.config;
                let client_retries = match self.protocol {
                    upstream::Protocol::ChatCompletions => config.chat_client_retries,
                    _ => {
                        self.upstream != upstream::Upstream::Gemini || config.gemini_client_retries
                    }
                };
                if fresh
                    && client_retries
                    && failure.answer.as_ref().is_some_and(|a| overloaded(a.0))
                {
                    return Err(self.hand_back(failure));
                }
                match self.failed(failure).await {
                    Some(step) => Err(step),
                    None => Ok(None),
                }
            }
        }
    }

    /// Hands an overloaded answer back to a client that has nothing yet,
    /// at once: its own retries take it up. Its `retry-after` still holds
    /// every request to the upstream, as a retried one's does.
    fn hand_back(&mut self, failure: Failure) -> Step {
        if let Some(wait) = warden_core::policy::hold(&self.inner.config.retry, &failure.error) {
            self.inner.admission.hold(self.upstream.name(), wait);
        }
        self.give_up(&failure.error, failure.answer)
    }

    /// Sends the attempt's request: the stream, a whole answer to pass on
    /// (`Ok(Err)`), or why it failed.
    async fn send(&mut self) -> Result<Result<Current, Response>, Failure> {
        let mut watch = Watch::arm(
            &self.inner.watchdog,
            WatchOptions::default()
                .progress(self.inner.config.progress_timeout)
                .deadline(self.deadline)
                .cancel_on(self.inner.stopping.clone()),
        )
        .map_err(|e| {
            Failure::of(StreamError::Internal {
                message: e.to_string(),
            })
        })?;
        // The access log counts what the upstream was sent.
        let continuing = std::mem::take(&mut self.continuing);
        let record = self.record();
        record.attempts += 1;
        if continuing {
            record.continuations += 1;
        }
        let send = self
            .inner
            .upstreams
            .post(&self.url, &self.headers, self.body.clone());
        let response = watch
            .until(send)
            .await
            .map_err(Failure::stopped)?
            .map_err(|why| {
                let circuit_open = self.inner.unreachable(self.upstream, &why);
                Failure {
                    circuit_open,
                    ..Failure::of(StreamError::Connection { message: why })
                }
            })?;
        self.inner.reached(self.upstream);
        let crate::client::Answer {
            status,
            headers: response_headers,
            body,
        } = response;
        let is_stream = response_headers
            .get(axum::http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if !status.is_success() || !is_stream {
            let limit = self.inner.config.max_reply_bytes;
            let bytes = watch
                .until(upstream::read_capped(body, limit, self.upstream))
                .await
                .map_err(Failure::stopped)?;
            let bytes = match bytes {
                Ok(b) => b,
                Err(too_large) if !self.sent => return Ok(Err(too_large)),
                // Judged by its status alone: the client has a stream.
                Err(_) => Bytes::new(),
            };
            let error = if status.is_success() {
                StreamError::Malformed {
                    message: "the upstream answered a stream request without an event stream"
                        .to_owned(),
                }
            } else {
                warden_llm::classify_response(
                    status,
                    &response_headers,
                    &bytes,
                    self.inner.config.retry.max_retry_after,
                )
            };
            if !error.is_retryable() && !self.sent {
                return Ok(Err(answer(status, &response_headers, bytes)));
            }
            return Err(Failure {
                answer: Some(Box::new((status, response_headers, bytes))),
                ..Failure::of(error)
            });
        }
        // The response's head: the connection is alive, and the progress
        // allowance counts from here.
        watch.heartbeat().beat();
        if let Some(progress) = watch.progress() {
            progress.beat();
        }
        let frames = Frames::new(body, self.inner.config.max_frame_bytes);
        Ok(Ok(Current {
            progress: crate::splice::progress_of(self.protocol),
            // Progress is judged per event by llm's decoder (`progress`).
            frames: watch.stream(frames, None),
            headers: headers::watched_response(&response_headers),
            span: tracing::Span::none(),
        }))
    }

    /// Reads the current attempt until it has output for the client, ends
    /// complete, or breaks: the output, and the break if any.
    pub(super) async fn read(&mut self) -> (String, Option<Failure>) {
        let mut out = std::mem::take(&mut self.out);
        let Some(current) = self.current.as_mut() else {
            return (out, None);
        };
        loop {
            let frame = match current.frames.next().await {
                Some(Ok(frame)) => frame,
                Some(Err(e)) => return (out, Some(Failure::watch(e))),
                // After a stop (given first) or the frames' own end (a
                // break, given first): not reached, but never a hang.
                None => {
                    let failure = Failure::of(StreamError::Truncated {
                        message: "the upstream closed the stream before its last event".to_owned(),
                    });
                    return (out, Some(failure));
                }
            };
            match frame {
                Parsed::Event(event) => {
                    if let Err(e) = self.splice.event(&event, &mut out) {
                        return (out, Some(Failure::of(e)));
                    }
                    if current.progress.judge(&event) {
                        current.frames.progressed();
                        self.content = true;
                    }
                }
                Parsed::KeepAlive => {
                    if self.sent {
                        out.push_str(":\n\n");
                    }
                }
            }
            if self.splice.done() {
                return (out, None);
            }
            // What one chunk of the upstream carried goes out together.
            if !out.is_empty() && current.frames.get_ref().buffered() == 0 {
                return (out, None);
            }
        }
    }
}

/// Whether `status` says the upstream has too much to do: rate limited
/// (429), unavailable (503), overloaded (529). Such an answer before any
/// of the reply is the client's to retry, not the proxy's: the clients
/// retry it themselves, honour its `retry-after` and know when to stop
/// (Claude Code after three 529s), and the proxy's attempts on top of
/// theirs would multiply the requests an overloaded upstream gets
/// (docs/proxy.md).
fn overloaded(status: StatusCode) -> bool {
    matches!(status.as_u16(), 429 | 503 | 529)
}
