//! Section 14's stalled turns: one turn per run whose first model stream
//! stalls mid-text (`warden mock`'s `stall` after some of the reply's
//! frames, then a normal reply), at an 8 s stream timeout, through each
//! agent CLI with the wire layer (the stall continued at 4 s inside the
//! CLI's own request) and without it (the process watchdog kills the CLI
//! at 8 s and the turn runs again), the two alternating, a few runs each:
//! the medians of the seconds to the whole reply and of the output tokens
//! the mock generated, as ratios.

use std::path::Path;
use std::time::Duration;

use warden_mock::{MockConfig, MockServer, Scenario};

use super::setup::{Cli, median, ratio, supervisor, turn, wire};

/// The stream timeout of the stalled turns.
const TIMEOUT: Duration = Duration::from_secs(8);

/// One stalled turn's figures.
#[derive(Clone, Copy, Default)]
struct Run {
    took: Duration,
    /// Output tokens the mock generated, every request of the turn.
    tokens: u64,
    /// Model requests the mock answered.
    requests: usize,
    /// Of them, continuations of a broken reply.
    continuations: usize,
}

/// How many of the reply's frames the mock sends before it stalls, so the
/// stall is mid-text for `cli`'s API (as the real-CLI tests have it):
/// Codex's Responses stream after its response, item, part and two text
/// deltas; Gemini's after two of its three frames; Claude Code's the
/// mock's default (after the first text delta).
fn frames_before_the_stall(cli: Cli) -> Option<usize> {
    match cli {
        Cli::ClaudeCode => None,
        Cli::Codex => Some(6),
        Cli::Gemini => Some(2),
        Cli::OpenCode | Cli::Kilo | Cli::Qwen | Cli::Aider => Some(3),
    }
}

/// One turn of `cli` whose first stream stalls mid-text, through the wire
/// when `via_wire`, in a home and workspace of its own under `base`.
async fn stalled_turn(cli: Cli, bin: &Path, via_wire: bool, base: &Path) -> Result<Run, String> {
    let mut config = MockConfig::default().with_sequence([Scenario::Stall, Scenario::Normal]);
    if let Some(frames) = frames_before_the_stall(cli) {
        config = config.with_fault_after_frames(frames);
    }
    let mock = MockServer::start(config)
        .await
        .map_err(|e| format!("the mock did not start: {e}"))?;
    let api = if via_wire {
        wire(&mock.base_url(), TIMEOUT)
            .await
            .map_err(|e| format!("the wire did not start: {e}"))?
    } else {
        mock.base_url()
    };
    let workspace = base.join("project");
    std::fs::create_dir_all(&workspace).map_err(|e| e.to_string())?;
    let sup = supervisor(cli.factory(bin, &api, base)?, TIMEOUT).await?;
    let took = turn(&sup, &workspace, "say hi").await;
    sup.shutdown().await;
    let journal = mock.requests();
    mock.shutdown().await;
    let generating: Vec<_> = journal
        .iter()
        .filter(|r| r.output_tokens.is_some())
        .collect();
    Ok(Run {
        took: took?,
        tokens: generating.iter().filter_map(|r| r.output_tokens).sum(),
        requests: generating.len(),
        continuations: generating
            .iter()
            .filter(|r| r.continuation.is_some())
            .count(),
    })
}

/// `runs`' medians and the range of their times.
fn summary(runs: &[Run]) -> (Duration, Duration, Duration, u64, usize, usize) {
    let times: Vec<Duration> = runs.iter().map(|r| r.took).collect();
    let min = times.iter().min().copied().unwrap_or_default();
    let max = times.iter().max().copied().unwrap_or_default();
    let tokens: Vec<u64> = runs.iter().map(|r| r.tokens).collect();
    let requests: Vec<usize> = runs.iter().map(|r| r.requests).collect();
    let continuations: Vec<usize> = runs.iter().map(|r| r.continuations).collect();
    (
        median(&times),
        min,
        max,
        median(&tokens),
        median(&requests),
        median(&continuations),
    )
}

/// Runs the stalled turns of every CLI whose binary is set, `reps` each
/// way, under `dir`.
pub(super) async fn stalled_through_the_wire(dir: &Path, reps: usize) {
    println!(
        "\nA turn whose stream stalls mid-text ({}s stream timeout, the wire acting at {}s): \
         through the wire layer vs without it, {reps} runs each way alternating, medians",
        TIMEOUT.as_secs(),
        TIMEOUT.as_secs() / 2
    );
    println!(
        "| agent | to the whole reply, wire / without (s) | min–max, wire / without (s) \
         | output tokens upstream, wire / without | requests (continuations), wire / without \
         | time wire ÷ without | tokens wire ÷ without |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for cli in Cli::STALLED {
        let bin = match cli.binary() {
            Ok(bin) => bin,
            Err(why) => {
                println!("| {} | skipped: {why} | | | | | |", cli.name());
                continue;
            }
        };
        let (mut wired, mut without) = (Vec::new(), Vec::new());
        let mut failed = None;
        'runs: for rep in 0..reps {
            // Alternating which goes first, so neither always runs on the
            // other's warm caches.
            let order = if rep % 2 == 0 {
                [true, false]
            } else {
                [false, true]
            };
            for via_wire in order {
                let arm = if via_wire { "wire" } else { "without" };
                let base = dir.join(format!("{}-{arm}-{rep}", cli.name()));
                match stalled_turn(cli, &bin, via_wire, &base).await {
                    Ok(run) if via_wire => wired.push(run),
                    Ok(run) => without.push(run),
                    Err(e) => {
                        failed = Some(format!("run {rep} {arm}: {e}"));
                        break 'runs;
                    }
                }
            }
        }
        if let Some(why) = failed {
            println!("| {} | failed: {why} | | | | | |", cli.name());
            continue;
        }
        let (w, s) = (summary(&wired), summary(&without));
        println!(
            "| {} | {:.1} / {:.1} | {:.1}–{:.1} / {:.1}–{:.1} | {} / {} | {} ({}) / {} ({}) | {} | {} |",
            cli.name(),
            w.0.as_secs_f64(),
            s.0.as_secs_f64(),
            w.1.as_secs_f64(),
            w.2.as_secs_f64(),
            s.1.as_secs_f64(),
            s.2.as_secs_f64(),
            w.3,
            s.3,
            w.4,
            w.5,
            s.4,
            s.5,
            ratio(w.0.as_secs_f64(), s.0.as_secs_f64()),
            ratio(w.3 as f64, s.3 as f64),
        );
    }
}
