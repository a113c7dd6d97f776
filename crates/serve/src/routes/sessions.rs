//! `/v1/sessions`: list them, look at one, reset one given up.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use warden_core::SessionKey;
use warden_core::store::TurnEventKind;

use crate::cluster::Cluster;
use crate::error::{ApiError, bad_session};
use crate::state::AppState;
use crate::views;

/// `GET /v1/sessions`: this node's running sessions, or on a cluster node
/// every session of the cluster with its owner (`here` when it is this
/// node).
pub(crate) async fn list_sessions(
    State(state): State<AppState>,
    cluster: Cluster,
) -> Result<Response, ApiError> {
    if let Some(placement) = cluster.placement()
        && let Some(all) = placement.sessions().await
    {
        let all = all.map_err(|e| ApiError::unavailable("unavailable", e))?;
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
    let keys = state
        .supervisor
        .sessions()
        .await
        .map_err(|e| ApiError::unavailable("unavailable", e.to_string()))?;
    let list: Vec<_> = keys.iter().map(|k| json!({"key": k.as_str()})).collect();
    Ok(Json(json!({"sessions": list})).into_response())
}

/// `GET /v1/sessions/{key}`: its record, and while it runs its turn.
pub(crate) async fn one_session(
    State(state): State<AppState>,
    Path(key): Path<String>,
) -> Result<Response, ApiError> {
    let key = SessionKey::new(&key);
    let unavailable =
        |e: &dyn std::fmt::Display| ApiError::unavailable("unavailable", e.to_string());
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
    let turn_id = running
        .as_ref()
        .and_then(|s| s.turn)
        .and_then(|n| state.turns.id_of(&key, n));
    Ok(Json(views::session(
        record.as_ref(),
        running.as_ref(),
        turn_id.as_deref(),
    ))
    .into_response())
}

/// `POST /v1/sessions/{key}/reset`: forgets that the session was given up;
/// `404` for a session never seen.
pub(crate) async fn reset_session(
    State(state): State<AppState>,
    Path(key): Path<String>,
) -> Result<Response, ApiError> {
    let session = SessionKey::new(&key);
    let running = state
        .supervisor
        .running(session.clone())
        .await
        .map_err(|e| ApiError::unavailable("unavailable", e.to_string()))?;
    if running.is_none() {
        let stored = state
            .supervisor
            .stored(&session)
            .await
            .map_err(|e| ApiError::unavailable("unavailable", e.to_string()))?;
        if stored.is_none() {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("no session {key}: nothing to reset"),
            ));
        }
    }
    state
        .supervisor
        .reset(key.as_str())
        .await
        .map_err(bad_session)?;
    Ok(Json(json!({"key": key, "reset": true})).into_response())
}

/// Turns listed by `GET /v1/sessions/{key}/turns`.
const RECENT_TURNS: usize = 50;

/// `GET /v1/sessions/{key}/turns`: the session's recent turns still kept
/// (`--keep-events` after they end), newest first, with their outcome and
/// final text — so a message re-sent after a restart can be followed.
pub(crate) async fn session_turns(
    State(state): State<AppState>,
    Path(key): Path<String>,
) -> Result<Response, ApiError> {
    let turns = state
        .turns
        .recent(&SessionKey::new(&key), RECENT_TURNS)
        .await
        .map_err(|e| ApiError::unavailable("unavailable", e.to_string()).retry_after(1))?;
    let list: Vec<_> = turns
        .iter()
        .map(|t| {
            let last = t.events.last();
            let mut v = json!({"id": t.id, "message_id": t.message_id});
            match last.map(|e| (e.kind, &e.data)) {
                Some((TurnEventKind::Done, data)) => {
                    v["outcome"] = json!("done");
                    v["text"] = data["text"].clone();
                    v["attempts"] = data["attempts"].clone();
                }
                Some((TurnEventKind::Error, data)) => {
                    v["outcome"] = json!("error");
                    v["code"] = data["code"].clone();
                    v["message"] = data["message"].clone();
                    v["exit"] = data["exit"].clone();
                }
                // Its log ended without a last event: it moved to another
                // node, or stopped here with its message still pending.
                _ if t.ended => v["outcome"] = json!("moved"),
                Some(_) => v["outcome"] = json!("running"),
                None => v["outcome"] = json!("pending"),
            }
            v
        })
        .collect();
    Ok(Json(json!({"key": key, "turns": list})).into_response())
}
