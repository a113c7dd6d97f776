//! [`WireLayer`]: the engine served on loopback, its routes and the
//! sources made live on them.

use std::sync::Arc;
use std::time::Duration;

use warden_claude::CliCommand;
use warden_core::{EventSource, SessionKey};
use warden_proxy::{Outcome, Proxy, ProxyConfig, RecoveryEvent};

use crate::live::Live;
use crate::options::WireError;
use crate::routes::{Routes, routed};

/// A running wire layer: the engine served on a loopback port. Cheap to
/// clone; the server stops when the last clone is dropped.
#[derive(Clone)]
pub struct WireLayer {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for WireLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WireLayer")
            .field("url", &self.inner.url)
            .finish()
    }
}

struct Inner {
    proxy: Proxy,
    /// What it carried, route by route.
    routes: Arc<Routes>,
    /// Its silence allowance per attempt.
    allowance: Duration,
    url: String,
    stop: parking_lot::Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl WireLayer {
    /// Starts the engine of `config` on a loopback port (its upstreams are
    /// where the CLIs' requests go on: see [`anthropic_upstream`](crate::anthropic_upstream),
    /// [`openai_upstream`](crate::openai_upstream), [`gemini_upstream`](crate::gemini_upstream)). What it recovers is
    /// printed on stderr, one `warden: wire layer: …` line each (the CLI
    /// never sees it: this line is its only trace), naming the session
    /// whose route it came on. Must run on a tokio runtime.
    pub async fn start(config: ProxyConfig) -> Result<Self, WireError> {
        let routes = Arc::new(Routes::default());
        let (killed, ended) = (Arc::clone(&routes), Arc::clone(&routes));
        let allowance = config.timeout;
        let policy_attempts = config.retry.max_attempts;
        let limits = config.connections.clone();
        let config = config
            .with_recovery_log(move |recovery| {
                let route = recovery
                    .path()
                    .map_or_else(|| Arc::clone(&killed.root), |path| killed.of_path(path).0);
                route.note_spent(recovery, policy_attempts);
                if let RecoveryEvent::Killed { request, .. } = recovery {
                    let mut seen = route.seen.lock();
                    seen.stalled.insert(*request);
                    seen.kills += 1;
                    seen.stalling = true;
                }
                eprintln!("{}", Routes::line(&route, recovery));
            })
            .with_access_log(move |record| {
                if record.outcome == Outcome::Complete {
                    let route = ended.of_path(&record.path).0;
                    let mut seen = route.seen.lock();
                    seen.completed += 1;
                    seen.stalling = false;
                }
            });
        let proxy = Proxy::start(config).await?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(WireError::Bind)?;
        let url = format!("http://{}", listener.local_addr().map_err(WireError::Bind)?);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        // Served as `Proxy::serve` serves it, within its connection
        // limits, each request first taken off its route ([`routed`]).
        let app = axum::Router::new().fallback_service(proxy.router()).layer(
            axum::middleware::from_fn_with_state(Arc::clone(&routes), routed),
        );
        let task = tokio::spawn(async move {
            warden_http::serve(listener, app, limits, async move {
                let _ = stopped.await;
            })
            .await
        });
        Ok(Self {
            inner: Arc::new(Inner {
                proxy,
                routes,
                allowance,
                url,
                stop: parking_lot::Mutex::new(Some(stop)),
                task,
            }),
        })
    }

    /// Its base URL, `http://127.0.0.1:<port>`: where a CLI sends its model
    /// requests (Codex and the chat-completions CLIs add `/v1` to it).
    pub fn url(&self) -> &str {
        &self.inner.url
    }

    /// Why nothing it carried without a route could save a failed turn,
    /// when every model request stalled: how many, how many silent
    /// attempts it killed and after how long; `None` when one completed or
    /// none stalled.
    pub fn every_request_stalled(&self) -> Option<String> {
        self.inner
            .routes
            .root
            .seen
            .lock()
            .every_request_stalled(self.inner.allowance)
    }

    /// `source`, whose attempts are also live while this wire sends their
    /// CLI its model stream: the process layer's silence allowance is then
    /// measured against the CLI's output and its model stream, so a CLI
    /// reading a long reply, or waiting on thinking the wire holds back
    /// (the wire keeps that stream live with a comment per held event),
    /// is not killed as silent. A CLI that hangs on a healthy stream is
    /// still killed once the stream ends. When the wire hands a request of
    /// the run back after the retry policy's attempts (an outage longer
    /// than them: each attempt failed before any byte, the last with a
    /// status the CLI would retry), the run ends at once with
    /// [`StreamError::RetriedBelow`](warden_core::StreamError::RetriedBelow)
    /// — the CLI's process group with it, before its own retries go out —
    /// and the session does not run the turn again: the policy's attempts
    /// upstream in all, not the product of three layers'. A CLI the wire
    /// hands an overloaded answer back to at once (Claude Code, Codex:
    /// their own retries take it up) is left to retry it. For a wire under
    /// one session (`warden chat`): every chunk sent without a route
    /// counts for it.
    pub fn live(&self, source: Arc<dyn EventSource>) -> Arc<dyn EventSource> {
        Arc::new(Live {
            inner: source,
            route: Arc::clone(&self.inner.routes.root),
            _hold: None,
            _wire: Arc::clone(&self.inner) as _,
        })
    }

    /// [`live`](Self::live) for a wire under many sessions: session
    /// `key`'s source, live while the wire sends its CLI's model stream on
    /// the session's own route (its CLI's command edited by
    /// [`per_session`](Self::per_session)), not another's. When the last
    /// source made for `key` is dropped (the session ended), `end` is
    /// called with `key` — it ends the session's CLI process
    /// ([`CliSource::end_session`](warden_claude::CliSource::end_session))
    /// — and the route is removed.
    pub fn session_source(
        &self,
        key: &SessionKey,
        source: Arc<dyn EventSource>,
        end: Arc<dyn Fn(&SessionKey) + Send + Sync>,
    ) -> Arc<dyn EventSource> {
        let hold = self.inner.routes.hold(key, end);
        Arc::new(Live {
            inner: source,
            route: Arc::clone(hold.route()),
            _hold: Some(hold),
            _wire: Arc::clone(&self.inner) as _,
        })
    }

    /// The edit each process of session `key` gets
    /// (`CliSource::set_per_session`): wherever its command names the
    /// wire (an environment variable, an argument, a configuration in
    /// one), the session's route after it: `http://127.0.0.1:P/s/<id>`,
    /// which every CLI the wire carries keeps as a path prefix (the
    /// Anthropic, OpenAI and Gemini SDKs add their paths to it). Holds
    /// the routes, not the server.
    pub fn per_session(&self) -> impl Fn(&SessionKey, &mut CliCommand) + Send + Sync + 'static {
        let (routes, url) = (Arc::clone(&self.inner.routes), self.inner.url.clone());
        move |key, command| routes.put_on_route(&url, key, command)
    }

    /// How many sessions have a route now.
    pub fn routes(&self) -> usize {
        self.inner.routes.len()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The CLIs are gone by now (their sources are): end what is still
        // open at once.
        self.proxy.end_open_responses();
        self.proxy.stop();
        if let Some(stop) = self.stop.lock().take() {
            let _ = stop.send(());
        }
        self.task.abort();
    }
}
