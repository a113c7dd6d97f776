//! How a turn's failure reads as a process exit: the one rule behind
//! `warden chat`'s exit status, the `exit` of `warden serve`'s error event
//! and the client that turns that event back into a status.

use crate::error::{StreamError, TurnError};

/// The class of a failed turn, with its process exit status
/// ([`code`](Self::code)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ExitClass {
    /// Any other failure (an internal error, a session given up): `1`.
    Failure,
    /// The API refused the request for good (401, 400, prompt too long, a
    /// reply over its cap): `3`.
    Api,
    /// The stream went silent (or made no progress) on every attempt, or
    /// the turn ran past its deadline: `4`.
    Timeout,
    /// Every attempt failed in a way a later try may not (a connection
    /// error, 429/5xx, a cut stream, a continuation that failed), or a
    /// layer under the session made the policy's attempts at such a
    /// failure already (`StreamError::RetriedBelow`): `5`.
    Unavailable,
    /// The session stopped before answering; the message stays pending and
    /// is answered when the session runs again — nothing to re-send: `6`.
    Deferred,
    /// Cancelled: `130` (128 + SIGINT).
    Cancelled,
}

impl ExitClass {
    /// Every class, in code order.
    pub const ALL: [ExitClass; 6] = [
        Self::Failure,
        Self::Api,
        Self::Timeout,
        Self::Unavailable,
        Self::Deferred,
        Self::Cancelled,
    ];

    /// The process exit status.
    pub const fn code(self) -> u8 {
        match self {
            Self::Failure => 1,
            Self::Api => 3,
            Self::Timeout => 4,
            Self::Unavailable => 5,
            Self::Deferred => 6,
            Self::Cancelled => 130,
        }
    }

    /// The class of exit status `code`, if it is one's.
    pub fn from_code(code: u64) -> Option<Self> {
        Self::ALL.into_iter().find(|c| u64::from(c.code()) == code)
    }

    /// The class of a turn that failed with `error`.
    pub fn of(error: &TurnError) -> Self {
        match error {
            TurnError::Cancelled => Self::Cancelled,
            TurnError::SessionStopped { .. } => Self::Deferred,
            TurnError::DeadlineExceeded { .. } => Self::Timeout,
            TurnError::ReplyTooLarge { .. } => Self::Api,
            TurnError::RetriesExhausted { last, .. } | TurnError::Fatal(last) => {
                Self::of_stream(last)
            }
            _ => Self::Failure,
        }
    }

    /// The class of a turn whose last attempt failed with `error`.
    pub fn of_stream(error: &StreamError) -> Self {
        match error {
            StreamError::InactivityTimeout { .. } | StreamError::NoProgress { .. } => Self::Timeout,
            StreamError::Internal { .. } => Self::Failure,
            StreamError::RetriedBelow { last, .. } => Self::of_stream(last),
            e if e.is_retryable() => Self::Unavailable,
            _ => Self::Api,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_code_is_one_class_and_the_rule_follows_retryability() {
        for class in ExitClass::ALL {
            assert_eq!(ExitClass::from_code(u64::from(class.code())), Some(class));
        }
        assert_eq!(ExitClass::from_code(2), None);
        let continuation = StreamError::ContinuationFailed {
            message: "the model would not go on".into(),
        };
        assert_eq!(
            ExitClass::of(&TurnError::Fatal(continuation.clone())),
            if continuation.is_retryable() {
                ExitClass::Unavailable
            } else {
                ExitClass::Api
            },
            "a failed continuation reads the same everywhere"
        );
        let cut = StreamError::Connection {
            message: "reset".into(),
        };
        assert_eq!(
            ExitClass::of(&TurnError::RetriesExhausted {
                attempts: 3,
                last: cut
            }),
            ExitClass::Unavailable
        );
        assert_eq!(ExitClass::of(&TurnError::Cancelled).code(), 130);
    }
}
