//! A node of a cluster: requests for sessions and turns another node runs
//! are forwarded to it.
//!
//! - `POST /v1/turns` for a session another live node owns is sent on to
//!   the owner's advertised address with the caller's `Authorization`
//!   (every node of a cluster checks the same token) and the answer —
//!   `202` or the turn's event stream — is relayed as it comes. A request
//!   already forwarded (`x-warden-forwarded`) is never forwarded again, so
//!   ownership moving in between cannot make two nodes bounce a request:
//!   the second node answers `503 session_elsewhere` itself. An owner that
//!   cannot be reached (dead, its lease not yet expired), or does not
//!   answer within 5 s (paused), gets the same `503` with `Retry-After`.
//! - Turn ids of a cluster node name the node (`turn_<node in hex>_<random>`),
//!   so `GET /v1/turns/{id}/events` (with `Last-Event-ID`) and
//!   `DELETE /v1/turns/{id}` work on any node: a turn kept elsewhere is
//!   fetched from its node.
//!
//! The handlers decide nothing about the cluster: each takes a [`Cluster`]
//! (an extractor: this node's placement, the request's headers, the
//! forwarding client) and asks it once where the request belongs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{FromRef, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, Method};
use axum::response::Response;
use warden_core::SessionKey;
use warden_core::cluster::Placement;

use crate::api::ErrorType;
use crate::error::{ApiError, elsewhere, gone};
use crate::ids::node_of_turn;

/// The header a forwarded request carries: the forwarding node's id.
const FORWARDED: &str = "x-warden-forwarded";

/// How long the owner may take to answer a forwarded request's head. A
/// paused owner (its process stopped, its kernel still accepting
/// connections) would otherwise hold the caller until it wakes; after this
/// the caller gets `503` and asks again. A forwarded turn the owner accepts
/// late is still run (delivery is at least once).
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);

/// Request headers passed on to the owner.
const REQUEST_HEADERS: [&str; 5] = [
    "authorization",
    "accept",
    "content-type",
    "last-event-id",
    "idempotency-key",
];

/// Response headers relayed back.
const RESPONSE_HEADERS: [&str; 5] = [
    "content-type",
    "retry-after",
    "cache-control",
    "x-warden-turn-id",
    "idempotent-replayed",
];

/// `segment` percent-encoded for one path segment (everything but the
/// unreserved characters of RFC 3986).
pub(crate) fn encode_segment(segment: &str) -> String {
    use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
    const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'.')
        .remove(b'_')
        .remove(b'~');
    utf8_percent_encode(segment, SEGMENT).to_string()
}

/// Whether this request was already forwarded by another node.
fn was_forwarded(headers: &HeaderMap) -> bool {
    headers.contains_key(FORWARDED)
}

/// Why a forward failed: the owner could not be reached.
#[derive(Debug)]
struct Unreachable(String);

/// Sends the request on to `base` (another node) and relays its answer,
/// streaming the body as it arrives.
async fn forward(
    http: &reqwest::Client,
    me: &str,
    method: Method,
    base: &str,
    path: &str,
    headers: &HeaderMap,
    body: Option<Bytes>,
) -> Result<Response, Unreachable> {
    let url = format!("{}{path}", base.trim_end_matches('/'));
    let mut req = http.request(method, &url).header(FORWARDED, me);
    for name in REQUEST_HEADERS {
        if let Some(v) = headers.get(name) {
            req = req.header(name, v);
        }
    }
    if let Some(body) = body {
        req = req.body(body);
    }
    // The head only: a turn's stream then lasts as long as the turn.
    let answer = tokio::time::timeout(HEAD_TIMEOUT, req.send())
        .await
        .map_err(|_| Unreachable(format!("{base}: no answer within {HEAD_TIMEOUT:?}")))?
        .map_err(|e| Unreachable(format!("{base}: {}", without_url(&e))))?;
    let mut out = Response::builder().status(answer.status());
    for name in RESPONSE_HEADERS {
        if let Some(v) = answer.headers().get(name) {
            out = out.header(HeaderName::from_static(name), v);
        }
    }
    out.body(Body::from_stream(answer.bytes_stream()))
        .map_err(|e| Unreachable(e.to_string()))
}

/// The client used for forwarding: a short connect timeout (a dead owner
/// is found out fast), no overall timeout (a turn's stream lasts as long as
/// the turn).
fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(2))
        .tcp_nodelay(true)
        .no_proxy()
        .build()
        .unwrap_or_default()
}

/// A reqwest error's text without its URL's query (none is sent, but
/// keep it short).
pub(crate) fn without_url(e: &reqwest::Error) -> String {
    let mut e = e.to_string();
    if let Some(i) = e.find(" for url") {
        e.truncate(i);
    }
    e
}

/// What the server keeps for the cluster: this node's placement (`None`
/// on a single node) and the client that forwards requests, built on first
/// use so a single node never builds it. Part of the server's state.
#[derive(Clone, Default)]
pub(crate) struct ClusterState {
    placement: Option<Arc<dyn Placement>>,
    http: Arc<OnceLock<reqwest::Client>>,
    forwarded: Arc<Forwarded>,
    /// The last `GET /v1/cluster` read from the database, answered
    /// (marked stale) while it cannot be read.
    last_view: Arc<parking_lot::Mutex<Option<crate::api::ClusterView>>>,
}

/// Requests forwarded to another node, by outcome (for `/metrics`).
#[derive(Debug, Default)]
struct Forwarded {
    answered: AtomicU64,
    unreachable: AtomicU64,
}

impl ClusterState {
    /// The state of a node placed by `placement`.
    pub(crate) fn new(placement: Option<Arc<dyn Placement>>) -> Self {
        Self {
            placement,
            http: Arc::default(),
            forwarded: Arc::default(),
            last_view: Arc::default(),
        }
    }
}

/// The cluster as a handler sees it (an extractor; on a single node every
/// question has the answer "here").
pub(crate) struct Cluster {
    state: ClusterState,
    headers: HeaderMap,
}

impl<S> FromRequestParts<S> for Cluster
where
    ClusterState: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Ok(Self {
            state: ClusterState::from_ref(state),
            headers: parts.headers.clone(),
        })
    }
}

/// Where a request for a session belongs.
pub(crate) enum Placed {
    /// Here: run it.
    Here,
    /// The owner answered the forwarded request: relay its answer.
    Forwarded(Response),
}

impl Cluster {
    /// This node's id, on a cluster node.
    pub(crate) fn node(&self) -> Option<&str> {
        self.state.placement.as_ref().and_then(|p| p.node())
    }

    /// The placement, on a cluster node.
    pub(crate) fn placement(&self) -> Option<&dyn Placement> {
        self.state.placement.as_deref()
    }

    fn http(&self) -> &reqwest::Client {
        self.state.http.get_or_init(client)
    }

    /// The last `GET /v1/cluster` read from the database (see
    /// `routes::ops::cluster_view`).
    pub(crate) fn last_view(&self) -> &parking_lot::Mutex<Option<crate::api::ClusterView>> {
        &self.state.last_view
    }

    /// Requests forwarded so far: (answered by their node, unreachable).
    pub(crate) fn forwarded(&self) -> (u64, u64) {
        let f = &self.state.forwarded;
        (
            f.answered.load(Ordering::Relaxed),
            f.unreachable.load(Ordering::Relaxed),
        )
    }

    /// Sends the request on to `base` and counts the outcome.
    async fn forward(
        &self,
        me: &str,
        method: Method,
        base: &str,
        path: &str,
        body: Option<Bytes>,
    ) -> Result<Response, Unreachable> {
        let answer = forward(self.http(), me, method, base, path, &self.headers, body).await;
        let counter = match &answer {
            Ok(_) => &self.state.forwarded.answered,
            Err(_) => &self.state.forwarded.unreachable,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        answer
    }

    /// `error` as a client gets it: on a cluster node that cannot reach
    /// its database now, or could not a moment ago
    /// ([`Placement::in_outage`]), a `503` is `503
    /// database_unreachable` with `Retry-After` whichever step failed
    /// first (the placement, the session's store, a lease the outage
    /// made this node give up), and says nothing of the driver (that is in
    /// the node's log); anything else is answered as it is.
    pub(crate) async fn in_outage(&self, error: ApiError) -> ApiError {
        let Some(placement) = &self.state.placement else {
            return error;
        };
        if error.kind.status() != 503 || !placement.in_outage().await {
            return error;
        }
        tracing::debug!(error.type = %error.kind, error = %error.message, "a new turn refused in a database outage");
        ApiError::new(
            ErrorType::DatabaseUnreachable,
            "this node cannot reach the cluster's database: the turn was not accepted; \
             ask again after Retry-After (or another node)",
        )
        .retry_after(1)
    }

    /// Where a new turn of `key` runs: here (this node holds or just took
    /// the session's lease), or at its owner, which is sent `body` once
    /// (a request already forwarded is not forwarded again); an owner that
    /// cannot be reached is `503 session_elsewhere` with `Retry-After`.
    pub(crate) async fn place_turn(
        &self,
        key: &SessionKey,
        body: &impl serde::Serialize,
    ) -> Result<Placed, ApiError> {
        let Some(placement) = &self.state.placement else {
            return Ok(Placed::Here);
        };
        let Err(e) = placement.place(key).await else {
            return Ok(Placed::Here);
        };
        if let (Some(owner), Some(me)) = (&e.advertise, placement.node())
            && !was_forwarded(&self.headers)
        {
            let body = serde_json::to_vec(body)
                .map(Bytes::from)
                .map_err(|e| ApiError::new(ErrorType::Internal, e.to_string()))?;
            let answer = self
                .forward(me, Method::POST, owner, "/v1/turns", Some(body))
                .await;
            match answer {
                Ok(answer) => return Ok(Placed::Forwarded(answer)),
                Err(Unreachable(why)) => {
                    tracing::info!(session = %key, %why, "the session's owner cannot be reached");
                }
            }
        }
        Err(elsewhere(key, e))
    }

    /// A turn this node does not keep: fetched from the node its id names
    /// (once), else 404.
    pub(crate) async fn turn_elsewhere(
        &self,
        id: &str,
        method: Method,
        path: &str,
    ) -> Result<Response, ApiError> {
        let Some(placement) = &self.state.placement else {
            return Err(gone());
        };
        let (Some(me), Some(node)) = (placement.node(), node_of_turn(id)) else {
            return Err(gone());
        };
        if node == me || was_forwarded(&self.headers) {
            return Err(gone());
        }
        let Some(base) = placement.advertise_of(&node).await else {
            return Err(ApiError::new(
                ErrorType::NotFound,
                format!("no such turn: its node {node} is no longer a member"),
            ));
        };
        self.forward(me, method, &base, path, None)
            .await
            .map_err(|Unreachable(why)| {
                ApiError::new(
                    ErrorType::NodeUnreachable,
                    format!("turn {id} is kept by node {node}, which cannot be reached: {why}"),
                )
                .retry_after(1)
            })
    }

    /// Sends the request to the other live node that holds `key`'s lease
    /// now, if there is one (and the request was not forwarded already).
    pub(crate) async fn to_session_owner(
        &self,
        key: &SessionKey,
        method: Method,
        path: &str,
    ) -> Option<Result<Response, ApiError>> {
        let placement = self.state.placement.as_deref()?;
        if was_forwarded(&self.headers) {
            return None;
        }
        let me = placement.node()?;
        let all = placement.sessions().await?.ok()?;
        let place = all.into_iter().find(|p| p.key == key.as_str())?;
        let live = place.lease_remaining_secs.is_some_and(|s| s > 0.0);
        let base = match (place.owner, place.advertise) {
            (Some(owner), Some(base)) if live && owner != me => base,
            _ => return None,
        };
        Some(
            self.forward(me, method, &base, path, None)
                .await
                .map_err(|Unreachable(why)| {
                    ApiError::new(ErrorType::NodeUnreachable, why).retry_after(1)
                }),
        )
    }
}
