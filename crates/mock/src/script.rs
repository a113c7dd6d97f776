//! From a scenario to the steps of a streamed body.
//!
//! Both APIs describe a normal stream as [`Frames`]; the scenario then cuts,
//! pads or corrupts that list the same way for both.

use std::time::Duration;

use hyper::body::Bytes;

use crate::body::Step;
use crate::{MockConfig, Scenario};

/// The frames of a normal stream (terminal frame last) and where the
/// scenario-specific frames go.
pub(crate) struct Frames {
    /// Every frame, in order; the last one is the terminal frame.
    pub(crate) frames: Vec<Bytes>,
    /// Index before which the `thinking-pings` pause is inserted.
    pub(crate) pause_at: usize,
    /// Index of the first text frame (where `oversized` inserts its frame).
    pub(crate) text_at: usize,
}

/// Frames of one API that only some scenarios need.
pub(crate) struct Extras {
    /// A keep-alive frame.
    pub(crate) ping: Bytes,
    /// The mid-stream error frame.
    pub(crate) error: Bytes,
    /// A frame whose data is not JSON.
    pub(crate) malformed: Bytes,
    /// The huge frame of `oversized` (empty for other scenarios).
    pub(crate) oversized: Bytes,
}

/// The body steps of `scenario` for a streamed response.
///
/// The HTTP-error scenarios never reach here; they play as a normal stream
/// if they do.
pub(crate) fn stream_steps(
    scenario: Scenario,
    normal: Frames,
    extras: Extras,
    config: &MockConfig,
) -> Vec<Step> {
    let Frames {
        frames,
        pause_at,
        text_at,
    } = normal;
    let interval = config.frame_interval;
    // Frames before a fault; never the terminal frame.
    let cut = config
        .fault_after_frames
        .min(frames.len().saturating_sub(1));
    match scenario {
        Scenario::ThinkingPings => {
            let at = pause_at.min(frames.len());
            let mut rest = frames;
            let tail = rest.split_off(at);
            let mut steps = paced(rest, interval);
            steps.extend(pings(
                config.thinking_pause,
                config.ping_interval,
                &extras.ping,
            ));
            steps.extend(paced(tail, interval));
            steps
        }
        Scenario::Stall => {
            let mut steps = paced(frames.into_iter().take(cut), interval);
            steps.push(Step::Hold);
            steps
        }
        Scenario::AbruptClose => {
            let mut steps = paced(frames.into_iter().take(cut), interval);
            steps.extend([Step::Sleep(interval), Step::Flush, Step::Abort]);
            steps
        }
        Scenario::EarlyEnd => paced(frames.into_iter().take(cut), interval),
        Scenario::MidstreamError => {
            let mut sent: Vec<Bytes> = frames.into_iter().take(cut).collect();
            sent.push(extras.error);
            paced(sent, interval)
        }
        Scenario::Malformed => {
            let mut all = frames;
            all.insert(cut, extras.malformed);
            paced(all, interval)
        }
        Scenario::Oversized => {
            let mut all = frames;
            all.insert(text_at.min(all.len()), extras.oversized);
            paced(all, interval)
        }
        _ => paced(frames, interval),
    }
}

/// The frames with `interval` between two of them (none before the first).
/// `frames` one `interval` apart, then silence with the socket open.
pub(crate) fn held(frames: Vec<Bytes>, interval: Duration) -> Vec<Step> {
    let mut steps = paced(frames, interval);
    steps.push(Step::Hold);
    steps
}

/// `frames` one `interval` apart, played through to the end (a re-attach).
pub(crate) fn paced_frames(frames: Vec<Bytes>, interval: Duration) -> Vec<Step> {
    paced(frames, interval)
}

fn paced(frames: impl IntoIterator<Item = Bytes>, interval: Duration) -> Vec<Step> {
    let mut steps = Vec::new();
    for (i, frame) in frames.into_iter().enumerate() {
        if i > 0 && !interval.is_zero() {
            steps.push(Step::Sleep(interval));
        }
        steps.push(Step::Frame(frame));
    }
    steps
}

/// A `pause` filled with a `ping` every `every` (no pings if zero).
fn pings(pause: Duration, every: Duration, ping: &Bytes) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut left = pause;
    if !every.is_zero() {
        while left >= every {
            steps.push(Step::Sleep(every));
            steps.push(Step::Frame(ping.clone()));
            left -= every;
        }
    }
    if !left.is_zero() {
        steps.push(Step::Sleep(left));
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;

    fn normal(n: usize) -> Frames {
        Frames {
            frames: (0..n).map(|i| Bytes::from(format!("f{i}"))).collect(),
            pause_at: 1,
            text_at: 2,
        }
    }

    fn extras() -> Extras {
        Extras {
            ping: Bytes::from_static(b"ping"),
            error: Bytes::from_static(b"error"),
            malformed: Bytes::from_static(b"bad"),
            oversized: Bytes::from_static(b"big"),
        }
    }

    fn sent(steps: &[Step]) -> Vec<String> {
        steps
            .iter()
            .filter_map(|s| match s {
                Step::Frame(b) => Some(String::from_utf8_lossy(b).into_owned()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn stall_never_sends_the_terminal_frame_even_with_a_large_cut() {
        let config = MockConfig::default().with_fault_after_frames(99);
        let steps = stream_steps(Scenario::Stall, normal(3), extras(), &config);
        assert_eq!(sent(&steps), ["f0", "f1"]);
        assert!(matches!(steps.last(), Some(Step::Hold)));
    }

    #[test]
    fn thinking_pause_is_filled_with_pings_after_the_first_frame() {
        let config = MockConfig::default()
            .with_thinking_pause(Duration::from_millis(100))
            .with_ping_interval(Duration::from_millis(30));
        let steps = stream_steps(Scenario::ThinkingPings, normal(3), extras(), &config);
        assert_eq!(sent(&steps), ["f0", "ping", "ping", "ping", "f1", "f2"]);
    }

    #[test]
    fn malformed_and_oversized_insert_one_frame_and_keep_the_rest() {
        let config = MockConfig::default().with_fault_after_frames(1);
        let steps = stream_steps(Scenario::Malformed, normal(3), extras(), &config);
        assert_eq!(sent(&steps), ["f0", "bad", "f1", "f2"]);
        let steps = stream_steps(Scenario::Oversized, normal(3), extras(), &config);
        assert_eq!(sent(&steps), ["f0", "f1", "big", "f2"]);
    }
}
