//! Exponential backoff with downward jitter and a max-attempts budget.
//!
//! Hand-written on purpose (a dozen lines): `backon`'s jitter adds up to
//! +100 % *above* the computed delay and so above the cap, while warden
//! follows the official Anthropic SDK rule: `min(initial * 2^n, max)` minus
//! up to 25 %, and a server's `retry-after` wins when present.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use derive_setters::Setters;
use rand::Rng;

use crate::error::StreamError;
use crate::store::TurnStoreError;

/// How a turn whose attempt failed with a retryable error is retried.
///
/// Every attempt is retried *from scratch* (a new request, a new stream);
/// partial output of a failed attempt is discarded.
#[derive(Clone, Setters)]
#[setters(prefix = "with_", strip_option)]
#[non_exhaustive]
pub struct RetryPolicy {
    /// Attempts per turn, the first included. Default `4` (three retries).
    /// `1` disables retries.
    #[setters(skip)]
    pub max_attempts: u32,
    /// Delay before the first retry. Default 500 ms.
    #[setters(skip)]
    pub initial_backoff: Duration,
    /// Cap of the exponential delay. Default 8 s.
    #[setters(skip)]
    pub max_backoff: Duration,
    /// Growth factor per retry. Default `2.0`.
    #[setters(skip)]
    pub multiplier: f64,
    /// Fraction of the delay that may be subtracted at random, `0.0..=1.0`.
    /// Default `0.25`. Spreads simultaneous retries of many sessions.
    #[setters(skip)]
    pub jitter: f64,
    /// Upper bound on a server-requested `retry-after`. Default 60 s.
    #[setters(skip)]
    pub max_retry_after: Duration,
    /// Your own rule, asked first about every failed attempt (see
    /// [`with_hook`](Self::with_hook)). Default none.
    #[setters(skip)]
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

/// An error [`RetryPolicy::retry`] can judge: whether another attempt may
/// succeed, and how long the other side asked to wait first.
pub trait Retryable {
    /// Whether another attempt may succeed (`false`: the error is final).
    fn is_retryable(&self) -> bool;

    /// The wait the other side asked for before another attempt (an HTTP
    /// `retry-after`), capped at the policy's
    /// [`max_retry_after`](RetryPolicy::max_retry_after); `None` (the
    /// default): the policy's jittered backoff.
    fn retry_after(&self) -> Option<Duration> {
        None
    }
}

/// A stream's error, judged as a turn's attempts are
/// ([`StreamError::is_retryable`], [`StreamError::retry_after`]); with
/// [`RetryPolicy::retry`] the policy's hook is asked first, as for a turn.
impl Retryable for StreamError {
    fn is_retryable(&self) -> bool {
        StreamError::is_retryable(self)
    }

    fn retry_after(&self) -> Option<Duration> {
        StreamError::retry_after(self)
    }
}

/// A turn store's error: a failure is retried, a session that moved is not
/// (its new owner carries on).
impl Retryable for TurnStoreError {
    fn is_retryable(&self) -> bool {
        matches!(self, TurnStoreError::Failed(_))
    }
}

/// An I/O error: retried when another try may go through — the other side
/// reset, aborted, refused or ended the connection early, the operation
/// timed out or was interrupted, the host or network was unreachable, the
/// resource was busy — and final otherwise (not found, permission denied,
/// invalid input or data, a full disk, …). For another rule, use
/// [`RetryPolicy::retry_if`].
impl Retryable for std::io::Error {
    fn is_retryable(&self) -> bool {
        use std::io::ErrorKind as K;
        matches!(
            self.kind(),
            K::ConnectionRefused
                | K::ConnectionReset
                | K::ConnectionAborted
                | K::NotConnected
                | K::BrokenPipe
                | K::TimedOut
                | K::Interrupted
                | K::WouldBlock
                | K::UnexpectedEof
                | K::HostUnreachable
                | K::NetworkUnreachable
                | K::NetworkDown
                | K::ResourceBusy
        )
    }
}

impl RetryPolicy {
    /// Runs `op` until it succeeds, fails with an error that is not
    /// [retryable](Retryable::is_retryable), or has been tried
    /// [`max_attempts`](Self::max_attempts) times; returns its last result.
    /// Between attempts it waits the error's
    /// [`retry_after`](Retryable::retry_after) (capped at
    /// [`max_retry_after`](Self::max_retry_after)), else the jittered
    /// backoff ([`jittered_delay`](Self::jittered_delay)). A
    /// [`StreamError`] is judged exactly as a turn's failed attempt is
    /// ([`next_delay`](Self::next_delay): the [hook](Self::with_hook)
    /// first). Waits use tokio's clock, so a test with a paused clock runs
    /// them at once.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// use std::time::Duration;
    /// use warden_core::{RetryPolicy, StreamError};
    ///
    /// let policy = RetryPolicy::default().with_backoff(Duration::from_millis(50), Duration::from_secs(2));
    /// let mut calls = 0;
    /// let answer: Result<&str, StreamError> = policy
    ///     .retry(|| {
    ///         calls += 1;
    ///         let n = calls;
    ///         async move {
    ///             if n < 3 {
    ///                 Err(StreamError::Connection { message: "refused".into() })
    ///             } else {
    ///                 Ok("answer")
    ///             }
    ///         }
    ///     })
    ///     .await;
    /// assert_eq!(answer.ok(), Some("answer"));
    /// # }
    /// ```
    pub async fn retry<T, E, F, Fut>(&self, op: F) -> Result<T, E>
    where
        E: Retryable + 'static,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let decide = |error: &E, attempts: u32| {
            if let Some(stream) = (error as &dyn Any).downcast_ref::<StreamError>() {
                return self.delay_after(attempts, stream);
            }
            if attempts >= self.max_attempts || !error.is_retryable() {
                return None;
            }
            Some(match error.retry_after() {
                Some(wait) => wait.min(self.max_retry_after),
                None => self.jittered_delay(attempts, &mut rand::rng()),
            })
        };
        self.run(decide, op).await
    }

    /// [`retry`](Self::retry) for any error, `retryable` saying which are
    /// worth another attempt (asked after each failure but the last, with
    /// the error; it may log the retry). The policy's jittered backoff
    /// separates attempts; the hook and `retry-after` are not consulted.
    pub async fn retry_if<T, E, F, Fut>(
        &self,
        mut retryable: impl FnMut(&E) -> bool,
        op: F,
    ) -> Result<T, E>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let decide = |error: &E, attempts: u32| {
            (attempts < self.max_attempts && retryable(error))
                .then(|| self.jittered_delay(attempts, &mut rand::rng()))
        };
        self.run(decide, op).await
    }

    /// Runs `op`, asking `decide` after each failure (with the attempts
    /// made so far) for the wait before the next attempt, or `None` to
    /// return the error.
    async fn run<T, E, F, Fut>(
        &self,
        mut decide: impl FnMut(&E, u32) -> Option<Duration>,
        mut op: F,
    ) -> Result<T, E>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let mut attempts = 0;
        loop {
            attempts += 1;
            let error = match op().await {
                Ok(value) => return Ok(value),
                Err(error) => error,
            };
            match decide(&error, attempts) {
                Some(wait) => tokio::time::sleep(wait).await,
                None => return Err(error),
            }
        }
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
    /// An operation that fails with `errors` in turn, then answers, and
    /// counts its calls.
    fn failing<'a, E: Clone + 'a>(
        errors: Vec<E>,
        calls: &'a std::cell::Cell<u32>,
    ) -> impl FnMut() -> std::future::Ready<Result<u32, E>> + 'a {
        move || {
            let n = calls.get();
            calls.set(n + 1);
            std::future::ready(match errors.get(n as usize) {
                Some(e) => Err(e.clone()),
                None => Ok(n + 1),
            })
        }
    }

    fn store_down() -> TurnStoreError {
        TurnStoreError::Failed("down".into())
    }

    #[tokio::test(start_paused = true)]
    async fn retry_waits_the_backoff_between_attempts_and_returns_the_first_success() {
        let p = RetryPolicy::default()
            .with_backoff(Duration::from_millis(100), Duration::from_secs(1))
            .with_jitter(0.0);
        let calls = std::cell::Cell::new(0);
        let t0 = tokio::time::Instant::now();
        let got = p
            .retry(failing(vec![store_down(), store_down()], &calls))
            .await;
        assert_eq!(got.ok(), Some(3));
        assert_eq!(calls.get(), 3);
        assert_eq!(t0.elapsed(), Duration::from_millis(300));
    }

    #[tokio::test(start_paused = true)]
    async fn retry_gives_up_after_max_attempts_with_the_last_error_and_no_wait_after_it() {
        let p = RetryPolicy::default()
            .with_backoff(Duration::from_millis(100), Duration::from_millis(100))
            .with_jitter(0.0)
            .with_max_attempts(3);
        let errors: Vec<_> = (1..=5)
            .map(|n| TurnStoreError::Failed(n.to_string()))
            .collect();
        let calls = std::cell::Cell::new(0);
        let t0 = tokio::time::Instant::now();
        let got = p.retry(failing(errors, &calls)).await;
        assert!(
            matches!(got, Err(TurnStoreError::Failed(ref n)) if n == "3"),
            "{got:?}"
        );
        assert_eq!(calls.get(), 3);
        assert_eq!(t0.elapsed(), Duration::from_millis(200));
    }

    #[tokio::test(start_paused = true)]
    async fn a_final_error_is_returned_at_once() {
        let calls = std::cell::Cell::new(0);
        let t0 = tokio::time::Instant::now();
        let moved = TurnStoreError::Moved("lease lost".into());
        let got = RetryPolicy::default()
            .retry(failing(vec![moved], &calls))
            .await;
        assert!(matches!(got, Err(TurnStoreError::Moved(_))));
        assert_eq!(calls.get(), 1);
        assert_eq!(t0.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn an_io_error_is_retried_when_the_connection_broke_and_final_when_the_input_is_wrong() {
        use std::io::{Error, ErrorKind};
        let p = RetryPolicy::default()
            .with_backoff(Duration::from_millis(10), Duration::from_millis(10))
            .with_jitter(0.0);
        let calls = std::cell::Cell::new(0);
        let got = p
            .retry(|| {
                calls.set(calls.get() + 1);
                let n = calls.get();
                async move {
                    match n {
                        1 => Err(Error::from(ErrorKind::ConnectionReset)),
                        2 => Err(Error::from(ErrorKind::TimedOut)),
                        _ => Ok(n),
                    }
                }
            })
            .await;
        assert_eq!(got.ok(), Some(3), "reset and timeout are retried");
        calls.set(0);
        let got: Result<u32, Error> = p
            .retry(|| {
                calls.set(calls.get() + 1);
                async { Err(Error::from(ErrorKind::PermissionDenied)) }
            })
            .await;
        assert_eq!(got.map_err(|e| e.kind()), Err(ErrorKind::PermissionDenied));
        assert_eq!(calls.get(), 1, "a denied permission is final");
    }

    #[tokio::test(start_paused = true)]
    async fn the_backoff_is_jittered_downwards_only() {
        let p = RetryPolicy::default().with_backoff(Duration::from_secs(1), Duration::from_secs(1));
        let mut seen_below = false;
        for _ in 0..50 {
            let calls = std::cell::Cell::new(0);
            let t0 = tokio::time::Instant::now();
            let got = p.retry(failing(vec![store_down()], &calls)).await;
            assert!(got.is_ok());
            let waited = t0.elapsed();
            assert!(waited <= Duration::from_secs(1), "{waited:?}");
            assert!(waited >= Duration::from_millis(750), "{waited:?}");
            seen_below |= waited < Duration::from_secs(1);
        }
        assert!(seen_below, "jitter never applied");
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_after_is_waited_and_capped() {
        let api = |secs| StreamError::Api {
            status: Some(429),
            kind: "rate_limit_error".into(),
            message: "slow down".into(),
            retryable: true,
            retry_after: Some(Duration::from_secs(secs)),
        };
        for (asked, waited) in [(3, 3), (3600, 60)] {
            let calls = std::cell::Cell::new(0);
            let t0 = tokio::time::Instant::now();
            let got = RetryPolicy::default()
                .retry(failing(vec![api(asked)], &calls))
                .await;
            assert!(got.is_ok());
            assert_eq!(t0.elapsed(), Duration::from_secs(waited));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_hook_judges_a_stream_error_first() {
        let fatal = RetryPolicy::default().with_hook(|_, _| RetryVerdict::Fatal);
        let calls = std::cell::Cell::new(0);
        let got = fatal.retry(failing(vec![timeout()], &calls)).await;
        assert!(got.is_err());
        assert_eq!(calls.get(), 1);
        let malformed = StreamError::Malformed {
            message: "x".into(),
        };
        let retry = RetryPolicy::default()
            .with_hook(|_, _| RetryVerdict::RetryAfter(Duration::from_secs(5)));
        let calls = std::cell::Cell::new(0);
        let t0 = tokio::time::Instant::now();
        let got = retry.retry(failing(vec![malformed], &calls)).await;
        assert_eq!(got.ok(), Some(2));
        assert_eq!(t0.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn retry_if_asks_its_closure_after_each_failure_but_the_last() {
        let p = RetryPolicy::default()
            .with_backoff(Duration::from_millis(10), Duration::from_millis(10))
            .with_max_attempts(4);
        let asked = std::cell::Cell::new(0);
        let calls = std::cell::Cell::new(0);
        let got = p
            .retry_if(
                |e: &&str| {
                    asked.set(asked.get() + 1);
                    *e == "busy"
                },
                failing(vec!["busy"; 10], &calls),
            )
            .await;
        assert_eq!(got, Err("busy"));
        assert_eq!((calls.get(), asked.get()), (4, 3));
        let calls = std::cell::Cell::new(0);
        let got = p
            .retry_if(|e: &&str| *e == "busy", failing(vec!["gone"], &calls))
            .await;
        assert_eq!((got, calls.get()), (Err("gone"), 1));
    }
}
