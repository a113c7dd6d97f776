//! Environment overrides, read in one place.
//!
//! | variable | meaning | accepted | default |
//! |---|---|---|---|
//! | `WARDEN_STREAM_TIMEOUT` | stream silence allowance | milliseconds `1..=86_400_000`, or a duration with a unit | `45000` |
//! | `WARDEN_PROGRESS_TIMEOUT` | progress allowance (no content while only keep-alives arrive) | the same | off |
//! | `WARDEN_TURN_DEADLINE` | wall-clock cap of one turn | the same | off |
//!
//! A bare number is whole milliseconds; a number with a unit — `500ms`,
//! `45s`, `1.5s`, `2m`, `1h` — means what it says ([`parse_duration`], which
//! the `warden` command uses for every duration flag too). An invalid value
//! is a [`ConfigError`], never a panic and never "no watchdog": `abc`, `0`,
//! `-5`, `1.5` (a fraction of a bare millisecond), `45x` or a value above one
//! day are all rejected with a message that names the variable and the
//! accepted forms.

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

/// What a bare number (no unit) means to [`parse_duration`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BareUnit {
    /// Whole milliseconds (`45000`); a fraction is refused.
    Millis,
    /// Seconds, fractions allowed (`10`, `0.5`).
    Seconds,
}

/// Parses a duration: a number with a unit (`500ms`, `45s`, `1.5s`, `2m`,
/// `1h`; fractions allowed), or a bare number in `bare` units. Negative
/// values, unknown units and values that do not fit are errors (the
/// message says which); zero is allowed here — callers decide whether it
/// means something.
pub fn parse_duration(value: &str, bare: BareUnit) -> Result<Duration, String> {
    let v = value.trim();
    if v.starts_with('-') {
        return Err(format!("{v:?} is negative"));
    }
    let split = v
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(v.len());
    let (number, unit) = v.split_at(split);
    if number.is_empty() {
        return Err(format!("{v:?} is not a number"));
    }
    let scale = match (unit.trim(), bare) {
        ("", BareUnit::Millis) => {
            let ms: u64 = number
                .parse()
                .map_err(|_| format!("{v:?} is not a whole number of milliseconds"))?;
            return Ok(Duration::from_millis(ms));
        }
        ("", BareUnit::Seconds) | ("s", _) => 1.0,
        ("ms", _) => 0.001,
        ("m", _) => 60.0,
        ("h", _) => 3600.0,
        (other, _) => return Err(format!("unknown unit {other:?} (use ms, s, m or h)")),
    };
    let n: f64 = number
        .parse()
        .map_err(|_| format!("{number:?} is not a number"))?;
    Duration::try_from_secs_f64(n * scale).map_err(|_| format!("{v:?} is too large"))
}

/// Parses a duration in `1 ms ..= 1 day` from variable `var` (a bare
/// number is milliseconds).
fn parse_millis(var: &'static str, value: &str) -> Result<Duration, ConfigError> {
    let invalid = |reason: &str| ConfigError::InvalidEnv {
        var,
        value: value.to_owned(),
        reason: format!(
            "{reason}; expected whole milliseconds in 1..=86400000, or a duration with a unit (45s, 500ms, 2m)"
        ),
    };
    let timeout = parse_duration(value, BareUnit::Millis).map_err(|e| invalid(&e))?;
    if timeout < Duration::from_millis(1) {
        return Err(invalid("under a millisecond would disable the watchdog"));
    }
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
    fn units_mean_what_they_say_and_a_bare_number_is_milliseconds() {
        for (value, want) in [
            ("45000", Duration::from_secs(45)),
            ("45s", Duration::from_secs(45)),
            (" 500ms ", Duration::from_millis(500)),
            ("1.5s", Duration::from_millis(1500)),
            ("2m", Duration::from_secs(120)),
            ("1h", Duration::from_secs(3600)),
        ] {
            assert_eq!(parse_stream_timeout(value), Ok(want), "{value}");
        }
        assert_eq!(
            parse_duration("0.5", BareUnit::Seconds),
            Ok(Duration::from_millis(500))
        );
        assert_eq!(
            parse_duration("10", BareUnit::Seconds),
            Ok(Duration::from_secs(10))
        );
        assert!(parse_duration("10", BareUnit::Millis).is_ok_and(|d| d.as_millis() == 10));
    }

    #[test]
    fn invalid_env_values_are_clear_errors() {
        for bad in [
            "abc",
            "0",
            "0s",
            "-5",
            "1.5",
            "45x",
            "s",
            "86400001",
            "25h",
            "99999999999999999999999",
        ] {
            let err = parse_stream_timeout(bad).expect_err(bad);
            let msg = err.to_string();
            assert!(msg.contains("WARDEN_STREAM_TIMEOUT"), "{msg}");
            assert!(msg.contains("1..=86400000") && msg.contains("45s"), "{msg}");
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
