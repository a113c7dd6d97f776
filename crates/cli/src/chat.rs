//! `warden chat`: one message to the session of a workspace.

use std::path::PathBuf;
use std::sync::Arc;

use warden_claude::{
    ClaudeOptions, ClaudeSource, CodexOptions, CodexSource, GeminiSource, OpenCodeFlavor,
    OpenCodeSource, QwenSource,
};
use warden_core::{
    EventSource, Notice, Notifier, SessionKey, SessionStore, Supervisor, SupervisorConfig, context,
};
use warden_llm::Transcripts;

use crate::exit::{CliError, Exit};
use crate::input::{MAX_INPUT_BYTES, read_bounded};
use crate::paths;
use crate::relay::relay;
use crate::sources::{
    HttpSettings, HttpSource, Provider, check_url, claude_binary, codex_binary, gemini_options,
    opencode_options, qwen_options, v1_base_url,
};

/// The agent behind a workspace's session: the API's one list of agent
/// kinds (`warden_serve::Agent`), whose names are the `--agent` values.
pub(crate) use warden_serve::Agent;

/// Arguments of `warden chat`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
The session of the workspace is resumed from the store (created if new); a stored
conversation that cannot be resumed is replaced by a fresh one, with a notice on
stderr and the message re-delivered. A message left pending by a crash is re-sent
first (stderr says so); one already answered is not answered twice. A transcript
whose last turn a crash cut off keeps its earlier turns (stderr says a turn was
lost). The reply streams to stdout, followed by the
context indicator [ctx: NN%]. Silent streams are killed after WARDEN_STREAM_TIMEOUT
ms (default 45000) and retried. API keys come from ANTHROPIC_API_KEY / OPENAI_API_KEY.

Examples:
  warden chat --workspace ~/src/app 'why does the build fail?'
  git diff | warden chat --workspace . --agent anthropic -")]
pub(crate) struct ChatArgs {
    /// The workspace directory; its normalized path names the session.
    #[arg(long, value_name = "DIR")]
    workspace: PathBuf,
    /// The agent. codex: `WARDEN_CODEX_BIN` else `codex` on PATH, read-only
    /// sandbox; --base-url is its Responses endpoint (`/v1` added), the key
    /// from OPENAI_API_KEY. gemini: `WARDEN_GEMINI_BIN` else `gemini` on
    /// PATH, its settings in DATA_DIR/gemini (its GEMINI_CLI_HOME; your
    /// ~/.gemini is not used); --base-url is its GOOGLE_GEMINI_BASE_URL,
    /// the key from GEMINI_API_KEY, the model default gemini-2.5-pro.
    #[arg(long, value_enum, default_value_t = Agent::ClaudeCode)]
    agent: Agent,
    /// The API's base URL, e.g. a `warden mock` server; for claude-code it
    /// is passed to the child as ANTHROPIC_BASE_URL. Default
    /// ANTHROPIC_BASE_URL / OPENAI_BASE_URL, else the provider's API. An
    /// empty or hostless URL is a usage error.
    #[arg(long, value_name = "URL")]
    base_url: Option<String>,
    /// The model (with --server: this turn's model on the node).
    #[arg(long)]
    model: Option<String>,
    /// Where sessions and transcripts are kept. Default WARDEN_DATA_DIR,
    /// else the user's data directory (~/.local/share/warden).
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// The Claude Code binary. Default WARDEN_CLAUDE_BIN, else `claude` on PATH.
    #[arg(long, value_name = "PATH")]
    claude_bin: Option<PathBuf>,
    /// Let Claude Code, Codex and Gemini CLI reach their APIs directly,
    /// without warden's wire layer (by default their model streams go
    /// through warden's watched engine in this process, which continues a
    /// stalled or cut reply inside the CLI's own request).
    #[arg(long)]
    no_wire_watch: bool,
    /// Forget that this workspace's session was given up before sending.
    #[arg(long)]
    reset: bool,
    /// Talk to a running `warden serve` node at URL instead of opening the
    /// store (which that node holds).
    #[arg(long, value_name = "URL", conflicts_with_all = ["base_url", "claude_bin", "reset"])]
    server: Option<String>,
    /// The node's token file (with --server). Default WARDEN_TOKEN, else
    /// DATA_DIR/token.
    #[arg(long, value_name = "FILE", requires = "server")]
    token_file: Option<PathBuf>,
    /// The message, or `-` to read it from stdin (at most 32 MiB).
    message: String,
}

/// Prints notices for the user on stderr.
struct StderrNotifier;

impl Notifier for StderrNotifier {
    fn notify(&self, _key: &SessionKey, notice: Notice) {
        match notice {
            Notice::FreshStart { message, .. } | Notice::SessionFailed { message, .. } => {
                eprintln!("warden: {message}");
            }
            Notice::RecoveredReply { message_id, result } => match result {
                Ok(text) => eprintln!(
                    "warden: re-sent pending message #{message_id} (interrupted by a crash): answered ({} characters, not shown)",
                    text.chars().count()
                ),
                Err(e) => eprintln!(
                    "warden: re-sent pending message #{message_id} (interrupted by a crash): failed: {e}"
                ),
            },
            _ => {}
        }
    }
}

/// How the Claude Code child is run: `--base-url` reaches it as
/// `ANTHROPIC_BASE_URL` (replacing an inherited one), which is where Claude
/// Code sends its requests.
fn claude_options(
    binary: PathBuf,
    model: Option<String>,
    base_url: Option<String>,
) -> ClaudeOptions {
    let mut options = ClaudeOptions::default().with_binary(binary);
    if let Some(model) = model {
        options = options.with_model(model);
    }
    if let Some(url) = base_url {
        options = options.with_env(warden_llm::Provider::ANTHROPIC.base_url_env, url);
    }
    options
}

/// An agent CLI source kept to shut its children down at the end.
#[derive(Clone)]
pub(crate) enum CliChildren {
    /// Claude Code's.
    Claude(Arc<ClaudeSource>),
    /// Codex's.
    Codex(Arc<CodexSource>),
    /// Gemini's.
    Gemini(Arc<GeminiSource>),
    /// OpenCode's or Kilo Code's.
    OpenCode(Arc<OpenCodeSource>),
    /// Qwen Code's.
    Qwen(Arc<QwenSource>),
    /// Aider's.
    Aider(Arc<warden_claude::AiderSource>),
}

impl CliChildren {
    /// Terminates the CLI's processes and waits until they are gone.
    pub(crate) async fn shutdown(&self) {
        match self {
            Self::Claude(source) => source.shutdown().await,
            Self::Codex(source) => source.shutdown().await,
            Self::Gemini(source) => source.shutdown().await,
            Self::OpenCode(source) => source.shutdown().await,
            Self::Qwen(source) => source.shutdown().await,
            Self::Aider(source) => source.shutdown().await,
        }
    }

    /// Ends session `key`'s process without waiting
    /// (`CliSource::end_session`): its source is gone.
    pub(crate) fn end_session(&self, key: &SessionKey) {
        match self {
            Self::Claude(source) => source.end_session(key),
            Self::Codex(source) => source.end_session(key),
            Self::Gemini(source) => source.end_session(key),
            Self::OpenCode(source) => source.end_session(key),
            Self::Qwen(source) => source.end_session(key),
            Self::Aider(source) => source.end_session(key),
        }
    }

    /// Gives each session's processes a part of their command of their
    /// own (`CliSource::set_per_session`): their route on the wire layer.
    pub(crate) fn set_per_session(
        &self,
        edit: impl Fn(&SessionKey, &mut warden_claude::CliCommand) + Send + Sync + 'static,
    ) {
        let set = match self {
            Self::Claude(source) => source.set_per_session(edit),
            Self::Codex(source) => source.set_per_session(edit),
            Self::Gemini(source) => source.set_per_session(edit),
            Self::OpenCode(source) => source.set_per_session(edit),
            Self::Qwen(source) => source.set_per_session(edit),
            Self::Aider(source) => source.set_per_session(edit),
        };
        debug_assert!(set, "set once, as the source is made");
    }
}

/// A session source, and the agent CLI source again when it is one (to
/// shut its children down at the end).
pub(crate) type AgentSource = (Arc<dyn EventSource>, Option<CliChildren>);

/// The process settings of a CLI run per turn (Codex, Gemini, OpenCode,
/// Kilo Code): each
/// process recorded under `DATA_DIR/children` while it runs, after the
/// groups a crashed warden left there are ended — a `kill -9` of warden
/// mid-turn leaves such a process running (its stdin is already closed),
/// and Codex's then holds its thread, so the re-delivered turn could not
/// resume it. The groups of a live warden on the same directory are left
/// alone.
fn children_settings(data_dir: &std::path::Path) -> warden_claude::ProcessSettings {
    let settings = warden_claude::ProcessSettings::default();
    let dir = children_dir(data_dir, settings.grace_period);
    settings.with_children_dir(dir)
}

/// `DATA_DIR/children`, once the groups a warden that is gone left there
/// are ended (said on stderr).
fn children_dir(data_dir: &std::path::Path, grace: std::time::Duration) -> PathBuf {
    let dir = data_dir.join(paths::CHILDREN);
    let ended = warden_claude::end_orphaned_children(&dir, grace);
    if !ended.is_empty() {
        eprintln!(
            "warden: ended {} agent process group(s) left running by a warden that stopped abruptly (pids {ended:?})",
            ended.len()
        );
    }
    dir
}

/// The source of `agent` (and, for Claude Code, the source again, to shut
/// its children down at the end): the HTTP APIs keep their conversations
/// in `conversations` (a cluster's database) when given, else as
/// transcripts under `data_dir`.
pub(crate) fn agent_source(
    agent: Agent,
    base_url: Option<String>,
    model: Option<String>,
    claude_bin: Option<PathBuf>,
    data_dir: &std::path::Path,
    conversations: Option<Arc<dyn warden_core::store::ConversationStore>>,
) -> Result<AgentSource, CliError> {
    Ok(match agent {
        Agent::ClaudeCode => {
            let options = claude_options(claude_binary(claude_bin)?, model, base_url);
            let children = children_dir(data_dir, options.process.settings.grace_period);
            let options = options.with_children_dir(children);
            let source = Arc::new(ClaudeSource::new(options));
            (source.clone(), Some(CliChildren::Claude(source)))
        }
        Agent::Codex => {
            let mut options = CodexOptions::default()
                .with_binary(codex_binary()?)
                .with_settings(children_settings(data_dir));
            if let Some(model) = model {
                options = options.with_model(model);
            }
            if let Some(url) = base_url {
                options = options.with_base_url(v1_base_url(&url));
            }
            let source = Arc::new(CodexSource::new(options));
            (source.clone(), Some(CliChildren::Codex(source)))
        }
        Agent::Gemini => {
            let options = gemini_options(data_dir, model, base_url)?
                .with_settings(children_settings(data_dir));
            let source = Arc::new(GeminiSource::new(options));
            (source.clone(), Some(CliChildren::Gemini(source)))
        }
        Agent::OpenCode | Agent::KiloCode => {
            let flavor = if agent == Agent::KiloCode {
                OpenCodeFlavor::Kilo
            } else {
                OpenCodeFlavor::OpenCode
            };
            let options = opencode_options(flavor, model, base_url)?
                .with_settings(children_settings(data_dir));
            let source = Arc::new(OpenCodeSource::new(options));
            (source.clone(), Some(CliChildren::OpenCode(source)))
        }
        Agent::QwenCode => {
            let options =
                qwen_options(data_dir, model, base_url)?.with_settings(children_settings(data_dir));
            let source = Arc::new(QwenSource::new(options));
            (source.clone(), Some(CliChildren::Qwen(source)))
        }
        Agent::Aider => {
            let options = crate::sources::aider_options(data_dir, model, base_url)?
                .with_settings(children_settings(data_dir));
            let source = Arc::new(warden_claude::AiderSource::new(options));
            (source.clone(), Some(CliChildren::Aider(source)))
        }
        Agent::Anthropic | Agent::Openai => {
            let provider = if agent == Agent::Anthropic {
                Provider::Anthropic
            } else {
                Provider::Openai
            };
            let dir = data_dir.join(paths::TRANSCRIPTS);
            let transcripts = Transcripts::open(&dir)
                .map_err(|e| {
                    CliError::failure(format!(
                        "cannot create the transcript directory {}: {e}",
                        dir.display()
                    ))
                })?
                .on_torn_tail(|id, torn| {
                    if torn.lost_turn {
                        eprintln!(
                            "warden: the last turn of conversation {id} was cut off by a crash and is lost ({} bytes dropped); the earlier turns are kept",
                            torn.dropped_bytes
                        );
                    }
                });
            let source = HttpSource::new(
                provider,
                HttpSettings {
                    base_url,
                    model,
                    transcripts: Some(transcripts),
                    conversations,
                },
            )?
            .into_source();
            (source, None)
        }
    })
}

/// Runs `warden chat`.
pub(crate) async fn run(args: ChatArgs) -> Result<Exit, CliError> {
    if let Some(url) = &args.base_url {
        check_url(url)?;
    }
    let message = if args.message == "-" {
        let bytes = read_bounded(
            std::io::stdin().lock(),
            MAX_INPUT_BYTES,
            "the message on stdin",
        )?;
        String::from_utf8(bytes)
            .map_err(|_| CliError::usage("the message on stdin is not valid UTF-8"))?
    } else {
        args.message.clone()
    };
    if message.trim().is_empty() {
        return Err(CliError::usage("the message is empty"));
    }
    match std::fs::metadata(&args.workspace) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(CliError::usage(format!(
                "workspace {} is not a directory",
                args.workspace.display()
            )));
        }
        Err(e) => {
            return Err(CliError::usage(format!(
                "workspace {}: {e}",
                args.workspace.display()
            )));
        }
    }
    if let Some(server) = &args.server {
        let client =
            crate::client::Client::new(server, args.token_file.clone(), args.data_dir.clone())?;
        return client
            .chat(&args.workspace, message, args.model.as_deref())
            .await;
    }
    let config = SupervisorConfig::from_env().map_err(|e| CliError::usage(e.to_string()))?;
    let data_dir = paths::data_dir(args.data_dir.clone())?;

    // The agent CLI's model traffic through the wire layer, which then
    // reaches what --base-url (or the CLI's own setting) names.
    let wire = crate::wire::Wire::for_agents(
        &[args.agent],
        args.base_url.as_deref(),
        args.no_wire_watch,
        config.watchdog.default_timeout,
    )
    .await?;
    let base_url = wire
        .as_ref()
        .and_then(|wire| wire.base_url(args.agent))
        .or_else(|| args.base_url.clone());
    let (source, claude) = agent_source(
        args.agent,
        base_url,
        args.model.clone(),
        args.claude_bin.clone(),
        &data_dir,
        None,
    )?;
    let store = Arc::new(paths::open_store(&data_dir)?);
    let records: Arc<dyn SessionStore> = store.clone();

    // Its one session's CLI is live while the wire sends it its stream.
    let source = match &wire {
        Some(wire) => wire.live(source),
        None => source,
    };
    let factory = move |_: &SessionKey| source.clone();
    let supervisor = Supervisor::builder(Arc::new(factory))
        .config(config)
        .store(store)
        .notifier(Arc::new(StderrNotifier))
        .start()
        .await?;
    let result = async {
        let key = supervisor.key_for(&args.workspace)?;
        // The session's first turn says its model stream is watched at the
        // wire (a session with no record yet, or one reset now).
        let first_turn = args.reset || matches!(records.load(&key).await, Ok(None));
        if args.reset {
            supervisor.reset(key).await?;
        }
        if let Some(line) = wire
            .as_ref()
            .filter(|_| first_turn)
            .and_then(|wire| wire.announcement(args.agent, None))
        {
            eprintln!("{line}");
        }
        let turn = supervisor
            .send_to_workspace(&args.workspace, message)
            .await?;
        relay(turn, crate::relay::Piped::Whole).await
    }
    .await;
    supervisor.shutdown().await;
    if let Some(claude) = claude {
        claude.shutdown().await;
    }
    // A failed turn says which layer gave up, after what.
    let result = result.map_err(|e| {
        if let Some(why) = wire
            .as_ref()
            .and_then(crate::wire::Wire::every_request_stalled)
        {
            eprintln!("warden: {why}");
        }
        process_layer_gave_up(args.agent, e)
    });
    drop(wire);
    let relayed = result?;
    if relayed.line_open {
        println!();
    }
    if let Some(ctx) = relayed.summary.context {
        println!("{}", context::indicator(ctx.percent));
    }
    Ok(Exit::Ok)
}

/// `error` of a turn that ran `agent`, naming the process layer when it
/// gave up: a CLI silent on stdout for the stream timeout on every run of
/// the turn (`ESTREAM_TIMEOUT`, what the process watchdog watches).
fn process_layer_gave_up(agent: Agent, error: CliError) -> CliError {
    if error.exit != Exit::Timeout || !agent.runs_in_workspace() {
        return error;
    }
    let message = format!(
        "the process layer gave up: {} printed nothing on stdout for the stream timeout on \
         every run ({})",
        agent.as_str(),
        error.message
    );
    CliError::new(error.exit, message)
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use super::*;

    #[test]
    fn base_url_reaches_claude_code_as_anthropic_base_url() {
        let options = claude_options(
            PathBuf::from("claude"),
            None,
            Some("http://127.0.0.1:9/proxy".into()),
        );
        assert!(options.child_env().contains(&(
            OsString::from("ANTHROPIC_BASE_URL"),
            OsString::from("http://127.0.0.1:9/proxy")
        )));
        let options = claude_options(PathBuf::from("claude"), None, None);
        assert!(
            !options
                .child_env()
                .iter()
                .any(|(k, _)| k == "ANTHROPIC_BASE_URL"),
            "without the flag the child inherits the variable"
        );
    }
}
