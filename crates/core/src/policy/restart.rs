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
/// Each restart may wait first ([`with_backoff`](Self::with_backoff)), so a
/// cause that clears by itself (a database blip, a full disk being
/// cleaned) is not run into the limit in a few milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RestartIntensity {
    /// Restarts allowed inside the window. Default `3`.
    pub max_restarts: u32,
    /// The sliding window. Default 60 s.
    pub within: Duration,
    /// The wait before the first restart inside the window; each further
    /// one waits twice the one before, up to
    /// [`max_backoff`](Self::max_backoff). Default zero: restarted at once,
    /// as Erlang/OTP does. A message sent to the session meanwhile starts it
    /// at once (the wait is for crash loops, not for callers).
    pub backoff: Duration,
    /// The longest wait before a restart. Default 30 s.
    pub max_backoff: Duration,
}

impl Default for RestartIntensity {
    fn default() -> Self {
        Self {
            max_restarts: 3,
            within: Duration::from_secs(60),
            backoff: Duration::ZERO,
            max_backoff: Duration::from_secs(30),
        }
    }
}

impl RestartIntensity {
    /// `max_restarts` within `within` (kameo's `restart_limit`), restarted
    /// at once.
    pub fn new(max_restarts: u32, within: Duration) -> Self {
        Self {
            max_restarts,
            within,
            ..Self::default()
        }
    }

    /// Waits `first` before the first restart inside the window, doubling
    /// for each further one, never more than `max`.
    pub fn with_backoff(mut self, first: Duration, max: Duration) -> Self {
        self.backoff = first;
        self.max_backoff = max;
        self
    }

    /// The wait before restart number `n` (1-based) inside the window.
    pub fn delay(&self, n: u32) -> Duration {
        let doublings = n.saturating_sub(1).min(31);
        self.backoff
            .saturating_mul(1u32 << doublings)
            .min(self.max_backoff.max(self.backoff))
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
    fn restarts_wait_doubling_up_to_the_cap_and_not_at_all_by_default() {
        let d = RestartIntensity::default();
        assert_eq!(d.delay(1), Duration::ZERO);
        assert_eq!(d.delay(5), Duration::ZERO);
        let i = RestartIntensity::new(10, Duration::from_secs(60))
            .with_backoff(Duration::from_millis(100), Duration::from_secs(1));
        let waits: Vec<_> = (1..=6).map(|n| i.delay(n).as_millis()).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(i.delay(u32::MAX), Duration::from_secs(1), "no overflow");
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
