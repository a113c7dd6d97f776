//! Running one proxied request, split by job: the pass-through path
//! ([`passthrough`]), a watched request's entry and its pull loop
//! ([`pump`]), one attempt's I/O on warden_core's watched stream
//! ([`attempt`]), what follows a broken attempt by warden_core's one
//! decision ([`recover`]), the whole answer asked for without a stream
//! when every streamed attempt went silent ([`fallback`]), and a whole
//! answer assembled from the stream ([`whole`]).

mod attempt;
mod fallback;
mod passthrough;
mod pump;
mod recover;
mod state;
mod watched;
mod whole;

use axum::extract::Request;
use axum::response::Response;
use tokio::time::Instant;
use warden_core::StreamError;

use crate::access::{AccessRecord, Outcome, RecoveryEvent};
use crate::circuit::{Pass, Probe};
use crate::config::ProxyConfig;
use crate::spans::PROXY_REQUEST;
use crate::upstream::Upstream;

pub(crate) use passthrough::{local, passthrough};
pub(crate) use watched::watched;

/// What every request of a running proxy shares.
pub(crate) struct Inner {
    pub(crate) config: ProxyConfig,
    /// Pass-through requests (bodies streamed both ways, any method).
    pub(crate) http: reqwest::Client,
    /// Watched requests' upstream connections, driven by the response's
    /// own task.
    pub(crate) upstreams: std::sync::Arc<crate::client::Upstreams>,
    pub(crate) watchdog: warden_core::watchdog::WatchdogHandle,
    pub(crate) admission: warden_core::Admission,
    /// Cancelled when the proxy ends its open responses (shutdown).
    pub(crate) stopping: tokio_util::sync::CancellationToken,
    /// Each upstream's circuit: Anthropic's, OpenAI's, Gemini's.
    pub(crate) circuits: [crate::circuit::Circuit; 3],
}

impl Inner {
    /// `upstream`'s circuit.
    pub(crate) fn circuit(&self, upstream: Upstream) -> &crate::circuit::Circuit {
        match upstream {
            Upstream::Anthropic => &self.circuits[0],
            Upstream::OpenAi => &self.circuits[1],
            Upstream::Gemini => &self.circuits[2],
        }
    }

    /// The upstream answered: its circuit closes (said once when it was
    /// open), and while closed its count of consecutive unreachable
    /// attempts starts again.
    pub(crate) fn reached(&self, upstream: Upstream) {
        let circuit = self.circuit(upstream);
        let was_open = circuit.is_open();
        circuit.reached();
        if was_open {
            report(
                self,
                RecoveryEvent::CircuitClosed {
                    upstream: upstream.name(),
                },
            );
        }
    }

    /// An attempt could not reach `upstream` (`cause`): whether its circuit
    /// is open now (said once when it opens).
    pub(crate) fn unreachable(&self, upstream: Upstream, cause: &str) -> bool {
        let circuit = self.circuit(upstream);
        let was_open = circuit.is_open();
        let open = circuit.unreachable(cause);
        if open
            && !was_open
            && let Some(config) = self.config.circuit
        {
            report(
                self,
                RecoveryEvent::CircuitOpened {
                    upstream: upstream.name(),
                    cause: cause.to_owned(),
                    probe_every: config.probe_every,
                },
            );
        }
        open
    }

    /// The answer to a request refused by `upstream`'s open circuit.
    pub(crate) fn refused(
        &self,
        upstream: Upstream,
        cause: &str,
        next_probe_in: std::time::Duration,
    ) -> axum::response::Response {
        crate::upstream::error_response_coded(
            upstream,
            axum::http::StatusCode::BAD_GATEWAY,
            &format!(
                "warden proxy: the {} upstream cannot be reached ({cause}); not asked again \
                 until a probe in {:.0}s gets an answer",
                upstream.name(),
                next_probe_in.as_secs_f64().ceil()
            ),
            Some(UNREACHABLE),
        )
    }
}

/// The error code of a request the proxy could not get to its upstream.
pub(crate) const UNREACHABLE: &str = "EUPSTREAM_UNREACHABLE";

/// Why a request ends when its deadline passes.
fn past_deadline() -> StreamError {
    StreamError::Interrupted {
        reason: "the request's deadline passed".to_owned(),
    }
}

/// Sleeps until `deadline`; never, without one.
async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Why an attempt ends when the proxy shuts down.
fn shutting_down() -> StreamError {
    StreamError::Interrupted {
        reason: "the proxy is shutting down".to_owned(),
    }
}

/// Hands `recovery` to the configured recovery log, if any.
fn report(inner: &Inner, recovery: RecoveryEvent) {
    if let Some(log) = &inner.config.recovery_log {
        log(&recovery);
    }
}

/// The access record of a request to `upstream`, before it is answered.
pub(crate) fn new_record(upstream: Upstream, request: &Request) -> AccessRecord {
    AccessRecord {
        id: crate::access::next_request_id(),
        upstream: upstream.name(),
        method: request.method().to_string(),
        path: request
            .extensions()
            .get::<crate::access::ClientPath>()
            .map_or_else(|| request.uri().path().to_owned(), |p| p.0.clone()),
        status: 0,
        duration_ms: 0,
        attempts: 1,
        kills: 0,
        continuations: 0,
        outcome: Outcome::Passthrough,
        code: None,
    }
}

/// Where requests to `upstream` go.
pub(crate) fn base_of(inner: &Inner, upstream: Upstream) -> &str {
    match upstream {
        Upstream::Anthropic => &inner.config.anthropic_upstream,
        Upstream::OpenAi => &inner.config.openai_upstream,
        Upstream::Gemini => &inner.config.gemini_upstream,
    }
}

fn upstream_url(base: &str, uri: &axum::http::Uri) -> String {
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    format!("{}{path}", base.trim_end_matches('/'))
}

fn finish(inner: &Inner, mut record: AccessRecord, started: Instant) {
    record.duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let span = tracing::Span::current();
    span.record("warden.status", record.status);
    span.record("warden.attempts", record.attempts);
    span.record("warden.kills", record.kills);
    span.record("warden.continuations", record.continuations);
    span.record("warden.outcome", record.outcome.as_str());
    // A failed request's span says so to the trace backend (OpenTelemetry's
    // span status), not only in an attribute of ours.
    if matches!(record.outcome, Outcome::UpstreamError | Outcome::ErrorEvent)
        || record.status >= 500
    {
        span.record("otel.status_code", "ERROR");
    }
    if let Some(log) = &inner.config.access_log {
        log(&record);
    }
}

fn request_span(record: &AccessRecord) -> tracing::Span {
    tracing::info_span!(
        PROXY_REQUEST,
        otel.name = PROXY_REQUEST,
        warden.upstream = record.upstream,
        warden.path = %record.path,
        warden.status = tracing::field::Empty,
        warden.attempts = tracing::field::Empty,
        warden.kills = tracing::field::Empty,
        warden.continuations = tracing::field::Empty,
        warden.outcome = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    )
}

/// The reason of a client error, without the URL (which may carry a
/// query string the user did not mean to log).
fn reason(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "connection failed"
    } else if e.is_body() || e.is_decode() {
        "the body broke off"
    } else {
        "request failed"
    };
    // Every cause, innermost last ("client error (Connect): tcp connect
    // error: Connection refused (os error 111)"), none of them a URL (the
    // error's own text, which names it, is left out).
    match std::error::Error::source(e) {
        Some(source) => format!("{kind}: {}", warden_llm::error_chain(source)),
        None => kind.to_owned(),
    }
}

/// The answer to a request while `upstream`'s circuit is open (a copy of
/// its access `record` written), or `Ok` when it may go — with the
/// circuit's probe when it goes as one, to hold until it ends: nothing is
/// copied for a request that goes.
fn refuse(
    inner: &Inner,
    upstream: Upstream,
    record: &AccessRecord,
    started: Instant,
) -> Result<Option<Probe>, Box<Response>> {
    let (cause, next_probe_in) = match inner.circuit(upstream).pass() {
        Pass::Go => return Ok(None),
        Pass::Probe(probe) => return Ok(Some(probe)),
        Pass::Refuse {
            cause,
            next_probe_in,
        } => (cause, next_probe_in),
    };
    let response = inner.refused(upstream, &cause, next_probe_in);
    let mut record = record.clone();
    record.status = response.status().as_u16();
    record.outcome = Outcome::UpstreamError;
    record.code = Some(UNREACHABLE);
    finish(inner, record, started);
    Err(Box::new(response))
}
