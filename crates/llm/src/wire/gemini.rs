//! Google's Gemini API on the wire (`POST
//! /v1beta/models/<model>:streamGenerateContent?alt=sse`): `data:` frames,
//! each a whole `GenerateContentResponse` carrying the next piece of the
//! reply — `{"candidates":[{"content":{"parts":[{"text":…}],"role":
//! "model"},"index":0}],"usageMetadata":{…}}`, the last with a
//! `finishReason` — no event names and no terminal `[DONE]`: a stream that
//! ends without a `finishReason` is broken. An error is `{"error":{"code":
//! N,"message":…,"status":"UNAVAILABLE"}}`.
//!
//! [`decode_chunk`] is the typed decoder of one frame, into the
//! [`AgentEvent`]s a session would see (so that progress is
//! [`AgentEvent::is_progress`], the one rule).

use serde::Deserialize;
use warden_core::{AgentEvent, StreamError, Usage, retryable_status};

use crate::json::parse_json;

/// One `data:` frame of a Gemini stream, decoded.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct GeminiChunk {
    /// What the frame carries, in its order: a text part is a
    /// [`AgentEvent::TextDelta`], a thought part (`"thought": true`) a
    /// [`AgentEvent::ThinkingDelta`], a `functionCall` part a tool call
    /// (started, its `args` as input, finished: the API sends a call
    /// whole); then the `finishReason` as [`AgentEvent::Stop`] and
    /// `usageMetadata` as [`AgentEvent::Usage`].
    pub events: Vec<AgentEvent>,
    /// The first candidate has its `finishReason`: the stream's last frame.
    pub finished: bool,
}

impl GeminiChunk {
    /// Whether the frame holds a function call.
    pub fn has_tool_call(&self) -> bool {
        self.events
            .iter()
            .any(|e| matches!(e, AgentEvent::ToolUseStarted { .. }))
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Response {
    #[serde(default)]
    candidates: Option<Vec<Candidate>>,
    #[serde(default)]
    usage_metadata: Option<UsageMetadata>,
    #[serde(default)]
    error: Option<ErrorBody>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Candidate {
    #[serde(default)]
    content: Option<Content>,
    #[serde(default)]
    finish_reason: Option<String>,
    #[serde(default)]
    index: Option<u64>,
}

#[derive(Deserialize)]
struct Content {
    #[serde(default)]
    parts: Option<Vec<Part>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Part {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    thought: Option<bool>,
    #[serde(default)]
    function_call: Option<FunctionCall>,
}

#[derive(Deserialize)]
struct FunctionCall {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    args: Option<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct UsageMetadata {
    #[serde(default)]
    prompt_token_count: Option<u64>,
    #[serde(default)]
    candidates_token_count: Option<u64>,
    #[serde(default)]
    thoughts_token_count: Option<u64>,
    #[serde(default)]
    cached_content_token_count: Option<u64>,
}

#[derive(Deserialize)]
struct ErrorBody {
    #[serde(default)]
    code: Option<u16>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    status: Option<String>,
}

/// Decodes one `data:` frame of a Gemini stream. Only the first candidate
/// (`index` 0) is read: the CLIs ask for one. An `error` object is the
/// error ([`StreamError::Api`], retryable when its `code` is a status the
/// shared rule retries or its `status` is `UNAVAILABLE`,
/// `RESOURCE_EXHAUSTED`, `INTERNAL` or `DEADLINE_EXCEEDED`); a frame that
/// is not such JSON is [`StreamError::Malformed`].
pub fn decode_chunk(data: &str) -> Result<GeminiChunk, StreamError> {
    let response = parse_json::<Response>(data)?;
    if let Some(error) = response.error {
        let status = error.status.unwrap_or_default();
        let retryable = error.code.is_some_and(retryable_status)
            || matches!(
                status.as_str(),
                "UNAVAILABLE" | "RESOURCE_EXHAUSTED" | "INTERNAL" | "DEADLINE_EXCEEDED"
            );
        return Err(StreamError::Api {
            status: None,
            kind: if status.is_empty() {
                "error".to_owned()
            } else {
                status
            },
            message: error.message.unwrap_or_default(),
            retryable,
            retry_after: None,
        });
    }
    let mut chunk = GeminiChunk::default();
    let first = response
        .candidates
        .into_iter()
        .flatten()
        .find(|c| c.index.unwrap_or(0) == 0);
    if let Some(candidate) = first {
        let parts = candidate.content.and_then(|c| c.parts).unwrap_or_default();
        for part in parts {
            if let Some(call) = part.function_call {
                let name = call.name.unwrap_or_default();
                let id = call.id.unwrap_or_else(|| name.clone());
                let args = call.args.unwrap_or(serde_json::Value::Null);
                chunk.events.push(AgentEvent::ToolUseStarted {
                    id: id.clone(),
                    name,
                });
                chunk.events.push(AgentEvent::ToolInputDelta {
                    id: id.clone(),
                    partial_json: args.to_string(),
                });
                chunk.events.push(AgentEvent::ToolUseFinished { id });
            } else if let Some(text) = part.text {
                chunk.events.push(if part.thought == Some(true) {
                    AgentEvent::ThinkingDelta(text)
                } else {
                    AgentEvent::TextDelta(text)
                });
            }
        }
        if let Some(reason) = candidate.finish_reason {
            chunk.finished = true;
            chunk.events.push(AgentEvent::Stop { reason });
        }
    }
    if let Some(usage) = response.usage_metadata {
        chunk.events.push(AgentEvent::Usage(Usage {
            input_tokens: usage.prompt_token_count.unwrap_or(0),
            cache_read_input_tokens: usage.cached_content_token_count.unwrap_or(0),
            output_tokens: usage
                .candidates_token_count
                .unwrap_or(0)
                .saturating_add(usage.thoughts_token_count.unwrap_or(0)),
            ..Usage::default()
        }));
    }
    Ok(chunk)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_thought_and_the_last_frame_are_told_apart() {
        let data = r#"{"candidates":[{"content":{"parts":[{"text":"hm","thought":true},{"text":"Hello"}],"role":"model"},"index":0}],"usageMetadata":{"promptTokenCount":10,"candidatesTokenCount":0}}"#;
        let chunk = decode_chunk(data).expect("a frame");
        assert_eq!(
            chunk.events[..2],
            [
                AgentEvent::ThinkingDelta("hm".into()),
                AgentEvent::TextDelta("Hello".into())
            ]
        );
        assert!(!chunk.finished);
        let last = r#"{"candidates":[{"content":{"parts":[{"text":""}],"role":"model"},"finishReason":"STOP","index":0}],"usageMetadata":{"promptTokenCount":10,"candidatesTokenCount":7,"totalTokenCount":17}}"#;
        let chunk = decode_chunk(last).expect("a frame");
        assert!(chunk.finished);
        // An empty part is no progress.
        assert!(!chunk.events[0].is_progress());
        assert!(chunk.events.contains(&AgentEvent::Usage(Usage {
            input_tokens: 10,
            output_tokens: 7,
            ..Usage::default()
        })));
    }

    #[test]
    fn a_function_call_comes_whole() {
        let data = r#"{"candidates":[{"content":{"parts":[{"functionCall":{"name":"run_shell_command","args":{"command":"ls"}}}],"role":"model"},"index":0}]}"#;
        let chunk = decode_chunk(data).expect("a frame");
        assert!(chunk.has_tool_call());
        assert_eq!(
            chunk.events[1],
            AgentEvent::ToolInputDelta {
                id: "run_shell_command".into(),
                partial_json: r#"{"command":"ls"}"#.into()
            }
        );
    }

    #[test]
    fn errors_follow_the_shared_retry_rule() {
        let busy =
            r#"{"error":{"code":503,"message":"The model is overloaded.","status":"UNAVAILABLE"}}"#;
        let e = decode_chunk(busy).expect_err("an error");
        assert!(e.is_retryable(), "{e:?}");
        let bad = r#"{"error":{"code":400,"message":"bad","status":"INVALID_ARGUMENT"}}"#;
        assert!(!decode_chunk(bad).expect_err("an error").is_retryable());
        assert!(matches!(
            decode_chunk("{\"candidates\":[{\"content\":"),
            Err(StreamError::Malformed { .. })
        ));
    }
}
