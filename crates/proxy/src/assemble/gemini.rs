//! A Gemini `GenerateContentResponse` assembled from its (spliced)
//! stream's frames, as `:generateContent` would have answered.

use serde_json::{Map, Value, json};
use warden_llm::sse::SseEvent;

use super::{Assembled, AssemblyError, Budget, append_field, json_size};

/// Builds one `GenerateContentResponse` from a stream's frames.
#[derive(Debug, Default)]
pub(crate) struct Gemini {
    /// The response's fields but its candidates (`responseId`,
    /// `modelVersion`, the last `usageMetadata`, …).
    head: Map<String, Value>,
    /// The first candidate's parts: a text part joined to the one before
    /// when both are plain text of the same kind (thought or not).
    parts: Vec<Value>,
    /// The first candidate's other fields (`finishReason`, …), the last.
    candidate: Map<String, Value>,
    error: Option<Value>,
    done: bool,
}

/// Whether `part` holds nothing but text (and its `thought` flag), so
/// that text after it may be joined to it.
fn plain_text(part: &Map<String, Value>) -> Option<bool> {
    let only_text = part.keys().all(|k| k == "text" || k == "thought");
    let thought = part.get("thought").and_then(Value::as_bool) == Some(true);
    (only_text && part.get("text").is_some_and(Value::is_string)).then_some(thought)
}

impl Gemini {
    /// Takes one frame of the (spliced) stream; what it keeps is charged
    /// to `budget`.
    pub(crate) fn event(
        &mut self,
        event: &SseEvent,
        budget: &mut Budget,
    ) -> Result<(), AssemblyError> {
        let Ok(Value::Object(chunk)) = serde_json::from_str::<Value>(&event.data) else {
            return Ok(());
        };
        if let Some(error) = chunk.get("error") {
            budget.spend(event.data.len())?;
            self.error = Some(error.clone());
            return Ok(());
        }
        for (key, value) in &chunk {
            if key == "candidates" {
                continue;
            }
            // Replaced, not accumulated: charged when new.
            if !self.head.contains_key(key) {
                budget.spend(key.len().saturating_add(json_size(value)))?;
            }
            self.head.insert(key.clone(), value.clone());
        }
        let first = chunk
            .get("candidates")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_object)
            .find(|c| c.get("index").and_then(Value::as_u64).unwrap_or(0) == 0);
        let Some(candidate) = first else {
            return Ok(());
        };
        for (key, value) in candidate {
            match key.as_str() {
                "content" => self.parts(value, budget)?,
                "index" => {}
                _ => {
                    if key == "finishReason" {
                        self.done = true;
                    }
                    if !self.candidate.contains_key(key) {
                        budget.spend(key.len().saturating_add(json_size(value)))?;
                    }
                    self.candidate.insert(key.clone(), value.clone());
                }
            }
        }
        Ok(())
    }

    fn parts(&mut self, content: &Value, budget: &mut Budget) -> Result<(), AssemblyError> {
        let parts = content
            .get("parts")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_object);
        for part in parts {
            let kind = plain_text(part);
            let joins = kind.is_some()
                && self
                    .parts
                    .last()
                    .and_then(Value::as_object)
                    .and_then(plain_text)
                    == kind;
            match (joins, part.get("text").and_then(Value::as_str)) {
                (true, Some(text)) => {
                    budget.spend(text.len())?;
                    if let Some(Value::Object(last)) = self.parts.last_mut() {
                        append_field(last, "text", text);
                    }
                }
                _ => {
                    budget.spend(json_size(&Value::Object(part.clone())))?;
                    self.parts.push(Value::Object(part.clone()));
                }
            }
        }
        Ok(())
    }

    /// The response, once the stream has ended.
    pub(crate) fn finish(self) -> Result<Assembled, AssemblyError> {
        if let Some(error) = self.error {
            return Ok(Assembled::Error(error));
        }
        if !self.done {
            return Ok(Assembled::Incomplete);
        }
        let mut candidate = Map::new();
        candidate.insert(
            "content".into(),
            json!({"parts": self.parts, "role": "model"}),
        );
        candidate.extend(self.candidate);
        candidate.insert("index".into(), json!(0));
        let mut out = self.head;
        out.insert("candidates".into(), json!([candidate]));
        Ok(Assembled::Answer(Value::Object(out)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(data: &Value) -> SseEvent {
        SseEvent {
            event: "message".to_owned(),
            data: data.to_string(),
            id: None,
        }
    }

    #[test]
    fn text_frames_become_one_part_with_the_finish_reason_and_the_last_usage() {
        let mut g = Gemini::default();
        let mut budget = Budget::new(1 << 20);
        let frame = |text: &str, last: bool| {
            let mut c =
                json!({"content": {"parts": [{"text": text}], "role": "model"}, "index": 0});
            if last {
                c["finishReason"] = json!("STOP");
            }
            json!({"candidates": [c], "usageMetadata": {"candidatesTokenCount": u64::from(last)}, "responseId": "r"})
        };
        for (text, last) in [("one ", false), ("two ", false), ("three", true)] {
            g.event(&ev(&frame(text, last)), &mut budget)
                .expect("taken");
        }
        let Assembled::Answer(answer) = g.finish().expect("assembled") else {
            panic!("an answer")
        };
        assert_eq!(
            answer,
            json!({"responseId": "r", "usageMetadata": {"candidatesTokenCount": 1}, "candidates": [
                {"content": {"parts": [{"text": "one two three"}], "role": "model"}, "finishReason": "STOP", "index": 0}
            ]})
        );
    }

    #[test]
    fn a_stream_without_a_finish_reason_is_incomplete_and_an_error_is_the_answer() {
        let mut g = Gemini::default();
        let mut budget = Budget::new(1 << 20);
        let text = json!({"candidates": [{"content": {"parts": [{"text": "a"}]}, "index": 0}]});
        g.event(&ev(&text), &mut budget).expect("taken");
        assert_eq!(g.finish().expect("ended"), Assembled::Incomplete);
        let mut g = Gemini::default();
        let error = json!({"error": {"code": 503, "message": "busy", "status": "UNAVAILABLE"}});
        g.event(&ev(&error), &mut budget).expect("taken");
        assert_eq!(
            g.finish().expect("ended"),
            Assembled::Error(error["error"].clone())
        );
    }
}
