//! Exit codes and the one-line error every failure becomes.

use std::fmt;
use std::process::ExitCode;

use warden_core::{ExitClass, SupervisorError, TurnError};

/// The documented exit codes (see `warden --help`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exit {
    /// Success.
    Ok,
    /// Any other failure: store, I/O, a check of the demo that did not hold.
    Failure,
    /// Bad flags or arguments (clap uses 2 as well).
    Usage,
    /// The API refused the request for good (401, 400, prompt too long, ...).
    Api,
    /// The stream went silent on every attempt (`ESTREAM_TIMEOUT`).
    Timeout,
    /// The server could not be reached or kept failing (connection errors,
    /// 429/5xx) on every attempt.
    Unavailable,
    /// The session stopped before answering (a server shutting down, a
    /// session moved to another node): the message stays pending and is
    /// answered when the session runs again — nothing to re-send.
    Deferred,
    /// Cancelled with Ctrl-C (128 + SIGINT).
    Cancelled,
    /// Stopped by SIGTERM, after cancelling and cleaning up (128 + SIGTERM).
    Terminated,
}

impl Exit {
    /// The process exit status.
    pub(crate) fn code(self) -> u8 {
        match self {
            Exit::Ok => 0,
            Exit::Failure => 1,
            Exit::Usage => 2,
            Exit::Api => 3,
            Exit::Timeout => 4,
            Exit::Unavailable => 5,
            Exit::Deferred => 6,
            Exit::Cancelled => 130,
            Exit::Terminated => 143,
        }
    }
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> Self {
        ExitCode::from(exit.code())
    }
}

/// The text of `--help`'s exit code section.
pub(crate) const EXIT_CODES: &str = "\
Exit codes:
  0    success
  1    failure (store, I/O, a demo check that did not hold)
  2    usage error (bad flag, argument, URL or file)
  3    fatal API error (401/403, 400, prompt too long, ...)
  4    stream timeout: silent on every attempt (ESTREAM_TIMEOUT)
  5    unavailable: connection errors or 429/5xx on every attempt
  6    deferred: the session stopped before answering; the message stays pending
       and is answered when the session runs again (do not re-send it)
  130  cancelled with Ctrl-C (SIGINT)
  143  cancelled by SIGTERM (the turn is cancelled and cleaned up, as with Ctrl-C)

Limits: a message on stdin or a --body file is at most 32 MiB; stream --retries at most 100.";

/// A failure the user sees as `warden: error: MESSAGE` and an exit code.
#[derive(Debug)]
pub(crate) struct CliError {
    pub(crate) exit: Exit,
    pub(crate) message: String,
}

impl CliError {
    pub(crate) fn new(exit: Exit, message: impl Into<String>) -> Self {
        Self {
            exit,
            message: message.into(),
        }
    }

    pub(crate) fn failure(message: impl Into<String>) -> Self {
        Self::new(Exit::Failure, message)
    }

    pub(crate) fn usage(message: impl Into<String>) -> Self {
        Self::new(Exit::Usage, message)
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // One line, whatever the source said.
        f.write_str(&self.message.replace('\n', " "))
    }
}

/// A failed turn's class as this process's exit: the one rule
/// ([`ExitClass`]) that `warden serve`'s error events carry too.
impl From<ExitClass> for Exit {
    fn from(class: ExitClass) -> Self {
        match class {
            ExitClass::Api => Exit::Api,
            ExitClass::Timeout => Exit::Timeout,
            ExitClass::Unavailable => Exit::Unavailable,
            ExitClass::Deferred => Exit::Deferred,
            ExitClass::Cancelled => Exit::Cancelled,
            _ => Exit::Failure,
        }
    }
}

impl From<TurnError> for CliError {
    fn from(error: TurnError) -> Self {
        CliError::new(ExitClass::of(&error).into(), error.to_string())
    }
}

impl From<SupervisorError> for CliError {
    fn from(error: SupervisorError) -> Self {
        CliError::failure(error.to_string())
    }
}

impl From<warden_core::ActorError> for CliError {
    fn from(error: warden_core::ActorError) -> Self {
        CliError::failure(error.to_string())
    }
}

impl From<warden_core::SubmitError> for CliError {
    fn from(error: warden_core::SubmitError) -> Self {
        CliError::failure(error.to_string())
    }
}

impl From<warden_core::StoreError> for CliError {
    fn from(error: warden_core::StoreError) -> Self {
        CliError::failure(error.to_string())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use warden_core::StreamError;

    use super::*;

    #[test]
    fn turn_errors_map_to_their_documented_codes() {
        let timeout = StreamError::InactivityTimeout {
            silent_for: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
        };
        let cases = [
            (TurnError::Cancelled, 130),
            (
                TurnError::RetriesExhausted {
                    attempts: 4,
                    last: timeout,
                },
                4,
            ),
            (
                TurnError::RetriesExhausted {
                    attempts: 4,
                    last: StreamError::Connection {
                        message: "refused".into(),
                    },
                },
                5,
            ),
            (
                TurnError::Fatal(StreamError::Unauthorized {
                    message: "bad key".into(),
                }),
                3,
            ),
        ];
        for (error, code) in cases {
            assert_eq!(CliError::from(error).exit.code(), code);
        }
    }
}
