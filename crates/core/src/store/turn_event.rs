//! What a turn's events carry: one type per event (the SSE `data:` of
//! `warden serve`'s turn streams, and what a [`TurnStore`](super::TurnStore)
//! keeps), and the time each was made.
//!
//! These types are the contract: `warden serve` sends them, its OpenAPI
//! document is derived from them (each derives [`JsonSchema`]), and the
//! clients are generated from that document. On the wire an event's `data`
//! is its type's fields plus `at` ([`Timed`]).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::TurnEventKind;

/// When an event was made, by the server's clock, to the millisecond. On
/// the wire an RFC 3339 UTC time with milliseconds
/// (`2026-12-05T18:42:48.123Z`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventTime(u64);

impl EventTime {
    /// This clock's time now, to the millisecond.
    pub fn now() -> Self {
        Self::from(SystemTime::now())
    }

    /// `ms` milliseconds after the Unix epoch.
    pub fn from_unix_ms(ms: u64) -> Self {
        Self(ms)
    }

    /// Milliseconds after the Unix epoch.
    pub fn unix_ms(self) -> u64 {
        self.0
    }
}

impl From<SystemTime> for EventTime {
    fn from(t: SystemTime) -> Self {
        let ms = t
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        Self(ms)
    }
}

impl From<EventTime> for SystemTime {
    fn from(t: EventTime) -> Self {
        UNIX_EPOCH + Duration::from_millis(t.0)
    }
}

impl std::fmt::Display for EventTime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        humantime::format_rfc3339_millis(SystemTime::from(*self)).fmt(f)
    }
}

impl Serialize for EventTime {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for EventTime {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_rfc3339(&text)
            .map(Self::from)
            .map_err(|e| serde::de::Error::custom(format!("not an RFC 3339 time {text:?}: {e}")))
    }
}

impl JsonSchema for EventTime {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "EventTime".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "format": "date-time",
            "description": "When the event was made, by the server's clock: RFC 3339, UTC, milliseconds",
        })
    }
}

/// An event's fields with the time it was made: what `data:` carries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "{T}Event")]
pub struct Timed<T> {
    /// The event's own fields.
    #[serde(flatten)]
    pub event: T,
    /// When the server made it. Absent only on events stored by a warden
    /// older than this field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<EventTime>,
}

/// `queued`: the message waits (behind other turns of its session, or for
/// a stream slot).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct Queued {
    /// The attempt that waits.
    pub attempt: u64,
    /// How many turns of its session are ahead of it (when it waits behind
    /// them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub behind: Option<u64>,
}

/// `started`: an attempt began streaming.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct Started {
    /// The attempt, from 1.
    pub attempt: u64,
}

/// `text` or `thinking`: a piece of the reply (or of its thinking).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct Delta {
    /// The text, appended to what came before (since the last `retrying`
    /// or `restarting`, which discard it).
    pub text: String,
}

/// Whether a tool call began or ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ToolState {
    /// The agent called it.
    Started,
    /// It returned.
    Finished,
}

/// `tool`: a tool call began or finished.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct Tool {
    /// The call's id (the same in its `started` and `finished`).
    pub id: String,
    /// The tool (on `started`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Began or finished.
    pub state: ToolState,
}

/// `retrying` (the reply so far is dropped, `discard` true) or `continuing`
/// (kept and continued, `discard` false): an attempt failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct AttemptFailed {
    /// The attempt that failed.
    pub failed_attempt: u64,
    /// The pause before the next attempt, in milliseconds.
    pub delay_ms: u64,
    /// Why it failed (an error code: `ESTREAM_TIMEOUT`, `ENODE_LOST`, …).
    pub code: String,
    /// Whether the text shown since the last `started` is to be dropped.
    pub discard: bool,
    /// `ENODE_LOST`: the cluster node that ran it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// `restarting`: the conversation could not be resumed; the message moves
/// to a fresh session (the text so far is dropped).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct Restarting {
    /// Why the resume failed (`context_overflow`, `conversation_not_found`, …).
    pub cause: String,
    /// A sentence for the user.
    pub notice: String,
    /// Always true: drop the text shown so far.
    pub discard: bool,
}

/// How full the context window is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct ContextFill {
    /// Tokens in context.
    pub tokens: u64,
    /// The model's context window, in tokens.
    pub window: u64,
    /// `tokens` in percent of `window`, rounded (over 100 past the window).
    pub percent: u64,
}

/// `done`: the turn ended with its answer. Last.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct Done {
    /// The turn's number in its session (its message's id).
    pub turn: u64,
    /// The whole answer.
    pub text: String,
    /// Attempts used, the first included.
    pub attempts: u64,
    /// How many of them continued a broken reply.
    pub continuations: u64,
    /// The context in use after it, once any usage is known.
    pub context: Option<ContextFill>,
    /// Output tokens of its last request, when reported.
    pub output_tokens: Option<u64>,
}

/// `error`: the turn failed. Last.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct Failed {
    /// The error code (`ESTREAM_TIMEOUT`, `ECANCELLED`, `ESESSION_STOPPED`, …).
    pub code: String,
    /// What happened, for a human.
    pub message: String,
    /// The exit-code class `warden chat` uses: 3 API, 4 timeout, 5
    /// unavailable, 6 deferred (the message stays pending and is answered
    /// later: do not re-send it), 130 cancelled, 1 other.
    pub exit: i32,
}

/// One event of a turn: its type and its fields.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TurnEventData {
    /// See [`Queued`].
    Queued(Queued),
    /// See [`Started`].
    Started(Started),
    /// Reply text.
    Text(Delta),
    /// Thinking text.
    Thinking(Delta),
    /// See [`Tool`].
    Tool(Tool),
    /// An attempt failed; the next starts over.
    Retrying(AttemptFailed),
    /// An attempt broke; the next continues its text.
    Continuing(AttemptFailed),
    /// See [`Restarting`].
    Restarting(Restarting),
    /// See [`Done`].
    Done(Done),
    /// See [`Failed`].
    Error(Failed),
}

/// Calls `$body` with the payload of `$data` bound to `$p`, whatever its
/// type.
macro_rules! with_payload {
    ($data:expr, $p:ident => $body:expr) => {
        match $data {
            TurnEventData::Queued($p) => $body,
            TurnEventData::Started($p) => $body,
            TurnEventData::Text($p) | TurnEventData::Thinking($p) => $body,
            TurnEventData::Tool($p) => $body,
            TurnEventData::Retrying($p) | TurnEventData::Continuing($p) => $body,
            TurnEventData::Restarting($p) => $body,
            TurnEventData::Done($p) => $body,
            TurnEventData::Error($p) => $body,
        }
    };
}

impl TurnEventData {
    /// Its type (the SSE `event:`).
    pub fn kind(&self) -> TurnEventKind {
        match self {
            Self::Queued(_) => TurnEventKind::Queued,
            Self::Started(_) => TurnEventKind::Started,
            Self::Text(_) => TurnEventKind::Text,
            Self::Thinking(_) => TurnEventKind::Thinking,
            Self::Tool(_) => TurnEventKind::Tool,
            Self::Retrying(_) => TurnEventKind::Retrying,
            Self::Continuing(_) => TurnEventKind::Continuing,
            Self::Restarting(_) => TurnEventKind::Restarting,
            Self::Done(_) => TurnEventKind::Done,
            Self::Error(_) => TurnEventKind::Error,
        }
    }

    /// Numbers its attempts on from `prior` (attempts an earlier node made
    /// of a re-delivered turn): `attempt`, `failed_attempt`, `attempts`.
    pub fn number_on(&mut self, prior: u64) {
        match self {
            Self::Queued(q) => q.attempt += prior,
            Self::Started(s) => s.attempt += prior,
            Self::Retrying(f) | Self::Continuing(f) => f.failed_attempt += prior,
            Self::Done(d) => d.attempts += prior,
            _ => {}
        }
    }

    /// The SSE `data:` of this event made at `at`: its fields and `at`, as
    /// JSON.
    pub fn to_wire(&self, at: Option<EventTime>) -> String {
        with_payload!(self, p => serde_json::to_string(&Timed { event: p, at }))
            .unwrap_or_else(|_| "{}".to_owned())
    }

    /// The same as a JSON value (what the stores keep).
    pub fn to_value(&self, at: Option<EventTime>) -> Value {
        with_payload!(self, p => serde_json::to_value(Timed { event: p, at }))
            .unwrap_or(Value::Null)
    }

    /// An event of type `kind` read back from its `data` (as
    /// [`to_value`](Self::to_value) wrote it, or as an older warden did),
    /// with its time when it has one. Fields it does not know are ignored.
    pub fn from_value(
        kind: TurnEventKind,
        data: Value,
    ) -> Result<(Self, Option<EventTime>), serde_json::Error> {
        fn read<T: serde::de::DeserializeOwned>(
            data: Value,
            make: fn(T) -> TurnEventData,
        ) -> Result<(TurnEventData, Option<EventTime>), serde_json::Error> {
            let Timed { event, at } = serde_json::from_value::<Timed<T>>(data)?;
            Ok((make(event), at))
        }
        match kind {
            TurnEventKind::Queued => read(data, Self::Queued),
            TurnEventKind::Started => read(data, Self::Started),
            TurnEventKind::Text => read(data, Self::Text),
            TurnEventKind::Thinking => read(data, Self::Thinking),
            TurnEventKind::Tool => read(data, Self::Tool),
            TurnEventKind::Retrying => read(data, Self::Retrying),
            TurnEventKind::Continuing => read(data, Self::Continuing),
            TurnEventKind::Restarting => read(data, Self::Restarting),
            TurnEventKind::Done => read(data, Self::Done),
            TurnEventKind::Error => read(data, Self::Error),
        }
    }

    /// The schema of each type's `data:` (with `at`), by type, for an API
    /// document: `(kind, schema)`, the schemas' definitions added to
    /// `generator`.
    pub fn schemas(
        generator: &mut schemars::SchemaGenerator,
    ) -> Vec<(TurnEventKind, schemars::Schema)> {
        use TurnEventKind as K;
        TurnEventKind::ALL
            .into_iter()
            .map(|kind| {
                let schema = match kind {
                    K::Queued => generator.subschema_for::<Timed<Queued>>(),
                    K::Started => generator.subschema_for::<Timed<Started>>(),
                    K::Text | K::Thinking => generator.subschema_for::<Timed<Delta>>(),
                    K::Tool => generator.subschema_for::<Timed<Tool>>(),
                    K::Retrying | K::Continuing => {
                        generator.subschema_for::<Timed<AttemptFailed>>()
                    }
                    K::Restarting => generator.subschema_for::<Timed<Restarting>>(),
                    K::Done => generator.subschema_for::<Timed<Done>>(),
                    K::Error => generator.subschema_for::<Timed<Failed>>(),
                };
                (kind, schema)
            })
            .collect()
    }
}

impl Queued {
    /// Attempt `attempt` waits, `behind` turns ahead of it when known.
    pub fn new(attempt: u64, behind: Option<u64>) -> Self {
        Self { attempt, behind }
    }
}

impl Started {
    /// Attempt `attempt` began.
    pub fn new(attempt: u64) -> Self {
        Self { attempt }
    }
}

impl Delta {
    /// A piece of text.
    pub fn new(text: impl Into<String>) -> Self {
        Self { text: text.into() }
    }
}

impl Tool {
    /// Call `id` of tool `name` (given on `started`) is in `state`.
    pub fn new(id: impl Into<String>, name: Option<String>, state: ToolState) -> Self {
        Self {
            id: id.into(),
            name,
            state,
        }
    }
}

impl AttemptFailed {
    /// Attempt `failed_attempt` failed with `code`; the next comes after
    /// `delay_ms`; `discard` the text so far or not.
    pub fn new(failed_attempt: u64, delay_ms: u64, code: impl Into<String>, discard: bool) -> Self {
        Self {
            failed_attempt,
            delay_ms,
            code: code.into(),
            discard,
            node: None,
        }
    }

    /// The same, naming the cluster node that ran the attempt.
    pub fn on_node(mut self, node: impl Into<String>) -> Self {
        self.node = Some(node.into());
        self
    }
}

impl Restarting {
    /// The resume failed because of `cause`.
    pub fn new(cause: impl Into<String>) -> Self {
        Self {
            cause: cause.into(),
            notice: "the conversation could not be resumed; the message moves to a fresh session"
                .to_owned(),
            discard: true,
        }
    }
}

impl ContextFill {
    /// `tokens` of a `window`, `percent` full.
    pub fn new(tokens: u64, window: u64, percent: u64) -> Self {
        Self {
            tokens,
            window,
            percent,
        }
    }
}

impl Done {
    /// Turn `turn` answered `text` after `attempts` attempts
    /// (`continuations` of them continuing).
    pub fn new(turn: u64, text: impl Into<String>, attempts: u64, continuations: u64) -> Self {
        Self {
            turn,
            text: text.into(),
            attempts,
            continuations,
            context: None,
            output_tokens: None,
        }
    }

    /// The same with the context after it and its output tokens.
    pub fn with_usage(mut self, context: Option<ContextFill>, output_tokens: Option<u64>) -> Self {
        self.context = context;
        self.output_tokens = output_tokens;
        self
    }
}

impl Failed {
    /// Failed with `code`, `message`, exit class `exit`.
    pub fn new(code: impl Into<String>, message: impl Into<String>, exit: i32) -> Self {
        Self {
            code: code.into(),
            message: message.into(),
            exit,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn an_event_goes_out_with_its_time_and_reads_back_the_same() {
        let at = EventTime::from_unix_ms(1_796_496_168_123);
        let event = TurnEventData::Retrying(AttemptFailed::new(2, 1500, "ESTREAM_TIMEOUT", true));
        let wire: Value = serde_json::from_str(&event.to_wire(Some(at))).expect("JSON");
        assert_eq!(
            wire,
            json!({"failed_attempt": 2, "delay_ms": 1500, "code": "ESTREAM_TIMEOUT", "discard": true,
                   "at": "2026-12-05T18:42:48.123Z"})
        );
        let back = TurnEventData::from_value(TurnEventKind::Retrying, wire).expect("reads");
        assert_eq!(back, (event, Some(at)));
    }

    #[test]
    fn an_event_stored_before_times_were_kept_reads_without_one() {
        let old = json!({"id": "t1", "state": "finished"});
        let (event, at) = TurnEventData::from_value(TurnEventKind::Tool, old).expect("reads");
        assert_eq!(
            event,
            TurnEventData::Tool(Tool::new("t1", None, ToolState::Finished))
        );
        assert_eq!(at, None);
        let wrong = TurnEventData::from_value(TurnEventKind::Done, json!({"text": "x"}));
        assert!(wrong.is_err(), "a done without its fields is refused");
    }

    #[test]
    fn every_kind_reads_back_as_itself() {
        let samples = [
            TurnEventData::Queued(Queued::new(1, Some(2))),
            TurnEventData::Started(Started::new(1)),
            TurnEventData::Text(Delta::new("a")),
            TurnEventData::Thinking(Delta::new("b")),
            TurnEventData::Tool(Tool::new("t", Some("Read".into()), ToolState::Started)),
            TurnEventData::Retrying(AttemptFailed::new(1, 0, "ENODE_LOST", true).on_node("n")),
            TurnEventData::Continuing(AttemptFailed::new(1, 10, "ESTREAM_TIMEOUT", false)),
            TurnEventData::Restarting(Restarting::new("context_overflow")),
            TurnEventData::Done(
                Done::new(3, "hi", 2, 1).with_usage(Some(ContextFill::new(5, 10, 50)), Some(7)),
            ),
            TurnEventData::Error(Failed::new("ECANCELLED", "cancelled", 130)),
        ];
        let kinds: Vec<_> = samples.iter().map(TurnEventData::kind).collect();
        assert_eq!(kinds, TurnEventKind::ALL);
        for event in samples {
            let value = event.to_value(None);
            let back = TurnEventData::from_value(event.kind(), value).expect("reads");
            assert_eq!(back, (event, None));
        }
    }

    #[test]
    fn a_redelivered_turn_numbers_its_attempts_on() {
        let mut done = TurnEventData::Done(Done::new(1, "x", 1, 0));
        done.number_on(2);
        assert!(matches!(
            done,
            TurnEventData::Done(Done { attempts: 3, .. })
        ));
        let mut failed = TurnEventData::Retrying(AttemptFailed::new(1, 0, "E", true));
        failed.number_on(2);
        assert!(matches!(
            failed,
            TurnEventData::Retrying(AttemptFailed {
                failed_attempt: 3,
                ..
            })
        ));
    }
}
