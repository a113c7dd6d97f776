//! Splicing Gemini streams (`:streamGenerateContent?alt=sse`): `data:`
//! frames, each a whole `GenerateContentResponse` with the next piece of
//! the reply, the last with a `finishReason`; decoded by llm's typed
//! decoder ([`decode_chunk`]). The API has no resume: a reply broken
//! mid-text is continued with a continuation turn — the request's
//! `contents`, the partial text as a `model` turn, [`CONTINUE_ASK`] as a
//! `user` turn — what the model repeats trimmed by the [`Stitcher`], and
//! the continuation's frames carry the first attempt's `responseId`, so
//! the client sees one reply.
//!
//! With `--hold-thinking` (the wire layer's default under an agent CLI) the
//! frames before the reply's first text, tool call or finish — its thought
//! parts — are held back: a break among them drops them and the request is
//! sent again ([`Resume::Again`]), the client having seen none of it (shown,
//! thought text could neither be continued nor taken back). Meanwhile each
//! held frame is replaced by a blank line, which keeps the client's stream
//! live: an SSE comment would not do, the Gemini SDK (`@google/genai`, under
//! the Gemini CLI) reads only `data:` lines after optional whitespace, and
//! a comment at the head of its buffer would block every frame after it.

use serde_json::{Value, json};
use warden_core::continuation::Stitcher;
use warden_core::{AgentEvent, StreamError};
use warden_llm::CONTINUE_ASK;
use warden_llm::gemini::decode_chunk;
use warden_llm::sse::SseEvent;

use super::{Resume, Splice};
use crate::upstream::gemini_error;

#[derive(Debug, Default)]
pub(crate) struct Gemini {
    /// The first attempt's `responseId`.
    response_id: Option<String>,
    /// The reply's text the client has (thought parts not included).
    text: String,
    /// The client has thought text: a reply without text yet cannot be
    /// continued (the continuation would show it again), nor taken back.
    thought: bool,
    /// The client has a function call: it cannot be continued.
    in_tool: bool,
    /// While a continuation's start is being stitched on.
    join: Option<Stitcher>,
    done: bool,
    /// Frames held back until the reply's text starts (`--hold-thinking`);
    /// `None` when not holding (off, or released).
    held: Option<Held>,
}

/// The frames held back before the reply's first text.
#[derive(Debug, Default)]
struct Held {
    frames: String,
    /// Whether they carry thought text.
    thought: bool,
}

/// What a held frame is replaced by: a blank line, which ends no event
/// (the SSE rule for an empty data buffer) and which the Gemini SDK skips.
const KEEP_ALIVE: &str = "\n";

fn frame(out: &mut String, data: &str) {
    out.push_str("data: ");
    out.push_str(data);
    out.push_str("\n\n");
}

fn stitch_failed(e: impl std::fmt::Display) -> StreamError {
    StreamError::ContinuationFailed {
        message: e.to_string(),
    }
}

impl Gemini {
    /// A splice that holds the frames before the reply's text back when
    /// `hold` (see the module docs).
    pub(crate) fn new(hold: bool) -> Self {
        Self {
            held: hold.then(Held::default),
            ..Self::default()
        }
    }

    /// After one event wrote `out[mark..]`: held while the reply has only
    /// thought (or nothing) so far, else what was held goes out before it.
    fn hold(&mut self, out: &mut String, mark: usize, only_thought: bool, thought: bool) {
        let Some(held) = self.held.as_mut() else {
            self.thought |= thought;
            return;
        };
        if only_thought {
            held.frames.push_str(&out[mark..]);
            held.thought |= thought;
            out.truncate(mark);
            out.push_str(KEEP_ALIVE);
            return;
        }
        let tail = out.split_off(mark);
        out.push_str(&held.frames);
        out.push_str(&tail);
        self.thought |= held.thought || thought;
        self.held = None;
    }

    /// `data` with its first candidate's text parts (not thought) replaced
    /// by one holding `text`, or left out when `text` is empty; `None`
    /// when nothing is left to send (no other part, no finish reason).
    fn with_text(mut data: Value, text: &str, finished: bool) -> Option<Value> {
        let parts = data
            .pointer_mut("/candidates/0/content/parts")
            .and_then(Value::as_array_mut)?;
        let is_text = |p: &Value| {
            p.get("text").is_some() && p.get("thought").and_then(Value::as_bool) != Some(true)
        };
        let at = parts.iter().position(is_text).unwrap_or(parts.len());
        parts.retain(|p| !is_text(p));
        if !text.is_empty() {
            parts.insert(at.min(parts.len()), json!({"text": text}));
        }
        (!parts.is_empty() || finished).then_some(data)
    }
}

impl Splice for Gemini {
    fn event(&mut self, event: &SseEvent, out: &mut String) -> Result<(), StreamError> {
        let chunk = match decode_chunk(&event.data) {
            Ok(chunk) => chunk,
            // Not retryable: the client gets it as the upstream sent it,
            // and the stream ends there.
            Err(StreamError::Api {
                retryable: false, ..
            }) => {
                self.done = true;
                frame(out, &event.data);
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        self.in_tool |= chunk.has_tool_call();
        let mut text = String::new();
        let mut thought = false;
        for e in &chunk.events {
            match e {
                AgentEvent::TextDelta(t) => text.push_str(t),
                AgentEvent::ThinkingDelta(t) if !t.is_empty() => thought = true,
                _ => {}
            }
        }
        let only_thought = text.is_empty() && !chunk.has_tool_call() && !chunk.finished;
        let mark = out.len();
        let mut data: Option<Value> = None;
        let parse = |raw: &str| {
            serde_json::from_str::<Value>(raw).map_err(|e| StreamError::Malformed {
                message: format!("a frame that is not JSON ({e})"),
            })
        };
        let id = serde_json::from_str::<ResponseId>(&event.data)
            .ok()
            .and_then(|r| r.response_id);
        match (&self.response_id, id) {
            (None, Some(id)) => self.response_id = Some(id),
            (Some(first), Some(id)) if *first != id => {
                let mut d = parse(&event.data)?;
                d["responseId"] = json!(first);
                data = Some(d);
            }
            _ => {}
        }
        if let Some(stitcher) = self.join.as_mut() {
            let mut shown = stitcher.push(&text).map_err(stitch_failed)?;
            if chunk.finished {
                shown.push_str(&stitcher.finish().map_err(stitch_failed)?);
                self.join = None;
            }
            self.text.push_str(&shown);
            let d = match data.take() {
                Some(d) => d,
                None => parse(&event.data)?,
            };
            // Nothing when held by the stitcher, or repeated.
            if let Some(d) = Self::with_text(d, &shown, chunk.finished) {
                frame(out, &d.to_string());
            }
        } else {
            self.text.push_str(&text);
            match data {
                Some(d) => frame(out, &d.to_string()),
                None => frame(out, &event.data),
            }
        }
        if chunk.finished {
            self.done = true;
        }
        self.hold(out, mark, only_thought, thought);
        Ok(())
    }

    fn done(&self) -> bool {
        self.done
    }

    fn resume(&mut self, original: &Value) -> Resume {
        if let Some(held) = self.held.as_mut() {
            // Nothing of this reply reached the client: as if it never began.
            *held = Held::default();
            self.response_id = None;
            self.join = None;
            return Resume::Again;
        }
        if self.in_tool {
            return Resume::GiveUp;
        }
        if self.text.is_empty() {
            self.join = None;
            return if self.thought {
                Resume::GiveUp
            } else {
                Resume::Again
            };
        }
        let mut request = original.clone();
        let Some(contents) = request.get_mut("contents").and_then(Value::as_array_mut) else {
            return Resume::GiveUp;
        };
        contents.push(json!({"role": "model", "parts": [{"text": self.text}]}));
        contents.push(json!({"role": "user", "parts": [{"text": CONTINUE_ASK}]}));
        self.join = Some(Stitcher::new(&self.text));
        Resume::Continue(request)
    }

    fn error_event(&self, message: &str) -> String {
        let data = gemini_error(axum::http::StatusCode::SERVICE_UNAVAILABLE, message);
        let mut out = String::new();
        frame(&mut out, &data.to_string());
        out
    }
}

/// A frame's `responseId`, read alone.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct ResponseId {
    #[serde(default)]
    response_id: Option<String>,
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

    fn text(id: &str, text: &str, last: bool) -> Value {
        let mut c = json!({"content": {"parts": [{"text": text}], "role": "model"}, "index": 0});
        if last {
            c["finishReason"] = json!("STOP");
        }
        json!({"candidates": [c], "responseId": id})
    }

    fn frames(out: &str) -> Vec<Value> {
        out.split("\n\n")
            .filter_map(|b| b.trim_start().strip_prefix("data: "))
            .map(|d| serde_json::from_str(d).expect("json"))
            .collect()
    }

    #[test]
    fn a_continued_reply_keeps_the_first_id_and_the_text_once() {
        let mut s = Gemini::default();
        let mut out = String::new();
        for d in [text("a", "one two ", false), text("a", "three four", false)] {
            s.event(&ev(&d), &mut out).expect("frame");
        }
        let original = json!({"contents": [{"role": "user", "parts": [{"text": "count"}]}]});
        let Resume::Continue(request) = s.resume(&original) else {
            panic!("continued")
        };
        assert_eq!(
            request["contents"][1],
            json!({"role": "model", "parts": [{"text": "one two three four"}]})
        );
        assert_eq!(request["contents"][2]["role"], "user");
        for d in [
            text("b", "two three four five six seven eight nine", false),
            text("b", " ten", true),
        ] {
            s.event(&ev(&d), &mut out).expect("frame");
        }
        assert!(s.done());
        let frames = frames(&out);
        assert!(frames.iter().all(|f| f["responseId"] == "a"), "{frames:?}");
        let shown: String = frames
            .iter()
            .filter_map(|f| f.pointer("/candidates/0/content/parts/0/text"))
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(shown, "one two three four five six seven eight nine ten");
        assert_eq!(
            frames.last().expect("frames")["candidates"][0]["finishReason"],
            "STOP"
        );
    }

    #[test]
    fn an_empty_part_is_no_progress_and_a_function_call_cannot_be_continued() {
        let mut s = Gemini::default();
        let mut progress = crate::splice::progress_of(crate::upstream::Protocol::Gemini);
        let mut out = String::new();
        let empty = ev(&text("a", "", false));
        s.event(&empty, &mut out).expect("frame");
        assert!(!progress.judge(&empty));
        assert!(matches!(s.resume(&json!({"contents": []})), Resume::Again));
        let call = json!({"candidates": [{"content": {"parts": [{"functionCall": {"name": "ls", "args": {}}}]}, "index": 0}]});
        s.event(&ev(&call), &mut out).expect("frame");
        assert!(progress.judge(&ev(&call)));
        assert!(matches!(s.resume(&json!({"contents": []})), Resume::GiveUp));
        assert!(s.error_event("x").contains("UNAVAILABLE"));
    }

    fn thought(id: &str, text: &str) -> Value {
        json!({"candidates": [{"content": {"parts": [{"text": text, "thought": true}], "role": "model"}, "index": 0}], "responseId": id})
    }

    #[test]
    fn held_thoughts_broken_before_the_text_are_sent_again_unseen() {
        let original = json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]});
        let mut s = Gemini::new(true);
        let mut out = String::new();
        for d in [thought("a", "Let me look "), thought("a", "at it.")] {
            s.event(&ev(&d), &mut out).expect("frame");
        }
        assert_eq!(out, "\n\n", "a blank line for each held frame, no frame");
        assert!(matches!(s.resume(&original), Resume::Again));
        out.clear();
        s.event(&ev(&thought("b", "Looked.")), &mut out)
            .expect("frame");
        assert_eq!(out, "\n");
        s.event(&ev(&text("b", "Hello", true)), &mut out)
            .expect("frame");
        let frames = frames(&out);
        assert_eq!(frames, [thought("b", "Looked."), text("b", "Hello", true)]);
        assert!(s.done());
        // Without the hold, shown thought text cannot be taken back.
        let mut s = Gemini::new(false);
        s.event(&ev(&thought("a", "Let me look ")), &mut out)
            .expect("frame");
        assert!(matches!(s.resume(&original), Resume::GiveUp));
    }

    #[test]
    fn error_frames_follow_the_shared_retry_rule() {
        let mut s = Gemini::default();
        let mut out = String::new();
        let busy = json!({"error": {"code": 503, "message": "busy", "status": "UNAVAILABLE"}});
        let e = s.event(&ev(&busy), &mut out).expect_err("retryable");
        assert!(e.is_retryable(), "{e:?}");
        assert!(out.is_empty());
        let bad = json!({"error": {"code": 400, "message": "bad", "status": "INVALID_ARGUMENT"}});
        s.event(&ev(&bad), &mut out).expect("passed on");
        assert!(s.done());
        assert_eq!(out, format!("data: {bad}\n\n"));
    }
}
