//! The wire layer under an agent CLI: warden's own watched proxy engine
//! (`warden_proxy`, what `warden proxy` runs), in this process, on
//! loopback, with the CLI's model traffic pointed at it (Claude Code's
//! `ANTHROPIC_BASE_URL`). A stall or a cut mid-reply is continued inside
//! the CLI's own request and spliced into the same response, a stall inside
//! a thinking block retried unseen (thinking is held back: no human
//! watches these streams): the CLI never sees the fault, is never killed
//! for it, and the reply is not generated twice. The process layer (the
//! session's watchdog on the CLI's stdout) stays for what the wire cannot
//! see: a CLI that hangs with a healthy upstream, crashes or prints
//! garbage.

use std::time::Duration;

use warden_proxy::{Proxy, ProxyConfig};

use crate::exit::CliError;

/// The share of the stream timeout the wire allows an upstream stream to
/// be silent: half, so a stall is continued at the wire well before the
/// process watchdog (the whole timeout) would kill the CLI waiting on it.
const WIRE_SHARE: u32 = 2;

/// A running wire layer.
pub(crate) struct Wire {
    proxy: Proxy,
    url: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Wire {
    /// Starts the engine in front of `upstream` (the Anthropic API's base
    /// URL), with half of `stream_timeout` as its silence allowance.
    pub(crate) async fn start(upstream: &str, stream_timeout: Duration) -> Result<Self, CliError> {
        let timeout = (stream_timeout / WIRE_SHARE).max(Duration::from_millis(500));
        let config = ProxyConfig::default()
            .with_anthropic_upstream(upstream)
            .with_timeout(timeout)
            .with_hold_thinking(true)
            // What it did, as `warden proxy` says it: the CLI never sees
            // it, so this line is the only trace of it on the terminal.
            .with_recovery_log(|recovery| eprintln!("warden: wire layer: {recovery}"));
        let proxy = Proxy::start(config)
            .await
            .map_err(|e| CliError::usage(format!("the wire layer: {e}")))?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| CliError::failure(format!("the wire layer cannot listen: {e}")))?;
        let url = match listener.local_addr() {
            Ok(addr) => format!("http://{addr}"),
            Err(e) => return Err(CliError::failure(format!("the wire layer: {e}"))),
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = proxy.clone();
        let task = tokio::spawn(async move {
            serving
                .serve(listener, async move {
                    let _ = stopped.await;
                })
                .await
        });
        Ok(Self {
            proxy,
            url,
            stop: Some(stop),
            task,
        })
    }

    /// Where the CLI sends its model requests.
    pub(crate) fn url(&self) -> &str {
        &self.url
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        // The CLIs are gone by now (their sources shut down first): end
        // what is still open at once.
        self.proxy.end_open_responses();
        self.proxy.stop();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.abort();
    }
}

/// The Anthropic API a Claude Code session would reach without warden:
/// `--base-url` when given, else the CLI's own `ANTHROPIC_BASE_URL`, else
/// the provider's.
pub(crate) fn anthropic_upstream(base_url: Option<&str>) -> String {
    base_url
        .map(str::to_owned)
        .or_else(|| {
            std::env::var("ANTHROPIC_BASE_URL")
                .ok()
                .filter(|u| !u.trim().is_empty())
        })
        .unwrap_or_else(|| warden_proxy::ANTHROPIC_API.to_owned())
}
