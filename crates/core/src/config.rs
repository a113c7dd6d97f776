//! Environment overrides, read in one place.
//!
//! | variable | meaning | accepted | default |
//! |---|---|---|---|
//! | `WARDEN_STREAM_TIMEOUT` | stream silence allowance, milliseconds | integer `1..=86_400_000` | `45000` |
//! | `WARDEN_PROGRESS_TIMEOUT` | progress allowance (no content while only keep-alives arrive), milliseconds | integer `1..=86_400_000` | off |
//! | `WARDEN_TURN_DEADLINE` | wall-clock cap of one turn, milliseconds | integer `1..=86_400_000` | off |
//!
//! An invalid value is a [`ConfigError`], never a panic and never "no
//! watchdog": `abc`, `0`, `-5`, `1.5` or a value above one day are all
//! rejected with a message that names the variable and the accepted range.

use std::time::Duration;

use crate::error::ConfigError;

/// Name of the stream-timeout environment variable (milliseconds).
pub const STREAM_TIMEOUT_ENV: &str = "WARDEN_STREAM_TIMEOUT";

/// The default stream silence allowance: 45 s.
///
/// Anthropic sends `ping` frames every 15-30 s even during long thinking,
/// so 45 s of total silence means the connection is gone.
pub const DEFAULT_STREAM_TIMEOUT: Duration = Duration::from_secs(45);

/// The largest accepted stream timeout: one day. Anything longer is almost
/// certainly a unit mistake (seconds typed as microseconds) and would in
/// effect disable the watchdog.
pub const MAX_STREAM_TIMEOUT: Duration = Duration::from_secs(24 * 60 * 60);

/// Checks that `timeout` is a usable silence allowance (`1 ms ..= 1 day`).
pub fn validate_timeout(what: &'static str, timeout: Duration) -> Result<Duration, ConfigError> {
    if timeout < Duration::from_millis(1) {
        return Err(ConfigError::InvalidValue {
            what,
            reason: format!("{timeout:?} is below 1 ms; a zero timeout would disable the watchdog"),
        });
    }
    if timeout > MAX_STREAM_TIMEOUT {
        return Err(ConfigError::InvalidValue {
            what,
            reason: format!("{timeout:?} is above the maximum of 24 h"),
        });
    }
    Ok(timeout)
}

/// Name of the progress-allowance environment variable (milliseconds).
pub const PROGRESS_TIMEOUT_ENV: &str = "WARDEN_PROGRESS_TIMEOUT";

/// Name of the turn-deadline environment variable (milliseconds).
pub const TURN_DEADLINE_ENV: &str = "WARDEN_TURN_DEADLINE";

/// Parses a `WARDEN_STREAM_TIMEOUT` value (milliseconds).
pub fn parse_stream_timeout(value: &str) -> Result<Duration, ConfigError> {
    parse_millis(STREAM_TIMEOUT_ENV, value)
}

/// An optional allowance from variable `var` (`WARDEN_PROGRESS_TIMEOUT`,
/// `WARDEN_TURN_DEADLINE`): `None` when unset or empty, else whole
/// milliseconds in `1..=86400000`.
pub fn optional_millis_from(
    var: &'static str,
    lookup: impl FnOnce(&str) -> Option<String>,
) -> Result<Option<Duration>, ConfigError> {
    match lookup(var) {
        Some(v) if !v.trim().is_empty() => parse_millis(var, &v).map(Some),
        _ => Ok(None),
    }
}

/// Parses whole milliseconds in `1..=86400000` from variable `var`.
fn parse_millis(var: &'static str, value: &str) -> Result<Duration, ConfigError> {
    let invalid = |reason: &str| ConfigError::InvalidEnv {
        var,
        value: value.to_owned(),
        reason: format!("{reason}; expected whole milliseconds in 1..=86400000"),
    };
    let trimmed = value.trim();
    if trimmed.starts_with('-') {
        return Err(invalid("negative"));
    }
    let ms: u64 = trimmed.parse().map_err(|_| invalid("not an integer"))?;
    if ms == 0 {
        return Err(invalid("zero would disable the watchdog"));
    }
    let timeout = Duration::from_millis(ms);
    if timeout > MAX_STREAM_TIMEOUT {
        return Err(invalid("above one day"));
    }
    Ok(timeout)
}

/// The stream timeout from a variable lookup: `lookup(STREAM_TIMEOUT_ENV)`,
/// or [`DEFAULT_STREAM_TIMEOUT`] when unset or empty.
pub fn stream_timeout_from(
    lookup: impl FnOnce(&str) -> Option<String>,
) -> Result<Duration, ConfigError> {
    match lookup(STREAM_TIMEOUT_ENV) {
        Some(v) if !v.trim().is_empty() => parse_stream_timeout(&v),
        _ => Ok(DEFAULT_STREAM_TIMEOUT),
    }
}

/// The stream timeout from the process environment (see the module docs).
pub fn stream_timeout_from_env() -> Result<Duration, ConfigError> {
    stream_timeout_from(|k| std::env::var(k).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bounds_are_one_millisecond_and_one_day_inclusive() {
        assert_eq!(MAX_STREAM_TIMEOUT, Duration::from_millis(86_400_000));
        assert!(validate_timeout("t", MAX_STREAM_TIMEOUT).is_ok());
        assert!(validate_timeout("t", MAX_STREAM_TIMEOUT + Duration::from_nanos(1)).is_err());
        assert!(validate_timeout("t", Duration::from_millis(1)).is_ok());
        assert!(validate_timeout("t", Duration::from_micros(999)).is_err());
    }

    #[test]
    fn default_is_45_seconds_when_unset_or_empty() {
        assert_eq!(stream_timeout_from(|_| None), Ok(Duration::from_secs(45)));
        assert_eq!(
            stream_timeout_from(|_| Some(" ".into())),
            Ok(Duration::from_secs(45))
        );
    }

    #[test]
    fn env_value_overrides_the_default() {
        let got = stream_timeout_from(|k| {
            assert_eq!(k, "WARDEN_STREAM_TIMEOUT");
            Some("10000".into())
        });
        assert_eq!(got, Ok(Duration::from_secs(10)));
    }

    #[test]
    fn invalid_env_values_are_clear_errors() {
        for bad in [
            "abc",
            "0",
            "-5",
            "1.5",
            "86400001",
            "99999999999999999999999",
        ] {
            let err = parse_stream_timeout(bad).expect_err(bad);
            let msg = err.to_string();
            assert!(msg.contains("WARDEN_STREAM_TIMEOUT"), "{msg}");
            assert!(msg.contains("1..=86400000"), "{msg}");
        }
    }

    #[test]
    fn optional_allowances_are_off_when_unset_and_checked_when_set() {
        assert_eq!(
            optional_millis_from(PROGRESS_TIMEOUT_ENV, |_| None),
            Ok(None)
        );
        assert_eq!(
            optional_millis_from(TURN_DEADLINE_ENV, |k| {
                assert_eq!(k, "WARDEN_TURN_DEADLINE");
                Some("600000".into())
            }),
            Ok(Some(Duration::from_secs(600)))
        );
        let err = optional_millis_from(PROGRESS_TIMEOUT_ENV, |_| Some("0".into()))
            .expect_err("zero")
            .to_string();
        assert!(err.contains("WARDEN_PROGRESS_TIMEOUT"), "{err}");
    }

    #[test]
    fn validate_rejects_zero_and_huge() {
        assert!(validate_timeout("t", Duration::ZERO).is_err());
        assert!(validate_timeout("t", Duration::from_secs(86_401)).is_err());
        assert!(validate_timeout("t", Duration::from_millis(1)).is_ok());
    }
}
