//! Section 14, `agents`: the per-turn cost of each agent CLI through warden
//! (issue #41) and of the wire layer under it (issue #47, and for OpenCode,
//! Kilo Code, Qwen Code and Aider issue #51). Claude Code
//! keeps one process per session and takes every turn over its stdin;
//! Codex (`codex exec`), Gemini and the chat-completions CLIs start a
//! process per turn. N trivial
//! turns per agent against an in-process `warden mock`, through a
//! supervisor, twice side by side: straight to the mock, and through the
//! wire layer (`warden_proxy` configured as `ProxyConfig::under_agent_cli`,
//! what `warden chat|serve` put under the CLI), a turn of each in turn.
//! Printed: the first turn (every CLI starts a process) and the median of
//! the later ones, straight against Claude Code's and through the wire
//! against the same CLI straight (issue #47: within 5 %). Then a turn
//! whose stream stalls mid-text, with the wire and without it
//! ([`stalled`], Claude Code, Codex and Gemini). An agent whose binary is
//! not configured (`WARDEN_CLAUDE_BIN`, `WARDEN_CODEX_BIN`,
//! `WARDEN_GEMINI_BIN`, `WARDEN_OPENCODE_BIN`, `WARDEN_KILO_BIN`,
//! `WARDEN_QWEN_BIN`, `WARDEN_AIDER_BIN`) is skipped with the reason
//! printed. The chat-completions CLIs run fewer turns (`Cli::turns`).

mod setup;
mod stalled;

use std::path::Path;
use std::time::Duration;

use warden_mock::{MockConfig, MockServer};

use setup::{Cli, median, ratio, supervisor, turn, wire};

/// The turns' times of one CLI, one way.
#[derive(Default)]
struct Figures {
    first: Duration,
    later: Vec<Duration>,
}

impl Figures {
    fn push(&mut self, took: Duration, first: bool) {
        if first {
            self.first = took;
        } else {
            self.later.push(took);
        }
    }

    fn median(&self) -> Duration {
        median(&self.later)
    }

    fn range_ms(&self) -> String {
        let min = self.later.iter().min().copied().unwrap_or_default();
        let max = self.later.iter().max().copied().unwrap_or_default();
        format!("{}–{}", ms(min), ms(max))
    }
}

fn ms(d: Duration) -> String {
    format!("{:.0}", d.as_secs_f64() * 1e3)
}

/// `turns` trivial turns of `cli` straight to `mock` and through `wired`
/// (the wire layer in front of it), one of each in turn (which goes first
/// alternating), each way in one workspace under `base`.
async fn side_by_side(
    cli: Cli,
    mock: &str,
    wired: &str,
    base: &Path,
    turns: usize,
) -> Result<(Figures, Figures), String> {
    let bin = cli.binary()?;
    let timeout = Duration::from_secs(60);
    let mut ways = Vec::new();
    for (way, api) in [("straight", mock), ("wire", wired)] {
        let base = base.join(way);
        let workspace = base.join("project");
        std::fs::create_dir_all(&workspace).map_err(|e| e.to_string())?;
        let sup = supervisor(cli.factory(&bin, api, &base)?, timeout).await?;
        ways.push((sup, workspace, Figures::default()));
    }
    let mut failed = None;
    'turns: for i in 0..turns {
        let order: [usize; 2] = if i % 2 == 0 { [0, 1] } else { [1, 0] };
        for way in order {
            let (sup, workspace, figures) = &mut ways[way];
            match turn(sup, workspace, &format!("turn {i}: say hi")).await {
                Ok(took) => figures.push(took, i == 0),
                Err(e) => {
                    failed = Some(format!("turn {i}: {e}"));
                    break 'turns;
                }
            }
        }
    }
    let mut figures = Vec::new();
    for (sup, _, f) in ways {
        sup.shutdown().await;
        figures.push(f);
    }
    if let Some(why) = failed {
        return Err(why);
    }
    let wire = figures.pop().unwrap_or_default();
    let straight = figures.pop().unwrap_or_default();
    Ok((straight, wire))
}

/// Runs the section.
pub(crate) async fn bench_agents(quick: bool) {
    let turns = if quick { 6 } else { 16 };
    println!(
        "\n## 14. agents: per-turn wall time of each agent CLI through warden, straight to the \
         in-process mock and through the wire layer ({turns} trivial turns each way, alternating)"
    );
    let mock = match MockServer::start(MockConfig::default()).await {
        Ok(m) => m,
        Err(e) => {
            println!("agents: skipped, the mock did not start: {e}");
            return;
        }
    };
    let dir = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => {
            println!("agents: skipped, no temp dir: {e}");
            return;
        }
    };
    let wired = match wire(&mock.base_url(), Duration::from_secs(60)).await {
        Ok(url) => url,
        Err(e) => {
            println!("agents: skipped, the wire layer did not start: {e}");
            return;
        }
    };
    let mut rows = Vec::new();
    for cli in Cli::ALL {
        let base = dir.path().join(cli.name());
        let figures = side_by_side(cli, &mock.base_url(), &wired, &base, cli.turns(turns)).await;
        rows.push((cli, figures));
    }
    mock.shutdown().await;
    let claude = rows
        .iter()
        .find_map(|(cli, f)| {
            (*cli == Cli::ClaudeCode)
                .then_some(f.as_ref().ok())
                .flatten()
        })
        .map(|(straight, _)| straight.median());
    println!(
        "| agent | first turn, straight / wire (ms) | later turns, median, straight / wire (ms) \
         | min–max, straight / wire (ms) | straight ÷ Claude Code's straight | wire ÷ straight |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    for (cli, figures) in &rows {
        let name = match cli.turns(turns) {
            n if n == turns => cli.name().to_owned(),
            n => format!("{} ({n} turns)", cli.name()),
        };
        match figures {
            Ok((straight, wire)) => {
                let against_claude = claude.map_or("n/a (no Claude Code run)".to_owned(), |c| {
                    ratio(straight.median().as_secs_f64(), c.as_secs_f64())
                });
                println!(
                    "| {name} | {} / {} | {} / {} | {} / {} | {against_claude} | {} |",
                    ms(straight.first),
                    ms(wire.first),
                    ms(straight.median()),
                    ms(wire.median()),
                    straight.range_ms(),
                    wire.range_ms(),
                    ratio(wire.median().as_secs_f64(), straight.median().as_secs_f64()),
                );
            }
            Err(why) => println!("| {name} | skipped: {why} | | | | |"),
        }
    }
    let reps = if quick { 3 } else { 5 };
    stalled::stalled_through_the_wire(&dir.path().join("stalled"), reps).await;
}
