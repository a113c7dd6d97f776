//! Plain, separately tested policies: how to retry a turn, when to restart
//! a session.
//!
//! Actors only route; every decision with a number in it lives here.

mod decide;
mod restart;
mod retry;

pub use decide::{Broken, GiveUp, Next, Shown, Verdict, decide, hold};
pub use restart::{Restart, RestartIntensity};
pub(crate) use restart::{RestartDecision, RestartTracker};
pub use retry::{RetryHook, RetryPolicy, RetryVerdict, Retryable};
