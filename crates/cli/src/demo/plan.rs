//! What the demo runs: its timings, derived from the watchdog timeout, and
//! each workspace's plan (its scenarios, stored state and messages).

use std::time::Duration;

use warden_mock::Scenario;

/// Every duration of the demo, derived from the watchdog timeout.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timings {
    pub(crate) timeout: Duration,
    pub(crate) thinking: Duration,
    pub(crate) ping: Duration,
    pub(crate) retry_after: Duration,
    pub(crate) idle: Duration,
    pub(crate) backoff: Duration,
    pub(crate) frame: Duration,
    pub(crate) between_turns: Duration,
}

impl Timings {
    pub(crate) fn new(timeout: Duration, quick: bool) -> Self {
        Self {
            timeout,
            thinking: timeout.mul_f64(2.5),
            ping: timeout / 4,
            retry_after: timeout / 2,
            idle: timeout.mul_f64(1.5),
            backoff: timeout / 8,
            frame: if quick {
                Duration::from_millis(3)
            } else {
                Duration::from_millis(15)
            },
            between_turns: if quick { Duration::ZERO } else { timeout / 3 },
        }
    }
}

/// How a workspace's stored state starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seed {
    /// Nothing stored.
    Empty,
    /// A conversation id whose transcript no longer exists.
    MissingTranscript,
    /// A conversation whose transcript is too long to send.
    OversizedTranscript,
}

/// One workspace of the demo.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) name: &'static str,
    /// The scenario of each request, in order (the last repeats).
    pub(crate) script: Vec<Scenario>,
    pub(crate) seed: Seed,
    /// Each message and the pause before it.
    pub(crate) messages: Vec<(Duration, &'static str)>,
}

/// The demo's workspaces and what happens to each.
pub(crate) fn plans(t: &Timings) -> Vec<Plan> {
    let gap = t.between_turns;
    vec![
        Plan {
            name: "api-server",
            script: vec![Scenario::Stall, Scenario::Normal],
            seed: Seed::Empty,
            messages: vec![
                (Duration::ZERO, "Why does the integration test hang?"),
                (gap, "Add a timeout to the HTTP client."),
                (gap, "Write a regression test for it."),
            ],
        },
        Plan {
            name: "docs-site",
            script: vec![Scenario::ThinkingPings, Scenario::Normal],
            seed: Seed::Empty,
            messages: vec![
                (
                    Duration::ZERO,
                    "Plan the move of the docs to the new generator.",
                ),
                (gap, "Start with the navigation."),
            ],
        },
        Plan {
            name: "billing",
            script: vec![Scenario::RateLimited, Scenario::Normal],
            seed: Seed::Empty,
            messages: vec![
                (Duration::ZERO, "Summarise the failing invoice job."),
                (gap, "Propose a fix."),
            ],
        },
        Plan {
            name: "legacy-app",
            script: vec![Scenario::Normal],
            seed: Seed::MissingTranscript,
            messages: vec![
                (Duration::ZERO, "Where were we with the upgrade?"),
                (gap, "Continue with the next step."),
            ],
        },
        Plan {
            name: "monorepo",
            script: vec![Scenario::PromptTooLong, Scenario::Normal],
            seed: Seed::OversizedTranscript,
            messages: vec![
                (Duration::ZERO, "Continue the refactor."),
                (gap, "Run the linters."),
            ],
        },
        Plan {
            name: "mobile-app",
            script: vec![Scenario::Normal],
            seed: Seed::Empty,
            messages: vec![
                (Duration::ZERO, "Draft the release notes."),
                // Idle past the reap timeout (with a timeout's margin for a
                // busy machine's timers): the session is stopped, then
                // resumed from the store by this message.
                (
                    t.idle + t.timeout,
                    "Add a section on the new settings screen.",
                ),
            ],
        },
    ]
}
