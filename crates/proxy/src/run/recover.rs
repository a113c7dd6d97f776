//! What follows a broken attempt of a watched request: warden_core's one
//! decision ([`decide`]), given what the client has of the stream, carried
//! out here (the backoff, the continuation request, the shared hold, the
//! recovery log) — the same rules a session's turn follows.

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use tokio::time::Instant;
use warden_core::StreamError;
use warden_core::policy::{Broken, Next, Shown, decide};

use super::state::{Failure, Pump, Step};
use super::{UNREACHABLE, past_deadline, report, shutting_down, until};
use crate::access::{Outcome, RecoveryEvent};
use crate::headers;
use crate::spans::{PROXY_CONTINUE, PROXY_KILL};
use crate::splice::{self, Resume};
use crate::upstream::{Upstream, error_response};

impl Pump {
    /// After a broken attempt: `None` to try again (after the backoff),
    /// or the step that ends the request.
    pub(super) async fn failed(&mut self, failure: Failure) -> Option<Step> {
        let Failure {
            error,
            killed,
            answer,
            circuit_open,
        } = failure;
        let pool = self.upstream.name();
        if killed {
            self.record().kills += 1;
            tracing::info!(
                event = PROXY_KILL,
                attempt = self.attempts,
                "upstream stream went silent; killed"
            );
            let killed = RecoveryEvent::Killed {
                upstream: pool,
                path: self.record().path.clone(),
                request: self.record().id,
                attempt: self.attempts,
            };
            report(&self.inner, killed);
        }
        // Gone silent after its head, before any content: what a broken
        // streaming path (the upstream's, a middlebox's) looks like. (An
        // upstream silent before its head answers nothing; pings without
        // content are a stream that gets through: neither is counted.)
        let (headed, content) = (
            std::mem::take(&mut self.headed),
            std::mem::take(&mut self.content),
        );
        if matches!(error, StreamError::InactivityTimeout { .. }) && headed && !content {
            self.silent += 1;
        }
        if circuit_open {
            // The upstream cannot be reached: its circuit is open, and
            // this request ends now with the cause, as the next ones will.
            return Some(self.give_up(&error, None));
        }
        // What the client has: nothing (the same request again), text to
        // continue, or what can be neither continued nor taken back.
        let resume = if self.sent {
            self.splice.resume(&self.original)
        } else {
            Resume::Again
        };
        let resume = match (resume, self.assembled) {
            // An answer assembled here that cannot be continued: none of
            // it reached the client, so it starts over (the assembler
            // starts again at the next head).
            (Resume::GiveUp, Some(protocol)) => {
                self.splice = splice::for_protocol(protocol, self.inner.config.hold_thinking);
                self.sent = false;
                Resume::Again
            }
            (resume, _) => resume,
        };
        let shown = match &resume {
            Resume::Again => Shown::Nothing,
            Resume::Continue(_) => Shown::Text,
            Resume::GiveUp => Shown::Other,
        };
        let verdict = decide(
            &self.inner.config.retry,
            &Broken {
                error: &error,
                attempts: self.attempts,
                shown,
                can_continue: true,
                // A client's stream cannot take back what it was sent.
                can_restart_shown: false,
                completed_tools: 0,
                restarts_repeat_tools: false,
                resumed_and_escalates: false,
            },
            &mut self.rng,
        );
        if let Some(wait) = verdict.hold {
            // The server asked the whole upstream to wait: every request's
            // next attempt waits too, as every session's does.
            self.inner.admission.hold(pool, wait);
        }
        if self.inner.stopping.is_cancelled() {
            return Some(self.give_up(&shutting_down(), None));
        }
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            return Some(self.give_up(&past_deadline(), answer));
        }
        if self.whole_is_due() {
            return Some(match self.ask_whole().await {
                Ok(step) => step,
                Err(failure) => self.give_up(&failure.error, failure.answer),
            });
        }
        let (path, id) = (self.record().path.clone(), self.record().id);
        let delay = match (verdict.next, resume) {
            (Next::Continue { delay }, Resume::Continue(request)) => {
                report(
                    &self.inner,
                    RecoveryEvent::Continuing {
                        upstream: pool,
                        path,
                        request: id,
                        attempt: self.attempts,
                        code: error.code(),
                        delay,
                    },
                );
                self.continuing = true;
                tracing::info!(
                    event = PROXY_CONTINUE,
                    attempt = self.attempts,
                    "continuing the broken reply"
                );
                match serde_json::to_vec(&request) {
                    Ok(body) => self.body = Bytes::from(body),
                    Err(e) => {
                        // Never an empty or partial body upstream: the
                        // stream ends here, with the provider's error.
                        tracing::error!(error = %e, "cannot encode the continuation request");
                        let error = StreamError::Internal {
                            message: format!("cannot encode the continuation request: {e}"),
                        };
                        return Some(self.give_up(&error, None));
                    }
                }
                delay
            }
            (Next::Retry { delay } | Next::Continue { delay }, _) => {
                // Nothing reached the client but the message's start: the
                // same request again.
                self.body = self.original_bytes.clone();
                report(
                    &self.inner,
                    RecoveryEvent::Retrying {
                        upstream: pool,
                        path,
                        request: id,
                        attempt: self.attempts,
                        code: error.code(),
                        delay,
                    },
                );
                delay
            }
            (Next::GiveUp(_) | Next::Escalate(_), _) => {
                return Some(self.give_up(&error, answer));
            }
        };
        tokio::select! {
            () = tokio::time::sleep(delay) => None,
            () = self.inner.stopping.cancelled() => Some(self.give_up(&shutting_down(), None)),
            () = until(self.deadline) => Some(self.give_up(&past_deadline(), None)),
        }
    }

    /// Ends the request after `error`: the upstream's own error answer or
    /// the proxy's while the client has nothing yet, else the provider's
    /// error event on the open stream.
    pub(super) fn give_up(
        &mut self,
        error: &StreamError,
        upstream_answer: Option<Box<(StatusCode, HeaderMap, Bytes)>>,
    ) -> Step {
        let message = match error {
            // Name the cause: "cannot be reached: connection failed: …
            // Connection refused", not an overload.
            StreamError::Connection { message } if !self.sent => {
                format!("warden proxy: the upstream cannot be reached: {message}")
            }
            _ => format!("warden proxy: the upstream stream failed: {}", error.code()),
        };
        self.record().code = Some(match error {
            StreamError::Connection { .. } if self.inner.circuit(self.upstream).is_open() => {
                UNREACHABLE
            }
            _ => error.code(),
        });
        let (upstream, path) = (self.upstream.name(), self.record().path.clone());
        let request = self.record().id;
        let (attempts, code, reason) = (self.attempts, error.code(), error.to_string());
        // What the client is left with names the line: a status its own
        // retries take up is not the end of the request (it may yet
        // complete), so it is not "gave up".
        let ended =
            move |answered: Option<StatusCode>| match answered.filter(|s| client_retries(*s)) {
                Some(status) => RecoveryEvent::HandedBack {
                    upstream,
                    path,
                    request,
                    attempts,
                    status: status.as_u16(),
                    code,
                    reason,
                },
                None => RecoveryEvent::GaveUp {
                    upstream,
                    path,
                    request,
                    attempts,
                    code,
                    reason,
                },
            };
        if self.sent {
            let line = match (self.assembled, self.upstream) {
                // Assembled into the provider's error answer (`whole`).
                (Some(_), Upstream::Anthropic) => ended(StatusCode::from_u16(529).ok()),
                (Some(_), Upstream::OpenAi | Upstream::Gemini) => {
                    ended(Some(StatusCode::SERVICE_UNAVAILABLE))
                }
                // A stream its client starts over: not the end either.
                (None, _) if self.splice.error_is_retried() => RecoveryEvent::HandedBackMidStream {
                    upstream,
                    path: self.record().path.clone(),
                    request,
                    attempts,
                    code,
                    reason: error.to_string(),
                },
                (None, _) => ended(None),
            };
            report(&self.inner, line);
            self.end(Outcome::ErrorEvent);
            return Step::Chunk(Bytes::from(self.splice.error_event(&message)));
        }
        let response = match upstream_answer {
            Some(a) => {
                let (status, headers, bytes) = *a;
                answer(status, &headers, bytes)
            }
            None => error_response(
                self.upstream,
                match (self.upstream, error) {
                    // Unreachable is not an overload: a 502 (`api_error`),
                    // as a pass-through request gets, which every client
                    // retries as it would a 529.
                    (_, StreamError::Connection { .. }) => StatusCode::BAD_GATEWAY,
                    (Upstream::OpenAi | Upstream::Gemini, _) => StatusCode::SERVICE_UNAVAILABLE,
                    (Upstream::Anthropic, _) => {
                        StatusCode::from_u16(529).unwrap_or(StatusCode::SERVICE_UNAVAILABLE)
                    }
                },
                &message,
            ),
        };
        let status = response.status();
        report(&self.inner, ended(Some(status)));
        self.record().status = status.as_u16();
        self.end(Outcome::UpstreamError);
        Step::Answer(response)
    }
}

/// Whether the SDKs and Claude Code retry an answer of `status` on their
/// own: `408`, `409`, `429` and every `5xx` (`529` included).
fn client_retries(status: StatusCode) -> bool {
    matches!(status.as_u16(), 408 | 409 | 429 | 500..=599)
}

/// An upstream answer passed on whole.
pub(super) fn answer(status: StatusCode, headers: &HeaderMap, bytes: Bytes) -> Response {
    let mut r = Response::new(Body::from(bytes));
    *r.status_mut() = status;
    *r.headers_mut() = headers::end_to_end(headers);
    r
}
