//! Relaying one turn to the terminal: text to stdout as it streams (its
//! control characters shown, not obeyed, on a terminal), retries and
//! notices to stderr, Ctrl-C cancels.

use std::io::{IsTerminal, Write};

use warden_core::{AgentEvent, StreamError, TurnEvent, TurnHandle, TurnSummary};

use crate::exit::CliError;

/// What [`relay`] printed.
#[derive(Debug)]
pub(crate) struct Relayed {
    /// The finished turn.
    pub(crate) summary: TurnSummary,
    /// The last text printed did not end with a newline.
    pub(crate) line_open: bool,
}

/// How [`relay`] writes a reply to stdout when it is not a terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Piped {
    /// As it streams, like a terminal (`warden stream`: watching a stream
    /// live is the point; a retry from scratch prints the reply again).
    Live,
    /// Once, whole, when the turn ends (`warden chat`: a script reading
    /// the answer never sees text a retry discarded).
    Whole,
}

/// Prints `turn` until it finishes. On a terminal each attempt's text is
/// printed as it arrives; when an attempt fails and is retried from
/// scratch, the next attempt's text starts over on a line of its own
/// (stderr says so) — unless the reply is continued, when stdout simply
/// goes on. Through a pipe or into a file, where printed text cannot be
/// taken back, `piped` says how. The first Ctrl-C cancels the turn at
/// once; the result is then `TurnError::Cancelled`.
pub(crate) async fn relay(mut turn: TurnHandle, piped: Piped) -> Result<Relayed, CliError> {
    let mut stdout = std::io::stdout();
    let terminal = stdout.is_terminal();
    let live = terminal || piped == Piped::Live;
    let mut line_open = false;
    let mut cancelled = false;
    // Cancels this turn only (a handle that follows it to a fresh session).
    let canceller = turn.canceller();
    let ctrl_c = crate::signal::shutdown_signal();
    tokio::pin!(ctrl_c);
    loop {
        let event = tokio::select! {
            event = turn.recv() => event,
            _ = &mut ctrl_c, if !cancelled => {
                cancelled = true;
                // An error means the session is gone: the turn ends anyway.
                let _ = canceller.cancel().await;
                continue;
            }
        };
        let Some(event) = event else {
            return Err(CliError::failure("the session ended without answering"));
        };
        match event {
            // Held back: the answer, once, whole.
            TurnEvent::Finished(Ok(summary)) if !live => {
                let written = stdout
                    .write_all(summary.text.as_bytes())
                    .and_then(|()| stdout.flush());
                if let Err(e) = written {
                    return Err(CliError::failure(format!("cannot write to stdout: {e}")));
                }
                let line_open = !summary.text.is_empty() && !summary.text.ends_with('\n');
                return Ok(Relayed { summary, line_open });
            }
            TurnEvent::Event(AgentEvent::TextDelta(text)) if live => {
                let shown = if terminal {
                    crate::terminal::inert(&text)
                } else {
                    text.as_str().into()
                };
                let written = stdout
                    .write_all(shown.as_bytes())
                    .and_then(|()| stdout.flush());
                if let Err(e) = written {
                    let _ = canceller.cancel().await;
                    return Err(CliError::failure(format!("cannot write to stdout: {e}")));
                }
                if !text.is_empty() {
                    line_open = !text.ends_with('\n');
                }
            }
            TurnEvent::Retrying { error, delay, .. } => {
                // On a terminal, keep the notice off the half-printed line.
                if line_open && terminal {
                    let _ = writeln!(stdout);
                    line_open = false;
                }
                tell_retry(&error, delay);
            }
            // The reply goes on where it broke: stdout is not restarted.
            TurnEvent::Continuing { error, delay, .. } => {
                if line_open && terminal {
                    eprintln!(); // the notice on its own line, stdout untouched
                }
                tell_retry(&error, delay);
                eprintln!("warden: continuing the reply where it stopped");
            }
            // A fresh start after a resume failure is told by the notifier.
            TurnEvent::Finished(Ok(summary)) => return Ok(Relayed { summary, line_open }),
            TurnEvent::Finished(Err(error)) => {
                if line_open {
                    let _ = writeln!(stdout);
                }
                return Err(error.into());
            }
            _ => {}
        }
    }
}

/// Tells stderr why an attempt failed and when the next one starts.
fn tell_retry(error: &StreamError, delay: std::time::Duration) {
    match error {
        StreamError::InactivityTimeout { .. } => {
            eprintln!("Connection lost during streaming. Retrying...");
        }
        other => eprintln!(
            "warden: {}; retrying in {:.1}s",
            CliError::failure(other.to_string()),
            delay.as_secs_f64()
        ),
    }
}
