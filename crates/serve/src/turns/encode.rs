//! A turn's events as its clients see them: the wire records of
//! `warden_core::store::turn_event`, and the exit-code class of an error.

use std::time::Duration;

use warden_core::store::TurnEventData as Data;
use warden_core::store::turn_event::{
    AttemptFailed, ContextFill, Delta, Done, Failed, Queued, Restarting, Started, Tool, ToolState,
};
use warden_core::{AgentEvent, TurnError, TurnEvent, TurnSummary};

/// The event as clients see it; `None` for events not sent to them (usage
/// reports, keep-alive-like ones).
pub(super) fn describe(event: TurnEvent) -> Option<Data> {
    let failed =
        |failed: warden_core::AttemptId, delay, error: &warden_core::StreamError, discard| {
            AttemptFailed::new(
                u64::from(failed.attempt),
                millis(delay),
                error.code(),
                discard,
            )
        };
    let discard = event.discards_shown_text();
    Some(match event {
        TurnEvent::Waiting { behind } => Data::Queued(Queued::new(1, Some(behind as u64))),
        TurnEvent::Queued(a) => Data::Queued(Queued::new(u64::from(a.attempt), None)),
        TurnEvent::Started(a) => Data::Started(Started::new(u64::from(a.attempt))),
        TurnEvent::Event(AgentEvent::TextDelta(t)) => Data::Text(Delta::new(t)),
        TurnEvent::Event(AgentEvent::ThinkingDelta(t)) => Data::Thinking(Delta::new(t)),
        TurnEvent::Event(AgentEvent::ToolUseStarted { id, name }) => {
            Data::Tool(Tool::new(id, Some(name), ToolState::Started))
        }
        TurnEvent::Event(AgentEvent::ToolUseFinished { id }) => {
            Data::Tool(Tool::new(id, None, ToolState::Finished))
        }
        TurnEvent::Retrying {
            failed: f,
            delay,
            error,
        } => Data::Retrying(failed(f, delay, &error, discard)),
        TurnEvent::Continuing {
            failed: f,
            delay,
            error,
        } => Data::Continuing(failed(f, delay, &error, discard)),
        TurnEvent::Restarting { cause } => Data::Restarting(Restarting::new(cause.as_str())),
        TurnEvent::Finished(Ok(summary)) => Data::Done(done(&summary)),
        TurnEvent::Finished(Err(error)) => Data::Error(failure(&error)),
        _ => return None,
    })
}

fn done(s: &TurnSummary) -> Done {
    let context = s
        .context
        .map(|c| ContextFill::new(c.tokens, c.window, u64::from(c.percent)));
    Done::new(
        s.turn,
        s.text.clone(),
        u64::from(s.attempts),
        u64::from(s.continuations),
    )
    .with_usage(context, s.usage.map(|u| u.output_tokens))
}

/// An error event: the code, the message and the exit status `warden
/// chat` gives it ([`warden_core::ExitClass`], the one rule: 4 timeout, 5
/// unavailable, 3 API, 6 deferred — the message stays pending and is
/// answered later, do not re-send it — 130 cancelled, 1 otherwise).
fn failure(e: &TurnError) -> Failed {
    let exit = warden_core::ExitClass::of(e).code();
    Failed::new(e.code(), e.to_string(), exit.into())
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
