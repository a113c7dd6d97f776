//! A turn as its reader shows it: [`TurnHandle`] as a
//! [`Stream`](futures_util::Stream) of [`TurnEvent`]s, and [`TurnText`],
//! the one place the keep/discard rules of a turn's text live: a
//! continuation keeps what was shown, a retry from scratch or a fresh
//! start after a resume failure drops it.

use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::stream::BoxStream;
use futures_util::{Stream, StreamExt as _};

use crate::error::TurnError;
use crate::event::AgentEvent;

use super::handle::{TurnEvent, TurnHandle, TurnSummary};

impl Stream for TurnHandle {
    type Item = TurnEvent;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<TurnEvent>> {
        self.get_mut().poll_event(cx)
    }
}

impl TurnEvent {
    /// Whether the text shown so far must go: `true` for
    /// [`Retrying`](Self::Retrying) (the turn starts over from scratch) and
    /// [`Restarting`](Self::Restarting) (a fresh session answers it);
    /// `false` for everything else — [`Continuing`](Self::Continuing) keeps
    /// it. The one rule behind [`TurnText`] and `warden serve`'s `discard`.
    pub fn discards_shown_text(&self) -> bool {
        matches!(self, Self::Retrying { .. } | Self::Restarting { .. })
    }
}

impl TurnHandle {
    /// The turn as edits of its reply text: [`TextEdit::Append`] for each
    /// piece, [`TextEdit::Discard`] when what was shown must go (a retry
    /// from scratch, a fresh start), then one [`TextEdit::Finished`].
    /// Applied in order to an empty string they leave the answer's text.
    pub fn text_stream(self) -> BoxStream<'static, TextEdit> {
        let mut text = TurnText::new();
        self.filter_map(move |event| std::future::ready(text.apply(event)))
            .boxed()
    }
}

/// An edit of the reply text shown so far.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum TextEdit {
    /// Show this text after what is shown.
    Append(String),
    /// Remove the last `chars` characters shown (Unicode scalar values):
    /// the turn starts its reply over.
    Discard {
        /// How many.
        chars: usize,
    },
    /// The turn is over; on success the text shown is its answer's text.
    Finished(Result<TurnSummary, TurnError>),
}

/// The reply text of a turn as it should be shown, from its events: feed it
/// every [`TurnEvent`] in order with [`apply`](Self::apply).
#[derive(Debug, Clone, Default)]
pub struct TurnText {
    text: String,
}

impl TurnText {
    /// Nothing shown yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The text to show now.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Takes `event` in; the edit it makes to the text shown, if any.
    pub fn apply(&mut self, event: TurnEvent) -> Option<TextEdit> {
        if event.discards_shown_text() {
            // The turn starts over (from scratch, or in a fresh session).
            let chars = self.text.chars().count();
            self.text.clear();
            return (chars > 0).then_some(TextEdit::Discard { chars });
        }
        match event {
            TurnEvent::Event(AgentEvent::TextDelta(piece)) if !piece.is_empty() => {
                self.text.push_str(&piece);
                Some(TextEdit::Append(piece))
            }
            TurnEvent::Finished(result) => Some(TextEdit::Finished(result)),
            // A continuation keeps what was shown; nothing else is text.
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::error::StreamError;
    use crate::source::AttemptId;

    fn text(t: &str) -> TurnEvent {
        TurnEvent::Event(AgentEvent::TextDelta(t.into()))
    }

    fn broke(attempt: u32) -> StreamError {
        let _ = attempt;
        StreamError::InactivityTimeout {
            silent_for: Duration::from_secs(45),
            timeout: Duration::from_secs(45),
        }
    }

    fn apply_all(events: Vec<TurnEvent>) -> (Vec<TextEdit>, String) {
        let mut view = TurnText::new();
        let mut shown = String::new();
        let mut edits = Vec::new();
        for e in events {
            if let Some(edit) = view.apply(e) {
                match &edit {
                    TextEdit::Append(t) => shown.push_str(t),
                    TextEdit::Discard { chars } => {
                        let keep = shown.chars().count() - chars;
                        shown = shown.chars().take(keep).collect();
                    }
                    _ => {}
                }
                edits.push(edit);
            }
        }
        assert_eq!(shown, view.text(), "the edits rebuild the view's text");
        (edits, shown)
    }

    #[test]
    fn a_continuation_keeps_what_was_shown() {
        let a1 = AttemptId {
            turn: 1,
            attempt: 1,
        };
        let (edits, shown) = apply_all(vec![
            TurnEvent::Started(a1),
            text("Hello, "),
            TurnEvent::Continuing {
                failed: a1,
                delay: Duration::ZERO,
                error: broke(1),
            },
            TurnEvent::Started(AttemptId {
                turn: 1,
                attempt: 2,
            }),
            text("world"),
        ]);
        assert_eq!(shown, "Hello, world");
        assert!(!edits.iter().any(|e| matches!(e, TextEdit::Discard { .. })));
    }

    #[test]
    fn a_retry_or_a_fresh_start_drops_it_by_its_characters() {
        let a1 = AttemptId {
            turn: 1,
            attempt: 1,
        };
        let (edits, shown) = apply_all(vec![
            text("naïve "),
            TurnEvent::Continuing {
                failed: a1,
                delay: Duration::ZERO,
                error: broke(1),
            },
            text("café"),
            TurnEvent::Retrying {
                failed: AttemptId {
                    turn: 1,
                    attempt: 2,
                },
                delay: Duration::ZERO,
                error: broke(2),
            },
            text("over "),
            TurnEvent::Restarting {
                cause: crate::ResumeCause::UnknownSession,
            },
            text("fresh"),
        ]);
        assert_eq!(shown, "fresh");
        assert_eq!(
            edits
                .iter()
                .filter_map(|e| match e {
                    TextEdit::Discard { chars } => Some(*chars),
                    _ => None,
                })
                .collect::<Vec<_>>(),
            [10, 5],
            "characters, not bytes"
        );
    }

    #[test]
    fn nothing_shown_is_nothing_to_discard() {
        let (edits, _) = apply_all(vec![TurnEvent::Retrying {
            failed: AttemptId {
                turn: 1,
                attempt: 1,
            },
            delay: Duration::ZERO,
            error: broke(1),
        }]);
        assert!(edits.is_empty(), "{edits:?}");
    }
}
