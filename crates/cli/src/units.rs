//! Durations on the command line, read one way by every command: a number
//! with a unit (`500ms`, `45s`, `1.5s`, `2m`, `1h`), or a bare number in the
//! flag's documented unit — milliseconds for timeouts (as
//! `WARDEN_STREAM_TIMEOUT`), seconds for grace periods, lease TTLs and how
//! long events are kept.

use std::time::Duration;

use warden_core::config::{BareUnit, parse_duration};

/// A duration flag whose bare number is milliseconds.
pub(crate) fn millis(value: &str) -> Result<Duration, String> {
    parse_duration(value, BareUnit::Millis)
}

/// A duration flag whose bare number is seconds.
pub(crate) fn seconds(value: &str) -> Result<Duration, String> {
    parse_duration(value, BareUnit::Seconds)
}
