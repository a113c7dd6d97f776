//! `/v1/sessions`: list them, look at one, reset one given up.

use std::collections::{BTreeMap, HashMap};

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::Method;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use warden_core::store::{StoredEvent, StoredTurn, TurnEventData};
use warden_core::{SessionKey, SessionRecord, SessionStatus, Unstick};

use super::Param;
use crate::api::ErrorType;
use crate::api::{
    RecoverHow, Session, SessionDetail, SessionList, SessionPlacement, SessionRecovered,
    SessionReset, SessionSummary, TurnList, TurnOutcome, TurnSummary,
};
use crate::cluster::Cluster;
use crate::error::{ApiError, bad_session, database_unreachable};
use crate::state::AppState;
use crate::views;

/// The query of `GET /v1/sessions`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListQuery {
    /// `full`: each session with its record (as `GET /v1/sessions/{key}`
    /// shows it), stored sessions that do not run included.
    detail: Option<String>,
}

/// `GET /v1/sessions`: this node's running sessions, or on a cluster node
/// every session of the cluster with its owner (`here` when it is this
/// node); with `?detail=full` each with its record and, while it runs
/// here, its turn.
pub(crate) async fn list_sessions(
    State(state): State<AppState>,
    cluster: Cluster,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) =
        query.map_err(|e| ApiError::new(ErrorType::InvalidRequest, e.body_text()))?;
    let full = match query.detail.as_deref() {
        None => false,
        Some("full") => true,
        Some(other) => {
            return Err(ApiError::new(
                ErrorType::InvalidRequest,
                format!("detail={other:?}: the only detail is `full`"),
            ));
        }
    };
    // On a cluster node the store is the cluster's database: its failure
    // is an outage (typed, without the pool's text); on one node, a store
    // that fails (a full disk) says why.
    let on_cluster = cluster.placement().is_some();
    let unavailable = |e: &dyn std::fmt::Display| match on_cluster {
        true => database_unreachable("cannot list the sessions", e),
        false => ApiError::new(ErrorType::Unavailable, e.to_string()),
    };
    // Where each session runs, on a cluster node.
    let mut places: Option<Vec<(String, SessionPlacement)>> = None;
    if let Some(placement) = cluster.placement()
        && let Some(all) = placement.sessions().await
    {
        let all = all.map_err(|e| unavailable(&e))?;
        let me = placement.node();
        places = Some(
            all.into_iter()
                .map(|p| {
                    let here = me.is_some() && p.owner.as_deref() == me;
                    let place = SessionPlacement {
                        owner: p.owner,
                        advertise: p.advertise,
                        epoch: p.epoch,
                        lease_remaining_secs: p.lease_remaining_secs,
                        here,
                    };
                    (p.key, place)
                })
                .collect(),
        );
    }
    let summary = |key: String| SessionSummary {
        key,
        ..SessionSummary::default()
    };
    if !full {
        let sessions = match places {
            Some(places) => places
                .into_iter()
                .map(|(key, place)| SessionSummary {
                    placement: Some(place),
                    ..summary(key)
                })
                .collect(),
            None => state
                .supervisor
                .sessions()
                .await
                .map_err(|e| unavailable(&e))?
                .into_iter()
                .map(|k| summary(k.as_str().to_owned()))
                .collect(),
        };
        return Ok(Json(SessionList { sessions }).into_response());
    }
    // Every stored record, the running ones with their status.
    let statuses = state
        .supervisor
        .statuses()
        .await
        .map_err(|e| unavailable(&e))?;
    let mut running: HashMap<String, SessionStatus> = statuses
        .into_iter()
        .map(|s| (s.key.as_str().to_owned(), s))
        .collect();
    let stored = state
        .supervisor
        .stored_sessions()
        .await
        .map_err(|e| unavailable(&e))?;
    let mut by_key: BTreeMap<String, SessionSummary> = BTreeMap::new();
    for record in stored.into_iter().flatten() {
        let status = running.remove(record.key.as_str());
        let view = full_view(&state, Some(&record), status.as_ref());
        let key = record.key.clone();
        by_key.insert(
            key.clone(),
            SessionSummary {
                detail: Some(view),
                ..summary(key)
            },
        );
    }
    // Running but not stored yet (a session's first record is written as
    // it starts).
    for (key, status) in running {
        let view = full_view(&state, None, Some(&status));
        by_key.insert(
            key.clone(),
            SessionSummary {
                detail: Some(view),
                ..summary(key)
            },
        );
    }
    for (key, place) in places.into_iter().flatten() {
        by_key
            .entry(key.clone())
            .or_insert_with(|| summary(key))
            .placement = Some(place);
    }
    let sessions = by_key.into_values().collect();
    Ok(Json(SessionList { sessions }).into_response())
}

/// One session's view for `?detail=full`: its record, its turn while it
/// runs here.
fn full_view(
    state: &AppState,
    record: Option<&SessionRecord>,
    status: Option<&SessionStatus>,
) -> SessionDetail {
    let turn_id = status.and_then(|s| s.turn.and_then(|n| state.turns.id_of(&s.key, n)));
    let mut view = views::session(record, status, turn_id.as_deref());
    view.agent = session_agent(
        state,
        record
            .map(|r| r.key.as_str())
            .or(status.map(|s| s.key.as_str())),
    );
    view
}

/// The agent session `key` runs: its binding on a server of several
/// agents, else the server's one (`None`: not said, or not readable).
fn session_agent(state: &AppState, key: Option<&str>) -> Option<crate::api::Agent> {
    let default = state.config.agents.first().copied();
    match (&state.config.session_agents, key) {
        (Some(book), Some(key)) if state.config.agents.len() > 1 => book
            .get(&warden_core::SessionKey::new(key))
            .ok()
            .flatten()
            .or(default),
        _ => default,
    }
}

/// `GET /v1/sessions/{key}`: its record, and while it runs its turn.
pub(crate) async fn one_session(
    State(state): State<AppState>,
    Param(key): Param,
) -> Result<Response, ApiError> {
    let key = SessionKey::new(&key);
    let unavailable =
        |e: &dyn std::fmt::Display| ApiError::new(ErrorType::Unavailable, e.to_string());
    let (running, trace_id) = match state.supervisor.running(key.clone()).await {
        Ok(Some(handle)) => {
            let context = handle.anchor().span_context();
            let trace = context.is_valid().then(|| context.trace_id().to_string());
            (handle.status().await.ok(), trace)
        }
        Ok(None) => (None, None),
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
            ErrorType::NotFound,
            format!("no session {key}"),
        ));
    }
    let turn_id = running
        .as_ref()
        .and_then(|s| s.turn)
        .and_then(|n| state.turns.id_of(&key, n));
    let mut detail = views::session(record.as_ref(), running.as_ref(), turn_id.as_deref());
    detail.agent = session_agent(&state, Some(key.as_str()));
    detail.trace_id = trace_id;
    let key = key.as_str().to_owned();
    Ok(Json(Session { key, detail }).into_response())
}

/// The query of `POST /v1/sessions/{key}/recover`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RecoverQuery {
    /// `retry` or `fresh`.
    how: String,
}

/// `POST /v1/sessions/{key}/recover?how=retry|fresh`: unsticks the
/// session's running turn — `retry` stops its attempt as failed so it is
/// retried (the conversation kept), `fresh` restarts the session without
/// its stored conversation (the user is told). `{"key", "how",
/// "recovered"}`: `false` when nothing was stuck (no turn running, or one
/// waiting for admission or its stream). On a cluster node, the session's
/// owner does it.
pub(crate) async fn recover_session(
    State(state): State<AppState>,
    Param(key): Param,
    cluster: Cluster,
    query: Result<Query<RecoverQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let bad = |detail: String| {
        ApiError::new(
            ErrorType::InvalidRequest,
            format!(
                "{detail}: give ?how=retry (retry the stuck attempt) or ?how=fresh (restart without the stored conversation)"
            ),
        )
    };
    let Query(query) = query.map_err(|e| bad(e.body_text()))?;
    let (how, said) = match query.how.as_str() {
        "retry" => (Unstick::Retry, RecoverHow::Retry),
        "fresh" => (Unstick::Fresh, RecoverHow::Fresh),
        other => return Err(bad(format!("how={other:?}"))),
    };
    let session = SessionKey::new(&key);
    let running = state
        .supervisor
        .running(session.clone())
        .await
        .map_err(|e| ApiError::new(ErrorType::Unavailable, e.to_string()))?;
    if running.is_none() {
        let path = format!(
            "/v1/sessions/{}/recover?how={}",
            crate::cluster::encode_segment(&key),
            query.how
        );
        if let Some(answer) = cluster
            .to_session_owner(&session, Method::POST, &path)
            .await
        {
            return answer;
        }
    }
    let recovered = state
        .supervisor
        .recover(session, how)
        .await
        .map_err(bad_session)?;
    Ok(Json(SessionRecovered {
        key,
        how: said,
        recovered,
    })
    .into_response())
}

/// `POST /v1/sessions/{key}/reset`: forgets that the session was given up;
/// `404` for a session never seen.
pub(crate) async fn reset_session(
    State(state): State<AppState>,
    Param(key): Param,
) -> Result<Response, ApiError> {
    let session = SessionKey::new(&key);
    let running = state
        .supervisor
        .running(session.clone())
        .await
        .map_err(|e| ApiError::new(ErrorType::Unavailable, e.to_string()))?;
    if running.is_none() {
        let stored = state
            .supervisor
            .stored(&session)
            .await
            .map_err(|e| ApiError::new(ErrorType::Unavailable, e.to_string()))?;
        if stored.is_none() {
            return Err(ApiError::new(
                ErrorType::NotFound,
                format!("no session {key}: nothing to reset"),
            ));
        }
    }
    state
        .supervisor
        .reset(key.as_str())
        .await
        .map_err(bad_session)?;
    Ok(Json(SessionReset { key, reset: true }).into_response())
}

/// Turns listed by `GET /v1/sessions/{key}/turns`.
const RECENT_TURNS: usize = 50;

/// `GET /v1/sessions/{key}/turns`: the session's recent turns still kept
/// (`--keep-events` after they end), newest first, with their outcome and
/// final text — so a message re-sent after a restart can be followed.
pub(crate) async fn session_turns(
    State(state): State<AppState>,
    Param(key): Param,
) -> Result<Response, ApiError> {
    let turns = state
        .turns
        .recent(&SessionKey::new(&key), RECENT_TURNS)
        .await
        // Only a cluster node's turn store can fail.
        .map_err(|e| database_unreachable("cannot read the session's turns", &e))?;
    let turns = turns.iter().map(summarize).collect();
    Ok(Json(TurnList { key, turns }).into_response())
}

/// A kept turn as `GET /v1/sessions/{key}/turns` lists it (`t.events`: its
/// last one, or none yet).
pub(crate) fn summarize(t: &StoredTurn) -> TurnSummary {
    let last = t.events.last();
    let outcome = match last.map(|e| &e.data) {
        Some(TurnEventData::Done(_)) => TurnOutcome::Done,
        Some(TurnEventData::Error(_)) => TurnOutcome::Error,
        // Its log ended without a last event: it moved to another node, or
        // stopped here with its message still pending.
        _ if t.ended => TurnOutcome::Moved,
        Some(_) => TurnOutcome::Running,
        None => TurnOutcome::Pending,
    };
    let mut summary = TurnSummary {
        id: t.id.clone(),
        message_id: t.message_id,
        outcome,
        text: None,
        attempts: None,
        code: None,
        message: None,
        exit: None,
        ended_at: None,
        started_at: t.asked.opened_at,
        prompt: t.asked.prompt.clone(),
        model: t.asked.model.clone(),
        trace_id: t.asked.trace_id.clone(),
        trace_ids: t.asked.trace_ids.clone(),
    };
    match last {
        Some(
            e @ StoredEvent {
                data: TurnEventData::Done(d),
                ..
            },
        ) => {
            summary.text = Some(d.text.clone());
            summary.attempts = Some(d.attempts);
            summary.ended_at = e.at;
        }
        Some(
            e @ StoredEvent {
                data: TurnEventData::Error(f),
                ..
            },
        ) => {
            summary.code = Some(f.code.clone());
            summary.message = Some(f.message.clone());
            summary.exit = Some(f.exit);
            summary.ended_at = e.at;
        }
        _ => {}
    }
    summary
}
