//! The API's errors: one typed JSON shape, `{"error": {"type", "message",
//! …}}`, with a 4xx/5xx status and, where asking again helps,
//! `Retry-After`.

use crate::api::{ErrorBody, ErrorType};
use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use warden_core::cluster::Elsewhere;
use warden_core::{SessionKey, SupervisorError};

/// A typed error answer: `{"error": {"type", "message", …}}`
/// ([`crate::api::Error`]), with its type's status.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub(crate) kind: ErrorType,
    pub(crate) message: String,
    /// Seconds for a `Retry-After` header.
    retry_after: Option<u64>,
    /// The error object's other fields (its `type` and `message` are set
    /// from the two above).
    pub(crate) body: Box<ErrorBody>,
}

impl ApiError {
    /// An error of type `kind`, answered with its status.
    pub(crate) fn new(kind: ErrorType, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            retry_after: None,
            body: Box::default(),
        }
    }

    /// Adds `Retry-After: secs`.
    pub(crate) fn retry_after(mut self, secs: u64) -> Self {
        self.retry_after = Some(secs);
        self
    }

    /// Sets more fields of the error object.
    pub(crate) fn with(mut self, set: impl FnOnce(&mut ErrorBody)) -> Self {
        set(&mut self.body);
        self
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut error = *self.body;
        error.kind = self.kind.as_str().to_owned();
        error.message = self.message;
        let body = Json(crate::api::Error { error });
        let status = self.kind.status_code();
        let mut response = (status, body).into_response();
        if status == StatusCode::UNAUTHORIZED {
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

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        let kind = match r.status() {
            StatusCode::PAYLOAD_TOO_LARGE => ErrorType::TooLarge,
            StatusCode::UNSUPPORTED_MEDIA_TYPE => ErrorType::UnsupportedMediaType,
            // Valid JSON, wrong fields: one missing, unknown or of the
            // wrong type (serde's message names the fields allowed).
            StatusCode::UNPROCESSABLE_ENTITY => ErrorType::InvalidFields,
            _ => ErrorType::InvalidRequest,
        };
        Self::new(kind, r.body_text())
    }
}

/// 404: no such turn here.
pub(crate) fn gone() -> ApiError {
    ApiError::new(ErrorType::NotFound, "no such turn (or it expired)")
}

/// 422 `idempotency_key_reused`: the request's Idempotency-Key named turn
/// `id` of session `key`, sent with another message, model or agent; nothing
/// was sent (as Stripe, and the IETF idempotency-key draft, answer it).
pub(crate) fn idempotency_key_reused(id: &str, key: &SessionKey) -> ApiError {
    ApiError::new(
        ErrorType::IdempotencyKeyReused,
        format!(
            "this Idempotency-Key was first sent to session {} with another message, model or \
             agent (turn {id}); a key names one message: nothing was sent. Send a new message \
             with a new key",
            key.as_str()
        ),
    )
    .with(|e| e.id = Some(id.to_owned()))
}

/// 503 with `Retry-After`: the session runs on another node (or, when its
/// workspace is not on this node and its owner is gone, nowhere yet).
pub(crate) fn elsewhere(key: &SessionKey, e: Elsewhere) -> ApiError {
    let retry = e.retry_after.as_secs_f64().ceil().max(1.0) as u64;
    if let Some(why) = &e.store_unreachable {
        return ApiError::new(ErrorType::DatabaseUnreachable,
            format!(
                "this node cannot tell where session {} runs: {why}; ask another node, or again after Retry-After",
                key.as_str()
            ),
        )
        .retry_after(retry);
    }
    if let Some(ws) = &e.missing_workspace {
        return ApiError::new(ErrorType::WorkspaceUnavailable,
            format!(
                "session {} lives in workspace {}, which is not on this node, and its node {} is gone; \
                 it runs again when a node with that directory takes it over",
                key.as_str(),
                ws.display(),
                e.owner.as_deref().unwrap_or("(unknown)")
            ),
        )
        .retry_after(retry)
        .with(|b| {
            b.owner = e.owner.clone();
            b.workspace = Some(ws.display().to_string());
        });
    }
    ApiError::new(ErrorType::SessionElsewhere,
        format!(
            "session {} runs on node {} now; ask it, or again after Retry-After (a dead owner's lease expires then)",
            key.as_str(),
            e.owner.as_deref().unwrap_or("(unknown)")
        ),
    )
    .retry_after(retry)
    .with(|b| {
        b.owner = e.owner.clone();
        b.advertise = e.advertise.clone();
    })
}

/// How long a client waits before it asks again in an outage (the nodes
/// retry the database every 100 ms; a second is a fair pace).
const OUTAGE_RETRY_SECS: u64 = 1;

/// `503 database_unreachable` with `Retry-After`: a cluster node cannot
/// reach its database (the one type every refusal of an outage has). The pool's text (host names, driver messages) is not for
/// clients: it goes to the node's log at debug level (the outage itself is
/// logged once by the node), `what` says what could not be done.
pub(crate) fn database_unreachable(what: &str, why: &dyn std::fmt::Display) -> ApiError {
    tracing::debug!(error = %why, "{what}: the cluster's database cannot be reached");
    ApiError::new(
        ErrorType::DatabaseUnreachable,
        format!(
            "{what}: this node cannot reach the cluster's database; ask again after Retry-After \
             (or another node)"
        ),
    )
    .retry_after(OUTAGE_RETRY_SECS)
}

/// A session error as the client's error: a path that cannot be a
/// workspace, a session given up, the store failing.
pub(crate) fn bad_session(e: SupervisorError) -> ApiError {
    match &e {
        SupervisorError::Workspace { .. } | SupervisorError::NoWorkspace { .. } => {
            ApiError::new(ErrorType::InvalidWorkspace, e.to_string())
        }
        SupervisorError::SessionFailed { .. } => {
            ApiError::new(ErrorType::SessionFailed, e.to_string())
        }
        SupervisorError::TooManySessions { limit, .. } => {
            let limit = *limit;
            ApiError::new(ErrorType::TooManySessions, e.to_string())
                .retry_after(5)
                .with(|b| b.limit = Some(limit as u64))
        }
        SupervisorError::Store {
            error: warden_core::StoreError::LeaseLost { .. },
            ..
        } => ApiError::new(ErrorType::SessionElsewhere, e.to_string()).retry_after(1),
        _ => ApiError::new(ErrorType::Unavailable, e.to_string()),
    }
}
