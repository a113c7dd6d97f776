//! How the wire runs ([`WireOptions`]) and why it could not start
//! ([`WireError`]).

use std::time::Duration;

/// Why the wire layer could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The engine's configuration is refused (an upstream that is not an
    /// `http(s)://` URL, a bad timeout).
    #[error("the wire layer: {0}")]
    Config(#[from] warden_proxy::ProxyError),
    /// No loopback port could be bound.
    #[error("the wire layer cannot listen on 127.0.0.1: {0}")]
    Bind(std::io::Error),
}

/// How [`WiredSourceFactory::start`](crate::WiredSourceFactory::start) runs the wire layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireOptions {
    /// The sessions' stream timeout (the process watchdog's allowance on
    /// the CLI's stdout); the wire allows an upstream stream half of it
    /// (at least 500 ms, [`ProxyConfig::under_agent_cli`](warden_proxy::ProxyConfig::under_agent_cli)). Default
    /// [`warden_core::config::DEFAULT_STREAM_TIMEOUT`].
    pub stream_timeout: Duration,
    /// Whether the wire runs. Default `true`; [`off`](Self::off).
    pub enabled: bool,
}

impl Default for WireOptions {
    fn default() -> Self {
        Self::new(warden_core::config::DEFAULT_STREAM_TIMEOUT)
    }
}

impl WireOptions {
    /// The wire under sessions whose stream timeout is `stream_timeout`.
    pub fn new(stream_timeout: Duration) -> Self {
        Self {
            stream_timeout,
            enabled: true,
        }
    }

    /// No wire: the CLI reaches its API directly.
    pub fn off() -> Self {
        Self {
            enabled: false,
            ..Self::default()
        }
    }
}
