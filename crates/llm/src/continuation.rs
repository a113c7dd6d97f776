//! Continuing a reply that broke mid-text over the Anthropic Messages API
//! (`docs/wire-formats.md`, "Continuing a broken reply"), for [`HttpSource`](crate::HttpSource).
//!
//! Two ways, and current models take only the second:
//! - **prefill**: the partial text, trailing whitespace stripped (the API
//!   refuses it), as the final assistant message; the model continues it
//!   exactly. What the continuation starts with of the stripped whitespace
//!   is dropped, since the consumer has it already.
//! - **continuation turn** (Claude 4.6 and later answer a prefill with 400
//!   `This model does not support assistant message prefill…`): the partial
//!   text as an assistant message, then [`CONTINUE_ASK`]; what the model
//!   repeats is trimmed by [`Stitcher`], and a reply that starts over
//!   fails the attempt with [`StreamError::ContinuationFailed`] (the turn
//!   then restarts from scratch).
//!
//! Which way a model takes is learned from the API's answer and remembered
//! per model for the source's life: a model is tried with prefill first,
//! and a refusal costs exactly one extra request, once.

use std::collections::HashSet;

use parking_lot::Mutex;

use futures_util::StreamExt as _;
use warden_core::continuation::Stitcher;
use warden_core::{AgentEvent, EventStream, Frame, StreamError};

/// The user message of a continuation turn.
pub const CONTINUE_ASK: &str = "Your previous reply was cut off mid-way by a network error. \
Continue it exactly where it stopped: begin by repeating the last few words you wrote, \
then go on. Do not add any preface or comment.";

/// How a continuation is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// The partial text as the final assistant message.
    Prefill,
    /// The partial text, then [`CONTINUE_ASK`].
    Turn,
}

/// Models known to refuse prefill.
#[derive(Debug, Default)]
pub(crate) struct Modes {
    refuse_prefill: Mutex<HashSet<String>>,
}

impl Modes {
    /// How to ask `model` (prefill until it refused).
    pub(crate) fn mode_for(&self, model: &str) -> Mode {
        let refused = self.refuse_prefill.lock().contains(model);
        if refused { Mode::Turn } else { Mode::Prefill }
    }

    /// Remembers that `model` refuses prefill.
    pub(crate) fn refuses_prefill(&self, model: &str) {
        self.refuse_prefill.lock().insert(model.to_owned());
    }
}

/// Whether `error` is the API refusing prefill for the model.
pub(crate) fn is_prefill_refusal(error: &StreamError) -> bool {
    matches!(
        error,
        StreamError::Api { status: Some(400), message, .. }
            if message.contains("does not support assistant message prefill")
    )
}

/// The assistant message of a continuation: the partial text without its
/// trailing whitespace (refused by the API in a final assistant message).
pub(crate) fn assistant_text(partial: &str) -> &str {
    partial.trim_end()
}

/// `stream`, made to yield only what follows `partial`.
pub(crate) fn adapt(stream: EventStream, mode: Mode, partial: &str) -> EventStream {
    match mode {
        Mode::Prefill => {
            let stripped = partial[partial.trim_end().len()..].to_owned();
            if stripped.is_empty() {
                stream
            } else {
                Box::pin(rejoin_whitespace(stream, stripped))
            }
        }
        Mode::Turn => Box::pin(stitched(stream, Stitcher::new(partial))),
    }
}

/// Drops from the start of the continuation what it repeats of the
/// whitespace the prefill left out (the consumer has it).
fn rejoin_whitespace(
    stream: EventStream,
    stripped: String,
) -> impl futures_util::Stream<Item = Result<Frame, StreamError>> {
    futures_util::stream::unfold(
        (stream, Some(stripped)),
        |(mut stream, mut pending)| async move {
            let item = stream.next().await?;
            let item = match (item, pending.as_deref()) {
                (Ok(Frame::Event(AgentEvent::TextDelta(text))), Some(ws)) if !text.is_empty() => {
                    let common: usize = ws
                        .chars()
                        .zip(text.chars())
                        .take_while(|(a, b)| a == b)
                        .map(|(a, _)| a.len_utf8())
                        .sum();
                    pending = None;
                    Ok(Frame::Event(AgentEvent::TextDelta(
                        text[common..].to_owned(),
                    )))
                }
                (item, _) => item,
            };
            Some((item, (stream, pending)))
        },
    )
}

/// Text deltas through `stitcher`; what it holds is let out before the
/// turn's end.
fn stitched(
    stream: EventStream,
    stitcher: Stitcher,
) -> impl futures_util::Stream<Item = Result<Frame, StreamError>> {
    let failed = |e: warden_core::continuation::StitchError| StreamError::ContinuationFailed {
        message: e.to_string(),
    };
    futures_util::stream::unfold(
        (stream, stitcher, Vec::<Result<Frame, StreamError>>::new()),
        move |(mut stream, mut stitcher, mut queued)| async move {
            loop {
                if let Some(item) = queued.pop() {
                    return Some((item, (stream, stitcher, queued)));
                }
                let item = stream.next().await?;
                match item {
                    Ok(Frame::Event(AgentEvent::TextDelta(text))) => match stitcher.push(&text) {
                        Ok(out) if out.is_empty() => continue,
                        Ok(out) => {
                            return Some((
                                Ok(Frame::Event(AgentEvent::TextDelta(out))),
                                (stream, stitcher, queued),
                            ));
                        }
                        Err(e) => return Some((Err(failed(e)), (stream, stitcher, queued))),
                    },
                    // The held text goes out before whatever ends the reply.
                    Ok(Frame::Event(
                        ref end @ (AgentEvent::Stop { .. } | AgentEvent::TurnComplete { .. }),
                    )) => {
                        let end = Ok(Frame::Event(end.clone()));
                        match stitcher.finish() {
                            Ok(out) if out.is_empty() => {
                                return Some((end, (stream, stitcher, queued)));
                            }
                            Ok(out) => {
                                queued.push(end);
                                return Some((
                                    Ok(Frame::Event(AgentEvent::TextDelta(out))),
                                    (stream, stitcher, queued),
                                ));
                            }
                            Err(e) => return Some((Err(failed(e)), (stream, stitcher, queued))),
                        }
                    }
                    other => return Some((other, (stream, stitcher, queued))),
                }
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use futures_util::stream;

    use super::*;

    fn text(t: &str) -> Result<Frame, StreamError> {
        Ok(Frame::Event(AgentEvent::TextDelta(t.into())))
    }

    fn complete() -> Result<Frame, StreamError> {
        Ok(Frame::Event(AgentEvent::TurnComplete {
            context_window: None,
            duration: None,
        }))
    }

    async fn texts(s: EventStream) -> (String, Vec<Result<Frame, StreamError>>) {
        let items: Vec<_> = s.collect().await;
        let joined = items
            .iter()
            .filter_map(|i| match i {
                Ok(Frame::Event(AgentEvent::TextDelta(t))) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        (joined, items)
    }

    #[tokio::test]
    async fn a_prefill_continuation_does_not_double_the_stripped_space() {
        let s: EventStream = Box::pin(stream::iter([text(" world"), text("!"), complete()]));
        let (joined, _) = texts(adapt(s, Mode::Prefill, "Hello, ")).await;
        assert_eq!(format!("Hello, {joined}"), "Hello, world!");
    }

    #[tokio::test]
    async fn a_continuation_turn_is_stitched_and_ends_after_its_text() {
        let s: EventStream = Box::pin(stream::iter([
            text("quick bro"),
            text("wn fox jumps."),
            complete(),
        ]));
        let (joined, items) = texts(adapt(s, Mode::Turn, "The quick brown fo")).await;
        assert_eq!(
            format!("The quick brown fo{joined}"),
            "The quick brown fox jumps."
        );
        assert_eq!(items.last(), Some(&complete()), "the end comes last");
    }

    #[tokio::test]
    async fn a_continuation_turn_that_starts_over_fails_the_attempt() {
        let partial = "Once upon a time, in a land far far away, there lived a dragon";
        let s: EventStream = Box::pin(stream::iter([text(partial), complete()]));
        let (_, items) = texts(adapt(s, Mode::Turn, &format!("{partial} who"))).await;
        assert!(
            items
                .iter()
                .any(|i| matches!(i, Err(StreamError::ContinuationFailed { .. }))),
            "{items:?}"
        );
    }

    #[test]
    fn only_the_prefill_refusal_switches_the_mode() {
        let refusal = StreamError::Api {
            status: Some(400),
            kind: "invalid_request_error".into(),
            message: "This model does not support assistant message prefill. The conversation must end with a user message.".into(),
            retryable: false,
            retry_after: None,
        };
        assert!(is_prefill_refusal(&refusal));
        let other = StreamError::Api {
            status: Some(400),
            kind: "invalid_request_error".into(),
            message: "prompt is too long".into(),
            retryable: false,
            retry_after: None,
        };
        assert!(!is_prefill_refusal(&other));
        let modes = Modes::default();
        assert_eq!(modes.mode_for("m"), Mode::Prefill);
        modes.refuses_prefill("m");
        assert_eq!(modes.mode_for("m"), Mode::Turn);
        assert_eq!(modes.mode_for("other"), Mode::Prefill);
    }
}
