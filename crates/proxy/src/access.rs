//! What the access log gets: one [`AccessRecord`] per request.

use std::sync::Arc;

/// One proxied request, as the access log reports it (no headers, no
/// bodies).
#[derive(Debug, Clone, serde::Serialize)]
#[non_exhaustive]
pub struct AccessRecord {
    /// `anthropic` or `openai`.
    pub upstream: &'static str,
    /// The request method.
    pub method: String,
    /// The request path (no query string).
    pub path: String,
    /// The status the client got.
    pub status: u16,
    /// From the request to the end of the response body, in milliseconds.
    pub duration_ms: u64,
    /// Upstream attempts made (1 when nothing went wrong).
    pub attempts: u32,
    /// Attempts the watchdog killed.
    pub kills: u32,
    /// Continuations spliced into the response.
    pub continuations: u32,
    /// How the response ended.
    pub outcome: Outcome,
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
        }
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
