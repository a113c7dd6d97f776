//! # warden-serve
//!
//! warden's workspace sessions over HTTP/1.1 + SSE, for orchestrators in
//! any language: the same [`Supervisor`] (store, sources, watchdog,
//! telemetry) as the library, behind a small JSON API.
//!
//! | route | what |
//! |---|---|
//! | `POST /v1/turns` `{"workspace": PATH \| "key": KEY, "message": TEXT}` | runs a turn: `202 {"id", "key"}`, or with `Accept: text/event-stream` its events as SSE |
//! | `GET /v1/turns/{id}/events` | the turn's events as SSE, from the first, or after `Last-Event-ID` |
//! | `DELETE /v1/turns/{id}` | cancels it (queued or running): `{"id", "cancelled"}` |
//! | `GET /v1/sessions` | the running sessions' keys |
//! | `GET /v1/sessions/{key}` | one session (key percent-encoded): its record, and while it runs its turn |
//! | `POST /v1/sessions/{key}/reset` | forgets that the session was given up |
//! | `GET /v1/events` | lifecycle events of every session, as SSE, from now on |
//! | `GET /healthz` | `ok` (no token needed) |
//! | `GET /openapi.json` | this API as an OpenAPI 3.1 document (no token needed) |
//! | `GET /readyz` | `ok` while the supervisor runs, else 503 |
//! | `GET /metrics` | Prometheus text: sessions by state, admission queue, kills, retries, continuations, fallbacks, turns by outcome, turn durations |
//!
//! Every event of a turn has an SSE `id:` unique and increasing within the
//! turn (from 1), an `event:` type and JSON `data:`; text arrives as `text`
//! events, and the last event is `done` (the summary) or `error` (`code`,
//! `message`, and the `exit` class the CLI uses). A turn's events are kept
//! until [`ServeConfig::keep_finished`] after it ends.
//!
//! Every route but `/healthz` needs `Authorization: Bearer <token>`
//! (compared in constant time). Bad requests get a typed JSON error,
//! `{"error": {"type", "message"}}`, with a 4xx status; bodies over
//! [`ServeConfig::max_body_bytes`] get 413.

mod cluster;
mod metrics;
mod openapi;
mod turns;
mod views;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::Stream;
use serde::Deserialize;
use serde_json::json;
use subtle::ConstantTimeEq as _;
use warden_core::cluster::{Elsewhere, Placement};
use warden_core::store::{StoredEvent as ServeEvent, StoredTurn, TurnStore};
use warden_core::{SessionKey, Supervisor, SupervisorError};

use turns::{TurnLog, Turns};

/// Request bodies larger than this get 413: 10 MiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 10 * 1024 * 1024;

/// How the server behaves.
#[derive(Clone)]
#[non_exhaustive]
pub struct ServeConfig {
    /// The bearer token every route but `/healthz` requires.
    pub token: String,
    /// How long a finished turn's events stay available for re-attach.
    /// Default 10 min.
    pub keep_finished: Duration,
    /// Largest request body accepted. Default [`DEFAULT_MAX_BODY_BYTES`].
    pub max_body_bytes: usize,
    /// Where sessions run, for a node of a cluster. Default `None`: every
    /// session runs here.
    pub placement: Option<Arc<dyn Placement>>,
    /// Where a cluster node stores its turns' events before it sends them,
    /// so a turn re-delivered elsewhere keeps its id and event numbers.
    /// Default `None`: they live in this process only.
    pub turn_store: Option<Arc<dyn TurnStore>>,
    /// The supervisor's re-delivered turns, relayed as turns of this
    /// server (see [`with_recovered_turns`](Self::with_recovered_turns)).
    recovered: Option<Arc<std::sync::Mutex<Option<RecoveredRx>>>>,
}

type RecoveredRx = tokio::sync::mpsc::UnboundedReceiver<warden_core::RecoveredTurn>;

impl std::fmt::Debug for ServeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeConfig")
            .field("token", &"<redacted>")
            .field("keep_finished", &self.keep_finished)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("placement", &self.placement.is_some())
            .field("turn_store", &self.turn_store.is_some())
            .finish()
    }
}

impl ServeConfig {
    /// A configuration requiring `token`, with the defaults.
    pub fn new(token: impl Into<String>) -> Self {
        Self {
            token: token.into(),
            keep_finished: Duration::from_secs(600),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            placement: None,
            turn_store: None,
            recovered: None,
        }
    }

    /// Sets [`turn_store`](Self::turn_store).
    pub fn with_turn_store(mut self, store: Arc<dyn TurnStore>) -> Self {
        self.turn_store = Some(store);
        self
    }

    /// Relays the turns the supervisor re-delivers (give it the sender with
    /// [`SupervisorBuilder::recovered_turns`](warden_core::SupervisorBuilder::recovered_turns)):
    /// each becomes a turn of this server, and with a
    /// [`turn_store`](Self::turn_store) it keeps the id and the events its
    /// message had on the node that died, so its clients re-attach to it.
    pub fn with_recovered_turns(mut self, rx: RecoveredRx) -> Self {
        self.recovered = Some(Arc::new(std::sync::Mutex::new(Some(rx))));
        self
    }

    /// Sets [`placement`](Self::placement).
    pub fn with_placement(mut self, placement: Arc<dyn Placement>) -> Self {
        self.placement = Some(placement);
        self
    }

    /// Sets [`keep_finished`](Self::keep_finished).
    pub fn with_keep_finished(mut self, keep: Duration) -> Self {
        self.keep_finished = keep;
        self
    }
}

#[derive(Clone)]
struct AppState {
    /// Forwards requests to other nodes of a cluster; built on first use,
    /// so a single node never builds it.
    http: Arc<std::sync::OnceLock<reqwest::Client>>,
    supervisor: Supervisor,
    turns: Arc<Turns>,
    config: Arc<ServeConfig>,
    metrics: Arc<metrics::Metrics>,
}

/// The API as an axum [`Router`], serving `supervisor`'s sessions.
pub fn router(supervisor: Supervisor, config: ServeConfig) -> Router {
    let max_body = config.max_body_bytes;
    let metrics = Arc::new(metrics::Metrics::new());
    metrics::watch(&supervisor, metrics.clone());
    let turns = Arc::new(Turns::new(config.turn_store.clone()));
    let recovered = config.recovered.as_ref().and_then(|r| {
        r.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    });
    if let Some(rx) = recovered {
        let node = config
            .placement
            .as_ref()
            .and_then(|p| p.node())
            .map(str::to_owned);
        turns.adopt(rx, config.keep_finished, node);
    }
    let state = AppState {
        http: Arc::default(),
        supervisor,
        turns,
        config: Arc::new(config),
        metrics,
    };
    let api = Router::new()
        .route("/v1/turns", post(create_turn))
        .route("/v1/turns/{id}/events", get(turn_events))
        .route("/v1/turns/{id}", axum::routing::delete(cancel_turn))
        .route("/v1/sessions", get(list_sessions))
        .route("/v1/sessions/{key}", get(one_session))
        .route("/v1/sessions/{key}/reset", post(reset_session))
        .route("/v1/events", get(lifecycle_events))
        .route("/readyz", get(ready))
        .route("/metrics", get(render_metrics))
        .route_layer(middleware::from_fn_with_state(state.clone(), authorize));
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/openapi.json", get(|| async { Json(openapi::document()) }))
        .merge(api)
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route") })
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(state)
}

/// A typed error answer: `{"error": {"type", "message"}}`.
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    kind: &'static str,
    message: String,
    /// Seconds for a `Retry-After` header.
    retry_after: Option<u64>,
    /// More fields of the error object.
    extra: Option<serde_json::Map<String, serde_json::Value>>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            message: message.into(),
            retry_after: None,
            extra: None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut error = serde_json::Map::new();
        error.insert("type".into(), json!(self.kind));
        error.insert("message".into(), json!(self.message));
        error.extend(self.extra.unwrap_or_default());
        let body = Json(json!({ "error": error }));
        let mut response = (self.status, body).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
        }
        if let Some(secs) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from(secs));
        }
        response
    }
}

/// 503 with `Retry-After`: the session runs on another node.
fn elsewhere(key: &SessionKey, e: Elsewhere) -> ApiError {
    if let Some(ws) = &e.missing_workspace {
        let mut extra = serde_json::Map::new();
        extra.insert("owner".into(), json!(e.owner));
        extra.insert("workspace".into(), json!(ws));
        return ApiError {
            retry_after: Some(e.retry_after.as_secs_f64().ceil().max(1.0) as u64),
            extra: Some(extra),
            ..ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "workspace_unavailable",
                format!(
                    "session {} lives in workspace {}, which is not on this node, and its node {} is gone; \
                     it runs again when a node with that directory takes it over",
                    key.as_str(),
                    ws.display(),
                    e.owner.as_deref().unwrap_or("(unknown)")
                ),
            )
        };
    }
    let mut extra = serde_json::Map::new();
    extra.insert("owner".into(), json!(e.owner));
    extra.insert("advertise".into(), json!(e.advertise));
    ApiError {
        retry_after: Some(e.retry_after.as_secs_f64().ceil().max(1.0) as u64),
        extra: Some(extra),
        ..ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "session_elsewhere",
            format!(
                "session {} runs on node {} now; ask it, or again after Retry-After (a dead owner's lease expires then)",
                key.as_str(),
                e.owner.as_deref().unwrap_or("(unknown)")
            ),
        )
    }
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        let kind = match r.status() {
            StatusCode::PAYLOAD_TOO_LARGE => "too_large",
            StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
            _ => "invalid_request",
        };
        Self::new(r.status(), kind, r.body_text())
    }
}

/// Requires `Authorization: Bearer <token>`.
async fn authorize(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    let ok: bool = given.as_bytes().ct_eq(state.config.token.as_bytes()).into();
    if ok && !state.config.token.is_empty() {
        next.run(request).await
    } else {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a valid `Authorization: Bearer <token>` header is required",
        )
        .into_response()
    }
}

async fn render_metrics(State(state): State<AppState>) -> Response {
    let body = state.metrics.render(&state.supervisor).await;
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

async fn ready(State(state): State<AppState>) -> Response {
    match state.supervisor.sessions().await {
        Ok(_) => "ok".into_response(),
        Err(e) => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "not_ready", e.to_string())
            .into_response(),
    }
}

/// The body of `POST /v1/turns`.
#[derive(Debug, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
struct NewTurn {
    workspace: Option<String>,
    key: Option<String>,
    message: String,
}

async fn create_turn(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Json<NewTurn>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(new) = body?;
    let sup = &state.supervisor;
    // A cluster node: only the session's owner runs its turns.
    if let Some(placement) = &state.config.placement {
        let key = match (&new.workspace, &new.key) {
            (Some(ws), None) if std::path::Path::new(ws).is_absolute() => {
                Some(sup.key_for(ws).map_err(bad_session)?)
            }
            (None, Some(k)) if !k.trim().is_empty() => Some(SessionKey::new(k)),
            _ => None, // refused below, with its own error
        };
        if let Some(key) = key
            && let Err(e) = placement.place(&key).await
        {
            // Another node runs it: forward the turn there, once.
            if let (Some(owner), Some(me)) = (&e.advertise, placement.node())
                && !cluster::was_forwarded(&headers)
            {
                let body = serde_json::to_vec(&new).map(Bytes::from).map_err(|e| {
                    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
                })?;
                let path = "/v1/turns";
                match cluster::forward(
                    state.http.get_or_init(cluster::client),
                    me,
                    Method::POST,
                    owner,
                    path,
                    &headers,
                    Some(body),
                )
                .await
                {
                    Ok(answer) => return Ok(answer),
                    Err(cluster::Unreachable(why)) => {
                        tracing::info!(session = %key, %why, "the session's owner cannot be reached");
                    }
                }
            }
            return Err(elsewhere(&key, e));
        }
    }
    let (key, handle) = match (new.workspace, new.key) {
        (Some(ws), None) => {
            // Relative to what? The server's working directory is no
            // client's business.
            if !std::path::Path::new(&ws).is_absolute() {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_workspace",
                    format!("workspace {ws:?} must be an absolute path"),
                ));
            }
            let key = sup.key_for(&ws).map_err(bad_session)?;
            (
                key,
                sup.send_to_workspace(&ws, new.message)
                    .await
                    .map_err(bad_session)?,
            )
        }
        (None, Some(k)) if !k.trim().is_empty() => {
            let key = SessionKey::new(&k);
            (
                key.clone(),
                sup.send(key, new.message).await.map_err(bad_session)?,
            )
        }
        _ => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "give exactly one of `workspace` (a directory) or `key` (a non-empty name)",
            ));
        }
    };
    let node = state.config.placement.as_ref().and_then(|p| p.node());
    let id = state
        .turns
        .start(key.clone(), handle, state.config.keep_finished, node, None)
        .await;
    if wants_events(&headers) {
        let log = state.turns.get(&id).ok_or_else(gone)?;
        let mut response = sse(log, 0).into_response();
        if let Ok(v) = header::HeaderValue::from_str(&id) {
            response.headers_mut().insert("x-warden-turn-id", v);
        }
        return Ok(response);
    }
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({"id": id, "key": key.as_str()})),
    )
        .into_response())
}

fn wants_events(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"))
}

fn gone() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        "no such turn (or it expired)",
    )
}

/// A session error as the client's error: a path that cannot be a
/// workspace, a session given up, the store failing.
fn bad_session(e: SupervisorError) -> ApiError {
    match &e {
        SupervisorError::Workspace { .. } => {
            ApiError::new(StatusCode::BAD_REQUEST, "invalid_workspace", e.to_string())
        }
        SupervisorError::SessionFailed { .. } => {
            ApiError::new(StatusCode::CONFLICT, "session_failed", e.to_string())
        }
        SupervisorError::Store {
            error: warden_core::StoreError::LeaseLost { .. },
            ..
        } => ApiError {
            retry_after: Some(1),
            ..ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "session_elsewhere",
                e.to_string(),
            )
        },
        _ => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            e.to_string(),
        ),
    }
}

async fn turn_events(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let after = last_event_id(&headers)?;
    let Some(log) = state.turns.get(&id) else {
        let path = format!("/v1/turns/{id}/events");
        let elsewhere = turn_elsewhere(&state, &id, Method::GET, &path, &headers).await;
        // Not kept here and its node cannot serve it: the cluster's store
        // can, while whichever node runs it now stores its events.
        return match (elsewhere, &state.turns.store) {
            (Ok(answer), _) => Ok(answer),
            (Err(e), Some(store)) => match store.read(&id, after).await {
                Ok(Some(turn)) => Ok(stored_sse(store.clone(), turn, after).into_response()),
                Ok(None) => Err(e),
                Err(why) => Err(ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    why.to_string(),
                )),
            },
            (Err(e), None) => Err(e),
        };
    };
    Ok(sse(log, after).into_response())
}

/// The `Last-Event-ID` header's number (0 without one).
fn last_event_id(headers: &HeaderMap) -> Result<u64, ApiError> {
    Ok(match headers.get("last-event-id") {
        None => 0,
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_request",
                    "Last-Event-ID must be an event id of this turn (a whole number)",
                )
            })?,
    })
}

/// How often a turn served from the store (its node died, or another node
/// runs it) is read again for new events.
const STORE_POLL: Duration = Duration::from_millis(100);

/// A turn's events read from the store: `turn` (read after `after`), then
/// its later ones as its current node stores them, until its last.
fn stored_sse(
    store: Arc<dyn TurnStore>,
    turn: StoredTurn,
    after: u64,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let queue: std::collections::VecDeque<ServeEvent> = turn.events.into();
    let events = futures_util::stream::unfold(
        (store, turn.id, after, queue, turn.ended),
        |(store, id, mut seen, mut queue, mut ended)| async move {
            loop {
                if let Some(e) = queue.pop_front() {
                    seen = e.id;
                    ended |= e.is_last();
                    return Some((Ok(sse_event(&e)), (store, id, seen, queue, ended)));
                }
                if ended {
                    return None;
                }
                tokio::time::sleep(STORE_POLL).await;
                match store.read(&id, seen).await {
                    Ok(Some(t)) => {
                        ended = t.ended && t.events.is_empty();
                        queue.extend(t.events);
                    }
                    // Expired, or the store failed: the client re-attaches.
                    Ok(None) | Err(_) => return None,
                }
            }
        },
    );
    Sse::new(events).keep_alive(KeepAlive::default())
}

/// A turn this node does not keep: fetched from the node its id names
/// (once), else 404.
async fn turn_elsewhere(
    state: &AppState,
    id: &str,
    method: Method,
    path: &str,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    let Some(placement) = &state.config.placement else {
        return Err(gone());
    };
    let (Some(me), Some(node)) = (placement.node(), cluster::node_of_turn(id)) else {
        return Err(gone());
    };
    if node == me || cluster::was_forwarded(headers) {
        return Err(gone());
    }
    let Some(base) = placement.advertise_of(&node).await else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no such turn: its node {node} is no longer a member"),
        ));
    };
    cluster::forward(
        state.http.get_or_init(cluster::client),
        me,
        method,
        &base,
        path,
        headers,
        None,
    )
    .await
    .map_err(|cluster::Unreachable(why)| ApiError {
        retry_after: Some(1),
        ..ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "node_unreachable",
            format!("turn {id} is kept by node {node}, which cannot be reached: {why}"),
        )
    })
}

async fn cancel_turn(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let Some(log) = state.turns.get(&id) else {
        let path = format!("/v1/turns/{id}");
        let elsewhere = turn_elsewhere(&state, &id, Method::DELETE, &path, &headers).await;
        let (Err(e), Some(store)) = (&elsewhere, &state.turns.store) else {
            return elsewhere;
        };
        // Its node cannot take it: the node that runs its session now can.
        let turn = match store.read(&id, u64::MAX).await {
            Ok(Some(turn)) => turn,
            Ok(None) | Err(_) => return elsewhere,
        };
        if turn.ended {
            return Ok(
                Json(json!({"id": id, "key": turn.key.as_str(), "cancelled": false}))
                    .into_response(),
            );
        }
        let owner = match &state.config.placement {
            Some(p) if !cluster::was_forwarded(&headers) => {
                current_owner(p.as_ref(), &turn.key).await
            }
            _ => None,
        };
        let Some((me, base)) = owner else {
            return Err(ApiError {
                retry_after: Some(1),
                ..ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "turn_moving",
                    format!(
                        "turn {id} is being re-delivered by another node; ask again ({})",
                        e.message
                    ),
                )
            });
        };
        return cluster::forward(
            state.http.get_or_init(cluster::client),
            &me,
            Method::DELETE,
            &base,
            &path,
            &headers,
            None,
        )
        .await
        .map_err(|cluster::Unreachable(why)| ApiError {
            retry_after: Some(1),
            ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "node_unreachable", why)
        });
    };
    // An error means the session is gone: nothing left to cancel.
    let cancelled = log.cancel().await.unwrap_or(false);
    Ok(Json(json!({"id": id, "key": log.key.as_str(), "cancelled": cancelled})).into_response())
}

/// This node's id and the address of the other live node that holds
/// `key`'s lease now, if any.
async fn current_owner(placement: &dyn Placement, key: &SessionKey) -> Option<(String, String)> {
    let me = placement.node()?;
    let all = placement.sessions().await?.ok()?;
    let place = all.into_iter().find(|p| p.key == key.as_str())?;
    let live = place.lease_remaining_secs.is_some_and(|s| s > 0.0);
    match (place.owner, place.advertise) {
        (Some(owner), Some(base)) if live && owner != me => Some((me.to_owned(), base)),
        _ => None,
    }
}

async fn list_sessions(State(state): State<AppState>) -> Result<Response, ApiError> {
    // A cluster node lists the whole cluster.
    if let Some(placement) = &state.config.placement
        && let Some(all) = placement.sessions().await
    {
        let all =
            all.map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", e))?;
        let me = placement.node();
        let list: Vec<_> = all
            .iter()
            .map(|p| {
                let mut v = json!(p);
                v["here"] = json!(me.is_some() && p.owner.as_deref() == me);
                v
            })
            .collect();
        return Ok(Json(json!({"sessions": list})).into_response());
    }
    let keys = state.supervisor.sessions().await.map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            e.to_string(),
        )
    })?;
    let list: Vec<_> = keys.iter().map(|k| json!({"key": k.as_str()})).collect();
    Ok(Json(json!({"sessions": list})).into_response())
}

async fn one_session(
    State(state): State<AppState>,
    Path(key): Path<String>,
) -> Result<Response, ApiError> {
    let key = SessionKey::new(&key);
    let unavailable = |e: &dyn std::fmt::Display| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            e.to_string(),
        )
    };
    let running = match state.supervisor.running(key.clone()).await {
        Ok(Some(handle)) => handle.status().await.ok(),
        Ok(None) => None,
        Err(e) => return Err(unavailable(&e)),
    };
    let record = match &running {
        Some(_) => None,
        None => state
            .supervisor
            .stored(&key)
            .await
            .map_err(|e| unavailable(&e))?,
    };
    if running.is_none() && record.is_none() {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no session {key}"),
        ));
    }
    Ok(Json(views::session(record.as_ref(), running.as_ref())).into_response())
}

async fn reset_session(
    State(state): State<AppState>,
    Path(key): Path<String>,
) -> Result<Response, ApiError> {
    state
        .supervisor
        .reset(key.as_str())
        .await
        .map_err(bad_session)?;
    Ok(Json(json!({"key": key, "reset": true})).into_response())
}

/// Every session's lifecycle events from now on; a client too slow to
/// keep up is told how many it missed (`lagged`).
async fn lifecycle_events(State(state): State<AppState>) -> Response {
    let rx = state.supervisor.subscribe();
    let events = futures_util::stream::unfold((rx, 0u64), |(mut rx, mut n)| async move {
        use tokio::sync::broadcast::error::RecvError;
        loop {
            let (kind, data) = match rx.recv().await {
                Ok(e) => match views::lifecycle(&e) {
                    Some(v) => v,
                    None => continue,
                },
                Err(RecvError::Lagged(missed)) => ("lagged", json!({"missed": missed})),
                Err(RecvError::Closed) => return None,
            };
            n += 1;
            let event = Event::default()
                .id(n.to_string())
                .event(kind)
                .data(data.to_string());
            return Some((Ok::<_, Infallible>(event), (rx, n)));
        }
    });
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// A turn's event as an SSE event: its number, type and JSON.
fn sse_event(e: &ServeEvent) -> Event {
    Event::default()
        .id(e.id.to_string())
        .event(e.kind.as_str())
        .data(e.data.to_string())
}

/// The turn's events after `after`, then its later ones as they come, until
/// its last.
fn sse(log: Arc<TurnLog>, after: u64) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let events = futures_util::stream::unfold(
        (log, after, std::collections::VecDeque::new(), false),
        |(log, mut seen, mut queue, mut ended)| async move {
            loop {
                if let Some(e) = queue.pop_front() {
                    let e: ServeEvent = e;
                    seen = e.id;
                    return Some((Ok(sse_event(&e)), (log, seen, queue, ended)));
                }
                if ended {
                    return None;
                }
                let (batch, last) = log.after(seen);
                if batch.is_empty() {
                    if last {
                        return None;
                    }
                    log.wait_past(seen).await;
                    continue;
                }
                ended = last;
                queue.extend(batch);
            }
        },
    );
    Sse::new(events).keep_alive(KeepAlive::default())
}
