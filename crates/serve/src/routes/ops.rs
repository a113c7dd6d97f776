//! What operators and monitors use: the token check, readiness, metrics,
//! and every session's lifecycle events.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use subtle::ConstantTimeEq as _;

use crate::cluster::Cluster;
use crate::error::ApiError;
use crate::history;
use crate::metrics::ClusterView;
use crate::state::AppState;

/// Requires `Authorization: Bearer <token>` (compared in constant time).
pub(crate) async fn authorize(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token)
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

/// The token of an `Authorization: Bearer <token>` value. The scheme is
/// case-insensitive (RFC 9110 §11.1), and spaces around the token are not
/// part of it.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim_start().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
}

/// `GET /metrics`: Prometheus text.
pub(crate) async fn render_metrics(State(state): State<AppState>, cluster: Cluster) -> Response {
    let view = match cluster.placement() {
        Some(placement) => {
            let (forwarded_answered, forwarded_unreachable) = cluster.forwarded();
            Some(ClusterView {
                stats: placement.stats().await,
                forwarded_answered,
                forwarded_unreachable,
            })
        }
        None => None,
    };
    let body = state.metrics.render(&state.supervisor, view).await;
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

/// `GET /readyz`: `ok` while the supervisor runs and, on a cluster node,
/// the placement can reach the cluster's database; else `503` saying which.
pub(crate) async fn ready(State(state): State<AppState>, cluster: Cluster) -> Response {
    if let Err(e) = state.supervisor.sessions().await {
        return ApiError::unavailable("not_ready", e.to_string()).into_response();
    }
    if let Some(placement) = cluster.placement()
        && let Err(why) = placement.ready().await
    {
        return ApiError::unavailable("database_unreachable", why)
            .retry_after(1)
            .into_response();
    }
    "ok".into_response()
}

/// `GET /v1/events`: every session's lifecycle events from now on — or,
/// with `Last-Event-ID`, from after that event: the missed ones are
/// replayed from the window kept ([`history::KEPT`](crate::history::KEPT)
/// events); a client that missed more than that, or whose id is from an
/// earlier run of the server, first gets a `reset` event saying so
/// (`{"reason": "missed" | "restarted"}`), then every event kept.
pub(crate) async fn lifecycle_events(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let seen = super::last_event_id(&headers, "the id of a lifecycle event")?
        .unwrap_or_else(|| state.history.now());
    let history = Arc::clone(&state.history);
    let events = futures_util::stream::unfold(
        (history, seen, VecDeque::<Event>::new()),
        |(history, mut seen, mut queue)| async move {
            loop {
                if let Some(e) = queue.pop_front() {
                    return Some((Ok::<_, Infallible>(e), (history, seen, queue)));
                }
                let kept = match history.after(seen).await {
                    history::Next::Events(events) => events,
                    history::Next::Reset { reason, events } => {
                        queue.push_back(
                            Event::default()
                                .event("reset")
                                .data(json!({"reason": reason}).to_string()),
                        );
                        events
                    }
                };
                for k in kept {
                    seen = k.id;
                    queue.push_back(
                        Event::default()
                            .id(k.id.to_string())
                            .event(k.kind)
                            .data(k.data.to_string()),
                    );
                }
            }
        },
    );
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response())
}
