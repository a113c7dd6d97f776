//! The handlers, one module per resource.

pub(crate) mod ops;
pub(crate) mod sessions;
pub(crate) mod turns;

use axum::http::{HeaderMap, StatusCode};

use crate::error::ApiError;

/// The `Last-Event-ID` header's number, if it has one; a typed 400 when
/// it is not a whole number (`what` names the ids it should be).
fn last_event_id(headers: &HeaderMap, what: &str) -> Result<Option<u64>, ApiError> {
    headers
        .get("last-event-id")
        .map(|v| {
            v.to_str()
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .ok_or_else(|| {
                    ApiError::new(
                        StatusCode::BAD_REQUEST,
                        "invalid_request",
                        format!("Last-Event-ID must be {what} (a whole number)"),
                    )
                })
        })
        .transpose()
}
