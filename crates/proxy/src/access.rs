//! What the access log gets: one [`AccessRecord`] per request.

use std::sync::Arc;

/// A request extension for a server that hands requests to
/// [`Proxy::router`](crate::Proxy::router) after rewriting their path (a
/// route prefix of its own stripped, say): the path its client asked
/// for, which the request's [`AccessRecord::path`] and
/// [`RecoveryEvent`]s then name, so the server can tell its requests
/// apart in them. The request still goes upstream by its rewritten path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientPath(pub String);

/// One proxied request, as the access log reports it (no headers, no
/// bodies).
#[derive(Debug, Clone, serde::Serialize)]
#[non_exhaustive]
pub struct AccessRecord {
    /// The request's id: unique within the process, counted from 1, and
    /// named by each [`RecoveryEvent`] of the request (`#7` in its line).
    pub id: u64,
    /// `anthropic` or `openai`.
    pub upstream: &'static str,
    /// The request method.
    pub method: String,
    /// The request path (no query string): the client's, [`ClientPath`],
    /// when a server in front rewrote it.
    pub path: String,
    /// The status the client got.
    pub status: u16,
    /// From the request to the end of the response body, in milliseconds.
    pub duration_ms: u64,
    /// Requests sent upstream for it, counted as each goes out (1 when
    /// nothing went wrong; 0 when the client left before the first).
    pub attempts: u32,
    /// Attempts the watchdog killed.
    pub kills: u32,
    /// Continuation requests sent upstream (a continuation scheduled but
    /// never sent — the client left during the backoff — is not counted).
    pub continuations: u32,
    /// How the response ended.
    pub outcome: Outcome,
    /// The error code the response ended with (`ECONNECTION`,
    /// `ESTREAM_TIMEOUT`, `EUPSTREAM_UNREACHABLE`, …), when it ended with
    /// an error of the proxy's; `null` otherwise.
    pub code: Option<&'static str>,
}

/// The next request's [`AccessRecord::id`].
pub(crate) fn next_request_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Called once per request when its response has ended.
pub type AccessLog = Arc<dyn Fn(&AccessRecord) + Send + Sync>;

/// How a proxied response ended (in the JSON access log, its snake-case
/// name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Outcome {
    /// A watched stream reached its terminal event.
    Complete,
    /// Not watched: passed through as it is.
    Passthrough,
    /// The upstream's error answer (or the proxy's, when the upstream
    /// could not be reached) was passed on.
    UpstreamError,
    /// A watched stream that could be neither retried nor continued ended
    /// with the provider's retryable error event.
    ErrorEvent,
    /// The client went away before the response ended.
    ClientGone,
    /// Answered by the proxy itself: a path no upstream is configured for.
    Local,
}

impl Outcome {
    /// The snake-case name (as in the access log and the spans).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Complete => "complete",
            Self::Passthrough => "passthrough",
            Self::UpstreamError => "upstream_error",
            Self::ErrorEvent => "error_event",
            Self::ClientGone => "client_gone",
            Self::Local => "local",
        }
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Something the proxy did to keep a response alive, as an operator hears
/// of it ([`ProxyConfig::with_recovery_log`](crate::ProxyConfig::with_recovery_log);
/// `warden proxy` prints each as one line on stderr). Never a header or a
/// body.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecoveryEvent {
    /// An attempt went silent past the timeout and was killed.
    Killed {
        /// `anthropic` or `openai`.
        upstream: &'static str,
        /// The request path.
        path: String,
        /// The request's [`AccessRecord::id`].
        request: u64,
        /// The attempt (from 1).
        attempt: u32,
    },
    /// An attempt failed and the request goes again after `delay` (nothing
    /// of it had reached the client, or the reply starts over).
    Retrying {
        /// `anthropic` or `openai`.
        upstream: &'static str,
        /// The request path.
        path: String,
        /// The request's [`AccessRecord::id`].
        request: u64,
        /// The attempt that failed.
        attempt: u32,
        /// Why, as an error code (`ESTREAM_TIMEOUT`, `ECONNECTION`, …).
        code: &'static str,
        /// The backoff before the next attempt.
        delay: std::time::Duration,
    },
    /// A reply broken mid-text is continued after `delay` and spliced into
    /// the same response.
    Continuing {
        /// `anthropic` or `openai`.
        upstream: &'static str,
        /// The request path.
        path: String,
        /// The request's [`AccessRecord::id`].
        request: u64,
        /// The attempt that broke.
        attempt: u32,
        /// Why, as an error code.
        code: &'static str,
        /// The backoff before the continuation.
        delay: std::time::Duration,
    },
    /// Every streamed attempt so far went silent before any of the reply's
    /// content: the whole answer is asked for once, without a stream, and
    /// given to the client as it asked for it
    /// ([`WholeFallback`](crate::WholeFallback)).
    AskingWhole {
        /// `anthropic`, `openai` or `gemini`.
        upstream: &'static str,
        /// The request path.
        path: String,
        /// The request's [`AccessRecord::id`].
        request: u64,
        /// The streamed attempts that went silent.
        silent: u32,
        /// How long the whole answer may take.
        within: std::time::Duration,
    },
    /// Nothing more could be done: the response ended with the provider's
    /// error event mid-stream, an error answer a client does not retry, or
    /// a whole answer that cannot be assembled (an error answer a client
    /// retries after the proxy's attempts is [`HandedBack`](Self::HandedBack),
    /// an error event a client retries
    /// [`HandedBackMidStream`](Self::HandedBackMidStream)).
    GaveUp {
        /// `anthropic` or `openai`.
        upstream: &'static str,
        /// The request path.
        path: String,
        /// The request's [`AccessRecord::id`].
        request: u64,
        /// Attempts made.
        attempts: u32,
        /// The last error's code.
        code: &'static str,
        /// The last error, in words (no URL, no header, no body).
        reason: String,
    },
    /// Nothing of the reply had reached the client when the proxy stopped
    /// trying: the client got an error status its own retries take up
    /// (`408`, `409`, `429`, `5xx`, `529`: what the SDKs and Claude Code
    /// retry), so the request may yet complete — not a give-up.
    HandedBack {
        /// `anthropic` or `openai`.
        upstream: &'static str,
        /// The request path.
        path: String,
        /// The request's [`AccessRecord::id`].
        request: u64,
        /// Attempts made.
        attempts: u32,
        /// The status the client got.
        status: u16,
        /// The last error's code.
        code: &'static str,
        /// The last error, in words (no URL, no header, no body).
        reason: String,
    },
    /// The stream ended with the provider's retryable error event before
    /// the client had any content block whole (a break inside the first
    /// thinking block, say): Claude Code starts such a request over at
    /// once, so it may yet complete — not a give-up. (The SDKs raise it.)
    HandedBackMidStream {
        /// `anthropic` or `openai`.
        upstream: &'static str,
        /// The request path.
        path: String,
        /// The request's [`AccessRecord::id`].
        request: u64,
        /// Attempts made.
        attempts: u32,
        /// The last error's code.
        code: &'static str,
        /// The last error, in words (no URL, no header, no body).
        reason: String,
    },
    /// Consecutive attempts could not reach the upstream: new requests to
    /// it are answered at once with `cause` until a probe gets an answer
    /// ([`CircuitConfig`](crate::CircuitConfig)).
    CircuitOpened {
        /// `anthropic` or `openai`.
        upstream: &'static str,
        /// The last attempt's reason.
        cause: String,
        /// How often a probe goes.
        probe_every: std::time::Duration,
    },
    /// A probe got an answer: requests to the upstream go again.
    CircuitClosed {
        /// `anthropic` or `openai`.
        upstream: &'static str,
    },
    /// The upstream of a request passed through could not be reached.
    Unreachable {
        /// `anthropic` or `openai`.
        upstream: &'static str,
        /// The request path.
        path: String,
        /// The request's [`AccessRecord::id`].
        request: u64,
        /// Why (connection refused, timed out, …).
        reason: String,
    },
}

impl std::fmt::Display for RecoveryEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secs = |d: &std::time::Duration| d.as_secs_f64();
        match self {
            Self::Killed {
                upstream,
                path,
                request,
                attempt,
            } => write!(
                f,
                "{upstream} {path} #{request}: attempt {attempt} went silent; killed it"
            ),
            Self::Retrying {
                upstream,
                path,
                request,
                attempt,
                code,
                delay,
            } => write!(
                f,
                "{upstream} {path} #{request}: attempt {attempt} failed ({code}); retrying in {:.1}s",
                secs(delay)
            ),
            Self::Continuing {
                upstream,
                path,
                request,
                attempt,
                code,
                delay,
            } => write!(
                f,
                "{upstream} {path} #{request}: attempt {attempt} broke mid-reply ({code}); continuing it in {:.1}s",
                secs(delay)
            ),
            Self::AskingWhole {
                upstream,
                path,
                request,
                silent,
                within,
            } => write!(
                f,
                "{upstream} {path} #{request}: {silent} streamed attempt(s) went silent before any content; asking once for the whole answer without a stream (within {:.0}s)",
                secs(within)
            ),
            Self::GaveUp {
                upstream,
                path,
                request,
                attempts,
                code,
                reason,
            } => write!(
                f,
                "{upstream} {path} #{request}: gave up after {attempts} attempt(s) ({code}: {reason})"
            ),
            Self::HandedBack {
                upstream,
                path,
                request,
                attempts,
                status,
                code,
                reason,
            } => write!(
                f,
                "{upstream} {path} #{request}: answered {status} after {attempts} attempt(s) ({code}: {reason}); handed back to the client as it came"
            ),
            Self::HandedBackMidStream {
                upstream,
                path,
                request,
                attempts,
                code,
                reason,
            } => write!(
                f,
                "{upstream} {path} #{request}: ended the stream with its error event after {attempts} attempt(s) ({code}: {reason}) before any block closed; handed back to the client"
            ),
            Self::CircuitOpened {
                upstream,
                cause,
                probe_every,
            } => write!(
                f,
                "{upstream}: the upstream cannot be reached ({cause}); new requests are answered at once until a probe (every {:.0}s) gets an answer",
                secs(probe_every)
            ),
            Self::CircuitClosed { upstream } => {
                write!(
                    f,
                    "{upstream}: the upstream answers again; requests go through"
                )
            }
            Self::Unreachable {
                upstream,
                path,
                request,
                reason,
            } => write!(
                f,
                "{upstream} {path} #{request}: the upstream cannot be reached ({reason})"
            ),
        }
    }
}

impl RecoveryEvent {
    /// The path of the request it is about (as its
    /// [`AccessRecord::path`]); `None` for an upstream's circuit.
    pub fn path(&self) -> Option<&str> {
        match self {
            Self::Killed { path, .. }
            | Self::Retrying { path, .. }
            | Self::Continuing { path, .. }
            | Self::AskingWhole { path, .. }
            | Self::GaveUp { path, .. }
            | Self::HandedBack { path, .. }
            | Self::HandedBackMidStream { path, .. }
            | Self::Unreachable { path, .. } => Some(path),
            Self::CircuitOpened { .. } | Self::CircuitClosed { .. } => None,
        }
    }
}

/// Called once per [`RecoveryEvent`].
pub type RecoveryLog = Arc<dyn Fn(&RecoveryEvent) + Send + Sync>;
