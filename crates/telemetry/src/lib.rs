//! # warden-telemetry
//!
//! Sets up tracing for binaries and examples (libraries only emit spans):
//!
//! - **Console**: readable logs filtered by `RUST_LOG` (default `info`).
//! - **OTLP/gRPC**: when `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or
//!   `OTEL_EXPORTER_OTLP_ENDPOINT` is set (or an endpoint is configured),
//!   warden's spans are exported with `OTEL_SERVICE_NAME` /
//!   `OTEL_RESOURCE_ATTRIBUTES` honoured (default service name `warden`).
//!   Only spans from `warden*` targets go to the exporter: ractor's, tonic's
//!   and the exporter's own spans are filtered out.
//!
//! [`init`] installs the global subscriber. To keep your own subscriber,
//! add [`layer`] to it instead (OTLP export with the same filtering and
//! guard), or [`export_layer`] with a tracer you built yourself. The OTLP
//! exporter is the `otlp` cargo feature (default): without it this crate
//! builds no gRPC stack, and [`export_layer`] and the console remain.
//!
//! ```no_run
//! use tracing_subscriber::layer::SubscriberExt as _;
//! use tracing_subscriber::util::SubscriberInitExt as _;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let config = warden_telemetry::TelemetryConfig::from_env();
//! let (otlp, _guard) = warden_telemetry::layer(&config)?;
//! tracing_subscriber::registry()
//!     .with(tracing_subscriber::fmt::layer()) // your own layers
//!     .with(otlp)
//!     .init();
//! # Ok(()) }
//! ```
//!
//! [`init`] returns a [`TelemetryGuard`]; dropping it (or a normal exit of
//! `main` while it is alive) flushes every finished span and shuts the
//! exporter down. The exporter runs on its own single-thread tokio runtime
//! and the SDK's batch thread, so flushing works from any context — a
//! current-thread runtime included — and an unreachable collector never
//! blocks the supervised work: spans queue (bounded) and are dropped when the
//! queue is full, and exports time out. An export failure is reported once
//! (a warning), not per batch, until exporting works again.
//!
//! ```no_run
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let _telemetry = warden_telemetry::init(warden_telemetry::TelemetryConfig::from_env())?;
//!     // ... run the orchestrator; spans are flushed when `_telemetry` drops.
//!     Ok(())
//! }
//! ```
//!
//! Dependencies: `opentelemetry`, `opentelemetry_sdk` (tracer provider,
//! batch processor), `opentelemetry-otlp` with `grpc-tonic` (the OTLP/gRPC
//! exporter Jaeger accepts on 4317), `tracing-opentelemetry` (bridges
//! `tracing` spans to OpenTelemetry), `tracing-subscriber` (registry,
//! `RUST_LOG` filtering, console output), `tokio` (the exporter's runtime).

use std::sync::Arc;
#[cfg(feature = "otlp")]
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use derive_setters::Setters;
#[cfg(feature = "otlp")]
use opentelemetry::trace::TracerProvider as _;
#[cfg(feature = "otlp")]
use opentelemetry_otlp::WithExportConfig;
#[cfg(feature = "otlp")]
use opentelemetry_sdk::Resource;
#[cfg(feature = "otlp")]
use opentelemetry_sdk::error::OTelSdkResult;
#[cfg(feature = "otlp")]
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use tracing::Subscriber;
use tracing_opentelemetry::OpenTelemetryLayer;
use tracing_subscriber::Layer as _;
use tracing_subscriber::filter::{EnvFilter, Filtered, Targets};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt as _;

/// How telemetry is set up.
#[derive(Debug, Clone, PartialEq, Eq, Setters)]
#[setters(prefix = "with_", strip_option)]
#[non_exhaustive]
pub struct TelemetryConfig {
    /// OTLP/gRPC endpoint (e.g. `http://127.0.0.1:4317`; `host:port` is
    /// taken as `http://host:port`, see [`otlp_url`]); `None` disables
    /// export. Default: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, else
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`, else `None`.
    #[setters(into)]
    pub otlp_endpoint: Option<String>,
    /// `service.name`. Default: `OTEL_SERVICE_NAME`, else `warden`.
    #[setters(into)]
    pub service_name: String,
    /// Print readable logs to stderr. Default `true`.
    pub console: bool,
    /// Console filter directives. Default: `RUST_LOG`, else `info`.
    #[setters(into)]
    pub console_filter: String,
    /// Upper bound of one export, and of everything dropping the
    /// [`TelemetryGuard`] does (the final flush and the shutdown). Default
    /// 3 s.
    #[setters(skip)]
    pub export_timeout: Duration,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            service_name: "warden".into(),
            console: true,
            console_filter: "info".into(),
            export_timeout: Duration::from_secs(3),
        }
    }
}

impl TelemetryConfig {
    /// The defaults with the standard OpenTelemetry and `RUST_LOG`
    /// environment variables applied.
    pub fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let d = Self::default();
        Self {
            otlp_endpoint: var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                .or_else(|| var("OTEL_EXPORTER_OTLP_ENDPOINT")),
            service_name: var("OTEL_SERVICE_NAME").unwrap_or(d.service_name),
            console_filter: var("RUST_LOG").unwrap_or(d.console_filter),
            ..d
        }
    }
}

/// Telemetry could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TelemetryError {
    /// The OTLP exporter could not be built (bad endpoint).
    #[error("OTLP exporter: {0}")]
    Exporter(String),
    /// The OTLP endpoint is not an `http://` or `https://` URL. Fatal: fix
    /// the setting.
    #[error(
        "OTLP endpoint {0:?} is not an http:// or https:// URL (OTEL_EXPORTER_OTLP_ENDPOINT, e.g. http://127.0.0.1:4317)"
    )]
    Endpoint(String),
    /// The console filter does not parse.
    #[error("invalid log filter {filter:?}: {message}")]
    Filter {
        /// The directives.
        filter: String,
        /// Parser message.
        message: String,
    },
    /// A global subscriber was already installed.
    #[error("a tracing subscriber is already installed")]
    AlreadyInstalled,
    /// The exporter's runtime could not start.
    #[error("telemetry runtime: {0}")]
    Runtime(String),
    /// An OTLP endpoint is configured but this build has no exporter (the
    /// `otlp` cargo feature is off).
    #[error(
        "OTLP endpoint {0} configured, but warden-telemetry was built without its `otlp` feature"
    )]
    OtlpDisabled(String),
}

/// Flushes and shuts the exporter down when dropped.
#[must_use = "dropping the guard flushes and stops span export"]
pub struct TelemetryGuard {
    #[cfg(feature = "otlp")]
    provider: Option<SdkTracerProvider>,
    #[cfg(feature = "otlp")]
    runtime: Option<tokio::runtime::Runtime>,
    /// The bound of the flush and shutdown at drop.
    #[cfg(feature = "otlp")]
    export_timeout: Duration,
    failures_reported: Arc<AtomicU64>,
}

impl std::fmt::Debug for TelemetryGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TelemetryGuard")
            .field("exporting", &self.is_exporting())
            .finish()
    }
}

impl TelemetryGuard {
    /// Whether spans are exported over OTLP.
    pub fn is_exporting(&self) -> bool {
        #[cfg(feature = "otlp")]
        return self.provider.is_some();
        #[cfg(not(feature = "otlp"))]
        false
    }

    /// How many export failures were reported (once per outage).
    pub fn failures_reported(&self) -> u64 {
        self.failures_reported.load(Ordering::Relaxed)
    }

    /// Exports every finished span now.
    pub fn flush(&self) {
        #[cfg(feature = "otlp")]
        if let Some(p) = &self.provider {
            let _ = p.force_flush();
        }
    }

    fn inactive(failures_reported: Arc<AtomicU64>) -> Self {
        Self {
            #[cfg(feature = "otlp")]
            provider: None,
            #[cfg(feature = "otlp")]
            runtime: None,
            #[cfg(feature = "otlp")]
            export_timeout: Duration::ZERO,
            failures_reported,
        }
    }
}

/// Flushes and shuts the exporter down within
/// [`TelemetryConfig::export_timeout`] all told: the SDK's flush waits
/// for one export per queued batch (a timeout each against a collector
/// that accepts and never answers), so flush and shutdown run on a thread
/// of their own, and what is not exported by the deadline is dropped.
#[cfg(feature = "otlp")]
impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(p) = self.provider.take() {
            let deadline = self.export_timeout;
            let (done, finished) = std::sync::mpsc::channel();
            let started = std::thread::Builder::new()
                .name("warden-otlp-shutdown".into())
                .spawn(move || {
                    let _ = p.force_flush();
                    let _ = p.shutdown_with_timeout(deadline);
                    let _ = done.send(());
                });
            if started.is_ok() && finished.recv_timeout(deadline).is_err() {
                eprintln!(
                    "warden: the span collector did not take the last spans within {deadline:?}; they are dropped"
                );
            }
        }
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// Reports export failures once, then again only after a recovery.
#[cfg(feature = "otlp")]
#[derive(Debug)]
struct ReportOnce<E> {
    inner: E,
    failing: Arc<AtomicBool>,
    reported: Arc<AtomicU64>,
    endpoint: String,
}

#[cfg(feature = "otlp")]
impl<E: SpanExporter> SpanExporter for ReportOnce<E> {
    fn export(&self, batch: Vec<SpanData>) -> impl Future<Output = OTelSdkResult> + Send {
        let failing = self.failing.clone();
        let reported = self.reported.clone();
        let endpoint = self.endpoint.clone();
        let fut = self.inner.export(batch);
        async move {
            let result = fut.await;
            match &result {
                Err(e) if !failing.swap(true, Ordering::Relaxed) => {
                    reported.fetch_add(1, Ordering::Relaxed);
                    eprintln!(
                        "warden: exporting spans to {endpoint} failed ({e}); spans are dropped until it recovers (reported once)"
                    )
                }
                Ok(()) if failing.swap(false, Ordering::Relaxed) => {
                    eprintln!("warden: exporting spans to {endpoint} works again")
                }
                _ => {}
            }
            result
        }
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// Targets whose spans go to the exporter: warden's crates only.
fn export_targets() -> Targets {
    Targets::new()
        .with_target("warden", tracing::Level::TRACE)
        .with_target("warden_core", tracing::Level::TRACE)
        .with_target("warden_store", tracing::Level::TRACE)
        .with_target("warden_llm", tracing::Level::TRACE)
        .with_target("warden_claude", tracing::Level::TRACE)
        .with_target("warden_mock", tracing::Level::TRACE)
        .with_default(tracing::level_filters::LevelFilter::OFF)
}

/// A layer exporting warden's spans (only those of `warden*` targets)
/// through `tracer`, for a subscriber and tracer provider of your own (any
/// exporter; no gRPC stack needed). Add it to your subscriber next to your
/// own layers.
pub fn export_layer<S, T>(tracer: T) -> Filtered<OpenTelemetryLayer<S, T>, Targets, S>
where
    S: Subscriber + for<'span> LookupSpan<'span>,
    T: opentelemetry::trace::Tracer + 'static,
    T::Span: Send + Sync,
{
    tracing_opentelemetry::layer()
        .with_tracer(tracer)
        // Not the emitting file, thread, target or busy/idle times: every
        // transition is emitted from the same two files, and these cost
        // time on each span and bytes in each export for nothing a user
        // searches by.
        .with_location(false)
        .with_threads(false)
        .with_target(false)
        .with_tracked_inactivity(false)
        .with_filter(export_targets())
}

/// The layer [`layer`] returns: warden's spans exported over OTLP/gRPC.
#[cfg(feature = "otlp")]
pub type OtlpLayer<S> =
    Filtered<OpenTelemetryLayer<S, opentelemetry_sdk::trace::Tracer>, Targets, S>;

/// The OTLP/gRPC export layer `config` describes, for your own subscriber
/// (see the [crate docs](crate)), and the guard that flushes it: `None`
/// when `config` names no endpoint. Installs nothing globally; the console
/// settings of `config` are not used (your subscriber has its own).
#[cfg(feature = "otlp")]
pub fn layer<S>(
    config: &TelemetryConfig,
) -> Result<(Option<OtlpLayer<S>>, TelemetryGuard), TelemetryError>
where
    S: Subscriber + for<'span> LookupSpan<'span>,
{
    let reported = Arc::new(AtomicU64::new(0));
    let Some(endpoint) = &config.otlp_endpoint else {
        return Ok((None, TelemetryGuard::inactive(reported)));
    };
    let endpoint = &otlp_url(endpoint)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("warden-otlp")
        .enable_all()
        .build()
        .map_err(|e| TelemetryError::Runtime(e.to_string()))?;
    let provider = match provider(config, endpoint, &runtime, reported.clone()) {
        Ok(provider) => provider,
        Err(e) => {
            // Dropping a runtime blocks, which panics on a caller's async
            // thread: let it go in the background instead.
            runtime.shutdown_background();
            return Err(e);
        }
    };
    let layer = export_layer(provider.tracer("warden"));
    Ok((
        Some(layer),
        TelemetryGuard {
            provider: Some(provider),
            runtime: Some(runtime),
            export_timeout: config.export_timeout,
            failures_reported: reported,
        },
    ))
}

/// The endpoint as the exporter takes it: `host:port` without a scheme (a
/// common spelling, as gRPC addresses are written) is taken as
/// `http://host:port`; a scheme other than `http` or `https` is an
/// [`TelemetryError::Endpoint`].
pub fn otlp_url(endpoint: &str) -> Result<String, TelemetryError> {
    let endpoint = endpoint.trim();
    match endpoint.split_once("://") {
        None if !endpoint.is_empty() && !endpoint.contains('/') => Ok(format!("http://{endpoint}")),
        Some((scheme, rest))
            if (scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https"))
                && !rest.is_empty()
                && !rest.starts_with('/') =>
        {
            Ok(endpoint.to_owned())
        }
        _ => Err(TelemetryError::Endpoint(endpoint.to_owned())),
    }
}

/// Builds the tracer provider for `endpoint` on `runtime`.
#[cfg(feature = "otlp")]
fn provider(
    config: &TelemetryConfig,
    endpoint: &str,
    runtime: &tokio::runtime::Runtime,
    reported: Arc<AtomicU64>,
) -> Result<SdkTracerProvider, TelemetryError> {
    // The tonic channel must belong to a runtime that keeps running while
    // the caller's thread blocks in a flush: ours.
    let _enter = runtime.enter();
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .with_timeout(config.export_timeout)
        .build()
        .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
    let exporter = ReportOnce {
        inner: exporter,
        failing: Arc::default(),
        reported,
        endpoint: endpoint.to_owned(),
    };
    // Resource::builder() reads OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME;
    // an explicit service name is applied on top only when the variable is unset.
    let mut resource = Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name(config.service_name.clone());
    }
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build())
}

/// Installs the global subscriber (console and, if configured, OTLP export)
/// and returns the guard that flushes on drop.
pub fn init(config: TelemetryConfig) -> Result<TelemetryGuard, TelemetryError> {
    let console_filter =
        EnvFilter::try_new(format!("{},opentelemetry=off,opentelemetry_sdk=off,opentelemetry_otlp=off,tonic=off,h2=off,hyper=off,tower=off", config.console_filter))
            .map_err(|e| TelemetryError::Filter {
                filter: config.console_filter.clone(),
                message: e.to_string(),
            })?;
    let console = config.console.then(|| {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            // Colours for a person at a terminal; plain text for a
            // journal, a file or a pipe.
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_target(false)
            .with_filter(console_filter)
    });
    #[cfg(feature = "otlp")]
    let (otel, guard) = layer(&config)?;
    #[cfg(not(feature = "otlp"))]
    let (otel, guard) = match &config.otlp_endpoint {
        Some(endpoint) => return Err(TelemetryError::OtlpDisabled(endpoint.clone())),
        None => (
            None::<tracing_subscriber::layer::Identity>,
            TelemetryGuard::inactive(Arc::default()),
        ),
    };
    tracing_subscriber::registry()
        .with(console)
        .with(otel)
        .try_init()
        .map_err(|_| TelemetryError::AlreadyInstalled)?;
    Ok(guard)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_without_a_scheme_is_http_and_other_schemes_are_refused() {
        let url = |s: &str| otlp_url(s).map_err(|e| e.to_string());
        assert_eq!(url("localhost:4317"), Ok("http://localhost:4317".into()));
        assert_eq!(url(" 10.0.0.5:4317 "), Ok("http://10.0.0.5:4317".into()));
        assert_eq!(url("https://otel:4317"), Ok("https://otel:4317".into()));
        assert_eq!(url("HTTP://otel:4317"), Ok("HTTP://otel:4317".into()));
        for bad in [
            "ftp://otel:4317",
            "http://",
            "http:///v1",
            "",
            "otel/v1/traces",
        ] {
            let e = url(bad).expect_err(bad);
            assert!(e.contains("http://127.0.0.1:4317"), "{bad}: {e}");
        }
    }
}
