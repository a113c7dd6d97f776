//! `GET /v1/turns/{id}/trace`: a turn's trace as the server read it from
//! Jaeger's query API (`--jaeger-url`), so the console draws it without
//! Jaeger's UI and without the browser reaching Jaeger. The spans are
//! Jaeger's own JSON (`/api/traces/{id}`'s `data[].spans`), field for
//! field, less what the console does not read (`processID`, `flags`,
//! `warnings`): what a Jaeger user sees is what the console draws.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A turn's trace: its spans and the spans its links point to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct TurnTrace {
    /// The turn.
    pub id: String,
    /// Its session.
    pub key: String,
    /// The trace it ran in (the turn's `trace_id`), rooted at its
    /// `turn_started` span.
    pub trace_id: String,
    /// The trace's spans, as Jaeger returns them, and those of the trace
    /// it ran in before when it started again in a fresh session (its
    /// `trace_ids`): each span names its trace.
    pub spans: Vec<TraceSpan>,
    /// The spans in other traces that the trace's spans link to
    /// (`FOLLOWS_FROM` references: its incarnation's `session_spawned`
    /// anchor, the turn before it), those Jaeger has.
    pub linked: Vec<TraceSpan>,
}

/// One span, in Jaeger's JSON (its query API's field names).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct TraceSpan {
    /// Its trace (hex).
    #[serde(rename = "traceID")]
    pub trace_id: String,
    /// The span (hex).
    #[serde(rename = "spanID")]
    pub span_id: String,
    /// Its name: a transition's (`turn_started`, `attempt_started`,
    /// `watchdog_killed`, …).
    #[serde(rename = "operationName")]
    pub operation_name: String,
    /// Its parent (`CHILD_OF`) and links (`FOLLOWS_FROM`).
    #[serde(default)]
    pub references: Vec<SpanReference>,
    /// When it started, microseconds since the Unix epoch.
    #[serde(rename = "startTime")]
    pub start_time: u64,
    /// How long it lasted, in microseconds.
    pub duration: u64,
    /// Its attributes (`warden.silent_ms`, `error.type`, `error`, …).
    #[serde(default)]
    pub tags: Vec<TraceTag>,
    /// Its span events: each transition's log, with its time.
    #[serde(default)]
    pub logs: Vec<SpanLog>,
}

/// A reference from a span to another.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct SpanReference {
    /// `CHILD_OF` (its parent) or `FOLLOWS_FROM` (a link).
    #[serde(rename = "refType")]
    pub ref_type: String,
    /// The trace referred to.
    #[serde(rename = "traceID")]
    pub trace_id: String,
    /// The span referred to.
    #[serde(rename = "spanID")]
    pub span_id: String,
}

/// An attribute or log field: `{key, type, value}` (`type`: `string`,
/// `int64`, `float64`, `bool`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct TraceTag {
    /// Its name.
    pub key: String,
    /// Its value's type, as Jaeger names it.
    #[serde(rename = "type", default)]
    pub kind: String,
    /// Its value (a number for `int64` and `float64`, a boolean for
    /// `bool`).
    pub value: serde_json::Value,
}

/// A span event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct SpanLog {
    /// When, microseconds since the Unix epoch.
    pub timestamp: u64,
    /// Its fields (`event`, `level`, …).
    #[serde(default)]
    pub fields: Vec<TraceTag>,
}
