//! `/v1/turns`: run a turn, follow its events, cancel it.

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use warden_core::store::TurnAsked;
use warden_core::{PendingMessage, SendOptions, SessionKey, Supervisor, TurnHandle};

use super::{Object, Param};
use crate::api::ErrorType;
use crate::api::{NewTurn, Turn, TurnCancelled, TurnCreated};
use crate::cluster::{Cluster, Placed};
use crate::error::{ApiError, bad_session, database_unreachable, gone, idempotency_key_reused};
use crate::sse;
use crate::state::AppState;
use crate::turns::{Named, Opening};

/// The session a new turn is for, parsed once from its body.
enum Target {
    /// A workspace directory (absolute) and its session's key.
    Workspace(String, SessionKey),
    /// A session named by the client.
    Key(SessionKey),
}

impl Target {
    /// Exactly one of `workspace` (an absolute path; an existing directory
    /// when `must_exist`) or `key` (not blank).
    fn parse(new: &NewTurn, supervisor: &Supervisor, must_exist: bool) -> Result<Self, ApiError> {
        match (&new.workspace, &new.key) {
            (Some(ws), None) => {
                // Relative to what? The server's working directory is no
                // client's business.
                if !std::path::Path::new(ws).is_absolute() {
                    return Err(ApiError::new(
                        ErrorType::InvalidWorkspace,
                        format!("workspace {ws:?} must be an absolute path"),
                    ));
                }
                let key = supervisor.key_for(ws).map_err(bad_session)?;
                if must_exist && !std::path::Path::new(ws).is_dir() {
                    return Err(ApiError::new(
                        ErrorType::InvalidWorkspace,
                        format!(
                            "workspace {ws:?} is not an existing directory, and this server's \
                             agent runs in its workspace: create it first"
                        ),
                    ));
                }
                Ok(Self::Workspace(ws.clone(), key))
            }
            (None, Some(k)) if !k.trim().is_empty() => Ok(Self::Key(SessionKey::new(k))),
            _ => Err(ApiError::new(
                ErrorType::InvalidRequest,
                "give exactly one of `workspace` (a directory) or `key` (a non-empty name)",
            )),
        }
    }

    fn key(&self) -> &SessionKey {
        match self {
            Self::Workspace(_, key) | Self::Key(key) => key,
        }
    }

    /// Sends `message` to the target's session.
    async fn send(
        &self,
        supervisor: &Supervisor,
        message: String,
        options: SendOptions,
    ) -> Result<TurnHandle, ApiError> {
        match self {
            Self::Workspace(ws, _) => {
                supervisor
                    .send_to_workspace_with(ws, message, options)
                    .await
            }
            Self::Key(key) => supervisor.send_with(key.clone(), message, options).await,
        }
        .map_err(bad_session)
    }
}

/// `POST /v1/turns`; on a cluster node in a database outage every `503`
/// is `database_unreachable` ([`Cluster::in_outage`]).
pub(crate) async fn create_turn(
    State(state): State<AppState>,
    cluster: Cluster,
    headers: HeaderMap,
    body: Result<Json<Object<NewTurn>>, JsonRejection>,
) -> Result<Response, ApiError> {
    match new_turn(state, &cluster, headers, body).await {
        Err(e) => Err(cluster.in_outage(e).await),
        answer => answer,
    }
}

async fn new_turn(
    state: AppState,
    cluster: &Cluster,
    headers: HeaderMap,
    body: Result<Json<Object<NewTurn>>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(Object(new)) = body.map_err(|r| {
        let limit = state.config.max_body_bytes;
        let too_large = r.status() == StatusCode::PAYLOAD_TOO_LARGE;
        let mut error = ApiError::from(r);
        if too_large {
            error.message = format!(
                "the body is over this server's limit of {limit} bytes \
                 (warden serve --max-body-bytes); send a shorter message"
            );
        }
        error
    })?;
    if new.message.trim().is_empty() {
        return Err(ApiError::new(
            ErrorType::InvalidRequest,
            "`message` is empty: a turn needs something to say",
        ));
    }
    let must_exist = state.config.workspaces_must_exist && state.config.placement.is_none();
    let target = Target::parse(&new, &state.supervisor, must_exist)?;
    let idempotency = idempotency_key(&headers)?;
    // What a request repeating the key must repeat: its message, model and
    // agent (a retry); another body is refused, never answered with the
    // first one's turn.
    let fingerprint = idempotency.as_ref().map(|_| {
        let agent = new.agent.map(crate::api::Agent::as_str);
        crate::ids::request_fingerprint(&new.message, new.model.as_deref(), agent)
    });
    // On a cluster node, a retry of a turn the cluster's store knows is
    // answered here, even while the session's owner cannot be reached. (A
    // single node answers it below, under the key's claim: one lookup.)
    if let (Some(k), Some(fp)) = (&idempotency, &fingerprint)
        && cluster.placement().is_some()
    {
        let id = crate::ids::idempotent_turn_id(target.key(), k);
        if let Some(answer) = replay(&state, &id, target.key(), &headers, fp).await? {
            return Ok(answer);
        }
    }
    // A cluster node: only the session's owner runs its turns.
    if let Placed::Forwarded(answer) = cluster.place_turn(target.key(), &new).await? {
        return Ok(answer);
    }
    let model = new.model.clone().filter(|m| !m.trim().is_empty());
    let mut options = SendOptions::default();
    if let Some(model) = model.clone() {
        options = options.with_model(model);
    }
    let key = target.key().clone();
    // A retried request with the key of a turn already sent gets that
    // turn; requests with one key decide one after the other. (Before the
    // agent is checked, as on a cluster's entry node: a key reused with
    // another agent is a reused key.)
    let mut named = None;
    let _claim = match (&idempotency, fingerprint) {
        (Some(k), Some(fp)) => {
            let id = crate::ids::idempotent_turn_id(&key, k);
            let claim = state.turns.claim(&id).await;
            if let Some(answer) = replay(&state, &id, &key, &headers, &fp).await? {
                return Ok(answer);
            }
            if let Some(waiting) = accepted_not_relayed(&state, &key, k).await? {
                // The message and model stored with it must be the
                // request's (its agent is not stored: not compared here).
                if waiting.text != new.message || waiting.model != model {
                    return Err(idempotency_key_reused(&id, &key));
                }
                return Err(ApiError::new(
                    ErrorType::TurnRecovering,
                    format!(
                        "a message with this Idempotency-Key was accepted for session {} \
                         before a restart and is being re-delivered as turn {id}; ask again",
                        key.as_str()
                    ),
                )
                .with(|e| e.id = Some(id.clone()))
                .retry_after(1));
            }
            options = options.with_idempotency_key(k.clone());
            named = Some(Named {
                id,
                fingerprint: Some(fp),
            });
            Some(claim)
        }
        _ => None,
    };
    // The session keeps the agent it was started with (bound now, on its
    // first turn, before its message is accepted).
    let existing = async { !matches!(state.supervisor.stored(&key).await, Ok(None)) };
    super::agent_choice::agent_for_turn(&state.config, &key, new.agent, existing).await?;
    let asked = TurnAsked::new(&new.message).with_model(new.model.clone());
    let handle = target.send(&state.supervisor, new.message, options).await?;
    let (trace, anchor) = trace_of(&state, &key).await.unzip();
    let asked = asked.with_trace_id(trace).with_span_id(anchor);
    let id = state
        .turns
        .start(
            key.clone(),
            handle,
            state.config.keep_finished,
            cluster.node(),
            Opening {
                named,
                continue_from: None,
                asked,
                arrival: None,
            },
        )
        .await;
    if wants_events(&headers) {
        let log = state.turns.get(&id).ok_or_else(gone)?;
        let mut response = sse::local(log, 0).into_response();
        if let Ok(v) = header::HeaderValue::from_str(&id) {
            response.headers_mut().insert("x-warden-turn-id", v);
        }
        return Ok(response);
    }
    Ok(accepted(&id, &key))
}

/// The `Idempotency-Key` header: 1 to 255 visible ASCII characters, sent
/// once (two would leave which message the request names to a guess).
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(ApiError::new(
            ErrorType::InvalidIdempotencyKey,
            "send one Idempotency-Key header, not several: one key names one message",
        ));
    }
    let bad = || {
        ApiError::new(
            ErrorType::InvalidIdempotencyKey,
            "Idempotency-Key must be 1 to 255 visible ASCII characters (a UUID is a good one)",
        )
    };
    let text = value.to_str().map_err(|_| bad())?;
    let visible = text.bytes().all(|b| b.is_ascii_graphic());
    if text.is_empty() || text.len() > 255 || !visible {
        return Err(bad());
    }
    Ok(Some(text.to_owned()))
}

/// The header naming a turn's idempotency key.
const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The answer to a request whose idempotency key names turn `id` of `key`
/// when that turn exists (kept here or in the store): the answer its first
/// request got, marked `Idempotent-Replayed: true` — if the request is a
/// retry of that one (its `fingerprint` the turn's, or the turn's unknown:
/// stored by an older warden, or re-delivered after a crash that came
/// before its log was opened); `422 idempotency_key_reused` if not.
async fn replay(
    state: &AppState,
    id: &str,
    key: &SessionKey,
    headers: &HeaderMap,
    fingerprint: &str,
) -> Result<Option<Response>, ApiError> {
    let another = |stored: Option<&str>| stored.is_some_and(|f| f != fingerprint);
    let mut response = if let Some(log) = state.turns.get(id) {
        if another(log.fingerprint.as_deref()) {
            return Err(idempotency_key_reused(id, key));
        }
        match wants_events(headers) {
            true => sse::local(log, 0).into_response(),
            false => accepted(id, key),
        }
    } else if let Some(store) = &state.turns.store {
        let stored = store
            .read(id, 0)
            .await
            .map_err(|e| database_unreachable("cannot read the turn this key named", &e))?;
        if let Some(turn) = &stored
            && another(turn.fingerprint.as_deref())
        {
            return Err(idempotency_key_reused(id, key));
        }
        match (stored, wants_events(headers)) {
            (None, _) => return Ok(None),
            (Some(turn), true) => sse::stored(store.clone(), turn, 0).into_response(),
            (Some(_), false) => accepted(id, key),
        }
    } else {
        return Ok(None);
    };
    let headers = response.headers_mut();
    headers.insert(
        "idempotent-replayed",
        header::HeaderValue::from_static("true"),
    );
    if let Ok(v) = header::HeaderValue::from_str(id) {
        headers.insert("x-warden-turn-id", v);
    }
    Ok(Some(response))
}

/// `202 {"id", "key"}`: the turn was accepted.
fn accepted(id: &str, key: &SessionKey) -> Response {
    (
        StatusCode::ACCEPTED,
        Json(TurnCreated {
            id: id.to_owned(),
            key: key.as_str().to_owned(),
        }),
    )
        .into_response()
}

/// The message with idempotency key `k` waiting in `key`'s stored record,
/// if one does: accepted before a restart, its turn not relayed yet.
async fn accepted_not_relayed(
    state: &AppState,
    key: &SessionKey,
    k: &str,
) -> Result<Option<PendingMessage>, ApiError> {
    let record = state
        .supervisor
        .stored(key)
        .await
        .map_err(|e| ApiError::new(ErrorType::Unavailable, e.to_string()).retry_after(1))?;
    Ok(record.and_then(|r| {
        r.pending
            .into_iter()
            .find(|p| p.idempotency_key.as_deref() == Some(k))
    }))
}

/// The trace of `key`'s running incarnation and its anchor span (hex),
/// which its turns link to, with tracing on.
pub(crate) async fn trace_of(state: &AppState, key: &SessionKey) -> Option<(String, String)> {
    let handle = state.supervisor.running(key.clone()).await.ok()??;
    let context = handle.anchor().span_context();
    let ids = (
        context.trace_id().to_string(),
        context.span_id().to_string(),
    );
    context.is_valid().then_some(ids)
}

fn wants_events(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"))
}

/// `GET /v1/turns/{id}/events`.
pub(crate) async fn turn_events(
    State(state): State<AppState>,
    Param(id): Param,
    cluster: Cluster,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let after = last_event_id(&headers)?;
    if let Some(log) = state.turns.get(&id) {
        return Ok(sse::local(log, after).into_response());
    }
    let path = format!("/v1/turns/{id}/events");
    let elsewhere = cluster.turn_elsewhere(&id, Method::GET, &path).await;
    // Not kept here and its node cannot serve it: the cluster's store can,
    // while whichever node runs it now stores its events.
    match (elsewhere, &state.turns.store) {
        (Ok(answer), _) => Ok(answer),
        (Err(e), Some(store)) => match store.read(&id, after).await {
            Ok(Some(turn)) => Ok(sse::stored(store.clone(), turn, after).into_response()),
            Ok(None) => Err(e),
            Err(why) => Err(database_unreachable("cannot read the turn", &why)),
        },
        (Err(e), None) => Err(e),
    }
}

/// The `Last-Event-ID` header's number (0 without one).
fn last_event_id(headers: &HeaderMap) -> Result<u64, ApiError> {
    Ok(super::last_event_id(headers, "an event id of this turn")?.unwrap_or(0))
}

/// `GET /v1/turns/{id}`: the turn as kept — its outcome, prompt head,
/// model, times and trace id.
pub(crate) async fn one_turn(
    State(state): State<AppState>,
    Param(id): Param,
    cluster: Cluster,
) -> Result<Response, ApiError> {
    match state.turns.one(&id).await {
        Ok(Some(turn)) => {
            let key = turn.key.as_str().to_owned();
            let turn = super::sessions::summarize(&turn);
            return Ok(Json(Turn { key, turn }).into_response());
        }
        Ok(None) => {}
        Err(why) => return Err(database_unreachable("cannot read the turn", &why)),
    }
    let path = format!("/v1/turns/{id}");
    cluster.turn_elsewhere(&id, Method::GET, &path).await
}

/// `DELETE /v1/turns/{id}`.
pub(crate) async fn cancel_turn(
    State(state): State<AppState>,
    Param(id): Param,
    cluster: Cluster,
) -> Result<Response, ApiError> {
    if let Some(log) = state.turns.get(&id) {
        // An error means the session is gone: nothing left to cancel.
        let cancelled = log.cancel().await.unwrap_or(false);
        return Ok(Json(TurnCancelled {
            key: log.key.as_str().to_owned(),
            id,
            cancelled,
        })
        .into_response());
    }
    let path = format!("/v1/turns/{id}");
    let elsewhere = cluster.turn_elsewhere(&id, Method::DELETE, &path).await;
    let (Err(e), Some(store)) = (&elsewhere, &state.turns.store) else {
        return elsewhere;
    };
    // Its node cannot take it: the node that runs its session now can.
    let turn = match store.read(&id, u64::MAX).await {
        Ok(Some(turn)) => turn,
        Ok(None) | Err(_) => return elsewhere,
    };
    if turn.ended {
        return Ok(Json(TurnCancelled {
            key: turn.key.as_str().to_owned(),
            id,
            cancelled: false,
        })
        .into_response());
    }
    match cluster
        .to_session_owner(&turn.key, Method::DELETE, &path)
        .await
    {
        Some(answer) => answer,
        None => Err(ApiError::new(
            ErrorType::TurnMoving,
            format!(
                "turn {id} is being re-delivered by another node; ask again ({})",
                e.message
            ),
        )
        .retry_after(1)),
    }
}
