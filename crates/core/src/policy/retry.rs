//! Exponential backoff with downward jitter and a max-attempts budget.
//!
//! Hand-written on purpose (a dozen lines): `backon`'s jitter adds up to
//! +100 % *above* the computed delay and so above the cap, while warden
//! follows the official Anthropic SDK rule: `min(initial * 2^n, max)` minus
//! up to 25 %, and a server's `retry-after` wins when present.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;

use crate::error::StreamError;

/// How a turn whose attempt failed with a retryable error is retried.
///
/// Every attempt is retried *from scratch* (a new request, a new stream);
/// partial output of a failed attempt is discarded.
#[derive(Clone)]
#[non_exhaustive]
pub struct RetryPolicy {
    /// Attempts per turn, the first included. Default `4` (three retries).
    /// `1` disables retries.
    pub max_attempts: u32,
    /// Delay before the first retry. Default 500 ms.
    pub initial_backoff: Duration,
    /// Cap of the exponential delay. Default 8 s.
    pub max_backoff: Duration,
    /// Growth factor per retry. Default `2.0`.
    pub multiplier: f64,
    /// Fraction of the delay that may be subtracted at random, `0.0..=1.0`.
    /// Default `0.25`. Spreads simultaneous retries of many sessions.
    pub jitter: f64,
    /// Upper bound on a server-requested `retry-after`. Default 60 s.
    pub max_retry_after: Duration,
    /// Your own rule, asked first about every failed attempt (see
    /// [`with_hook`](Self::with_hook)). Default none.
    pub hook: Option<RetryHook>,
    /// Whether a restart may repeat tool calls the failed attempt already
    /// delivered complete (your code may have run them). Default `false`:
    /// such a turn ends [`TurnError::ToolCallsWouldRepeat`](crate::TurnError)
    /// instead of being retried. Only for sources whose restarts re-issue
    /// tool calls ([`EventSource::restarts_repeat_tool_calls`](crate::EventSource::restarts_repeat_tool_calls)).
    pub repeat_tool_calls: bool,
}

/// What a [`RetryHook`] says about a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RetryVerdict {
    /// Use the built-in classification ([`StreamError::is_retryable`],
    /// the server's `retry-after`, the backoff).
    Default,
    /// Retry after the policy's backoff, even if the error is fatal by
    /// default.
    Retry,
    /// Retry after this wait (capped at `max_retry_after`).
    RetryAfter(Duration),
    /// Do not retry: the turn ends with the error as fatal.
    Fatal,
}

/// A retry rule of your own: given the error and the number of attempts
/// made so far (from 1), a [`RetryVerdict`]. It may be called more than
/// once per failure, so it should not have side effects. `max_attempts`
/// still bounds the attempts of a turn, and a user's cancel and a resume
/// failure (which the supervisor takes) never reach it.
pub type RetryHook = Arc<dyn Fn(&StreamError, u32) -> RetryVerdict + Send + Sync>;

impl fmt::Debug for RetryPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryPolicy")
            .field("max_attempts", &self.max_attempts)
            .field("initial_backoff", &self.initial_backoff)
            .field("max_backoff", &self.max_backoff)
            .field("multiplier", &self.multiplier)
            .field("jitter", &self.jitter)
            .field("max_retry_after", &self.max_retry_after)
            .field("hook", &self.hook.as_ref().map(|_| "Fn"))
            .field("repeat_tool_calls", &self.repeat_tool_calls)
            .finish()
    }
}

/// Equal when every setting is, and both have no hook or the same one.
impl PartialEq for RetryPolicy {
    fn eq(&self, other: &Self) -> bool {
        self.max_attempts == other.max_attempts
            && self.initial_backoff == other.initial_backoff
            && self.max_backoff == other.max_backoff
            && self.multiplier == other.multiplier
            && self.jitter == other.jitter
            && self.max_retry_after == other.max_retry_after
            && self.repeat_tool_calls == other.repeat_tool_calls
            && match (&self.hook, &other.hook) {
                (None, None) => true,
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                _ => false,
            }
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 4,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(8),
            multiplier: 2.0,
            jitter: 0.25,
            max_retry_after: Duration::from_secs(60),
            hook: None,
            repeat_tool_calls: false,
        }
    }
}

impl RetryPolicy {
    /// A policy that never retries.
    pub fn never() -> Self {
        Self {
            max_attempts: 1,
            ..Self::default()
        }
    }

    /// Lets a restart repeat tool calls already delivered (see
    /// [`repeat_tool_calls`](Self::repeat_tool_calls)): your code runs
    /// each tool call idempotently, or not at all before the turn ends.
    pub fn with_repeat_tool_calls(mut self, allow: bool) -> Self {
        self.repeat_tool_calls = allow;
        self
    }

    /// Sets [`max_attempts`](Self::max_attempts) (at least 1).
    pub fn with_max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n.max(1);
        self
    }

    /// Sets the initial and maximum backoff.
    pub fn with_backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.initial_backoff = initial;
        self.max_backoff = max.max(initial);
        self
    }

    /// Sets the jitter fraction (clamped to `0.0..=1.0`).
    pub fn with_jitter(mut self, jitter: f64) -> Self {
        self.jitter = if jitter.is_finite() {
            jitter.clamp(0.0, 1.0)
        } else {
            0.0
        };
        self
    }

    /// Asks `hook` first about every failed attempt; see [`RetryHook`].
    pub fn with_hook(
        mut self,
        hook: impl Fn(&StreamError, u32) -> RetryVerdict + Send + Sync + 'static,
    ) -> Self {
        self.hook = Some(Arc::new(hook));
        self
    }

    fn verdict(&self, attempts_made: u32, error: &StreamError) -> RetryVerdict {
        self.hook
            .as_ref()
            .map_or(RetryVerdict::Default, |h| h(error, attempts_made))
    }

    /// Whether `error` after `attempts_made` attempts is worth a retry at
    /// all: the hook's verdict, else [`StreamError::is_retryable`].
    pub fn is_retryable(&self, attempts_made: u32, error: &StreamError) -> bool {
        match self.verdict(attempts_made, error) {
            RetryVerdict::Retry | RetryVerdict::RetryAfter(_) => true,
            RetryVerdict::Fatal => false,
            RetryVerdict::Default => error.is_retryable(),
        }
    }

    /// The un-jittered delay before retry number `retry` (1-based).
    pub fn base_delay(&self, retry: u32) -> Duration {
        let exp = retry.saturating_sub(1).min(63) as i32;
        let secs = self.initial_backoff.as_secs_f64() * self.multiplier.max(1.0).powi(exp);
        let cap = self.max_backoff.as_secs_f64();
        Duration::from_secs_f64(if secs.is_finite() { secs.min(cap) } else { cap })
    }

    /// The delay before retry number `retry` (1-based), jittered with `rng`.
    /// Always in `base * (1 - jitter) ..= base`.
    pub fn jittered_delay(&self, retry: u32, rng: &mut impl Rng) -> Duration {
        let base = self.base_delay(retry);
        let cut = self.jitter.clamp(0.0, 1.0) * rng.random::<f64>();
        base.mul_f64(1.0 - cut)
    }

    /// [`next_delay`](Self::next_delay) with the thread's random generator,
    /// for callers without their own (and without a `rand` dependency).
    pub fn delay_after(&self, attempts_made: u32, error: &StreamError) -> Option<Duration> {
        self.next_delay(attempts_made, error, &mut rand::rng())
    }

    /// Decides what follows a failed attempt: `Some(delay)` to retry after
    /// `delay`, `None` to give up (not retryable, by the hook or the
    /// built-in rule, or `attempts_made` reached
    /// [`max_attempts`](Self::max_attempts)).
    pub fn next_delay(
        &self,
        attempts_made: u32,
        error: &StreamError,
        rng: &mut impl Rng,
    ) -> Option<Duration> {
        if attempts_made >= self.max_attempts {
            return None;
        }
        let asked = match self.verdict(attempts_made, error) {
            RetryVerdict::Fatal => return None,
            RetryVerdict::Default if !error.is_retryable() => return None,
            RetryVerdict::RetryAfter(wait) => Some(wait),
            RetryVerdict::Default | RetryVerdict::Retry => error.retry_after(),
        };
        Some(match asked {
            Some(wait) => wait.min(self.max_retry_after),
            None => self.jittered_delay(attempts_made, rng),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{SeedableRng, rngs::SmallRng};

    fn timeout() -> StreamError {
        StreamError::InactivityTimeout {
            silent_for: Duration::from_secs(45),
            timeout: Duration::from_secs(45),
        }
    }

    #[test]
    fn the_builders_set_what_they_name_and_delay_after_follows_them() {
        let p = RetryPolicy::default()
            .with_backoff(Duration::from_millis(100), Duration::from_millis(250))
            .with_jitter(0.0);
        assert_eq!(
            p.delay_after(1, &timeout()),
            Some(Duration::from_millis(100))
        );
        assert_eq!(
            p.delay_after(2, &timeout()),
            Some(Duration::from_millis(200))
        );
        assert_eq!(
            p.delay_after(3, &timeout()),
            Some(Duration::from_millis(250))
        );
        assert_eq!(p.delay_after(p.max_attempts, &timeout()), None);
        // Full jitter may cut a delay to anything down to zero, never more.
        let p = p.with_jitter(1.0);
        assert_eq!(p.jitter, 1.0);
        assert!(p.delay_after(1, &timeout()) <= Some(Duration::from_millis(100)));
        assert_eq!(RetryPolicy::default().with_jitter(f64::NAN).jitter, 0.0);
    }

    #[test]
    fn base_delay_doubles_up_to_the_cap() {
        let p = RetryPolicy::default();
        let got: Vec<_> = (1..=6).map(|n| p.base_delay(n).as_millis()).collect();
        assert_eq!(got, [500, 1000, 2000, 4000, 8000, 8000]);
        assert_eq!(p.base_delay(u32::MAX), Duration::from_secs(8));
    }

    #[test]
    fn jitter_only_subtracts_and_stays_within_the_fraction() {
        let p = RetryPolicy::default();
        let mut rng = SmallRng::seed_from_u64(7);
        let mut seen_below = false;
        for retry in 1..=10 {
            for _ in 0..1000 {
                let base = p.base_delay(retry);
                let d = p.jittered_delay(retry, &mut rng);
                assert!(d <= base, "{d:?} > {base:?}");
                assert!(d >= base.mul_f64(0.75), "{d:?} < 75% of {base:?}");
                seen_below |= d < base;
            }
        }
        assert!(seen_below, "jitter never applied");
    }

    #[test]
    fn gives_up_after_max_attempts_and_on_fatal_errors() {
        let p = RetryPolicy::default().with_max_attempts(3);
        let mut rng = SmallRng::seed_from_u64(1);
        assert!(p.next_delay(1, &timeout(), &mut rng).is_some());
        assert!(p.next_delay(2, &timeout(), &mut rng).is_some());
        assert!(p.next_delay(3, &timeout(), &mut rng).is_none());
        let fatal = StreamError::Malformed {
            message: "x".into(),
        };
        assert!(p.next_delay(1, &fatal, &mut rng).is_none());
        assert!(
            RetryPolicy::never()
                .next_delay(1, &timeout(), &mut rng)
                .is_none()
        );
    }

    #[test]
    fn retry_after_wins_and_is_capped() {
        let p = RetryPolicy::default();
        let mut rng = SmallRng::seed_from_u64(1);
        let api = |secs| StreamError::Api {
            status: Some(429),
            kind: "rate_limit_error".into(),
            message: "slow down".into(),
            retryable: true,
            retry_after: Some(Duration::from_secs(secs)),
        };
        assert_eq!(
            p.next_delay(1, &api(3), &mut rng),
            Some(Duration::from_secs(3))
        );
        assert_eq!(
            p.next_delay(1, &api(3600), &mut rng),
            Some(Duration::from_secs(60))
        );
    }
}
