//! What operators and monitors use: the token check, readiness, metrics,
//! and every session's lifecycle events.

use std::convert::Infallible;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use subtle::ConstantTimeEq as _;

use crate::cluster::Cluster;
use crate::error::ApiError;
use crate::metrics::ClusterView;
use crate::state::AppState;
use crate::views;

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

/// `GET /v1/events`: every session's lifecycle events from now on; a
/// client too slow to keep up is told how many it missed (`lagged`).
pub(crate) async fn lifecycle_events(State(state): State<AppState>) -> Response {
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
