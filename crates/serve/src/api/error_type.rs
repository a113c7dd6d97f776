//! Every error `type` the API answers, with its HTTP status and meaning:
//! the one list the handlers, the API document and the docs' catalogue
//! are checked against.

use axum::http::StatusCode;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Declares the enum, its wire names and statuses.
macro_rules! error_types {
    ($( #[doc = $doc:literal] $variant:ident = $name:literal, $status:literal; )*) => {
        /// An error's `type`: what went wrong, and so what a client does.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
        #[non_exhaustive]
        pub enum ErrorType {
            $(
                #[doc = $doc]
                #[serde(rename = $name)]
                $variant,
            )*
        }

        impl ErrorType {
            /// Every type, in the catalogue's order (by status).
            pub const ALL: &[ErrorType] = &[$(Self::$variant),*];

            /// Its name on the wire (`type`).
            #[must_use]
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $name,)*
                }
            }

            /// The HTTP status it is answered with.
            #[must_use]
            pub const fn status(self) -> u16 {
                match self {
                    $(Self::$variant => $status,)*
                }
            }
        }
    };
}

error_types! {
    /// Bad JSON, neither or both of `workspace`/`key`, an empty message, an unknown query value, a `Last-Event-ID` that is not a number, a key or id in the path that is not UTF-8.
    InvalidRequest = "invalid_request", 400;
    /// `Idempotency-Key` empty, over 255 characters, not visible ASCII, or sent more than once.
    InvalidIdempotencyKey = "invalid_idempotency_key", 400;
    /// A workspace that is not absolute, holds a NUL byte, is over 4,096 bytes or is not a directory.
    InvalidWorkspace = "invalid_workspace", 400;
    /// No token, or the wrong one.
    Unauthorized = "unauthorized", 401;
    /// An unknown or expired turn, a session never seen, no such route.
    NotFound = "not_found", 404;
    /// The turn has no trace Jaeger returns: not exported yet (a turn's spans are exported when they end), tracing off, or dropped by Jaeger.
    TraceNotFound = "trace_not_found", 404;
    /// A route asked with another method.
    MethodNotAllowed = "method_not_allowed", 405;
    /// The request body sent nothing for the header timeout; the connection closes.
    RequestTimeout = "request_timeout", 408;
    /// The session was given up; reset it.
    SessionFailed = "session_failed", 409;
    /// `agent` is not the session's, or not one the server runs; nothing was sent.
    AgentMismatch = "agent_mismatch", 409;
    /// The Idempotency-Key's message is being re-delivered after a restart; ask again after `Retry-After`.
    TurnRecovering = "turn_recovering", 409;
    /// The body is over the server's limit.
    TooLarge = "too_large", 413;
    /// The body is not `application/json`.
    UnsupportedMediaType = "unsupported_media_type", 415;
    /// A field missing, unknown or of the wrong type, or a body that is not a JSON object.
    InvalidFields = "invalid_fields", 422;
    /// The Idempotency-Key named another message; nothing was sent.
    IdempotencyKeyReused = "idempotency_key_reused", 422;
    /// The server failed in a way it did not expect.
    Internal = "internal", 500;
    /// A turn's trace was asked of a server started without `--jaeger-url`: it reads traces from nowhere.
    NoJaegerUrl = "no_jaeger_url", 501;
    /// The Jaeger query API at `--jaeger-url` did not answer, or answered an error; ask again after `Retry-After`.
    JaegerUnreachable = "jaeger_unreachable", 502;
    /// Every live session is busy; ask again after `Retry-After`.
    TooManySessions = "too_many_sessions", 503;
    /// Past the connection cap, before any routing; ask again after `Retry-After: 1`.
    TooManyConnections = "too_many_connections", 503;
    /// Cluster: another node runs the session; ask it, or again after `Retry-After`.
    SessionElsewhere = "session_elsewhere", 503;
    /// Cluster: the session's workspace is on no live node.
    WorkspaceUnavailable = "workspace_unavailable", 503;
    /// Cluster: this node cannot reach the cluster's database (to place a turn, list the sessions, read a turn); ask again after `Retry-After`.
    DatabaseUnreachable = "database_unreachable", 503;
    /// Cluster: the node keeping the turn or session cannot be reached.
    NodeUnreachable = "node_unreachable", 503;
    /// The server is not ready (its supervisor stopped).
    NotReady = "not_ready", 503;
    /// Cluster: the turn is being re-delivered by another node; ask again.
    TurnMoving = "turn_moving", 503;
    /// The session's store failed (a full disk); ask again later.
    Unavailable = "unavailable", 503;
}

impl ErrorType {
    /// [`ErrorType::status`] as a [`StatusCode`].
    pub(crate) fn status_code(self) -> StatusCode {
        StatusCode::from_u16(self.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

impl std::fmt::Display for ErrorType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
