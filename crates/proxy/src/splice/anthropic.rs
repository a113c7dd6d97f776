//! Splicing Anthropic Messages streams (`docs/wire-formats.md`: the event
//! sequence, and how Claude Code takes each kind of broken stream).
//!
//! The client gets one `message_start`, content blocks numbered 0, 1, 2 …
//! in the order it received them, one `message_delta` whose
//! `usage.output_tokens` counts every attempt, one `message_stop`. What a
//! continuation produces is mapped onto that: its `message_start` is
//! dropped; while a text block is open downstream, the continuation's
//! first text block joins it (through the [`Stitcher`], which trims what
//! the model repeats) and its thinking blocks are dropped (a thinking block
//! cannot follow text inside one block); every other block gets the next
//! downstream index.

mod block;

use std::collections::HashMap;

use serde_json::{Value, json};
use warden_core::StreamError;
use warden_core::continuation::Stitcher;
use warden_llm::CONTINUE_ASK;
use warden_llm::sse::SseEvent;

use super::hold::Hold;
use super::{Resume, Splice};
use block::{DeltaEvent, Join, Open, Typed, frame, malformed};

#[derive(Debug, Default)]
pub(crate) struct Anthropic {
    started: bool,
    next_index: u64,
    /// This attempt's block index → the downstream one (`None`: dropped).
    map: HashMap<u64, Option<u64>>,
    open: Option<Open>,
    /// Blocks the client has whole, for a continuation's assistant message.
    closed: Vec<Value>,
    join: Option<Join>,
    /// Output tokens of the attempts before this one.
    prior_output: u64,
    /// This attempt's: the last `usage.output_tokens` seen, else estimated.
    attempt_output: Option<u64>,
    attempt_text_bytes: usize,
    /// A text block's `content_block_stop` (its downstream index and
    /// data), held until the next event: a stream that breaks right after
    /// it leaves the block open downstream, so the continuation's text
    /// joins it instead of becoming a second text block (of which Claude
    /// Code would keep only the last).
    held_stop: Option<(u64, String)>,
    /// Thinking held until its block is whole (`--hold-thinking`).
    hold: Hold,
    done: bool,
}

impl Anthropic {
    fn index_of(data: &Value) -> Result<u64, StreamError> {
        data.get("index")
            .and_then(Value::as_u64)
            .ok_or_else(|| malformed("a content block event without an index"))
    }

    fn emit_with_index(out: &mut String, event: &str, mut data: Value, index: u64, raw: &str) {
        if data.get("index").and_then(Value::as_u64) == Some(index) {
            frame(out, event, raw);
        } else {
            data["index"] = json!(index);
            frame(out, event, &data.to_string());
        }
    }

    fn emit_text(out: &mut String, index: u64, text: &str) {
        let data = json!({
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": "text_delta", "text": text},
        });
        frame(out, "content_block_delta", &data.to_string());
    }

    /// Closes the joined block if the continuation never mapped a text
    /// block onto it (or flushes what the stitcher still holds).
    fn close_join(&mut self, out: &mut String) -> Result<(), StreamError> {
        if let Some(mut join) = self.join.take() {
            let rest = join
                .stitcher
                .finish()
                .map_err(|e| StreamError::ContinuationFailed {
                    message: e.to_string(),
                })?;
            if !rest.is_empty() {
                self.append_text(&rest);
                Self::emit_text(out, join.index, &rest);
            }
            frame(
                out,
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": join.index}).to_string(),
            );
            self.close_open();
        }
        Ok(())
    }

    fn append_text(&mut self, text: &str) {
        if let Some(open) = &mut self.open {
            open.text.push_str(text);
        }
    }

    fn close_open(&mut self) {
        if let Some(open) = self.open.take() {
            self.closed.push(open.whole());
        }
    }

    /// A `content_block_delta`: the hot path, read through [`DeltaEvent`]
    /// and passed on as it came unless its index changes.
    fn on_delta(&mut self, raw: &str, out: &mut String) -> Result<(), StreamError> {
        let event: DeltaEvent<'_> = serde_json::from_str(raw)
            .map_err(|e| malformed(format!("a content_block_delta the proxy cannot read ({e})")))?;
        let upstream = event.index;
        let Some(target) = self.map.get(&upstream).copied() else {
            return Err(malformed("a delta for a block that was never started"));
        };
        let Some(index) = target else { return Ok(()) };
        let delta = event.delta;
        if delta.kind == "text_delta" {
            let text = delta.text.as_deref().unwrap_or("");
            self.attempt_text_bytes += text.len();
            if let Some(join) = self.join.as_mut().filter(|j| j.index == index) {
                let shown =
                    join.stitcher
                        .push(text)
                        .map_err(|e| StreamError::ContinuationFailed {
                            message: e.to_string(),
                        })?;
                if !shown.is_empty() {
                    self.append_text(&shown);
                    Self::emit_text(out, index, &shown);
                }
                return Ok(());
            }
            self.append_text(text);
        } else if let Some(open) = &mut self.open {
            match &*delta.kind {
                "thinking_delta" => {
                    let t = delta.thinking.as_deref().unwrap_or("");
                    self.attempt_text_bytes += t.len();
                    open.text.push_str(t);
                }
                "signature_delta" => open.signature = delta.signature,
                "input_json_delta" => {
                    let p = delta.partial_json.as_deref().unwrap_or("");
                    self.attempt_text_bytes += p.len();
                    open.text.push_str(p);
                }
                _ => {}
            }
        }
        if upstream == index {
            frame(out, "content_block_delta", raw);
        } else {
            let mut data: Value = serde_json::from_str(raw)
                .map_err(|e| malformed(format!("a delta that is not JSON ({e})")))?;
            data["index"] = json!(index);
            frame(out, "content_block_delta", &data.to_string());
        }
        Ok(())
    }
}

impl Anthropic {
    /// A splice that holds thinking blocks back until whole when `hold`.
    pub(crate) fn new(hold: bool) -> Self {
        let mut splice = Self::default();
        splice.hold.on = hold;
        splice
    }

    /// One upstream event's output, held or not (`hold.rs`).
    fn apply(&mut self, event: &SseEvent, out: &mut String) -> Result<(), StreamError> {
        let mark = out.len();
        let result = self.splice_event(event, out);
        let open = self.open.as_ref().map(|o| o.index);
        self.hold.settle(out, mark, self.done, open);
        result
    }

    fn splice_event(&mut self, event: &SseEvent, out: &mut String) -> Result<(), StreamError> {
        if let Some((index, raw)) = self.held_stop.take() {
            if self.open.as_ref().is_some_and(|o| o.index == index) {
                self.close_open();
            }
            frame(out, "content_block_stop", &raw);
        }
        let typed: Typed<'_> = serde_json::from_str(&event.data).map_err(|e| {
            malformed(format!(
                "an event whose data is not a typed JSON object ({e})"
            ))
        })?;
        if typed.kind == "content_block_delta" {
            return self.on_delta(&event.data, out);
        }
        let kind = typed.kind.into_owned();
        let data: Value = serde_json::from_str(&event.data)
            .map_err(|e| malformed(format!("an event whose data is not JSON ({e})")))?;
        match kind.as_str() {
            "message_start" => {
                if !self.started {
                    self.started = true;
                    frame(out, "message_start", &event.data);
                }
            }
            "content_block_start" => {
                let upstream = Self::index_of(&data)?;
                let block = data.get("content_block").cloned().unwrap_or(Value::Null);
                let block_type = block.get("type").and_then(Value::as_str).unwrap_or("");
                if let Some(join) = self.join.as_mut() {
                    if block_type == "text" && !join.mapped {
                        join.mapped = true;
                        let index = join.index;
                        self.map.insert(upstream, Some(index));
                        return Ok(());
                    }
                    if block_type == "thinking" || block_type == "redacted_thinking" {
                        self.map.insert(upstream, None);
                        return Ok(());
                    }
                    // Anything else after the joined text: close it first.
                    self.close_join(out)?;
                }
                let index = self.next_index;
                self.next_index += 1;
                self.map.insert(upstream, Some(index));
                if block_type == "thinking" || block_type == "redacted_thinking" {
                    self.hold.begin(index, out.len());
                }
                self.open = Some(Open::new(index, block));
                Self::emit_with_index(out, "content_block_start", data, index, &event.data);
            }
            "content_block_stop" => {
                let upstream = Self::index_of(&data)?;
                match self.map.get(&upstream).copied().flatten() {
                    Some(index) if self.join.as_ref().is_some_and(|j| j.index == index) => {
                        self.close_join(out)?;
                    }
                    Some(index) => {
                        let open = self.open.as_ref().filter(|o| o.index == index);
                        let text = open.is_some_and(|o| o.kind() == "text");
                        let mut stop = String::new();
                        Self::emit_with_index(
                            &mut stop,
                            "content_block_stop",
                            data,
                            index,
                            &event.data,
                        );
                        if text {
                            let raw = stop
                                .strip_prefix("event: content_block_stop\ndata: ")
                                .and_then(|r| r.strip_suffix("\n\n"))
                                .unwrap_or("")
                                .to_owned();
                            self.held_stop = Some((index, raw));
                        } else {
                            if open.is_some() {
                                self.close_open();
                            }
                            out.push_str(&stop);
                        }
                    }
                    None => {}
                }
            }
            "message_delta" => {
                self.close_join(out)?;
                let mut data = data;
                if let Some(n) = data.pointer("/usage/output_tokens").and_then(Value::as_u64) {
                    self.attempt_output = Some(n);
                    if self.prior_output > 0 {
                        data["usage"]["output_tokens"] = json!(self.prior_output + n);
                        frame(out, "message_delta", &data.to_string());
                        return Ok(());
                    }
                }
                frame(out, "message_delta", &event.data);
            }
            "message_stop" => {
                self.close_join(out)?;
                self.done = true;
                frame(out, "message_stop", &event.data);
            }
            "error" => {
                let error = warden_llm::stream_error(data.get("error").unwrap_or(&Value::Null));
                if error.is_retryable() {
                    return Err(error);
                }
                // Not retryable: the client gets it as the upstream sent it.
                self.done = true;
                frame(out, "error", &event.data);
            }
            // `ping`, and events this proxy does not know: passed on.
            _ => frame(out, &event.event, &event.data),
        }
        Ok(())
    }
}

impl Splice for Anthropic {
    fn event(&mut self, event: &SseEvent, out: &mut String) -> Result<(), StreamError> {
        self.apply(event, out)
    }

    fn done(&self) -> bool {
        self.done
    }

    fn resume(&mut self, original: &Value) -> Resume {
        // This attempt's tokens count even though it broke.
        self.prior_output += self
            .attempt_output
            .take()
            .unwrap_or(self.attempt_text_bytes.div_ceil(4) as u64);
        self.attempt_text_bytes = 0;
        self.map.clear();
        // A held block never reached the client: as if it never began.
        if let Some(index) = self.hold.drop_held() {
            if self.open.as_ref().is_some_and(|o| o.index == index) {
                self.open = None;
            }
            self.next_index = index;
        }
        // A held stop was never sent: its block is still open downstream.
        self.held_stop = None;
        if let Some(join) = &self.join {
            // The continuation broke before its text joined: ask again.
            if !join.mapped {
                return self.continuation(original);
            }
        }
        self.join = None;
        match &self.open {
            None if self.closed.is_empty() => Resume::Again,
            None => match self
                .closed
                .last()
                .and_then(|b| b.get("type"))
                .and_then(Value::as_str)
            {
                // A tool call is answered by a tool result, not continued.
                Some("tool_use") | Some("server_tool_use") => Resume::GiveUp,
                _ => self.continuation(original),
            },
            Some(open) if open.kind() == "text" => {
                self.join = Some(Join {
                    index: open.index,
                    stitcher: Stitcher::new(&open.text),
                    mapped: false,
                });
                self.continuation(original)
            }
            // Inside a thinking block (its signature comes only at its end)
            // or a tool call's input: nothing can continue it.
            Some(_) => Resume::GiveUp,
        }
    }

    fn error_is_retried(&self) -> bool {
        self.closed.is_empty()
    }

    fn error_event(&self, message: &str) -> String {
        let data =
            json!({"type": "error", "error": {"type": "overloaded_error", "message": message}});
        let mut out = String::new();
        frame(&mut out, "error", &data.to_string());
        out
    }
}

impl Anthropic {
    /// The original request with the reply so far as an assistant message
    /// and [`CONTINUE_ASK`] after it (a continuation turn: accepted by every
    /// model and with thinking on, which a prefill is not).
    fn continuation(&mut self, original: &Value) -> Resume {
        let mut content: Vec<Value> = self.closed.clone();
        if let Some(open) = &self.open {
            let text = &open.text;
            if open.kind() == "text" && !text.is_empty() {
                content.push(json!({"type": "text", "text": text}));
            }
        }
        if content.is_empty() {
            return Resume::Again;
        }
        let mut request = original.clone();
        let Some(messages) = request.get_mut("messages").and_then(Value::as_array_mut) else {
            return Resume::GiveUp;
        };
        messages.push(json!({"role": "assistant", "content": content}));
        messages.push(json!({"role": "user", "content": CONTINUE_ASK}));
        Resume::Continue(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(event: &str, data: Value) -> SseEvent {
        SseEvent {
            event: event.to_owned(),
            data: data.to_string(),
            id: None,
        }
    }

    fn feed(s: &mut Anthropic, events: &[SseEvent]) -> Vec<(String, Value)> {
        let mut out = String::new();
        for e in events {
            s.event(e, &mut out).expect("event");
        }
        out.split("\n\n")
            .filter(|b| !b.is_empty())
            .map(|b| {
                let mut lines = b.lines();
                let name = lines
                    .next()
                    .unwrap_or("")
                    .trim_start_matches("event: ")
                    .to_owned();
                let data = lines.next().unwrap_or("").trim_start_matches("data: ");
                (name, serde_json::from_str(data).expect("json"))
            })
            .collect()
    }

    fn start() -> SseEvent {
        ev(
            "message_start",
            json!({"type": "message_start", "message": {"id": "msg_1", "usage": {"output_tokens": 1}}}),
        )
    }
    fn block(i: u64, t: &str) -> SseEvent {
        let block = if t == "text" {
            json!({"type": "text", "text": ""})
        } else {
            json!({"type": t, "thinking": ""})
        };
        ev(
            "content_block_start",
            json!({"type": "content_block_start", "index": i, "content_block": block}),
        )
    }
    fn text(i: u64, t: &str) -> SseEvent {
        ev(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": i, "delta": {"type": "text_delta", "text": t}}),
        )
    }
    fn stop(i: u64) -> SseEvent {
        ev(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": i}),
        )
    }
    fn end(tokens: u64) -> [SseEvent; 2] {
        [
            ev(
                "message_delta",
                json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": tokens}}),
            ),
            ev("message_stop", json!({"type": "message_stop"})),
        ]
    }

    #[test]
    fn held_thinking_keeps_the_clients_stream_live_with_a_comment_per_event() {
        let mut s = Anthropic::new(true);
        let mut out = String::new();
        s.event(&start(), &mut out).expect("start");
        let started = out.len();
        let thinking = ev(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hmm"}}),
        );
        s.event(&block(0, "thinking"), &mut out).expect("block");
        s.event(&thinking, &mut out).expect("delta");
        assert_eq!(
            &out[started..],
            ":\n\n:\n\n",
            "none of the thinking yet, a comment for each of its events"
        );
        s.event(&stop(0), &mut out).expect("stop");
        assert!(
            out[started..].contains("\"thinking\":\"hmm\""),
            "the block whole at its end: {out}"
        );
    }

    #[test]
    fn a_continuation_joins_the_open_text_block_as_one_well_formed_stream() {
        let mut s = Anthropic::default();
        let thinking = [
            block(0, "thinking"),
            ev(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hmm"}}),
            ),
            ev(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "sig"}}),
            ),
            stop(0),
        ];
        let mut first = vec![start()];
        first.extend(thinking);
        first.extend([block(1, "text"), text(1, "one two three four")]);
        let mut got = feed(&mut s, &first);
        let original = json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "count"}]});
        let Resume::Continue(request) = s.resume(&original) else {
            panic!("a broken text block is continued")
        };
        let messages = request["messages"].as_array().expect("messages");
        assert_eq!(messages.len(), 3);
        assert_eq!(
            messages[1]["content"],
            json!([{"type": "thinking", "thinking": "hmm", "signature": "sig"}, {"type": "text", "text": "one two three four"}])
        );
        assert_eq!(messages[2]["content"], json!(CONTINUE_ASK));
        // The continuation: its own start, a thinking block, then text that
        // repeats the last words.
        let mut second = vec![
            start(),
            block(0, "thinking"),
            stop(0),
            block(1, "text"),
            text(1, "three four five six seven eight nine ten"),
        ];
        second.extend([stop(1)]);
        second.extend(end(7));
        got.extend(feed(&mut s, &second));
        assert!(s.done());
        let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names.iter().filter(|n| **n == "message_start").count(), 1);
        assert_eq!(
            names
                .iter()
                .filter(|n| **n == "content_block_start")
                .count(),
            2,
            "{names:?}"
        );
        let indexes: Vec<u64> = got
            .iter()
            .filter_map(|(_, d)| d.get("index").and_then(Value::as_u64))
            .collect();
        assert!(indexes.iter().all(|i| *i <= 1), "{indexes:?}");
        let all_text: String = got
            .iter()
            .filter_map(|(_, d)| d.pointer("/delta/text").and_then(Value::as_str))
            .collect();
        assert_eq!(all_text, "one two three four five six seven eight nine ten");
        let stops: Vec<u64> = got
            .iter()
            .filter(|(n, _)| n == "content_block_stop")
            .filter_map(|(_, d)| d["index"].as_u64())
            .collect();
        assert_eq!(stops, [0, 1]);
        let usage = got
            .iter()
            .find(|(n, _)| n == "message_delta")
            .map(|(_, d)| d["usage"]["output_tokens"].clone());
        assert_eq!(
            usage,
            Some(json!(6 + 7)),
            "the broken attempt's 21 bytes count as 6 tokens"
        );
    }

    #[test]
    fn a_break_right_after_a_text_block_ends_joins_the_continuation_to_it() {
        let mut s = Anthropic::default();
        let mut got = feed(
            &mut s,
            &[start(), block(0, "text"), text(0, "one two three"), stop(0)],
        );
        assert!(
            got.iter().all(|(n, _)| n != "content_block_stop"),
            "the text block's stop is held until the next event"
        );
        let Resume::Continue(_) = s.resume(&json!({"messages": []})) else {
            panic!("continued")
        };
        let mut second = vec![start(), block(0, "text"), text(0, "two three"), stop(0)];
        second.extend(end(2));
        got.extend(feed(&mut s, &second));
        let starts = got
            .iter()
            .filter(|(n, _)| n == "content_block_start")
            .count();
        assert_eq!(starts, 1, "one text block: {got:?}");
        let all: String = got
            .iter()
            .filter_map(|(_, d)| d.pointer("/delta/text").and_then(Value::as_str))
            .collect();
        assert_eq!(all, "one two three");
        assert!(s.done());
    }

    #[test]
    fn inside_a_thinking_block_nothing_can_continue_and_the_end_is_an_overloaded_error() {
        let mut s = Anthropic::default();
        feed(&mut s, &[start(), block(0, "thinking")]);
        assert!(matches!(s.resume(&json!({"messages": []})), Resume::GiveUp));
        let e = s.error_event("x");
        assert!(e.starts_with("event: error\ndata: "), "{e}");
        assert!(e.contains("overloaded_error"));
    }

    #[test]
    fn a_break_before_any_block_is_the_same_request_again_without_a_second_start() {
        let mut s = Anthropic::default();
        let mut got = feed(&mut s, &[start()]);
        assert!(matches!(s.resume(&json!({"messages": []})), Resume::Again));
        let mut again = vec![start(), block(0, "text"), text(0, "hi"), stop(0)];
        again.extend(end(1));
        got.extend(feed(&mut s, &again));
        let starts = got.iter().filter(|(n, _)| n == "message_start").count();
        assert_eq!(starts, 1);
        assert!(s.done());
    }

    #[test]
    fn a_retryable_error_event_breaks_the_attempt_and_another_is_passed_on() {
        let mut s = Anthropic::default();
        let mut out = String::new();
        let overloaded = ev(
            "error",
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
        );
        assert!(s.event(&overloaded, &mut out).is_err());
        let invalid = ev(
            "error",
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "no"}}),
        );
        assert!(s.event(&invalid, &mut out).is_ok());
        assert!(s.done() && out.contains("invalid_request_error"));
    }
}
