//! The response of one request: its status recorded in the journal, its
//! headers, and an error body in the shape of the API asked; reading a
//! request body, and the model list.

use http_body_util::{BodyExt, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{Value, json};

use crate::body::{MockBody, Tracker};
use crate::journal::{Journal, Outcome, RequestId};
use crate::{Scenario, anthropic, gemini, openai};

/// Which wire format to speak.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Api {
    Anthropic,
    OpenAi,
    /// The OpenAI Responses API (OpenAI's error shape).
    Responses,
    /// Google's Gemini API (`streamGenerateContent`).
    Gemini,
}

/// Builds one response and records its status.
pub(super) struct Answer<'a> {
    pub(super) journal: &'a Journal,
    pub(super) id: RequestId,
    /// A `HEAD` request: hyper sends the headers only.
    pub(super) head: bool,
}

impl Answer<'_> {
    pub(super) fn response(
        &self,
        status: u16,
        body: MockBody,
        headers: &[(&str, String)],
    ) -> Response<MockBody> {
        self.journal.status(self.id, status);
        let mut resp = Response::new(body);
        *resp.status_mut() =
            StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let map = resp.headers_mut();
        for (name, value) in headers {
            if let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(value),
            ) {
                map.insert(name, value);
            }
        }
        resp
    }

    /// A complete (non-streamed) body; the request is completed.
    pub(super) fn full(
        &self,
        tracker: &mut Tracker,
        status: u16,
        content_type: &str,
        body: Bytes,
        extra: &[(&str, String)],
    ) -> Response<MockBody> {
        if !body.is_empty() && !self.head {
            tracker.frame();
        }
        tracker.finish(Outcome::Completed);
        let mut headers = vec![(header::CONTENT_TYPE.as_str(), content_type.to_owned())];
        headers.extend(extra.iter().cloned());
        self.response(status, MockBody::full(body), &headers)
    }

    pub(super) fn json(
        &self,
        tracker: &mut Tracker,
        status: u16,
        value: &Value,
        extra: &[(&str, String)],
    ) -> Response<MockBody> {
        let body = Bytes::from(value.to_string());
        self.full(tracker, status, "application/json", body, extra)
    }

    /// An error body in the shape of `api`.
    /// HTTP 529 `overloaded_error`: the `overloaded` scenario, and
    /// `midstream-error` on a request that did not ask for a stream.
    pub(super) fn overloaded(&self, tracker: &mut Tracker, api: Api) -> Response<MockBody> {
        self.error(tracker, api, 529, "overloaded_error", "Overloaded", &[])
    }

    pub(super) fn error(
        &self,
        tracker: &mut Tracker,
        api: Api,
        status: u16,
        kind: &str,
        message: &str,
        extra: &[(&str, String)],
    ) -> Response<MockBody> {
        let (value, id_header) = match api {
            Api::Anthropic => (anthropic::error_body(kind, message), "request-id"),
            Api::Gemini => (gemini::error_body(status, kind, message), "x-request-id"),
            Api::OpenAi | Api::Responses => {
                let (kind, code) = match kind {
                    "api_error" => ("server_error", None),
                    "overloaded_error" => ("overloaded_error", Some("overloaded")),
                    "rate_limit_error" => ("rate_limit_error", Some("rate_limit_exceeded")),
                    "invalid_request_error" if status == 400 && message.contains("too long") => {
                        ("invalid_request_error", Some("context_length_exceeded"))
                    }
                    other => (other, None),
                };
                (openai::error_body(kind, message, code), "x-request-id")
            }
        };
        let mut headers = vec![(id_header, request_id(self.id))];
        headers.extend(extra.iter().cloned());
        self.json(tracker, status, &value, &headers)
    }
}

pub(super) fn request_id(id: RequestId) -> String {
    format!("req_mock{id:014}")
}

pub(super) fn bad_request(
    answer: &Answer<'_>,
    tracker: &mut Tracker,
    api: Api,
    message: &str,
) -> Response<MockBody> {
    answer.error(tracker, api, 400, "invalid_request_error", message, &[])
}

pub(super) fn method_not_allowed(
    answer: &Answer<'_>,
    tracker: &mut Tracker,
    method: &Method,
    path: &str,
) -> Response<MockBody> {
    answer.error(
        tracker,
        Api::Anthropic,
        405,
        "invalid_request_error",
        &format!("warden-mock: method {method} not allowed on {path}"),
        &[],
    )
}

/// Largest request body accepted: 64 MiB.
const MAX_REQUEST_BYTES: usize = 64 * 1024 * 1024;

/// Reads the whole request body as a JSON object; returns it and its size.
pub(super) async fn read_json(req: Request<Incoming>) -> Result<(Value, usize), String> {
    let bytes = Limited::new(req.into_body(), MAX_REQUEST_BYTES)
        .collect()
        .await
        .map_err(|e| format!("warden-mock: could not read the request body: {e}"))?
        .to_bytes();
    let value: Value = serde_json::from_slice(&bytes)
        .map_err(|e| format!("warden-mock: the request body is not JSON: {e}"))?;
    if !value.is_object() {
        return Err("warden-mock: the request body must be a JSON object".to_owned());
    }
    Ok((value, bytes.len()))
}

/// A model list readable by both Anthropic and OpenAI clients: one
/// `mock-NAME` model per scenario.
pub(super) fn models_json() -> Value {
    let data: Vec<Value> = Scenario::all()
        .iter()
        .map(|s| {
            json!({
                "id": format!("mock-{s}"),
                "type": "model",
                "object": "model",
                "display_name": format!("warden-mock: {}", s.description()),
                "created_at": "2025-01-01T00:00:00Z",
                "created": 1_735_689_600u64,
                "owned_by": "warden-mock"
            })
        })
        .collect();
    let first = data.first().and_then(|m| m.get("id")).cloned();
    let last = data.last().and_then(|m| m.get("id")).cloned();
    json!({
        "object": "list",
        "data": data,
        "has_more": false,
        "first_id": first,
        "last_id": last
    })
}
