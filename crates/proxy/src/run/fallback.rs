//! The last resort of a request whose streamed attempts all went silent
//! before any content — an upstream or a middlebox whose streaming path
//! is broken while its plain answers get through: its whole answer asked
//! for once, without a stream (`"stream": false`, Gemini's
//! `:generateContent`), within its own deadline
//! ([`WholeFallback`](crate::config::WholeFallback)), and given to the
//! client as it asked for it: as it came to a client that asked for no
//! stream, else replayed as the provider's events (`replay`) through the
//! request's splice, which drops a second `message_start`. What happens
//! when it fails goes back to `recover` as a [`Failure`].

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use bytes::Bytes;
use serde_json::Value;
use tokio::time::Instant;
use warden_core::StreamError;
use warden_llm::sse::{Parsed, SseParser};

use super::state::{Failure, Pump, Step};
use super::{report, shutting_down};
use crate::access::{Outcome, RecoveryEvent};
use crate::headers;
use crate::replay;
use crate::upstream::{self, Protocol};

impl Pump {
    /// Whether the whole answer is asked for now: every attempt so far
    /// went silent before any content, and there have been
    /// [`WholeFallback::after`](crate::config::WholeFallback::after) of
    /// them (by default the retry policy's attempts, all of them).
    pub(super) fn whole_is_due(&self) -> bool {
        let Some(fallback) = self.inner.config.whole_fallback else {
            return false;
        };
        let after = fallback
            .after
            .unwrap_or(self.inner.config.retry.max_attempts)
            .max(1);
        replay::replays(self.protocol) && self.silent == self.attempts && self.silent >= after
    }

    /// Asks the upstream once for the whole answer: the step that ends
    /// the request with it, or why there is none.
    pub(super) async fn ask_whole(&mut self) -> Result<Step, Failure> {
        let within = self
            .inner
            .config
            .whole_fallback
            .map_or(crate::config::WHOLE_FALLBACK_DEADLINE, |f| f.deadline);
        let asked = RecoveryEvent::AskingWhole {
            upstream: self.upstream.name(),
            path: self.record().path.clone(),
            request: self.record().id,
            silent: self.silent,
            within,
        };
        report(&self.inner, asked);
        let (url, body) = self.whole_request().map_err(Failure::of)?;
        self.attempts += 1;
        self.record().attempts += 1;
        let deadline = Instant::now() + within;
        let deadline = self.deadline.map_or(deadline, |d| d.min(deadline));
        let (upstreams, limit) = (
            std::sync::Arc::clone(&self.inner.upstreams),
            self.inner.config.max_reply_bytes,
        );
        let upstream = self.upstream;
        let headers = self.headers.clone();
        let asked = async move {
            let answer = upstreams.post(&url, &headers, body).await?;
            let bytes = upstream::read_capped(answer.body, limit, upstream).await;
            Ok::<_, String>((answer.status, answer.headers, bytes))
        };
        let stopping = self.inner.stopping.clone();
        let (status, answer_headers, bytes) = tokio::select! {
            asked = asked => match asked {
                Ok(answer) => answer,
                Err(why) => {
                    let circuit_open = self.inner.unreachable(self.upstream, &why);
                    return Err(Failure {
                        circuit_open,
                        ..Failure::of(StreamError::Connection { message: why })
                    });
                }
            },
            () = tokio::time::sleep_until(deadline) => {
                return Err(Failure::of(StreamError::Interrupted {
                    reason: format!(
                        "the whole answer asked for without a stream did not come within {:.0}s",
                        within.as_secs_f64()
                    ),
                }));
            }
            () = stopping.cancelled() => return Err(Failure::of(shutting_down())),
        };
        self.inner.reached(self.upstream);
        let bytes = match bytes {
            Ok(b) => b,
            Err(too_large) if !self.sent => {
                self.record().status = too_large.status().as_u16();
                self.end(Outcome::UpstreamError);
                return Ok(Step::Answer(too_large));
            }
            Err(_) => {
                return Err(Failure::of(StreamError::Malformed {
                    message: format!(
                        "the upstream's whole answer passed --max-reply-bytes ({limit} bytes)"
                    ),
                }));
            }
        };
        let json = serde_json::from_slice::<Value>(&bytes)
            .ok()
            .filter(Value::is_object);
        let Some(json) = json.filter(|_| status.is_success()) else {
            let error = if status.is_success() {
                StreamError::Malformed {
                    message: "the upstream's whole answer is not a JSON object".to_owned(),
                }
            } else {
                warden_llm::classify_response(
                    status,
                    &answer_headers,
                    &bytes,
                    self.inner.config.retry.max_retry_after,
                )
            };
            return Err(Failure {
                answer: Some(Box::new((status, answer_headers, bytes))),
                ..Failure::of(error)
            });
        };
        if self.assembled.is_some() {
            // What the client asked for, as it came.
            let mut response = Response::new(Body::from(bytes));
            *response.status_mut() = status;
            *response.headers_mut() = headers::end_to_end(&answer_headers);
            self.record().status = status.as_u16();
            self.end(Outcome::Complete);
            return Ok(Step::Answer(response));
        }
        self.replayed(&json, &answer_headers)
    }

    /// The whole answer `json` replayed through the splice as the stream
    /// the client asked for.
    fn replayed(&mut self, json: &Value, answer_headers: &HeaderMap) -> Result<Step, Failure> {
        let malformed = |message: &str| {
            Failure::of(StreamError::Malformed {
                message: message.to_owned(),
            })
        };
        let sse = replay::stream_of(self.protocol, &self.original, json)
            .ok_or_else(|| malformed("the upstream's whole answer cannot be replayed"))?;
        let mut frames = std::collections::VecDeque::new();
        SseParser::new(sse.len().saturating_add(1))
            .feed(sse.as_bytes(), &mut frames)
            .map_err(Failure::of)?;
        let mut out = String::with_capacity(sse.len());
        for frame in frames {
            if let Parsed::Event(event) = frame {
                self.splice.event(&event, &mut out).map_err(Failure::of)?;
            }
        }
        if !self.splice.done() {
            return Err(malformed(
                "the upstream's whole answer replayed is not a whole stream",
            ));
        }
        self.end(Outcome::Complete);
        let bytes = Bytes::from(out);
        if self.sent {
            return Ok(Step::Chunk(bytes));
        }
        self.sent = true;
        self.record().status = StatusCode::OK.as_u16();
        let mut head = headers::watched_response(answer_headers);
        head.remove(header::CONTENT_LENGTH);
        head.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        head.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        Ok(Step::Head(head, bytes))
    }

    /// The URL and body of the request for the whole answer: the
    /// client's request without a stream.
    fn whole_request(&self) -> Result<(String, Bytes), StreamError> {
        if self.protocol == Protocol::Gemini {
            let (path, query) = self.url.split_once('?').unwrap_or((&self.url, ""));
            let path = path.replace(":streamGenerateContent", ":generateContent");
            let query: Vec<&str> = query
                .split('&')
                .filter(|pair| !pair.is_empty() && *pair != "alt=sse")
                .collect();
            let url = match query.as_slice() {
                [] => path,
                pairs => format!("{path}?{}", pairs.join("&")),
            };
            return Ok((url, self.original_bytes.clone()));
        }
        let mut body = self.original.clone();
        body["stream"] = Value::Bool(false);
        if let Some(map) = body.as_object_mut() {
            // Refused by the API on a request without a stream.
            map.remove("stream_options");
        }
        let body = serde_json::to_vec(&body).map_err(|e| StreamError::Internal {
            message: format!("cannot encode the request for the whole answer: {e}"),
        })?;
        Ok((self.url.clone(), Bytes::from(body)))
    }
}
