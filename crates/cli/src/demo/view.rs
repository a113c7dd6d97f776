//! How the demo shows what happens: a live table on a terminal, plain
//! lines otherwise, or one JSON object per transition.

use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use warden_core::{LifecycleEvent, Notice};

use super::agent::Liveness;

/// Output mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// A table refreshed in place, transitions scrolling above it.
    Live,
    /// One line per transition.
    Plain,
    /// One JSON object per transition.
    Json,
}

/// Something that happened, stamped on arrival.
#[derive(Debug, Clone)]
pub(super) enum Note {
    /// A lifecycle event of the actor tree.
    Life(LifecycleEvent),
    /// A notice for the user.
    Notice(Notice),
    /// The demo sent a message.
    Sent { turn: usize, of: usize },
}

/// One transition, as shown.
#[derive(Debug, Clone)]
pub(super) struct Transition {
    pub(super) at: Duration,
    pub(super) workspace: String,
    pub(super) kind: &'static str,
    pub(super) text: String,
    pub(super) fields: Value,
}

struct Row {
    name: String,
    state: String,
    attempt: u32,
    ctx: Option<u32>,
    last: String,
    streaming: bool,
    liveness: Arc<Liveness>,
}

/// The live table and the transition log.
pub(super) struct View {
    mode: Mode,
    rows: Vec<Row>,
    index: HashMap<String, usize>,
    timeout: Duration,
    started: Instant,
    drawn: usize,
    pending: Vec<String>,
    finished: bool,
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

impl View {
    /// A view of `workspaces` (name and liveness, in display order).
    pub(super) fn new(
        mode: Mode,
        workspaces: Vec<(String, Arc<Liveness>)>,
        timeout: Duration,
        started: Instant,
    ) -> Self {
        let index = workspaces
            .iter()
            .enumerate()
            .map(|(i, (name, _))| (name.clone(), i))
            .collect();
        let rows = workspaces
            .into_iter()
            .map(|(name, liveness)| Row {
                name,
                state: "waiting".into(),
                attempt: 0,
                ctx: None,
                last: String::new(),
                streaming: false,
                liveness,
            })
            .collect();
        Self {
            mode,
            rows,
            index,
            timeout,
            started,
            drawn: 0,
            pending: Vec::new(),
            finished: false,
        }
    }

    /// Applies `note` about `workspace` to the table and returns the
    /// transition it is.
    pub(super) fn apply(&mut self, at: Duration, workspace: &str, note: &Note) -> Transition {
        let (kind, text, fields, state) = describe(note);
        if let Some(&i) = self.index.get(workspace) {
            let row = &mut self.rows[i];
            match note {
                Note::Life(LifecycleEvent::AttemptStarted { attempt, .. }) => {
                    row.streaming = true;
                    row.attempt = attempt.attempt;
                }
                Note::Life(LifecycleEvent::ContextUsage { percent, .. }) => {
                    row.ctx = Some(*percent)
                }
                Note::Life(
                    LifecycleEvent::StreamTimedOut { .. }
                    | LifecycleEvent::RetryScheduled { .. }
                    | LifecycleEvent::ContinueScheduled { .. }
                    | LifecycleEvent::ResumeFailed { .. }
                    | LifecycleEvent::TurnFinished { .. }
                    | LifecycleEvent::SessionReaped { .. }
                    | LifecycleEvent::SessionStopped { .. },
                ) => row.streaming = false,
                _ => {}
            }
            if let Some(state) = state {
                row.state = state;
            }
            row.last = text.clone();
        }
        Transition {
            at,
            workspace: workspace.to_owned(),
            kind,
            text,
            fields,
        }
    }

    /// Shows `transition`.
    pub(super) fn show(&mut self, t: &Transition) {
        match self.mode {
            Mode::Json => {
                let mut object = json!({
                    "t": (secs(t.at) * 1000.0).round() / 1000.0,
                    "workspace": t.workspace,
                    "event": t.kind,
                    "text": t.text,
                });
                if let (Some(o), Some(extra)) = (object.as_object_mut(), t.fields.as_object()) {
                    o.extend(extra.clone());
                }
                println!("{object}");
            }
            Mode::Plain => println!("{:7.2}s  {:<11} {}", secs(t.at), t.workspace, t.text),
            Mode::Live => self.pending.push(format!(
                "{:7.2}s  {:<11} {}",
                secs(t.at),
                t.workspace,
                t.text
            )),
        }
    }

    /// A line of text outside the transition log (headers, summary).
    pub(super) fn say(&mut self, line: &str) {
        match self.mode {
            Mode::Live if !self.finished => {
                self.pending.push(line.to_owned());
                self.draw();
            }
            Mode::Live | Mode::Plain => println!("{line}"),
            Mode::Json => {}
        }
    }

    /// Redraws the table (live mode), with pending lines above it.
    pub(super) fn draw(&mut self) {
        if self.mode != Mode::Live || self.finished {
            return;
        }
        // Table lines longer than the terminal would wrap and break the
        // cursor arithmetic: cut them.
        let width = terminal_size::terminal_size()
            .map(|(w, _)| usize::from(w.0))
            .unwrap_or(80)
            .saturating_sub(1)
            .max(20);
        let mut out = String::new();
        if self.drawn > 0 {
            // Back to the table's first line, erase to the end of screen.
            out.push_str(&format!("\x1b[{}A\r\x1b[J", self.drawn));
        }
        for line in self.pending.drain(..) {
            out.push_str(&line);
            out.push('\n');
        }
        let now = self.started.elapsed();
        let mut lines = vec![format!(
            "  {:<11} {:<15} {:>7} {:>4}  {:<14} {:>8}  {}",
            "WORKSPACE", "STATE", "ATTEMPT", "CTX", "PHASE", "WATCHDOG", "LAST EVENT"
        )];
        for row in &self.rows {
            // The phase the stream is in, and (WATCHDOG) what is left of
            // that phase's silence allowance.
            let phase = if row.streaming {
                row.liveness.phase().as_str()
            } else {
                "-"
            };
            let countdown = if row.streaming {
                let last =
                    Duration::from_millis(row.liveness.last_frame_ms.load(Ordering::Relaxed));
                let left = self.timeout.saturating_sub(now.saturating_sub(last));
                format!("{:.1}s", secs(left))
            } else {
                "-".into()
            };
            let mut last: String = row.last.chars().take(48).collect();
            if row.last.chars().count() > 48 {
                last.push('…');
            }
            lines.push(format!(
                "  {:<11} {:<15} {:>7} {:>4}  {:<14} {:>8}  {}",
                row.name,
                row.state.chars().take(15).collect::<String>(),
                if row.attempt == 0 {
                    "-".into()
                } else {
                    row.attempt.to_string()
                },
                row.ctx
                    .map(|c| format!("{c}%"))
                    .unwrap_or_else(|| "-".into()),
                phase,
                countdown,
                last
            ));
        }
        for line in &lines {
            out.extend(line.chars().take(width));
            out.push('\n');
        }
        self.drawn = lines.len();
        let mut stdout = std::io::stdout();
        let _ = stdout.write_all(out.as_bytes());
        let _ = stdout.flush();
    }

    /// Leaves the table on screen as it is and stops redrawing it.
    pub(super) fn finish(&mut self) {
        self.draw();
        self.finished = true;
        for line in self.pending.drain(..) {
            println!("{line}");
        }
    }

    /// Whether the mode prints JSON.
    pub(super) fn json(&self) -> bool {
        self.mode == Mode::Json
    }
}

/// `(kind, text, fields, new state)` of a note.
fn describe(note: &Note) -> (&'static str, String, Value, Option<String>) {
    use LifecycleEvent as L;
    match note {
        Note::Sent { turn, of } => (
            "message_sent",
            format!("message {turn}/{of} sent"),
            json!({ "turn": turn }),
            Some("sent".into()),
        ),
        Note::Notice(Notice::FreshStart { message, cause, .. }) => (
            "user_notified",
            format!("user told: \"{message}\""),
            json!({ "cause": cause.as_str(), "message": message }),
            None,
        ),
        Note::Notice(Notice::SessionFailed { message, reason }) => (
            "user_notified",
            format!("user told: \"{message}\""),
            json!({ "reason": reason, "message": message }),
            Some("failed".into()),
        ),
        Note::Notice(_) => ("notice", "notice for the user".into(), json!({}), None),
        Note::Life(event) => {
            let (text, state) = match event {
                L::SessionSpawned { .. } => ("session started".into(), Some("ready".into())),
                L::SessionStopped { reason, .. } => (
                    format!(
                        "session stopped{}",
                        reason
                            .as_deref()
                            .map(|r| format!(" ({r})"))
                            .unwrap_or_default()
                    ),
                    None,
                ),
                L::SessionRestarted { cause, .. } => (
                    format!("session restarted after: {cause}"),
                    Some("restarted".into()),
                ),
                L::SupervisorEscalated { cause, .. } => (
                    format!("supervisor gave up: {cause}"),
                    Some("given up".into()),
                ),
                L::AgentSessionId { session_id, .. } => {
                    (format!("conversation {session_id}"), None)
                }
                L::ResumeFailed {
                    failed_id, cause, ..
                } => (
                    format!("cannot resume {failed_id}: {cause}"),
                    Some("resume failed".into()),
                ),
                L::FreshFallback { redelivered, .. } => (
                    format!("started fresh, {redelivered} message(s) re-delivered"),
                    Some("fresh start".into()),
                ),
                L::SessionFailed { reason, .. } => {
                    (format!("session failed: {reason}"), Some("failed".into()))
                }
                L::SessionReaped { idle_for, .. } => (
                    format!("reaped after {:.1}s idle", secs(*idle_for)),
                    Some("reaped (idle)".into()),
                ),
                L::ContextUsage {
                    tokens,
                    window,
                    percent,
                    ..
                } => (
                    format!("context {percent}% ({tokens} of {window} tokens)"),
                    None,
                ),
                L::StoreFailed { error, .. } => (format!("store error: {error}"), None),
                L::TurnStarted { turn, .. } => {
                    (format!("turn {turn} started"), Some(format!("turn {turn}")))
                }
                L::AttemptStarted {
                    attempt, timeout, ..
                } => (
                    format!(
                        "attempt {} streaming (watchdog {:.1}s)",
                        attempt.attempt,
                        secs(*timeout)
                    ),
                    Some("streaming".into()),
                ),
                L::StreamTimedOut {
                    attempt,
                    silent_for,
                    ..
                } => (
                    format!(
                        "watchdog killed attempt {} after {:.2}s of silence (ESTREAM_TIMEOUT)",
                        attempt.attempt,
                        secs(*silent_for)
                    ),
                    Some("killed (silent)".into()),
                ),
                L::RetryScheduled {
                    delay, error_code, ..
                } => (
                    format!("retrying in {:.2}s after {error_code}", secs(*delay)),
                    Some(format!("backoff {:.1}s", secs(*delay))),
                ),
                L::ContinueScheduled {
                    delay,
                    error_code,
                    kept_bytes,
                    ..
                } => (
                    format!(
                        "continuing the reply in {:.2}s after {error_code} (keeps {kept_bytes} bytes)",
                        secs(*delay)
                    ),
                    Some(format!("continue in {:.1}s", secs(*delay))),
                ),
                L::TurnFinished {
                    turn,
                    attempts,
                    error_code,
                    ..
                } => match error_code {
                    None => (
                        format!("turn {turn} answered ({attempts} attempt(s))"),
                        Some("answered".into()),
                    ),
                    Some(code) => (format!("turn {turn} failed: {code}"), Some("failed".into())),
                },
                L::WorkspaceNormalized {
                    original,
                    normalized,
                } => (
                    format!("{} is {}", original.display(), normalized.display()),
                    None,
                ),
                L::AttemptQueued { attempt, pool, .. } => (
                    format!("attempt {} waits for {pool}", attempt.attempt),
                    Some("queued".into()),
                ),
                L::AttemptAdmitted {
                    attempt, waited, ..
                } => (
                    format!(
                        "attempt {} admitted after {:.2}s",
                        attempt.attempt,
                        secs(*waited)
                    ),
                    None,
                ),
                L::AttemptEnded {
                    attempt,
                    outcome,
                    error_code,
                    ..
                } => (
                    match error_code {
                        Some(code) => {
                            format!("attempt {} {} ({code})", attempt.attempt, outcome.as_str())
                        }
                        None => format!("attempt {} {}", attempt.attempt, outcome.as_str()),
                    },
                    None,
                ),
                // An event this view does not know yet (the enum is
                // non-exhaustive): its wire name and fields, never Rust's
                // Debug shape.
                _ => (generic_line(event), None),
            };
            // One JSON view of a lifecycle event, core's (as `warden serve`
            // streams it); the workspace column names the session.
            let fields = fields_of(event);
            (event.name(), text, fields, state)
        }
    }
}

/// A lifecycle event's wire fields, without its session key (the
/// workspace column names the session).
fn fields_of(event: &LifecycleEvent) -> Value {
    let mut fields = event.to_json();
    if let Some(object) = fields.as_object_mut() {
        object.remove("key");
    }
    fields
}

/// `name k=v …` of a lifecycle event from its wire view.
fn generic_line(event: &LifecycleEvent) -> String {
    let mut line = event.name().replace('_', " ");
    if let Value::Object(fields) = fields_of(event) {
        for (k, v) in fields {
            if k == "event" || k == "at" {
                continue;
            }
            match v {
                Value::String(s) => line.push_str(&format!(" {k}={s}")),
                Value::Null => {}
                v => line.push_str(&format!(" {k}={v}")),
            }
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use warden_core::lifecycle::AttemptOutcome;
    use warden_core::{AttemptId, SessionKey};

    use super::*;

    #[test]
    fn an_event_without_its_own_line_reads_as_its_wire_name_and_fields() {
        let event = LifecycleEvent::AttemptEnded {
            key: SessionKey::new("/w/docs-site"),
            attempt: AttemptId {
                turn: 2,
                attempt: 1,
            },
            outcome: AttemptOutcome::Completed,
            error_code: None,
        };
        let line = generic_line(&event);
        assert!(line.starts_with("attempt ended"), "{line}");
        assert!(line.contains("outcome=completed"), "{line}");
        assert!(!line.contains("docs-site") && !line.contains('{'), "{line}");
    }
}
