//! `warden demo --agents`: one session per agent CLI installed here —
//! Claude Code, Codex, Gemini CLI — against the built-in mock, two turns
//! each (the second resumes the agent's own conversation). An agent whose
//! CLI is not installed is skipped with the reason. Each CLI runs with a
//! home of its own under `DATA_DIR/demo-agents/<agent>/`, a dummy key and
//! the mock's address: nothing of the user's own configuration is read or
//! written.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use warden_claude::{
    ClaudeOptions, ClaudeSource, CodexOptions, CodexSource, GeminiOptions, GeminiSource,
};
use warden_core::{EventSource, MemoryStore, SessionKey, SessionStore, Supervisor};
use warden_mock::{MockConfig, MockServer};

use crate::exit::{CliError, Exit};
use crate::sources::{claude_binary, codex_binary, gemini_binary};

/// How long one turn may take before the demo calls it failed.
const TURN_BOUND: Duration = Duration::from_secs(120);

/// One agent CLI of the demo.
#[derive(Debug, Clone, Copy)]
enum Cli {
    ClaudeCode,
    Codex,
    Gemini,
}

impl Cli {
    const ALL: [Cli; 3] = [Cli::ClaudeCode, Cli::Codex, Cli::Gemini];

    fn name(self) -> &'static str {
        match self {
            Cli::ClaudeCode => "claude-code",
            Cli::Codex => "codex",
            Cli::Gemini => "gemini",
        }
    }

    /// The CLI's source against `mock`, everything of it under `dir`; an
    /// error when the CLI is not installed.
    fn source(self, mock: &MockServer, dir: &Path) -> Result<Arc<dyn EventSource>, CliError> {
        let home = dir.join("home");
        let scratch = dir.join("scratch");
        for d in [&home, &scratch] {
            std::fs::create_dir_all(d)
                .map_err(|e| CliError::failure(format!("cannot create {}: {e}", d.display())))?;
        }
        Ok(match self {
            Cli::ClaudeCode => Arc::new(ClaudeSource::new(
                ClaudeOptions::default()
                    .with_binary(claude_binary(None)?)
                    .with_env("ANTHROPIC_BASE_URL", mock.base_url())
                    .with_env("ANTHROPIC_API_KEY", "demo-key")
                    .with_env("DISABLE_TELEMETRY", "1")
                    .with_env("DISABLE_AUTOUPDATER", "1")
                    .with_env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
                    .with_env("HOME", &home)
                    .with_scratch_dir(&scratch),
            )),
            Cli::Codex => Arc::new(CodexSource::new(
                CodexOptions::default()
                    .with_binary(codex_binary()?)
                    .with_base_url(mock.url("/v1"))
                    .with_api_key_env("WARDEN_DEMO_KEY")
                    .with_env("WARDEN_DEMO_KEY", "demo-key")
                    .with_env("HOME", &home),
            )),
            Cli::Gemini => {
                let options = GeminiOptions::default()
                    .with_binary(gemini_binary()?)
                    .with_model("gemini-2.5-pro")
                    .with_base_url(mock.base_url())
                    .with_gemini_home(dir.join("gemini"))
                    .with_env("GEMINI_API_KEY", "demo-key")
                    .with_env("HOME", &home);
                options.write_settings().map_err(|e| {
                    CliError::failure(format!("cannot write the Gemini CLI settings: {e}"))
                })?;
                Arc::new(GeminiSource::new(options))
            }
        })
    }
}

/// What one agent's two turns showed.
struct Ran {
    took: [Duration; 2],
    conversation: String,
}

/// Two turns of `cli`'s session in `dir`: how long each took and the one
/// conversation they share, or what went wrong.
async fn two_turns(source: Arc<dyn EventSource>, dir: &Path) -> Result<Ran, String> {
    let store = Arc::new(MemoryStore::new());
    let factory = move |_: &SessionKey| source.clone();
    let supervisor = Supervisor::builder(Arc::new(factory))
        .store(store.clone())
        .start()
        .await
        .map_err(|e| format!("the supervisor did not start: {e}"))?;
    let workspace = dir.join("workspace");
    std::fs::create_dir_all(&workspace).map_err(|e| e.to_string())?;
    let mut took = [Duration::ZERO; 2];
    let mut ids = Vec::new();
    for (i, message) in ["Say hello.", "Say it again."].into_iter().enumerate() {
        let started = Instant::now();
        let turn = supervisor
            .send_to_workspace(&workspace, message)
            .await
            .map_err(|e| format!("turn {}: not accepted: {e}", i + 1))?;
        tokio::time::timeout(TURN_BOUND, turn.finish())
            .await
            .map_err(|_| format!("turn {}: no answer within {TURN_BOUND:?}", i + 1))?
            .map_err(|e| format!("turn {}: {e}", i + 1))?;
        took[i] = started.elapsed();
        let key = supervisor.key_for(&workspace).map_err(|e| e.to_string())?;
        let record = store
            .load(&key)
            .await
            .map_err(|e| e.to_string())?
            .ok_or("the session has no record")?;
        ids.push(record.agent_session_id.unwrap_or_default());
    }
    supervisor.shutdown().await;
    if ids[0].is_empty() || ids[0] != ids[1] {
        return Err(format!(
            "the second turn did not resume the first's conversation ({ids:?})"
        ));
    }
    Ok(Ran {
        took,
        conversation: ids.swap_remove(0),
    })
}

/// Runs `warden demo --agents`: exit 1 when an installed CLI failed.
pub(super) async fn run(data_dir: &Path) -> Result<Exit, CliError> {
    let mock =
        MockServer::start(MockConfig::default().with_reply(
            "Hello from warden's mock: this reply went through your agent CLI and back.",
        ))
        .await
        .map_err(|e| CliError::failure(format!("the mock LLM server did not start: {e}")))?;
    let root: PathBuf = data_dir.join("demo-agents");
    println!(
        "One session per agent CLI installed here, against the built-in mock ({}):",
        mock.base_url()
    );
    let mut failed = false;
    for cli in Cli::ALL {
        let dir = root.join(cli.name());
        let source = match cli.source(&mock, &dir) {
            Ok(s) => s,
            Err(why) => {
                println!("  {:<12} skipped: {why}", cli.name());
                continue;
            }
        };
        match two_turns(source, &dir).await {
            Ok(ran) => println!(
                "  {:<12} answered twice in one conversation ({}): {:.1} s, then {:.1} s resumed",
                cli.name(),
                ran.conversation,
                ran.took[0].as_secs_f64(),
                ran.took[1].as_secs_f64()
            ),
            Err(why) => {
                failed = true;
                println!("  {:<12} FAILED: {why}", cli.name());
            }
        }
    }
    Ok(if failed { Exit::Failure } else { Exit::Ok })
}
