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
//! | `GET /v1/turns/{id}/trace` | its trace, read from the Jaeger query API at [`ServeConfig::jaeger_url`] |
//! | `GET /v1/sessions` | the running sessions' keys |
//! | `GET /v1/sessions/{key}` | one session (key percent-encoded): its record, and while it runs its turn |
//! | `POST /v1/sessions/{key}/reset` | forgets that the session was given up |
//! | `GET /v1/events` | lifecycle events of every session, as SSE, from now on |
//! | `GET /healthz` | `ok` (no token needed) |
//! | `GET /openapi.json` | this API as an OpenAPI 3.1 document (no token needed) |
//! | `GET /readyz` | `ok` while the supervisor runs (and a cluster node reaches its database), else 503 (no token needed) |
//! | `GET /metrics` | Prometheus text: sessions by state, admission queue, kills, retries, continuations, fallbacks, turns by outcome, turn durations (no token needed with [`ServeConfig::public_metrics`]) |
//!
//! Every event of a turn has an SSE `id:` unique and increasing within the
//! turn (from 1), an `event:` type and JSON `data:`; text arrives as `text`
//! events, and the last event is `done` (the summary) or `error` (`code`,
//! `message`, and the `exit` class the CLI uses). A turn's events are kept
//! until [`ServeConfig::keep_finished`] after it ends.
//!
//! Every route but the probes (`/healthz`, `/readyz`), `/openapi.json`,
//! the console's files and public metrics needs `Authorization: Bearer <token>`
//! (compared in constant time). Bad requests get a typed JSON error,
//! `{"error": {"type", "message"}}`, with a 4xx status; bodies over
//! [`ServeConfig::max_body_bytes`] get 413.

mod agent;
pub mod api;
mod cluster;
mod config;
mod console;
mod error;
mod history;
mod ids;
mod metrics;
mod openapi;
mod routes;
mod sse;
mod state;
mod turns;
mod views;

use crate::api::ErrorType;
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::middleware;
use axum::routing::{get, post};
use axum::{Json, Router};
use warden_core::Supervisor;

pub use agent::{Agent, SessionAgents};
pub use config::{DEFAULT_MAX_BODY_BYTES, RecoveredRx, ServeConfig};
use error::ApiError;
use routes::{ops, sessions, turns as turn_routes};
use state::AppState;
use turns::Turns;

/// The OpenAPI 3.1 document `/openapi.json` serves: the contract client
/// packages are generated or checked from (`clients/openapi.json` is a
/// copy, kept equal by a test).
pub fn openapi_document() -> serde_json::Value {
    openapi::document()
}

/// The API as an axum [`Router`], serving `supervisor`'s sessions.
pub fn router(supervisor: Supervisor, config: ServeConfig) -> Router {
    let max_body = config.max_body_bytes;
    let metrics = Arc::new(metrics::Metrics::new(config.placement.is_some()));
    metrics::watch(&supervisor, metrics.clone());
    let turns = Arc::new(Turns::new(
        config.turn_store.clone(),
        config.slow_client_grace,
    ));
    let recovered = config.recovered.as_ref().and_then(|r| r.lock().take());
    if let Some(rx) = recovered {
        let node = config
            .placement
            .as_ref()
            .and_then(|p| p.node())
            .map(str::to_owned);
        turns.adopt(rx, config.keep_finished, node, config.placement.clone());
    }
    let history = history::History::record(&supervisor, Arc::clone(&turns));
    let state = AppState {
        cluster: cluster::ClusterState::new(config.placement.clone()),
        history,
        supervisor,
        turns,
        config: Arc::new(config),
        metrics,
    };
    let api = Router::new()
        .route("/v1/turns", post(turn_routes::create_turn))
        .route("/v1/turns/{id}/events", get(turn_routes::turn_events))
        .route(
            "/v1/turns/{id}",
            get(turn_routes::one_turn).delete(turn_routes::cancel_turn),
        )
        .route("/v1/turns/{id}/trace", get(routes::trace::turn_trace))
        .route("/v1/sessions", get(sessions::list_sessions))
        .route("/v1/sessions/{key}", get(sessions::one_session))
        .route("/v1/sessions/{key}/reset", post(sessions::reset_session))
        .route("/v1/sessions/{key}/turns", get(sessions::session_turns))
        .route(
            "/v1/sessions/{key}/recover",
            post(sessions::recover_session),
        )
        .route("/v1/server", get(ops::server_info))
        .route("/v1/cluster", get(ops::cluster_view))
        .route("/v1/events", get(ops::lifecycle_events));
    // Probes reveal nothing but up or not; many load balancers cannot
    // send a header. Metrics are public only when the operator says so.
    let mut public = Router::new().route("/readyz", get(ops::ready));
    let api = match state.config.public_metrics {
        true => {
            public = public.route("/metrics", get(ops::render_metrics));
            api
        }
        false => api.route("/metrics", get(ops::render_metrics)),
    };
    let api = api.route_layer(middleware::from_fn_with_state(
        state.clone(),
        ops::authorize,
    ));
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/openapi.json", get(|| async { Json(openapi::document()) }))
        .route("/ui", get(console::index))
        .route("/ui/", get(console::index))
        .route("/ui/{file}", get(console::file))
        .merge(public)
        .merge(api)
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(state)
}

/// `404 not_found` for a path no route takes; a session key or turn id with
/// a `/` in it is the usual cause, so that is said.
async fn no_route(uri: axum::http::Uri) -> ApiError {
    let path = uri.path();
    let nested = ["/v1/sessions/", "/v1/turns/"]
        .iter()
        .any(|p| path.strip_prefix(p).is_some_and(|rest| rest.contains('/')));
    let message = match nested {
        true => format!(
            "no route {path}: a session key or turn id in a path must be percent-encoded \
             (a `/` is %2F)"
        ),
        false => format!("no route {path} (see /openapi.json)"),
    };
    ApiError::new(ErrorType::NotFound, message)
}

/// `405 method_not_allowed` in the errors' shape.
async fn wrong_method(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        ErrorType::MethodNotAllowed,
        format!("{} does not take {method} (see /openapi.json)", uri.path()),
    )
}
