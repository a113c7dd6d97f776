//! OpenAI Responses streams: passed on event by event. A broken one is
//! retried while the client has nothing of it; after that it ends with
//! the API's `error` event (a reply can be re-attached only when it was
//! started with `"background": true`, which the client chose, not the
//! proxy).

use serde_json::{Value, json};
use warden_core::StreamError;
use warden_llm::sse::SseEvent;

use super::{Resume, Splice};

#[derive(Debug, Default)]
pub(crate) struct Responses {
    last_sequence: Option<u64>,
    /// The last event was content (see [`Splice::was_content`]).
    content: bool,
    done: bool,
}

impl Splice for Responses {
    fn event(&mut self, event: &SseEvent, out: &mut String) -> Result<(), StreamError> {
        self.content = false;
        let data: Value =
            serde_json::from_str(&event.data).map_err(|e| StreamError::Malformed {
                message: format!("an event whose data is not JSON ({e})"),
            })?;
        if let Some(n) = data.get("sequence_number").and_then(Value::as_u64) {
            self.last_sequence = Some(n);
        }
        let kind = data
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or(&event.event);
        // The reply's start and its failures are not content; its output
        // items, deltas and its end are.
        self.content = kind.starts_with("response.")
            && !matches!(
                kind,
                "response.created" | "response.in_progress" | "response.queued" | "response.failed"
            );
        if matches!(
            kind,
            "response.completed" | "response.failed" | "response.incomplete" | "error"
        ) {
            self.done = true;
        }
        out.push_str("event: ");
        out.push_str(&event.event);
        out.push_str("\ndata: ");
        out.push_str(&event.data);
        out.push_str("\n\n");
        Ok(())
    }

    fn was_content(&self) -> bool {
        self.content
    }

    fn done(&self) -> bool {
        self.done
    }

    fn resume(&mut self, _original: &Value) -> Resume {
        if self.last_sequence.is_none() {
            Resume::Again
        } else {
            Resume::GiveUp
        }
    }

    fn error_event(&self, message: &str) -> String {
        let data = json!({
            "type": "error",
            "code": "server_error",
            "message": message,
            "param": null,
            "sequence_number": self.last_sequence.map_or(0, |n| n + 1),
        });
        format!("event: error\ndata: {data}\n\n")
    }
}
