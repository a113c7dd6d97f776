//! The server: [`MockServer`] binds, accepts and serves each connection on
//! its own task; every request is recorded in its journal.
//!
//! Connections speak HTTP/1.1 (what the Anthropic and OpenAI SDKs and the
//! Claude Code CLI use against a plain `http://` base URL), with
//! `TCP_NODELAY` so every frame leaves as soon as it is written.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{broadcast, oneshot};
use tokio::task::{JoinHandle, JoinSet};

use crate::handler::{Ctx, handle};
use crate::journal::{Journal, RequestId, RequestRecord, ServerEvent};
use crate::{MockConfig, MockError, Scenario};

/// A running mock LLM server on `127.0.0.1`.
///
/// Dropping it stops accepting and closes every connection in the
/// background; [`shutdown`](Self::shutdown) does the same and waits for it.
/// Must be started inside a tokio runtime.
pub struct MockServer {
    addr: SocketAddr,
    journal: Arc<Journal>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for MockServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MockServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl MockServer {
    /// Binds `127.0.0.1` on [`MockConfig::port`] (a free port by default)
    /// and starts serving.
    pub async fn start(config: MockConfig) -> Result<Self, MockError> {
        let wanted = SocketAddr::from((Ipv4Addr::LOCALHOST, config.port.unwrap_or(0)));
        let bind_err = |source| MockError::Bind {
            addr: wanted,
            source,
        };
        let listener = TcpListener::bind(wanted).await.map_err(bind_err)?;
        let addr = listener.local_addr().map_err(bind_err)?;
        let journal = Arc::new(Journal::new());
        let ctx = Arc::new(Ctx {
            journal: journal.clone(),
            config,
            background: Default::default(),
        });
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(accept_loop(listener, ctx, stopped));
        tracing::debug!(target: "warden_mock", %addr, "mock server listening");
        Ok(Self {
            addr,
            journal,
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// The bound address (`127.0.0.1:PORT`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, the value for `ANTHROPIC_BASE_URL`. OpenAI
    /// clients usually want [`url("/v1")`](Self::url).
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `base_url()` followed by `path` (which should start with `/`).
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url())
    }

    /// A base URL whose requests play `scenario` (unless a header or the
    /// model picks another): `http://127.0.0.1:PORT/scenario/NAME`.
    pub fn scenario_base_url(&self, scenario: Scenario) -> String {
        self.url(&format!("/scenario/{scenario}"))
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.journal.records()
    }

    /// The record of request `id`.
    pub fn request(&self, id: RequestId) -> Option<RequestRecord> {
        self.journal.records().into_iter().find(|r| r.id == id)
    }

    /// Number of requests received so far (every path).
    pub fn request_count(&self) -> usize {
        self.journal.records().len()
    }

    /// Number of requests whose path (without the query) is exactly
    /// `path`, e.g. `requests_to("/v1/messages")` also counts
    /// `/v1/messages?beta=true`.
    pub fn requests_to(&self, path: &str) -> usize {
        self.journal
            .records()
            .iter()
            .filter(|r| r.path == path)
            .count()
    }

    /// Number of requests per path (without the query).
    pub fn request_counts(&self) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for r in self.journal.records() {
            *counts.entry(r.path).or_insert(0) += 1;
        }
        counts
    }

    /// Number of responses the client abandoned: it closed the connection
    /// while the server was still streaming (or still holding) it.
    pub fn closed_by_client(&self) -> usize {
        self.journal
            .count_events(|e| matches!(e, ServerEvent::ClientClosed { .. }))
    }

    /// The most streams that were open at once, per group: `group` maps a
    /// request to its group (say, the session a prompt belongs to, through
    /// [`RequestRecord::prompt_digest`]) or `None` to leave it out. A
    /// request counts from its `RequestStarted` event until its end
    /// (`Completed`, `ServerClosed`, `ClientClosed`), in the order the
    /// server saw them; a request still open counts to the end.
    pub fn peak_concurrency<K: Ord + Clone>(
        &self,
        group: impl Fn(&RequestRecord) -> Option<K>,
    ) -> BTreeMap<K, usize> {
        let records: BTreeMap<RequestId, RequestRecord> = self
            .journal
            .records()
            .into_iter()
            .map(|r| (r.id, r))
            .collect();
        let key = |id: &RequestId| records.get(id).and_then(&group);
        let mut open: BTreeMap<K, usize> = BTreeMap::new();
        let mut peak: BTreeMap<K, usize> = BTreeMap::new();
        for event in self.journal.events() {
            match event {
                ServerEvent::RequestStarted { id, .. } => {
                    if let Some(k) = key(&id) {
                        let n = open.entry(k.clone()).or_insert(0);
                        *n += 1;
                        let p = peak.entry(k).or_insert(0);
                        *p = (*p).max(*n);
                    }
                }
                ServerEvent::Completed { id, .. }
                | ServerEvent::ServerClosed { id, .. }
                | ServerEvent::ClientClosed { id, .. } => {
                    if let Some(n) = key(&id).and_then(|k| open.get_mut(&k)) {
                        *n = n.saturating_sub(1);
                    }
                }
                _ => {}
            }
        }
        peak
    }

    /// Every event so far, in order.
    pub fn events(&self) -> Vec<ServerEvent> {
        self.journal.events()
    }

    /// Live events from now on (earlier ones are in
    /// [`events`](Self::events)). A receiver more than 1024 events behind
    /// gets `Lagged`.
    pub fn subscribe(&self) -> broadcast::Receiver<ServerEvent> {
        self.journal.subscribe()
    }

    /// The first event, past or future, that matches `pred`; `None` if
    /// none came within `timeout`.
    pub async fn wait_for_event(
        &self,
        pred: impl Fn(&ServerEvent) -> bool,
        timeout: Duration,
    ) -> Option<ServerEvent> {
        let mut changes = self.journal.watch_changes();
        let found = async {
            loop {
                changes.borrow_and_update();
                if let Some(event) = self.journal.find_event(&pred) {
                    return Some(event);
                }
                if changes.changed().await.is_err() {
                    return None;
                }
            }
        };
        tokio::time::timeout(timeout, found).await.ok().flatten()
    }

    /// Waits until the server has seen the client close request `id`'s
    /// connection mid-response ([`ServerEvent::ClientClosed`]); `false`
    /// after `timeout`.
    pub async fn wait_for_client_close(&self, id: RequestId, timeout: Duration) -> bool {
        self.wait_for_event(
            |e| matches!(e, ServerEvent::ClientClosed { id: i, .. } if *i == id),
            timeout,
        )
        .await
        .is_some()
    }

    /// Waits until request `id` exists and has started
    /// ([`ServerEvent::RequestStarted`]); `false` after `timeout`.
    pub async fn wait_for_request(&self, id: RequestId, timeout: Duration) -> bool {
        self.wait_for_event(
            |e| matches!(e, ServerEvent::RequestStarted { id: i, .. } if *i == id),
            timeout,
        )
        .await
        .is_some()
    }

    /// Stops accepting, closes every open connection (stalled ones
    /// included) and waits until that is done. Responses cut this way are
    /// recorded as [`Outcome::Interrupted`](crate::Outcome::Interrupted),
    /// not as closed by the client.
    pub async fn shutdown(mut self) {
        self.journal.set_shutting_down();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for MockServer {
    fn drop(&mut self) {
        // The accept loop sees its stop channel close and winds down.
        self.journal.set_shutting_down();
    }
}

async fn accept_loop(listener: TcpListener, ctx: Arc<Ctx>, mut stopped: oneshot::Receiver<()>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut stopped => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    connections.spawn(serve_connection(stream, ctx.clone()));
                }
                Err(err) => {
                    // E.g. too many open files: back off instead of spinning.
                    tracing::warn!(target: "warden_mock", error = %err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    ctx.journal.set_shutting_down();
    drop(listener);
    connections.shutdown().await;
}

async fn serve_connection(stream: TcpStream, ctx: Arc<Ctx>) {
    // Frames are small and must leave at once.
    let _ = stream.set_nodelay(true);
    let service = service_fn(move |req| handle(ctx.clone(), req));
    if let Err(err) = http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .await
    {
        tracing::debug!(target: "warden_mock", error = %err, "connection ended with an error");
    }
}
