//! Splicing OpenAI Responses streams (`docs/wire-formats.md`, "OpenAI
//! Responses streams"): typed events numbered by `sequence_number`, output
//! items numbered by `output_index`, a message's text streamed as
//! `response.output_text.delta` events of its content parts, the end a
//! `response.completed` carrying every output item.
//!
//! A stream broken while the client has only the response's start (or a
//! message item with no text yet) is sent again; one broken mid-text is
//! continued with a continuation turn, as chat completions are (that API
//! has no prefill either): the request's `input`, the items the client
//! has whole, the text it was shown as an assistant message, then
//! [`CONTINUE_ASK`](warden_llm::CONTINUE_ASK). The client sees one response:
//! - the later attempt's start (`response.created`, `…in_progress`) is
//!   dropped;
//! - its first message item joins the open one (that item's id and output
//!   index), its first text part the open part, through the [`Stitcher`]
//!   (which trims what the model repeats); reasoning items before it are
//!   dropped (the client has its reasoning); any other item comes after,
//!   at the next output index;
//! - every event is renumbered, so sequence numbers run on without a gap;
//! - the joined item's `.done` events carry its whole text, and
//!   `response.completed` the first attempt's id, every output item the
//!   client got and the output tokens of every attempt.
//!
//! Inside a reasoning item or a tool call, or between items, nothing can
//! continue the reply: the stream ends with the API's `error` event (a
//! reply can be re-attached only when it was started with
//! `"background": true`, which the client chose, not the proxy); with
//! `--hold-thinking` one inside a reasoning item, held, is sent again unseen.

mod shown;

use std::collections::HashMap;

use serde_json::{Value, json};
use warden_core::StreamError;
use warden_core::continuation::Stitcher;
use warden_llm::sse::SseEvent;

use super::hold::Hold;
use super::{Resume, Splice};
use shown::{Open, continuation};

#[derive(Debug, Default)]
pub(crate) struct Responses {
    /// The response id the client has (the first attempt's).
    first_id: Option<String>,
    /// An attempt after the first one is being spliced on: its start is
    /// dropped and the end names what the client has.
    spliced: bool,
    /// The sequence number of the next event the client gets.
    next_seq: u64,
    /// The output index of the next item the client gets.
    next_index: u64,
    /// This attempt's output index → the client's (`None`: dropped).
    map: HashMap<u64, Option<u64>>,
    /// Output items the client has whole, in order.
    items: Vec<Value>,
    /// The item the client has open.
    open: Option<Open>,
    /// While a later attempt's message is joined onto the open one.
    join: Option<Join>,
    /// Bytes of text this attempt streamed (its tokens, estimated, count
    /// if it breaks).
    attempt_text_bytes: usize,
    /// Output tokens of the attempts before this one.
    prior_output: u64,
    done: bool,
    /// A reasoning item held until whole, and its first sequence number.
    hold: Hold,
    held_seq: u64,
}

/// A later attempt's message, joined onto the open item.
#[derive(Debug)]
struct Join {
    /// Trims what the model repeats of the open part's text (`None`: the
    /// same request again, nothing shown to trim).
    stitcher: Option<Stitcher>,
    /// The attempt's message item has been mapped onto the open one.
    mapped: bool,
    /// Its first content index and the client's for it.
    parts_from: Option<(u64, u64)>,
}

fn malformed(message: impl Into<String>) -> StreamError {
    StreamError::Malformed {
        message: message.into(),
    }
}

fn stitch_failed(e: warden_core::continuation::StitchError) -> StreamError {
    StreamError::ContinuationFailed {
        message: e.to_string(),
    }
}

/// The error an `error` event or a `response.failed` reports: its kind
/// from the `code` (`server_is_overloaded`, `rate_limit_exceeded` …).
fn reported_error(data: &Value, kind: &str) -> StreamError {
    let object = if kind == "error" {
        data.get("error")
            .cloned()
            .unwrap_or_else(|| json!({"code": data.get("code"), "message": data.get("message")}))
    } else {
        data.pointer("/response/error")
            .cloned()
            .unwrap_or(Value::Null)
    };
    warden_llm::stream_error(&object)
}

impl Responses {
    /// A splice that holds reasoning items back until whole when `hold`.
    pub(crate) fn new(on: bool) -> Self {
        let mut splice = Self::default();
        splice.hold.on = on;
        splice
    }

    /// Writes one event, numbered next; `changed` (or a renumbering)
    /// writes `data` instead of the upstream's `raw` text.
    fn emit(&mut self, out: &mut String, name: &str, mut data: Value, raw: &str, changed: bool) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let renumber = data.get("sequence_number").and_then(Value::as_u64) != Some(seq);
        out.push_str("event: ");
        out.push_str(name);
        out.push_str("\ndata: ");
        if changed || renumber {
            data["sequence_number"] = json!(seq);
            out.push_str(&data.to_string());
        } else {
            out.push_str(raw);
        }
        out.push_str("\n\n");
    }

    /// `response.output_item.added`: the item opens, unless it joins the
    /// open one or is dropped.
    fn item_added(
        &mut self,
        event: &SseEvent,
        mut data: Value,
        out: &mut String,
    ) -> Result<(), StreamError> {
        let upstream = output_index(&data)?;
        let item = data.get("item").cloned().unwrap_or(Value::Null);
        let kind = item.get("type").and_then(Value::as_str).unwrap_or("");
        if let Some(join) = self.join.as_mut().filter(|j| !j.mapped) {
            match (kind, &self.open) {
                ("message", Some(open)) => {
                    join.mapped = true;
                    self.map.insert(upstream, Some(open.index));
                    return Ok(());
                }
                ("reasoning", _) => {
                    self.map.insert(upstream, None);
                    return Ok(());
                }
                _ => {
                    return Err(StreamError::ContinuationFailed {
                        message: format!(
                            "the continuation began with a {kind} item, not the message"
                        ),
                    });
                }
            }
        }
        let index = self.next_index;
        self.next_index += 1;
        self.map.insert(upstream, Some(index));
        self.open = Some(Open {
            index,
            id: item
                .get("id")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
            message: kind == "message",
            parts: Vec::new(),
            part: None,
        });
        let changed = index != upstream;
        if changed {
            data["output_index"] = json!(index);
        }
        if kind == "reasoning" {
            self.hold.begin(index, out.len());
            self.held_seq = self.next_seq;
        }
        self.emit(out, &event.event, data, &event.data, changed);
        Ok(())
    }

    /// An event of an output item: mapped onto the client's item, its
    /// text joined and the item's whole text kept.
    fn item_event(
        &mut self,
        kind: &str,
        event: &SseEvent,
        mut data: Value,
        out: &mut String,
    ) -> Result<(), StreamError> {
        let upstream = output_index(&data)?;
        let index = match self.map.get(&upstream) {
            None => return Err(malformed("an event of an output item that was never added")),
            Some(None) => return Ok(()),
            Some(Some(index)) => *index,
        };
        let mut changed = index != upstream;
        if changed {
            data["output_index"] = json!(index);
        }
        let Some(open) = self.open.as_mut().filter(|o| o.index == index) else {
            // An item the client has whole: nothing more of it can come.
            return Err(malformed("an event of an output item after its end"));
        };
        let joined = self.join.as_mut().filter(|j| j.mapped);
        if joined.is_some()
            && data.get("item_id").and_then(Value::as_str) != Some(&open.id)
            && data.get("item_id").is_some()
        {
            data["item_id"] = json!(open.id);
            changed = true;
        }
        let content_index = data.get("content_index").and_then(Value::as_u64);
        let mut joins_part = false;
        if let (Some(join), Some(ci)) = (joined, content_index) {
            let (first, client_first) = *join.parts_from.get_or_insert_with(|| {
                let client = open
                    .part
                    .as_ref()
                    .map_or(open.parts.len() as u64, |(i, _)| *i);
                (ci, client)
            });
            let client = ci.saturating_sub(first) + client_first;
            if client != ci {
                data["content_index"] = json!(client);
                changed = true;
            }
            joins_part = ci == first && open.part.as_ref().is_some_and(|(i, _)| *i == client);
            if joins_part && kind == "response.content_part.added" {
                // The client has the part open: the attempt's text goes on in it.
                return Ok(());
            }
        }
        let client_ci = data.get("content_index").and_then(Value::as_u64);
        // What the stitcher still held, sent before the part's end.
        let mut held_rest = None;
        match kind {
            "response.content_part.added" => {
                if let Some(ci) = client_ci {
                    open.part = Some((ci, String::new()));
                }
            }
            "response.output_text.delta" => {
                let delta = data
                    .get("delta")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned();
                self.attempt_text_bytes += delta.len();
                let stitcher = self
                    .join
                    .as_mut()
                    .filter(|_| joins_part)
                    .and_then(|j| j.stitcher.as_mut());
                let shown = match stitcher {
                    Some(s) => {
                        let shown = s.push(&delta).map_err(stitch_failed)?;
                        if shown.is_empty() {
                            return Ok(());
                        }
                        data["delta"] = json!(shown);
                        changed = true;
                        shown
                    }
                    None => delta,
                };
                if let Some((_, text)) = open.part.as_mut().filter(|(i, _)| Some(*i) == client_ci) {
                    text.push_str(&shown);
                }
            }
            "response.output_text.done" if joins_part => {
                let rest = match self.join.as_mut().and_then(|j| j.stitcher.as_mut()) {
                    Some(s) => s.finish().map_err(stitch_failed)?,
                    None => String::new(),
                };
                let mut whole = String::new();
                if let Some((_, text)) = open.part.as_mut() {
                    text.push_str(&rest);
                    whole.clone_from(text);
                }
                if !rest.is_empty() {
                    let mut delta = data.clone();
                    delta["type"] = json!("response.output_text.delta");
                    if let Some(d) = delta.as_object_mut() {
                        d.remove("text");
                        d.remove("logprobs");
                    }
                    delta["delta"] = json!(rest);
                    held_rest = Some(delta);
                }
                data["text"] = json!(whole);
                changed = true;
            }
            "response.content_part.done" => {
                let mut part = data.get("part").cloned().unwrap_or(Value::Null);
                if let Some((_, text)) = open.part.take().filter(|(i, _)| Some(*i) == client_ci) {
                    if joins_part || self.spliced {
                        part["text"] = json!(text);
                        data["part"] = part.clone();
                        changed = true;
                    }
                }
                open.parts.push(part);
            }
            "response.output_item.done" => {
                let mut item = data.get("item").cloned().unwrap_or(Value::Null);
                if self.join.take().is_some() {
                    item["id"] = json!(open.id);
                    item["content"] = Value::Array(open.parts.clone());
                    data["item"] = item.clone();
                    changed = true;
                }
                self.items.push(item);
                self.open = None;
            }
            _ => {}
        }
        if let Some(delta) = held_rest {
            self.emit(out, "response.output_text.delta", delta, "", true);
        }
        self.emit(out, &event.event, data, &event.data, changed);
        Ok(())
    }

    /// `response.completed` (or `.incomplete`): after a splice, the first
    /// attempt's id, every item the client got and every attempt's tokens.
    fn end(
        &mut self,
        event: &SseEvent,
        mut data: Value,
        out: &mut String,
    ) -> Result<(), StreamError> {
        if self.join.is_some() {
            return Err(StreamError::ContinuationFailed {
                message: "the continuation ended without continuing the message".to_owned(),
            });
        }
        self.done = true;
        let changed = self.spliced;
        if changed && let Some(response) = data.get_mut("response") {
            if let Some(id) = &self.first_id {
                response["id"] = json!(id);
            }
            response["output"] = Value::Array(self.items.clone());
            if let Some(usage) = response.get_mut("usage").filter(|u| u.is_object()) {
                for key in ["output_tokens", "total_tokens"] {
                    if let Some(n) = usage.get(key).and_then(Value::as_u64) {
                        usage[key] = json!(n + self.prior_output);
                    }
                }
            }
        }
        self.emit(out, &event.event, data, &event.data, changed);
        Ok(())
    }
}

fn output_index(data: &Value) -> Result<u64, StreamError> {
    data.get("output_index")
        .and_then(Value::as_u64)
        .ok_or_else(|| malformed("an output item event without an output_index"))
}

impl Splice for Responses {
    fn event(&mut self, event: &SseEvent, out: &mut String) -> Result<(), StreamError> {
        let mark = out.len();
        let result = self.splice_event(event, out);
        let open = self.open.as_ref().map(|o| o.index);
        self.hold.settle(out, mark, self.done, open);
        result
    }

    fn done(&self) -> bool {
        self.done
    }

    fn resume(&mut self, original: &Value) -> Resume {
        // A held item never reached the client: as if it never began.
        if let Some(index) = self.hold.drop_held() {
            self.open = self.open.take().filter(|o| o.index != index);
            (self.next_index, self.next_seq) = (index, self.held_seq);
        }
        // This attempt's tokens count even though it broke.
        self.prior_output += self.attempt_text_bytes.div_ceil(4) as u64;
        self.attempt_text_bytes = 0;
        self.map.clear();
        self.spliced = true;
        let Some(open) = &self.open else {
            // Only the response's start, or whole items and nothing open
            // (which the model would not go on from).
            return if self.items.is_empty() {
                Resume::Again
            } else {
                Resume::GiveUp
            };
        };
        if !open.message {
            return Resume::GiveUp;
        }
        let part_text = open
            .part
            .as_ref()
            .map(|(_, t)| t.as_str())
            .filter(|t| !t.is_empty());
        let Some(text) = part_text else {
            if open.texts().is_empty() {
                // A message with nothing in it yet: the same request again,
                // its message joined onto this one.
                self.join = Some(Join {
                    stitcher: None,
                    mapped: false,
                    parts_from: None,
                });
                return Resume::Again;
            }
            // Between two parts of a message: the model would not go on.
            return Resume::GiveUp;
        };
        let stitcher = Stitcher::new(text);
        match continuation(original, &self.items, open) {
            Some(request) => {
                self.join = Some(Join {
                    stitcher: Some(stitcher),
                    mapped: false,
                    parts_from: None,
                });
                Resume::Continue(request)
            }
            None => Resume::GiveUp,
        }
    }

    fn error_event(&self, message: &str) -> String {
        let data = json!({
            "type": "error",
            "code": "server_error",
            "message": message,
            "param": null,
            "sequence_number": self.next_seq,
        });
        format!("event: error\ndata: {data}\n\n")
    }
}

impl Responses {
    fn splice_event(&mut self, event: &SseEvent, out: &mut String) -> Result<(), StreamError> {
        let data: Value = serde_json::from_str(&event.data)
            .map_err(|e| malformed(format!("an event whose data is not JSON ({e})")))?;
        let kind = data
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or(&event.event)
            .to_owned();
        match kind.as_str() {
            "error" | "response.failed" => {
                let error = reported_error(&data, &kind);
                if error.is_retryable() {
                    return Err(error);
                }
                // Not retryable: the client gets it, and the stream ends.
                self.done = true;
                self.emit(out, &event.event, data, &event.data, false);
            }
            "response.created" | "response.in_progress" | "response.queued" => {
                if !self.spliced {
                    if kind == "response.created" {
                        self.first_id = data
                            .pointer("/response/id")
                            .and_then(Value::as_str)
                            .map(str::to_owned);
                    }
                    self.emit(out, &event.event, data, &event.data, false);
                }
            }
            "response.output_item.added" => self.item_added(event, data, out)?,
            "response.completed" | "response.incomplete" => self.end(event, data, out)?,
            _ if data.get("output_index").is_some() => self.item_event(&kind, event, data, out)?,
            _ => self.emit(out, &event.event, data, &event.data, false),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
