//! The kinds of a turn's events: their wire names (the SSE `event:` of
//! `GET /v1/turns/{id}/events`), in the order a turn may meet them.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

/// The type of a turn's event (the SSE `event:` name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum TurnEventKind {
    /// The message waits behind another turn of its session.
    Queued,
    /// An attempt began (`attempt`).
    Started,
    /// Reply text (`text`).
    Text,
    /// Thinking text (`text`).
    Thinking,
    /// A tool call began or finished (`id`, `name`, `state`).
    Tool,
    /// An attempt failed and the turn starts over (`discard` true).
    Retrying,
    /// An attempt broke and the next one continues its text.
    Continuing,
    /// The session restarts fresh; the turn is re-sent.
    Restarting,
    /// The turn ended with its answer. Last.
    Done,
    /// The turn failed. Last.
    Error,
}

impl TurnEventKind {
    /// Every kind, in the order a turn may meet them.
    pub const ALL: [TurnEventKind; 10] = [
        Self::Queued,
        Self::Started,
        Self::Text,
        Self::Thinking,
        Self::Tool,
        Self::Retrying,
        Self::Continuing,
        Self::Restarting,
        Self::Done,
        Self::Error,
    ];

    /// The wire name (`queued`, `started`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Started => "started",
            Self::Text => "text",
            Self::Thinking => "thinking",
            Self::Tool => "tool",
            Self::Retrying => "retrying",
            Self::Continuing => "continuing",
            Self::Restarting => "restarting",
            Self::Done => "done",
            Self::Error => "error",
        }
    }

    /// Whether an event of this kind ends its turn (`done`, `error`).
    pub fn is_last(self) -> bool {
        matches!(self, Self::Done | Self::Error)
    }
}

impl fmt::Display for TurnEventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is no [`TurnEventKind`] (a log written by a newer warden, or
/// a corrupt row).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown turn event type {0:?}")]
pub struct UnknownEventKind(pub String);

impl FromStr for TurnEventKind {
    type Err = UnknownEventKind;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| UnknownEventKind(s.to_owned()))
    }
}
