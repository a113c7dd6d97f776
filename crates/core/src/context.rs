//! The context indicator: how full the agent's context window is.
//!
//! Tokens in context = input + cache creation + cache read of the **last**
//! usage report of a turn, not the per-turn sum (which counts cache reads
//! once per sub-call and can exceed the window). The window comes from the
//! agent when it reports one with a turn (Claude Code's
//! `modelUsage.*.contextWindow`), else from the source's knowledge of the
//! model ([`EventSource::context_window`](crate::EventSource::context_window);
//! Claude Code's `[1m]` names are 1,000,000), else [`DEFAULT_WINDOW`];
//! [`ContextConfig::window`] overrides all of them.

use derive_setters::Setters;

/// Context window when neither the agent nor its source says otherwise.
pub const DEFAULT_WINDOW: u64 = 200_000;

/// The instruction appended to the system prompt for the self-report track.
pub const SELF_REPORT_INSTRUCTION: &str = "At the very end of every response, append your own estimate of how full your context window is, in the exact form [ctx: ~NN%].";

/// Context usage at the end of a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextReport {
    /// Tokens in context (input + cache creation + cache read of the last
    /// usage report).
    pub tokens: u64,
    /// The window measured against.
    pub window: u64,
    /// Percent, rounded.
    pub percent: u32,
    /// The agent's own estimate, when the self-report track is on.
    pub self_reported: Option<u32>,
}

/// Context indicator settings.
#[derive(Debug, Clone, PartialEq, Eq, Setters)]
#[setters(prefix = "with_", strip_option)]
#[non_exhaustive]
pub struct ContextConfig {
    /// Append `[ctx: NN%]` to relayed text. Default `true`.
    pub indicator: bool,
    /// Fixed window, overriding the agent's and the model's. Default `None`.
    pub window: Option<u64>,
    /// Ask the agent for `[ctx: ~NN%]` (appended system prompt), strip it
    /// from relayed text and log it next to the measured value. Default
    /// `false`.
    pub self_report: bool,
}

impl Default for ContextConfig {
    fn default() -> Self {
        Self {
            indicator: true,
            window: None,
            self_report: false,
        }
    }
}

/// `tokens / window` in whole percent, rounded half up. A zero window is 0 %.
pub fn percent(tokens: u64, window: u64) -> u32 {
    if window == 0 {
        return 0;
    }
    let p = (u128::from(tokens) * 100 + u128::from(window) / 2) / u128::from(window);
    u32::try_from(p).unwrap_or(u32::MAX)
}

/// The indicator text: `[ctx: NN%]`.
pub fn indicator(percent: u32) -> String {
    format!("[ctx: {percent}%]")
}

/// Finds the agent's last `[ctx: ~NN%]` self-report in `text` and returns
/// the text without every such marker, and the last value.
pub fn strip_self_report(text: &str) -> (String, Option<u32>) {
    let mut out = String::with_capacity(text.len());
    let mut last = None;
    let mut rest = text;
    while let Some(start) = rest.find("[ctx: ~") {
        let after = &rest[start + "[ctx: ~".len()..];
        let digits = after.chars().take_while(char::is_ascii_digit).count();
        let tail = &after[digits..];
        if digits > 0 && digits <= 3 && tail.starts_with("%]") {
            out.push_str(&rest[..start]);
            last = after[..digits].parse().ok();
            rest = &tail[2..];
        } else {
            out.push_str(&rest[..start + 1]);
            rest = &rest[start + 1..];
        }
    }
    out.push_str(rest);
    let trimmed = out.trim_end().len();
    out.truncate(trimmed);
    (out, last)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Usage;

    #[test]
    fn a_self_report_needs_one_to_three_digits_and_its_closing() {
        assert_eq!(strip_self_report("a [ctx: ~7%]"), ("a".into(), Some(7)));
        assert_eq!(strip_self_report("a [ctx: ~100%]"), ("a".into(), Some(100)));
        // Not markers: no digits, four digits, no `%]`.
        for text in ["a [ctx: ~%]", "a [ctx: ~1000%]", "a [ctx: ~12]"] {
            assert_eq!(strip_self_report(text), (text.into(), None), "{text}");
        }
        // The last of several wins; every marker is stripped.
        assert_eq!(
            strip_self_report("[ctx: ~1%]x [ctx: ~2%] y"),
            ("x  y".into(), Some(2))
        );
    }

    #[test]
    fn context_counts_input_and_both_cache_fields_of_the_last_report() {
        let last = Usage {
            input_tokens: 3,
            cache_creation_input_tokens: 200,
            cache_read_input_tokens: 14_000,
            output_tokens: 1,
        };
        assert_eq!(last.context_tokens(), 14_203);
        assert_eq!(percent(last.context_tokens(), DEFAULT_WINDOW), 7);
        assert_eq!(percent(124_000, DEFAULT_WINDOW), 62);
        assert_eq!(percent(124_000, 1_000_000), 12);
        assert_eq!(percent(1, 0), 0);
        assert_eq!(percent(99_999, 200_000), 50, "rounds half up");
    }

    #[test]
    fn self_report_is_parsed_and_stripped() {
        let (t, v) = strip_self_report("Here it is.\n[ctx: ~40%]");
        assert_eq!((t.as_str(), v), ("Here it is.", Some(40)));
        let (t, v) = strip_self_report("a [ctx: ~1%] b [ctx: ~55%]");
        assert_eq!((t.as_str(), v), ("a  b", Some(55)));
        let (t, v) = strip_self_report("no marker [ctx: 40%] [ctx: ~x%]");
        assert_eq!((t.as_str(), v), ("no marker [ctx: 40%] [ctx: ~x%]", None));
        assert_eq!(indicator(62), "[ctx: 62%]");
    }
}
