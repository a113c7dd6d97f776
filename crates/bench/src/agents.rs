//! Section 14, `agents`: the per-turn cost of each agent CLI through warden
//! (issue #41). Claude Code keeps one process per session and takes every
//! turn over its stdin; Codex (`codex exec`) and Gemini start a process per
//! turn. N trivial turns per agent against an in-process `warden mock`,
//! through a supervisor: the first turn (every CLI starts a process) and
//! the median of the later ones, each against Claude Code's measured in
//! the same run. An agent whose binary is not configured
//! (`WARDEN_CLAUDE_BIN`, `WARDEN_CODEX_BIN`, `WARDEN_GEMINI_BIN`) is
//! skipped with the reason printed. Claude Code runs twice: straight to
//! the mock, and through the wire layer (`warden_proxy` configured as
//! `ProxyConfig::under_agent_cli`, what `warden chat|serve` put under it),
//! whose per-turn cost is its later turns against the direct run's (issue
//! #47: within 5 %).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use warden_claude::{
    ClaudeOptions, ClaudeSourceFactory, CodexOptions, CodexSourceFactory, GeminiOptions,
    GeminiSourceFactory,
};
use warden_core::{MemoryStore, SourceFactory, Supervisor, SupervisorConfig, WatchdogConfig};
use warden_mock::{MockConfig, MockServer};
use warden_proxy::{Proxy, ProxyConfig};

/// The wire layer in front of `upstream`, as `warden chat|serve` runs it
/// for `stream_timeout`: its base URL (the proxy serves until the process
/// ends).
async fn wire(upstream: &str, stream_timeout: Duration) -> Result<String, String> {
    let config = ProxyConfig::under_agent_cli(stream_timeout).with_anthropic_upstream(upstream);
    let proxy = Proxy::start(config).await.map_err(|e| e.to_string())?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let url = format!(
        "http://{}",
        listener.local_addr().map_err(|e| e.to_string())?
    );
    tokio::spawn(async move { proxy.serve(listener, std::future::pending()).await });
    Ok(url)
}

/// One agent's figures: the first turn and the later turns' times.
struct Figures {
    first: Duration,
    later: Vec<Duration>,
}

fn median(times: &[Duration]) -> Duration {
    let mut sorted = times.to_vec();
    sorted.sort();
    sorted.get(sorted.len() / 2).copied().unwrap_or_default()
}

/// The binary in `var`, or why the agent is skipped.
fn binary(var: &str) -> Result<PathBuf, String> {
    match std::env::var_os(var).filter(|v| !v.is_empty()) {
        Some(bin) if Path::new(&bin).is_file() => Ok(PathBuf::from(bin)),
        Some(bin) => Err(format!("{var}={} is not a file", bin.to_string_lossy())),
        None => Err(format!("{var} is unset")),
    }
}

/// `turns` trivial turns in one workspace through a supervisor whose
/// sessions come from `factory`.
async fn run(
    factory: Arc<dyn SourceFactory>,
    workspace: &Path,
    turns: usize,
) -> Result<Figures, String> {
    let config = SupervisorConfig::default().with_watchdog(
        WatchdogConfig::default()
            .with_default_timeout(Duration::from_secs(60))
            .map_err(|e| e.to_string())?,
    );
    let sup = Supervisor::builder(factory)
        .config(config)
        .store(Arc::new(MemoryStore::new()))
        .start()
        .await
        .map_err(|e| e.to_string())?;
    let mut times = Vec::with_capacity(turns);
    for i in 0..turns {
        let t0 = Instant::now();
        let turn = sup
            .send_to_workspace(workspace, &format!("turn {i}: say hi"))
            .await
            .map_err(|e| e.to_string())?;
        tokio::time::timeout(Duration::from_secs(120), turn.finish())
            .await
            .map_err(|_| format!("turn {i} took over 120 s"))?
            .map_err(|e| format!("turn {i}: {e}"))?;
        times.push(t0.elapsed());
    }
    sup.shutdown().await;
    let first = times.first().copied().unwrap_or_default();
    Ok(Figures {
        first,
        later: times.into_iter().skip(1).collect(),
    })
}

/// Runs the section.
pub(crate) async fn bench_agents(quick: bool) {
    let turns = if quick { 6 } else { 16 };
    println!(
        "\n## 14. agents: per-turn wall time of each agent CLI through warden ({turns} trivial turns each, in-process mock)"
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
    let wired = wire(&mock.base_url(), Duration::from_secs(60)).await;
    let mut rows: Vec<(&str, Result<Figures, String>)> = Vec::new();
    for agent in ["claude-code", "claude-code (wire)", "codex", "gemini"] {
        let base = dir.path().join(agent.replace([' ', '(', ')'], "_"));
        let (workspace, home) = (base.join("project"), base.join("home"));
        for d in [&workspace, &home] {
            if let Err(e) = std::fs::create_dir_all(d) {
                println!("agents: skipped, cannot create {}: {e}", d.display());
                return;
            }
        }
        let factory: Result<Arc<dyn SourceFactory>, String> = match agent {
            "claude-code" | "claude-code (wire)" => {
                let api = if agent == "claude-code" {
                    Ok(mock.base_url())
                } else {
                    wired.clone()
                };
                binary("WARDEN_CLAUDE_BIN").and_then(|bin| api.map(|api| (bin, api)))
            }
            .map(|(bin, api)| {
                Arc::new(ClaudeSourceFactory::new(
                    ClaudeOptions::default()
                        .with_binary(bin)
                        .with_env("ANTHROPIC_BASE_URL", api)
                        .with_env("ANTHROPIC_API_KEY", "dummy")
                        .with_env("DISABLE_TELEMETRY", "1")
                        .with_env("DISABLE_AUTOUPDATER", "1")
                        .with_env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
                        .with_env("HOME", &home)
                        .with_scratch_dir(base.join("scratch")),
                )) as Arc<dyn SourceFactory>
            }),
            "codex" => binary("WARDEN_CODEX_BIN").map(|bin| {
                Arc::new(CodexSourceFactory::new(
                    CodexOptions::default()
                        .with_binary(bin)
                        .with_base_url(mock.url("/v1"))
                        .with_api_key_env("WARDEN_BENCH_KEY")
                        .with_env("WARDEN_BENCH_KEY", "dummy")
                        .with_env("HOME", &home),
                )) as Arc<dyn SourceFactory>
            }),
            _ => binary("WARDEN_GEMINI_BIN").map(|bin| {
                Arc::new(GeminiSourceFactory::new(
                    GeminiOptions::default()
                        .with_binary(bin)
                        .with_model("gemini-2.5-pro")
                        .with_base_url(mock.base_url())
                        .with_gemini_home(base.join("gemini-home"))
                        .with_env("GEMINI_API_KEY", "dummy")
                        .with_env("HOME", &home),
                )) as Arc<dyn SourceFactory>
            }),
        };
        let figures = match factory {
            Ok(factory) => run(factory, &workspace, turns).await,
            Err(why) => Err(why),
        };
        rows.push((agent, figures));
    }
    mock.shutdown().await;
    let claude = rows
        .iter()
        .find_map(|(a, f)| (*a == "claude-code").then_some(f.as_ref().ok()).flatten())
        .map(|f| (f.first, median(&f.later)));
    println!(
        "| agent | first turn (ms) | later turns, median (ms) | min–max (ms) | later ÷ Claude Code's |"
    );
    println!("| --- | --- | --- | --- | --- |");
    for (agent, figures) in &rows {
        match figures {
            Ok(f) => {
                let later = median(&f.later);
                let min = f.later.iter().min().copied().unwrap_or_default();
                let max = f.later.iter().max().copied().unwrap_or_default();
                let ratio = claude
                    .filter(|(_, c)| !c.is_zero())
                    .map_or("n/a (no Claude Code run)".to_owned(), |(_, c)| {
                        format!("{:.2}x", later.as_secs_f64() / c.as_secs_f64())
                    });
                println!(
                    "| {agent} | {:.0} | {:.0} | {:.0}–{:.0} | {ratio} |",
                    f.first.as_secs_f64() * 1e3,
                    later.as_secs_f64() * 1e3,
                    min.as_secs_f64() * 1e3,
                    max.as_secs_f64() * 1e3,
                );
            }
            Err(why) => println!("| {agent} | skipped: {why} | | | |"),
        }
    }
    stalled_through_the_wire(&dir.path().join("stalled")).await;
}

/// One Claude Code turn whose first API stream stalls mid-text, with a
/// stream timeout of 8 s: through the wire layer (continued at 4 s) and
/// straight to the mock (the watchdog kills the CLI at 8 s and the turn
/// runs again). Seconds to the whole reply and output tokens the API
/// generated, as ratios.
async fn stalled_through_the_wire(dir: &Path) {
    let timeout = Duration::from_secs(8);
    println!(
        "\nA turn whose stream stalls mid-text ({}s stream timeout): through the wire layer vs straight",
        timeout.as_secs()
    );
    let bin = match binary("WARDEN_CLAUDE_BIN") {
        Ok(bin) => bin,
        Err(why) => {
            println!("skipped: {why}");
            return;
        }
    };
    let mut figures = Vec::new();
    for via_wire in [true, false] {
        let script = [warden_mock::Scenario::Stall, warden_mock::Scenario::Normal];
        let mock = match MockServer::start(MockConfig::default().with_sequence(script)).await {
            Ok(m) => m,
            Err(e) => return println!("skipped: the mock did not start: {e}"),
        };
        let api = if via_wire {
            match wire(&mock.base_url(), timeout).await {
                Ok(url) => url,
                Err(e) => return println!("skipped: the wire did not start: {e}"),
            }
        } else {
            mock.base_url()
        };
        let base = dir.join(if via_wire { "wire" } else { "straight" });
        let (workspace, home) = (base.join("project"), base.join("home"));
        for d in [&workspace, &home] {
            if let Err(e) = std::fs::create_dir_all(d) {
                return println!("skipped: {e}");
            }
        }
        let factory = Arc::new(ClaudeSourceFactory::new(
            ClaudeOptions::default()
                .with_binary(&bin)
                .with_env("ANTHROPIC_BASE_URL", api)
                .with_env("ANTHROPIC_API_KEY", "dummy")
                .with_env("DISABLE_TELEMETRY", "1")
                .with_env("DISABLE_AUTOUPDATER", "1")
                .with_env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
                .with_env("HOME", &home)
                .with_scratch_dir(base.join("scratch")),
        ));
        let config = SupervisorConfig::default().with_watchdog(
            WatchdogConfig::default()
                .with_default_timeout(timeout)
                .unwrap_or_default(),
        );
        let sup = match Supervisor::builder(factory)
            .config(config)
            .store(Arc::new(MemoryStore::new()))
            .start()
            .await
        {
            Ok(s) => s,
            Err(e) => return println!("skipped: {e}"),
        };
        let t0 = Instant::now();
        let answered = match sup.send_to_workspace(&workspace, "say hi").await {
            Ok(turn) => tokio::time::timeout(Duration::from_secs(120), turn.finish())
                .await
                .map_err(|_| "over 120 s".to_owned())
                .and_then(|r| r.map_err(|e| e.to_string())),
            Err(e) => Err(e.to_string()),
        };
        let took = t0.elapsed();
        sup.shutdown().await;
        let tokens: u64 = mock.requests().iter().filter_map(|r| r.output_tokens).sum();
        mock.shutdown().await;
        match answered {
            Ok(_) => figures.push((took, tokens)),
            Err(e) => return println!("skipped: the turn failed: {e}"),
        }
    }
    if let [(wire_time, wire_tokens), (straight_time, straight_tokens)] = figures[..] {
        println!("| | to the whole reply (s) | output tokens generated upstream |");
        println!("| --- | --- | --- |");
        println!(
            "| through the wire | {:.1} | {wire_tokens} |",
            wire_time.as_secs_f64()
        );
        println!(
            "| straight (watchdog kill, re-run) | {:.1} | {straight_tokens} |",
            straight_time.as_secs_f64()
        );
        println!(
            "| wire ÷ straight | {:.2}x | {:.2}x |",
            wire_time.as_secs_f64() / straight_time.as_secs_f64().max(1e-9),
            wire_tokens as f64 / (straight_tokens as f64).max(1.0)
        );
    }
}
