//! Splicing OpenAI chat-completions streams (`docs/wire-formats.md`: `data:`
//! chunks, `data: [DONE]` at the end). That API has no resume: a reply broken
//! mid-text is continued with a continuation turn (the partial text as an
//! assistant message, then [`CONTINUE_ASK`]), what the model repeats is
//! trimmed by the [`Stitcher`], and the continuation's chunks carry the
//! first attempt's `id`, so the client sees one completion.

use serde_json::{Value, json};
use warden_core::StreamError;
use warden_core::continuation::Stitcher;
use warden_llm::CONTINUE_ASK;
use warden_llm::sse::SseEvent;

use super::{Resume, Splice};

#[derive(Debug, Default)]
pub(crate) struct Chat {
    /// The first attempt's completion id.
    id: Option<String>,
    /// The text the client has.
    text: String,
    /// A tool call has begun: it cannot be continued.
    in_tool: bool,
    /// While a continuation's start is being stitched on.
    join: Option<Stitcher>,
    done: bool,
}

fn chunk(out: &mut String, data: &str) {
    out.push_str("data: ");
    out.push_str(data);
    out.push_str("\n\n");
}

impl Chat {
    /// A chunk carrying only `text`, shaped like `template`.
    fn text_chunk(template: &Value, text: &str) -> Value {
        let mut c = template.clone();
        c["choices"] = json!([{"index": 0, "delta": {"content": text}, "finish_reason": null}]);
        if let Some(o) = c.as_object_mut() {
            o.remove("usage");
        }
        c
    }
}

impl Splice for Chat {
    fn event(&mut self, event: &SseEvent, out: &mut String) -> Result<(), StreamError> {
        if event.data.trim() == "[DONE]" {
            self.done = true;
            chunk(out, "[DONE]");
            return Ok(());
        }
        let mut data: Value =
            serde_json::from_str(&event.data).map_err(|e| StreamError::Malformed {
                message: format!("a chunk that is not JSON ({e})"),
            })?;
        if let Some(error) = data.get("error") {
            let error = warden_llm::stream_error(error);
            if error.is_retryable() {
                return Err(error);
            }
            // Not retryable: the client gets it as the upstream sent it,
            // and the stream ends there.
            self.done = true;
            chunk(out, &event.data);
            return Ok(());
        }
        let id = data.get("id").and_then(Value::as_str).map(str::to_owned);
        let mut changed = false;
        match (&self.id, id) {
            (None, Some(id)) => self.id = Some(id),
            (Some(first), Some(id)) if *first != id => {
                data["id"] = json!(first);
                changed = true;
            }
            _ => {}
        }
        let delta = data
            .pointer("/choices/0/delta")
            .cloned()
            .unwrap_or(Value::Null);
        if delta.get("tool_calls").is_some() {
            self.in_tool = true;
        }
        let finish = data
            .pointer("/choices/0/finish_reason")
            .is_some_and(|f| !f.is_null());
        if let Some(content) = delta.get("content").and_then(Value::as_str) {
            if let Some(stitcher) = self.join.as_mut() {
                let shown =
                    stitcher
                        .push(content)
                        .map_err(|e| StreamError::ContinuationFailed {
                            message: e.to_string(),
                        })?;
                data["choices"][0]["delta"]["content"] = json!(shown);
                if let Some(d) = data["choices"][0]["delta"].as_object_mut() {
                    d.remove("role");
                }
                changed = true;
                self.text.push_str(&shown);
                if shown.is_empty() && !finish && data.get("usage").is_none_or(Value::is_null) {
                    return Ok(());
                }
            } else {
                self.text.push_str(content);
            }
        }
        if finish {
            if let Some(mut stitcher) = self.join.take() {
                let rest = stitcher
                    .finish()
                    .map_err(|e| StreamError::ContinuationFailed {
                        message: e.to_string(),
                    })?;
                if !rest.is_empty() {
                    self.text.push_str(&rest);
                    chunk(out, &Self::text_chunk(&data, &rest).to_string());
                }
            }
        }
        if changed {
            chunk(out, &data.to_string());
        } else {
            chunk(out, &event.data);
        }
        Ok(())
    }

    fn done(&self) -> bool {
        self.done
    }

    fn resume(&mut self, original: &Value) -> Resume {
        if self.in_tool {
            return Resume::GiveUp;
        }
        if self.text.is_empty() {
            self.join = None;
            return Resume::Again;
        }
        let mut request = original.clone();
        let Some(messages) = request.get_mut("messages").and_then(Value::as_array_mut) else {
            return Resume::GiveUp;
        };
        messages.push(json!({"role": "assistant", "content": self.text}));
        messages.push(json!({"role": "user", "content": CONTINUE_ASK}));
        self.join = Some(Stitcher::new(&self.text));
        Resume::Continue(request)
    }

    fn error_event(&self, message: &str) -> String {
        let data = json!({"error": {"message": message, "type": "server_error", "param": null, "code": "upstream_stream_failed"}});
        let mut out = String::new();
        chunk(&mut out, &data.to_string());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(data: &str) -> SseEvent {
        SseEvent {
            event: "message".to_owned(),
            data: data.to_owned(),
            id: None,
        }
    }

    fn content(id: &str, text: &str) -> String {
        json!({"id": id, "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]}).to_string()
    }

    #[test]
    fn a_continued_completion_keeps_the_first_id_and_the_text_once() {
        let mut s = Chat::default();
        let mut out = String::new();
        for d in [content("a", "one two "), content("a", "three four")] {
            s.event(&ev(&d), &mut out).expect("chunk");
        }
        let Resume::Continue(request) =
            s.resume(&json!({"messages": [{"role": "user", "content": "count"}]}))
        else {
            panic!("continued")
        };
        assert_eq!(
            request["messages"][1],
            json!({"role": "assistant", "content": "one two three four"})
        );
        let finish = json!({"id": "b", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}).to_string();
        for d in [
            content("b", "two three four five six seven eight nine"),
            finish,
            "[DONE]".to_owned(),
        ] {
            s.event(&ev(&d), &mut out).expect("chunk");
        }
        assert!(s.done());
        let chunks: Vec<Value> = out
            .split("\n\n")
            .filter_map(|b| b.strip_prefix("data: "))
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str(d).expect("json"))
            .collect();
        assert!(chunks.iter().all(|c| c["id"] == "a"), "{chunks:?}");
        let text: String = chunks
            .iter()
            .filter_map(|c| {
                c.pointer("/choices/0/delta/content")
                    .and_then(Value::as_str)
            })
            .collect();
        assert_eq!(text, "one two three four five six seven eight nine");
        assert!(out.ends_with("data: [DONE]\n\n"));
    }

    #[test]
    fn a_tool_call_cannot_be_continued() {
        let mut s = Chat::default();
        let mut out = String::new();
        let tool = json!({"id": "a", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"a"}}]}}]}).to_string();
        s.event(&ev(&tool), &mut out).expect("chunk");
        assert!(matches!(s.resume(&json!({"messages": []})), Resume::GiveUp));
        assert!(s.error_event("x").contains("server_error"));
    }

    #[test]
    fn error_chunks_follow_the_shared_retry_rule() {
        let mut s = Chat::default();
        let mut out = String::new();
        let overloaded = json!({"error": {"message": "busy", "type": "server_error"}}).to_string();
        let e = s.event(&ev(&overloaded), &mut out).expect_err("retryable");
        assert!(e.is_retryable(), "{e:?}");
        assert!(out.is_empty());
        let invalid =
            json!({"error": {"message": "bad", "type": "invalid_request_error"}}).to_string();
        s.event(&ev(&invalid), &mut out).expect("passed on");
        assert!(s.done());
        assert_eq!(out, format!("data: {invalid}\n\n"));
    }
}
