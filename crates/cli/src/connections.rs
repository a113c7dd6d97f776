//! The connection limits `warden serve` and `warden proxy` share, as flags.

use std::time::Duration;

/// [`warden_http::DEFAULT_MAX_CONNECTIONS`] as the flag's type.
const DEFAULT_MAX_CONNECTIONS: u32 = 4096;
const _: () = assert!(DEFAULT_MAX_CONNECTIONS as usize == warden_http::DEFAULT_MAX_CONNECTIONS);

/// `--header-timeout` and `--max-connections`.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct ConnectionArgs {
    /// A request head must arrive whole within this (and a kept-alive
    /// connection must start its next request within it), else the
    /// connection is closed; a request body that sends nothing for this
    /// long is answered `408` and its connection closed: seconds, or a
    /// duration with a unit.
    #[arg(long, env = "WARDEN_HEADER_TIMEOUT", value_name = "SECONDS", default_value = "30", value_parser = crate::units::seconds)]
    pub(crate) header_timeout: Duration,
    /// Connections open at once; past it a new connection is answered
    /// `503` with `Retry-After: 1` and closed. Mind `ulimit -n`.
    #[arg(long, env = "WARDEN_MAX_CONNECTIONS", value_name = "N", default_value_t = DEFAULT_MAX_CONNECTIONS,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) max_connections: u32,
}

impl ConnectionArgs {
    /// `--max-connections`.
    pub(crate) fn max_connections(&self) -> usize {
        usize::try_from(self.max_connections).unwrap_or(usize::MAX)
    }

    /// The limits, with `busy_body` as the `503`'s body and
    /// `stalled_body` as the `408`'s (`warden serve`; the proxy sets its
    /// own bodies).
    pub(crate) fn limits(&self, busy_body: &str, stalled_body: &str) -> warden_http::Limits {
        warden_http::Limits::default()
            .with_header_timeout(self.header_timeout)
            .with_max_connections(self.max_connections())
            .with_busy_body(busy_body)
            .with_stalled_body(stalled_body)
    }
}
