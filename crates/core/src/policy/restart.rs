//! When a supervised session is restarted, and when the supervisor gives up.
//!
//! Names follow Erlang/OTP and kameo: a child is `Permanent`, `Transient`
//! or `Temporary`; restarts are limited by an intensity (`max` within a
//! sliding window), past which the supervisor escalates.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// Which exits of a session lead to a restart.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Restart {
    /// Always restarted, even after a normal stop.
    /// Use for sessions that must always be present (a bot's home channel).
    Permanent,
    /// Restarted only after an abnormal exit (panic or error); a normal stop
    /// (reap, explicit stop) is final. **Default.** Use for on-demand
    /// workspace sessions: they come back on the next message anyway.
    #[default]
    Transient,
    /// Never restarted. Use for one-shot jobs whose failure a caller handles.
    Temporary,
}

impl Restart {
    /// Whether an exit (`abnormal` = panic or error) calls for a restart.
    pub fn should_restart(self, abnormal: bool) -> bool {
        match self {
            Self::Permanent => true,
            Self::Transient => abnormal,
            Self::Temporary => false,
        }
    }
}

/// At most `max_restarts` restarts within `within`; one more escalates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RestartIntensity {
    /// Restarts allowed inside the window. Default `3`.
    pub max_restarts: u32,
    /// The sliding window. Default 60 s.
    pub within: Duration,
}

impl Default for RestartIntensity {
    fn default() -> Self {
        Self {
            max_restarts: 3,
            within: Duration::from_secs(60),
        }
    }
}

impl RestartIntensity {
    /// `max_restarts` within `within` (kameo's `restart_limit`).
    pub fn new(max_restarts: u32, within: Duration) -> Self {
        Self {
            max_restarts,
            within,
        }
    }
}

/// What to do about one failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RestartDecision {
    /// Restart; this is restart number `n` inside the window.
    Restart(u32),
    /// The intensity is exceeded: stop restarting and escalate.
    Escalate,
}

/// The restart history of one child.
#[derive(Debug, Clone, Default)]
pub(crate) struct RestartTracker {
    history: VecDeque<Instant>,
}

impl RestartTracker {
    /// Records a failure at `now` and decides: restart, or escalate when
    /// this restart would be one more than `intensity` allows.
    pub(crate) fn on_failure(
        &mut self,
        intensity: RestartIntensity,
        now: Instant,
    ) -> RestartDecision {
        while let Some(&oldest) = self.history.front() {
            if now.saturating_duration_since(oldest) >= intensity.within {
                self.history.pop_front();
            } else {
                break;
            }
        }
        if self.history.len() as u32 >= intensity.max_restarts {
            return RestartDecision::Escalate;
        }
        self.history.push_back(now);
        RestartDecision::Restart(self.history.len() as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restart_kinds() {
        assert!(Restart::Permanent.should_restart(false));
        assert!(Restart::Permanent.should_restart(true));
        assert!(!Restart::Transient.should_restart(false));
        assert!(Restart::Transient.should_restart(true));
        assert!(!Restart::Temporary.should_restart(true));
    }

    #[test]
    fn escalates_on_the_restart_past_the_limit_within_the_window() {
        let i = RestartIntensity::new(2, Duration::from_secs(10));
        let t0 = Instant::now();
        let mut t = RestartTracker::default();
        assert_eq!(t.on_failure(i, t0), RestartDecision::Restart(1));
        assert_eq!(
            t.on_failure(i, t0 + Duration::from_secs(1)),
            RestartDecision::Restart(2)
        );
        assert_eq!(
            t.on_failure(i, t0 + Duration::from_secs(2)),
            RestartDecision::Escalate
        );
    }

    #[test]
    fn old_restarts_slide_out_of_the_window() {
        let i = RestartIntensity::new(1, Duration::from_secs(10));
        let t0 = Instant::now();
        let mut t = RestartTracker::default();
        assert_eq!(t.on_failure(i, t0), RestartDecision::Restart(1));
        assert_eq!(
            t.on_failure(i, t0 + Duration::from_secs(10)),
            RestartDecision::Restart(1)
        );
        let mut none = RestartTracker::default();
        assert_eq!(
            none.on_failure(RestartIntensity::new(0, Duration::from_secs(1)), t0),
            RestartDecision::Escalate
        );
    }
}
