//! OpenAI's Responses API on the wire (`POST /v1/responses`): the request
//! body (streamed, in background, stored, so a dropped stream can be
//! re-attached) and the typed, numbered events → frames. Each event's
//! `sequence_number` and the response id are noted in a [`ResumePoint`],
//! shared with the source, which re-attaches a broken stream after the
//! last event the consumer has (`docs/wire-formats.md`, "Continuing a broken reply").

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::Mutex;

use serde::{Deserialize, Serialize};
use warden_core::{AgentEvent, Frame, StreamError, Usage};

use super::{EventMapper, Flow, Message, Turn};
use crate::classify::{ErrorBody, stream_error_event};
use crate::json::parse_json;
use crate::sse::SseEvent as Event;

/// The body of a Responses request: the system prompt as `instructions`,
/// the conversation as `input`, streamed in background and stored.
pub(super) fn request<'a>(turn: &'a Turn<'a>) -> ResponsesRequest<'a> {
    ResponsesRequest {
        model: turn.model,
        stream: true,
        background: true,
        store: true,
        instructions: turn.system,
        max_output_tokens: turn.max_tokens,
        input: &turn.messages,
    }
}

#[derive(Serialize)]
pub(super) struct ResponsesRequest<'a> {
    model: &'a str,
    stream: bool,
    background: bool,
    store: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    instructions: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_output_tokens: Option<u32>,
    input: &'a [Message<'a>],
}

/// Where a Responses stream is: the response id, and per text event the
/// sequence number and the text streamed up to it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ResumePoint {
    /// The response id (`response.created`).
    pub(crate) id: Option<String>,
    /// The last sequence number mapped.
    pub(crate) last_seq: Option<u64>,
    /// `(sequence_number, text bytes streamed once it is applied)` of each
    /// text delta: where to re-attach for a given partial text.
    pub(crate) text_marks: Vec<(u64, usize)>,
    /// Text bytes mapped so far.
    pub(crate) text_len: usize,
}

impl ResumePoint {
    /// Forgets everything after event `seq` (the consumer then has
    /// `text_len` bytes): those events come again after a re-attach.
    pub(crate) fn truncate(&mut self, seq: u64, text_len: usize) {
        self.last_seq = Some(seq);
        self.text_len = text_len;
        self.text_marks.retain(|(s, _)| *s <= seq);
    }

    /// The sequence number to re-attach after, for a consumer holding
    /// `partial_len` bytes of text: the last event at or before which
    /// exactly that much text had been streamed. `None` when no event
    /// matches (the consumer's text does not line up with the events).
    pub(crate) fn after_text(&self, partial_len: usize) -> Option<u64> {
        if partial_len == self.text_len {
            return self.last_seq;
        }
        self.text_marks
            .iter()
            .rev()
            .find(|(_, len)| *len == partial_len)
            .map(|(seq, _)| *seq)
    }
}

/// A shared [`ResumePoint`].
pub(crate) type SharedPoint = Arc<Mutex<ResumePoint>>;

#[derive(Deserialize)]
struct WireEvent {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    sequence_number: Option<u64>,
    #[serde(default)]
    delta: Option<String>,
    #[serde(default)]
    response: Option<WireResponse>,
    #[serde(default)]
    item: Option<WireItem>,
    #[serde(default)]
    item_id: Option<String>,
    // `error` events carry code and message at the top level.
    #[serde(default)]
    code: Option<serde_json::Value>,
    #[serde(default)]
    message: Option<String>,
}

#[derive(Deserialize)]
struct WireResponse {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<ErrorBody>,
    #[serde(default)]
    incomplete_details: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct WireItem {
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    call_id: Option<String>,
    #[serde(default)]
    name: Option<String>,
}

#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
    #[serde(default)]
    input_tokens_details: Option<InputDetails>,
}

#[derive(Deserialize)]
struct InputDetails {
    #[serde(default)]
    cached_tokens: u64,
}

/// Maps one Responses stream, noting where it is in `point`.
pub(crate) struct ResponsesMapper {
    point: SharedPoint,
}

impl ResponsesMapper {
    pub(crate) fn new(point: SharedPoint) -> Self {
        Self { point }
    }

    fn note(&self, f: impl FnOnce(&mut ResumePoint)) {
        let mut p = self.point.lock();
        f(&mut p);
    }
}

impl Default for ResponsesMapper {
    fn default() -> Self {
        Self::new(SharedPoint::default())
    }
}

impl EventMapper for ResponsesMapper {
    fn map(&mut self, event: &Event, out: &mut VecDeque<Frame>) -> Result<Flow, StreamError> {
        if event.data.is_empty() {
            return Ok(Flow::Continue);
        }
        let ev: WireEvent = parse_json(&event.data)?;
        let seq = ev.sequence_number;
        self.note(|p| {
            if seq.is_some() {
                p.last_seq = seq;
            }
        });
        match ev.kind.as_str() {
            "response.created" => {
                if let Some(id) = ev.response.and_then(|r| r.id) {
                    self.note(|p| p.id = Some(id));
                }
            }
            "response.output_text.delta" => {
                let text = ev.delta.unwrap_or_default();
                self.note(|p| {
                    p.text_len += text.len();
                    if let Some(seq) = seq {
                        p.text_marks.push((seq, p.text_len));
                    }
                });
                out.push_back(Frame::Event(AgentEvent::TextDelta(text)));
            }
            "response.reasoning_summary_text.delta" | "response.reasoning_text.delta" => {
                out.push_back(Frame::Event(AgentEvent::ThinkingDelta(
                    ev.delta.unwrap_or_default(),
                )));
            }
            "response.output_item.added" => {
                if let Some(item) = ev.item.filter(|i| i.kind == "function_call") {
                    out.push_back(Frame::Event(AgentEvent::ToolUseStarted {
                        id: item.call_id.or(item.id).unwrap_or_default(),
                        name: item.name.unwrap_or_default(),
                    }));
                }
            }
            "response.function_call_arguments.delta" => {
                out.push_back(Frame::Event(AgentEvent::ToolInputDelta {
                    id: ev.item_id.unwrap_or_default(),
                    partial_json: ev.delta.unwrap_or_default(),
                }));
            }
            "response.output_item.done" => {
                if let Some(item) = ev.item.filter(|i| i.kind == "function_call") {
                    out.push_back(Frame::Event(AgentEvent::ToolUseFinished {
                        id: item.call_id.or(item.id).unwrap_or_default(),
                    }));
                }
            }
            "response.completed" => {
                let response = ev.response;
                if let Some(u) = response.as_ref().and_then(|r| r.usage.as_ref()) {
                    let cached = u
                        .input_tokens_details
                        .as_ref()
                        .map_or(0, |d| d.cached_tokens);
                    out.push_back(Frame::Event(AgentEvent::Usage(Usage {
                        input_tokens: u.input_tokens.saturating_sub(cached),
                        output_tokens: u.output_tokens,
                        cache_read_input_tokens: cached,
                        ..Usage::default()
                    })));
                }
                let status = response
                    .and_then(|r| r.status)
                    .unwrap_or_else(|| "completed".into());
                out.push_back(Frame::Event(AgentEvent::Stop { reason: status }));
                out.push_back(Frame::Event(AgentEvent::TurnComplete {
                    context_window: None,
                    duration: None,
                }));
                return Ok(Flow::Done);
            }
            "response.failed" | "response.incomplete" => {
                let response = ev.response;
                let message = response
                    .as_ref()
                    .and_then(|r| r.incomplete_details.as_ref())
                    .map(ToString::to_string);
                let body = response.and_then(|r| r.error).unwrap_or(ErrorBody {
                    kind: Some(ev.kind.clone()),
                    message,
                    code: None,
                });
                return Err(stream_error_event(body));
            }
            "error" => {
                return Err(stream_error_event(ErrorBody {
                    kind: None,
                    message: ev.message,
                    code: ev.code,
                }));
            }
            _ => {}
        }
        Ok(Flow::Continue)
    }

    fn terminal(&self) -> &'static str {
        "response.completed"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(data: &str) -> Event {
        Event {
            event: "message".to_owned(),
            data: data.to_owned(),
            id: None,
        }
    }

    #[test]
    fn text_usage_and_the_end_are_mapped_and_the_point_follows() {
        let point = SharedPoint::default();
        let mut m = ResponsesMapper::new(point.clone());
        let mut out = VecDeque::new();
        for data in [
            r#"{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","status":"in_progress"}}"#,
            r#"{"type":"response.output_text.delta","sequence_number":4,"delta":"Hel"}"#,
            r#"{"type":"response.output_text.delta","sequence_number":5,"delta":"lo"}"#,
            r#"{"type":"response.output_text.done","sequence_number":6,"text":"Hello"}"#,
        ] {
            assert_eq!(m.map(&event(data), &mut out), Ok(Flow::Continue));
        }
        let done = r#"{"type":"response.completed","sequence_number":9,"response":{"id":"resp_1","status":"completed","usage":{"input_tokens":12,"output_tokens":3,"input_tokens_details":{"cached_tokens":2}}}}"#;
        assert_eq!(m.map(&event(done), &mut out), Ok(Flow::Done));
        let texts: String = out
            .iter()
            .filter_map(|f| match f {
                Frame::Event(AgentEvent::TextDelta(t)) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(texts, "Hello");
        assert!(out.iter().any(|f| matches!(
            f,
            Frame::Event(AgentEvent::Usage(u)) if u.input_tokens == 10 && u.cache_read_input_tokens == 2 && u.output_tokens == 3
        )));
        let p = point.lock().clone();
        assert_eq!(p.id.as_deref(), Some("resp_1"));
        assert_eq!(p.after_text(3), Some(4), "after 'Hel'");
        assert_eq!(p.after_text(5), Some(9), "after everything");
        assert_eq!(p.after_text(4), None, "no event ends there");
    }

    #[test]
    fn failures_and_error_events_are_typed_errors() {
        let mut m = ResponsesMapper::default();
        let mut out = VecDeque::new();
        let err = m
            .map(
                &event(r#"{"type":"error","code":"server_is_overloaded","message":"The server is overloaded.","sequence_number":3}"#),
                &mut out,
            )
            .expect_err("an error");
        assert!(err.is_retryable(), "{err:?}");
        let failed = m
            .map(
                &event(r#"{"type":"response.failed","sequence_number":4,"response":{"status":"failed","error":{"code":"invalid_prompt","message":"bad"}}}"#),
                &mut out,
            )
            .expect_err("a failure");
        assert!(!failed.is_retryable(), "{failed:?}");
    }
}
