//! Continuing a broken reply instead of replaying it.
//!
//! When an attempt breaks mid-text (see [`StreamPhase`]) and its source
//! [`continues`](crate::EventSource::continues), warden asks the source for
//! a *continuation*: the next attempt's [`TurnRequest`](crate::TurnRequest)
//! carries the text the consumer already has ([`Continuation`]), and the
//! source's stream yields only what comes after it. How a provider is asked
//! is the source's business (Anthropic: the partial text as a prefilled
//! assistant message, or, for models that refuse prefill, a continuation
//! turn; see `docs/wire-formats.md`).
//!
//! A model asked to continue in a new turn may repeat the last words or add
//! a lead-in. [`stitch`] (whole text) and [`Stitcher`] (streaming) trim
//! that: the longest overlap between the end of the partial text and the
//! start of the continuation, starting at a word boundary and spanning one
//! (so ask the model to repeat the last few words: a repeated fragment
//! alone is ambiguous and kept), after an optional short lead-in; a continuation that starts the reply over is
//! [`StitchError::Restarted`], and the turn then restarts from scratch
//! (the consumer is told to discard). Pure functions, no I/O.

use derive_setters::Setters;

use crate::event::AgentEvent;

/// What a continuation attempt continues.
#[derive(Debug, Clone, PartialEq, Eq, Setters)]
#[setters(prefix = "with_", strip_option)]
#[non_exhaustive]
pub struct Continuation {
    /// The reply text the consumer already has, in full (every earlier
    /// attempt of the chain).
    #[setters(skip)]
    pub partial_text: String,
    /// The attempt that broke.
    #[setters(skip)]
    pub broken_attempt: u32,
    /// Whether `partial_text` is the whole reply: the upstream finished it
    /// (its stop came) and only the turn's end was lost (its node gave the
    /// session up for a database outage before it could record it). A
    /// source may then end the turn with that text without asking the
    /// upstream again (the HTTP agents record it as the answer and send
    /// nothing); one that asks anyway gets nothing more to generate.
    pub complete: bool,
}

impl Continuation {
    /// A continuation of `partial_text`, which attempt `broken_attempt`
    /// left.
    pub fn new(partial_text: impl Into<String>, broken_attempt: u32) -> Self {
        Self {
            partial_text: partial_text.into(),
            broken_attempt,
            complete: false,
        }
    }
}

/// Where an attempt's stream was when it ended: what a consumer has of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum StreamPhase {
    /// Nothing shown yet (connecting, headers, `message_start`, pings).
    #[default]
    BeforeContent,
    /// Inside a thinking block (it cannot be continued: its signature
    /// comes at its end).
    Thinking,
    /// Text is streaming.
    Text,
    /// Inside a tool call (its input JSON partial).
    ToolCall,
    /// After a completed tool call, before more content.
    AfterToolCall,
}

impl StreamPhase {
    /// The stable name (`before_content`, `thinking`, `text`, `tool_call`,
    /// `after_tool_call`), as in the `stream.phase` span attribute.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::BeforeContent => "before_content",
            Self::Thinking => "thinking",
            Self::Text => "text",
            Self::ToolCall => "tool_call",
            Self::AfterToolCall => "after_tool_call",
        }
    }

    /// The phase after `event`.
    pub fn after(self, event: &AgentEvent) -> Self {
        match event {
            AgentEvent::ThinkingDelta(_) => Self::Thinking,
            AgentEvent::TextDelta(_) => Self::Text,
            AgentEvent::ToolUseStarted { .. } | AgentEvent::ToolInputDelta { .. } => Self::ToolCall,
            AgentEvent::ToolUseFinished { .. } => Self::AfterToolCall,
            _ => self,
        }
    }
}

impl std::fmt::Display for StreamPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Longest lead-in ("Continuing: ", "…") skipped before the overlap, in
/// bytes.
pub const MAX_LEAD_IN: usize = 64;
/// Shortest overlap that makes a lead-in count (shorter ones after a
/// lead-in could be chance).
pub const MIN_OVERLAP_AFTER_LEAD_IN: usize = 16;
/// Longest overlap looked for, in bytes: a model repeats a few words or a
/// sentence, not the reply.
pub const MAX_OVERLAP: usize = 400;
/// A continuation that starts with this many bytes of the reply's own
/// beginning (or the whole partial text, if shorter) starts over.
const RESTART_PROBE: usize = 40;

/// A continuation that cannot be stitched onto the partial text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StitchError {
    /// The model started the reply over instead of continuing it.
    #[error("the continuation starts the reply over")]
    Restarted,
}

/// How much of the start of `continuation` repeats the end of `partial`
/// (a lead-in included): the bytes to drop. `Ok(0)` for a continuation
/// that picks up exactly where `partial` stopped.
pub fn stitch(partial: &str, continuation: &str) -> Result<usize, StitchError> {
    Ends::of(partial).stitch(continuation)
}

/// What stitching needs of the partial text: its start (to tell a
/// restart) and its end (to find the overlap).
#[derive(Debug, Clone, Default)]
struct Ends {
    /// The first [`RESTART_PROBE`] bytes.
    probe: String,
    /// Whether the partial text is longer than the probe.
    longer: bool,
    /// The last [`MAX_OVERLAP`] bytes (at a char boundary).
    tail: String,
    /// Whether `tail` is the whole partial text.
    whole: bool,
}

impl Ends {
    fn of(partial: &str) -> Self {
        let probe = floor_char(partial, RESTART_PROBE.min(partial.len()));
        let mut from = partial.len().saturating_sub(MAX_OVERLAP);
        while !partial.is_char_boundary(from) {
            from += 1;
        }
        Self {
            probe: probe.to_owned(),
            longer: partial.len() > probe.len(),
            tail: partial[from..].to_owned(),
            whole: from == 0,
        }
    }

    fn stitch(&self, continuation: &str) -> Result<usize, StitchError> {
        if self.tail.is_empty() || continuation.is_empty() {
            return Ok(0);
        }
        let overlap_at = |j: usize| overlap(&self.tail, self.whole, &continuation[j..]);
        if let Some(k) = overlap_at(0) {
            return Ok(k);
        }
        for j in lead_in_ends(continuation) {
            if let Some(k) = overlap_at(j).filter(|k| *k >= MIN_OVERLAP_AFTER_LEAD_IN) {
                return Ok(j + k);
            }
        }
        if self.longer && continuation.trim_start().starts_with(&self.probe) {
            return Err(StitchError::Restarted);
        }
        Ok(0)
    }
}

/// The longest `k` such that `partial` ends with `cont[..k]`, the overlap
/// starting at a word boundary of `partial` and spanning one (a repeated
/// word and what follows it, not just a fragment: "fo" then "fox" is
/// ambiguous — the word may have been "fofox" — "brown fo" then
/// "brown fox" is not), or being all of it (`whole`: `partial` is the
/// whole partial text, and the model started over from its first word).
fn overlap(partial: &str, whole: bool, cont: &str) -> Option<usize> {
    let max = partial.len().min(cont.len()).min(MAX_OVERLAP);
    (1..=max).rev().find(|&k| {
        let start = partial.len() - k;
        partial.is_char_boundary(start)
            && cont.is_char_boundary(k)
            && partial[start..] == cont[..k]
            && at_word_start(partial, start)
            && (spans_a_boundary(&partial[start..]) || (whole && start == 0))
    })
}

/// Whether a word starts somewhere inside `s` (after its first character).
fn spans_a_boundary(s: &str) -> bool {
    s.char_indices().skip(1).any(|(i, _)| at_word_start(s, i))
}

/// Whether a word (or the overlap's whitespace) starts at byte `i`. In
/// scripts written without spaces (Chinese, Japanese, Thai) every
/// character counts as a word.
fn at_word_start(s: &str, i: usize) -> bool {
    let before = s[..i].chars().next_back();
    let here = s[i..].chars().next();
    match (before, here) {
        (None, _) => true,
        (Some(b), Some(h)) => !is_word(b) || !is_word(h) || spaceless(b) || spaceless(h),
        (Some(_), None) => false,
    }
}

fn spaceless(c: char) -> bool {
    matches!(c,
        '\u{0E00}'..='\u{0E7F}'   // Thai
        | '\u{3040}'..='\u{30FF}' // Hiragana, Katakana
        | '\u{3400}'..='\u{4DBF}' // CJK Extension A
        | '\u{4E00}'..='\u{9FFF}' // CJK Unified Ideographs
    )
}

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_' || c == '\''
}

/// Byte offsets, within [`MAX_LEAD_IN`], where a lead-in could end: after
/// each run of non-word characters.
fn lead_in_ends(cont: &str) -> impl Iterator<Item = usize> + '_ {
    cont.char_indices()
        .take_while(|(i, _)| *i <= MAX_LEAD_IN)
        .filter(move |(i, _)| *i > 0 && at_word_start(cont, *i))
        .map(|(i, _)| i)
}

/// `s[..at]` at the nearest char boundary at or below `at`.
fn floor_char(s: &str, mut at: usize) -> &str {
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    &s[..at]
}

/// Bytes of the continuation to hold before deciding: the largest lead-in
/// plus the largest overlap, plus one.
const DECIDE_AFTER: usize = MAX_LEAD_IN + MAX_OVERLAP + 1;

/// [`stitch`] over a stream: holds the continuation's first text back until
/// the overlap can be decided (or the stream ends), then lets the rest
/// through unchanged.
#[derive(Debug, Clone)]
pub struct Stitcher {
    ends: Ends,
    /// Held text, until decided.
    held: String,
    decided: bool,
}

impl Stitcher {
    /// A stitcher for a continuation of `partial`.
    pub fn new(partial: &str) -> Self {
        Self {
            ends: Ends::of(partial),
            held: String::new(),
            decided: partial.is_empty(),
        }
    }

    /// Feeds a text delta of the continuation; returns what may be shown
    /// now (possibly empty).
    pub fn push(&mut self, delta: &str) -> Result<String, StitchError> {
        if self.decided {
            return Ok(delta.to_owned());
        }
        self.held.push_str(delta);
        if self.held.len() < DECIDE_AFTER {
            return Ok(String::new());
        }
        self.decide()
    }

    /// The continuation ended: what is still held, stitched.
    pub fn finish(&mut self) -> Result<String, StitchError> {
        if self.decided {
            return Ok(String::new());
        }
        self.decide()
    }

    fn decide(&mut self) -> Result<String, StitchError> {
        self.decided = true;
        let held = std::mem::take(&mut self.held);
        let drop = self.ends.stitch(&held)?;
        Ok(held[drop..].to_owned())
    }
}

#[cfg(test)]
#[path = "continuation_tests.rs"]
mod tests;
