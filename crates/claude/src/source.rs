//! [`ClaudeSource`]: the [`EventSource`] that runs `claude`.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;

use futures_util::future::BoxFuture;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::task::JoinHandle;
use warden_core::{
    Diagnostics, EventSource, EventStream, Frame, SessionKey, SourceFactory, StreamError,
    TurnRequest,
};

use crate::options::ClaudeOptions;
use crate::parse::{LineParser, Step, early_exit_error};
use crate::process::{LineRead, ProcessGroup, StderrTail, read_line_limited};
use crate::transcript;

/// How long to wait for stderr's end after an early exit (the process may
/// have left a child holding it).
const STDERR_DRAIN: Duration = Duration::from_millis(500);

/// Extra time over the grace period to wait for an old process group to be
/// gone before starting its successor.
const GONE_MARGIN: Duration = Duration::from_secs(1);

/// An [`EventSource`] that runs the Claude Code CLI.
///
/// One long-lived `claude` process per session key serves consecutive
/// turns over stdin; see the [crate docs](crate) for when a process is
/// reused, restarted with `--resume`, or killed. Dropping the source
/// terminates its idle processes (SIGTERM, grace period, SIGKILL).
#[derive(Debug)]
pub struct ClaudeSource {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    options: ClaudeOptions,
    sessions: Mutex<HashMap<SessionKey, Slot>>,
    last_stderr: Mutex<Option<Arc<StderrTail>>>,
}

/// What the source keeps per session key.
#[derive(Debug, Default)]
struct Slot {
    /// The process waiting for the next turn (after a complete turn).
    idle: Option<AgentProcess>,
    /// The newest process started for the key, idle, busy or going down.
    last_group: Option<Arc<ProcessGroup>>,
    /// The newest session id announced, and the turn it was seen in.
    newest: Option<(String, u64)>,
}

/// A running `claude` and the state that outlives one turn.
#[derive(Debug)]
struct AgentProcess {
    group: Arc<ProcessGroup>,
    stdin: tokio::process::ChildStdin,
    stdout: BufReader<tokio::process::ChildStdout>,
    stderr: Arc<StderrTail>,
    stderr_task: JoinHandle<()>,
    parser: LineParser,
    workspace: Option<PathBuf>,
    system_prompt: Option<String>,
    /// The model it was started with (`--model`), if one was given.
    model: Option<String>,
    line: Vec<u8>,
    /// Whether a turn completed on this process.
    served: bool,
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        self.group.terminate();
        self.stderr_task.abort();
    }
}

impl ClaudeSource {
    /// A source running `claude` as `options` say.
    pub fn new(options: ClaudeOptions) -> Self {
        Self {
            shared: Arc::new(Shared {
                options,
                sessions: Mutex::new(HashMap::new()),
                last_stderr: Mutex::new(None),
            }),
        }
    }

    /// The options.
    pub fn options(&self) -> &ClaudeOptions {
        &self.shared.options
    }

    /// The newest agent session id a process of `key` announced (a resume
    /// forks the id: this is the one to resume next), if any.
    pub fn newest_session_id(&self, key: &SessionKey) -> Option<String> {
        self.shared
            .sessions
            .lock()
            .get(key)
            .and_then(|s| s.newest.as_ref().map(|(id, _)| id.clone()))
    }

    /// The pid of the newest process started for `key` while it is still
    /// running, if any.
    pub fn pid(&self, key: &SessionKey) -> Option<u32> {
        self.shared
            .sessions
            .lock()
            .get(key)
            .and_then(|s| s.last_group.as_ref())
            .filter(|g| !g.has_exited())
            .map(|g| g.pid())
    }

    /// Ends the session `key`: terminates its process (idle or busy) and
    /// waits until its process group is gone.
    pub async fn close_session(&self, key: &SessionKey) {
        let slot = self.shared.sessions.lock().remove(key);
        if let Some(slot) = slot {
            shut(vec![slot]).await;
        }
    }

    /// Terminates every process of this source (idle or busy) and waits
    /// until their process groups are gone: at most about the grace period.
    /// A busy turn's stream then fails (`Truncated` or `Connection`).
    pub async fn shutdown(&self) {
        let slots: Vec<Slot> = self
            .shared
            .sessions
            .lock()
            .drain()
            .map(|(_, slot)| slot)
            .collect();
        shut(slots).await;
    }
}

async fn shut(slots: Vec<Slot>) {
    let mut groups = Vec::new();
    for mut slot in slots {
        drop(slot.idle.take());
        if let Some(group) = slot.last_group.take() {
            group.terminate();
            groups.push(group);
        }
    }
    for group in groups {
        group.wait_gone().await;
    }
}

/// What survives a fresh start of a Claude Code session: the project's
/// memory file, read again by the new conversation.
pub const FRESH_START_NOTE: &str = "Project context is preserved in CLAUDE.md.";

/// The context window Claude Code gives `model`: 1,000,000 tokens for the
/// `[1m]` variants (`sonnet[1m]`, `claude-sonnet-4-5[1m]`, any case);
/// `None` (warden's 200,000 default) otherwise. A window Claude Code
/// reports with a turn (`modelUsage.*.contextWindow`) wins over this.
pub fn window_for_model(model: &str) -> Option<u64> {
    model
        .to_ascii_lowercase()
        .contains("[1m]")
        .then_some(1_000_000)
}

impl EventSource for ClaudeSource {
    fn open(&self, request: TurnRequest) -> BoxFuture<'static, Result<EventStream, StreamError>> {
        let shared = self.shared.clone();
        Box::pin(async move { shared.open(request).await })
    }

    fn provider(&self) -> &str {
        "claude-code"
    }

    /// The CLI runs tools itself and a retry resumes its session, whose
    /// transcript holds their results: a retry does not hand a tool call
    /// to the caller again.
    fn restarts_repeat_tool_calls(&self) -> bool {
        false
    }

    fn context_window(&self, model: Option<&str>) -> Option<u64> {
        model.and_then(window_for_model)
    }

    fn fresh_start_note(&self) -> Option<String> {
        Some(FRESH_START_NOTE.to_owned())
    }

    fn diagnostics(&self, session_id: &str, workspace: Option<&Path>) -> Diagnostics {
        let mut d = Diagnostics::default();
        let tail = self.shared.last_stderr.lock().clone();
        if let Some(tail) = tail {
            let lines = tail.lines();
            if !lines.is_empty() {
                d.stderr_tail = Some(lines.join("\n"));
            }
        }
        let (path, bytes) = self.shared.transcript(session_id, workspace);
        d.transcript_path = path;
        d.transcript_bytes = bytes;
        d
    }
}

impl Shared {
    /// The transcript of `session_id` for `workspace`: where it should be
    /// (or was found) and its size when it exists.
    fn transcript(
        &self,
        session_id: &str,
        workspace: Option<&Path>,
    ) -> (Option<PathBuf>, Option<u64>) {
        let Some(config) = transcript::config_dir(&self.options.child_env()) else {
            return (None, None);
        };
        let cwd = match workspace {
            Some(w) => w.to_path_buf(),
            None => match std::env::current_dir() {
                Ok(d) => d,
                Err(_) => return (None, None),
            },
        };
        let cwd = transcript::real_path(&cwd);
        match transcript::find_transcript(&config, &cwd, session_id) {
            Some((path, bytes)) => (Some(path), Some(bytes)),
            None => (
                Some(transcript::transcript_path(&config, &cwd, session_id)),
                None,
            ),
        }
    }

    async fn open(self: Arc<Self>, request: TurnRequest) -> Result<EventStream, StreamError> {
        let prompt = self
            .options
            .system_prompt_for(request.append_system_prompt.as_deref());
        let (idle, previous, newest) = {
            let mut sessions = self.sessions.lock();
            let slot = sessions.entry(request.session_key.clone()).or_default();
            (
                slot.idle.take(),
                slot.last_group.clone(),
                slot.newest.clone(),
            )
        };
        // The id to resume: the request's; for a retry of the same turn
        // without one, the id the failed attempt's process announced.
        let retried_id = match newest {
            Some((id, turn)) if request.attempt > 1 && turn == request.turn_id => Some(id),
            _ => None,
        };
        let resume_id = request.resume_id.clone().or(retried_id);
        let mut process = match idle {
            Some(p)
                if p.reusable(
                    resume_id.as_deref(),
                    request.workspace.as_deref(),
                    prompt.as_deref(),
                    request.model.as_deref().or(self.options.model.as_deref()),
                ) =>
            {
                tracing::debug!(
                    pid = p.group.pid(),
                    turn = request.turn_id,
                    "reusing claude process"
                );
                Some(p)
            }
            other => {
                drop(other);
                None
            }
        };
        if process.is_none() {
            wait_gone(previous.as_ref(), self.options.grace_period).await;
        }
        let mut attempts_left = 2;
        loop {
            attempts_left -= 1;
            let mut p = match process.take() {
                Some(p) => p,
                None => self.spawn(&request, resume_id.as_deref(), prompt.clone())?,
            };
            p.parser.begin_turn();
            match p.send_user(&request.message).await {
                Ok(()) => return Ok(self.turn_stream(p, &request)),
                Err(e) if attempts_left > 0 && p.reused() => {
                    // The idle process died since its last turn: start anew.
                    tracing::debug!(pid = p.group.pid(), error = %e, "idle claude process is gone; starting a new one");
                    let group = p.group.clone();
                    drop(p);
                    wait_gone(Some(&group), self.options.grace_period).await;
                }
                Err(e) => {
                    // A fresh process that does not take input has exited or
                    // is exiting: its stdout and stderr say why.
                    tracing::debug!(pid = p.group.pid(), error = %e, "could not write the user message");
                    return Ok(self.turn_stream(p, &request));
                }
            }
        }
    }

    fn turn_stream(self: &Arc<Self>, process: AgentProcess, request: &TurnRequest) -> EventStream {
        let turn = Turn {
            process: Some(process),
            home: Arc::downgrade(self),
            key: request.session_key.clone(),
            turn_id: request.turn_id,
            pending: VecDeque::new(),
            finished: false,
            max_line: self.options.max_line_bytes,
            grace: self.options.grace_period,
        };
        Box::pin(futures_util::stream::unfold(turn, |mut turn| async move {
            turn.next().await.map(|item| (item, turn))
        }))
    }

    fn spawn(
        &self,
        request: &TurnRequest,
        resume_id: Option<&str>,
        system_prompt: Option<String>,
    ) -> Result<AgentProcess, StreamError> {
        let options = &self.options;
        if let Some(id) = resume_id {
            self.log_transcript(id, request.workspace.as_deref());
        }
        let mut cmd = std::process::Command::new(&options.binary);
        // A turn that asks for a model gets a process started with it (the
        // conversation resumed as usual).
        let model = request.model.clone().or_else(|| options.model.clone());
        cmd.args(options.args_for_model(resume_id, system_prompt.as_deref(), model.as_deref()));
        cmd.envs(options.child_env());
        if let Some(dir) = &options.scratch_dir
            && let Err(e) = std::fs::create_dir_all(dir)
        {
            tracing::warn!(dir = %dir.display(), error = %e, "could not create the scratch directory");
        }
        if let Some(dir) = &request.workspace {
            cmd.current_dir(dir);
        }
        let failed = |e: std::io::Error| StreamError::Connection {
            message: format!("could not start {}: {e}", options.binary.display()),
        };
        let (group, pipes) = ProcessGroup::spawn(cmd, options.grace_period).map_err(failed)?;
        let converted = (|| {
            Ok::<_, std::io::Error>((
                tokio::process::ChildStdin::from_std(pipes.stdin)?,
                tokio::process::ChildStdout::from_std(pipes.stdout)?,
                tokio::process::ChildStderr::from_std(pipes.stderr)?,
            ))
        })();
        let (stdin, stdout, stderr) = match converted {
            Ok(p) => p,
            Err(e) => {
                group.terminate();
                return Err(failed(e));
            }
        };
        let tail = StderrTail::new(options.stderr_tail_lines);
        let stderr_task = tokio::spawn(tail.clone().read_from(BufReader::new(stderr)));
        tracing::info!(
            pid = group.pid(),
            resume = resume_id.is_some(),
            gen_ai.conversation.id = resume_id.unwrap_or_default(),
            cwd = ?request.workspace,
            "claude process started"
        );
        {
            let mut sessions = self.sessions.lock();
            let slot = sessions.entry(request.session_key.clone()).or_default();
            slot.last_group = Some(group.clone());
        }
        *self.last_stderr.lock() = Some(tail.clone());
        Ok(AgentProcess {
            group,
            stdin,
            stdout: BufReader::new(stdout),
            stderr: tail,
            stderr_task,
            parser: LineParser::new(resume_id.map(str::to_owned), options.max_garbage_lines),
            workspace: request.workspace.clone(),
            system_prompt,
            model,
            line: Vec::new(),
            served: false,
        })
    }

    /// The transcript check before a resume (a debug event).
    fn log_transcript(&self, session_id: &str, workspace: Option<&Path>) {
        let (path, bytes) = self.transcript(session_id, workspace);
        let elsewhere = match (&bytes, transcript::config_dir(&self.options.child_env())) {
            (None, Some(config)) => transcript::find_transcript_anywhere(&config, session_id),
            _ => None,
        };
        tracing::debug!(
            gen_ai.conversation.id = session_id,
            transcript = ?path,
            exists = bytes.is_some(),
            transcript_bytes = ?bytes,
            found_elsewhere = ?elsewhere,
            "resuming claude session"
        );
    }

    /// Puts a process whose turn completed back for the next turn.
    fn give_back(&self, key: &SessionKey, turn_id: u64, mut process: AgentProcess) {
        process.served = true;
        let mut sessions = self.sessions.lock();
        let slot = sessions.entry(key.clone()).or_default();
        note_id(slot, &process, turn_id);
        let current = slot
            .last_group
            .as_ref()
            .is_some_and(|g| Arc::ptr_eq(g, &process.group));
        if current && !process.group.has_exited() {
            if let Some(old) = slot.idle.replace(process) {
                drop(old);
            }
        } else {
            drop(process);
        }
    }

    /// Records the id of a process whose turn failed or was dropped.
    fn note_failed(&self, key: &SessionKey, turn_id: u64, process: &AgentProcess) {
        let mut sessions = self.sessions.lock();
        if let Some(slot) = sessions.get_mut(key) {
            note_id(slot, process, turn_id);
        }
    }
}

fn note_id(slot: &mut Slot, process: &AgentProcess, turn_id: u64) {
    if let Some(id) = process.parser.session_id() {
        slot.newest = Some((id.to_owned(), turn_id));
    }
}

/// Waits (bounded) until an old process group is gone, so that its
/// successor never finds the conversation "already in use".
async fn wait_gone(group: Option<&Arc<ProcessGroup>>, grace: Duration) {
    let Some(group) = group else { return };
    if group.is_gone() {
        return;
    }
    if tokio::time::timeout(grace + GONE_MARGIN, group.wait_gone())
        .await
        .is_err()
    {
        tracing::warn!(
            pid = group.pid(),
            "previous claude process still running; starting a new one anyway"
        );
    }
}

impl AgentProcess {
    fn reusable(
        &self,
        resume_id: Option<&str>,
        workspace: Option<&Path>,
        prompt: Option<&str>,
        model: Option<&str>,
    ) -> bool {
        !self.group.has_exited()
            && self.workspace.as_deref() == workspace
            && self.system_prompt.as_deref() == prompt
            && self.parser.session_id() == resume_id
            && self.model.as_deref() == model
    }

    /// Whether this process has served a turn before.
    fn reused(&self) -> bool {
        self.served
    }

    /// Writes one user turn to stdin.
    async fn send_user(&mut self, message: &str) -> std::io::Result<()> {
        let line = serde_json::json!({
            "type": "user",
            "message": {"role": "user", "content": message},
        });
        let mut bytes = serde_json::to_vec(&line).map_err(std::io::Error::other)?;
        bytes.push(b'\n');
        self.stdin.write_all(&bytes).await?;
        self.stdin.flush().await
    }
}

/// One turn's stream: owns the process until the turn completes.
struct Turn {
    process: Option<AgentProcess>,
    home: Weak<Shared>,
    key: SessionKey,
    turn_id: u64,
    pending: VecDeque<Result<Frame, StreamError>>,
    finished: bool,
    max_line: usize,
    grace: Duration,
}

impl Drop for Turn {
    fn drop(&mut self) {
        // Dropped before the turn completed (the watchdog's kill, a cancel,
        // a failure): the process goes down with the stream.
        if let Some(process) = self.process.take() {
            if let Some(home) = self.home.upgrade() {
                home.note_failed(&self.key, self.turn_id, &process);
            }
            drop(process);
        }
    }
}

impl Turn {
    async fn next(&mut self) -> Option<Result<Frame, StreamError>> {
        loop {
            if let Some(item) = self.pending.pop_front() {
                return Some(item);
            }
            if self.finished {
                return None;
            }
            let process = self.process.as_mut()?;
            let read =
                read_line_limited(&mut process.stdout, &mut process.line, self.max_line, true)
                    .await;
            match read {
                Ok(LineRead::Line(size)) if size > self.max_line => {
                    self.fail(StreamError::FrameTooLarge {
                        size,
                        limit: self.max_line,
                    });
                }
                Ok(LineRead::Line(_)) => match process.parser.line(&process.line) {
                    Step::Frames(frames) => self.pending.extend(frames.into_iter().map(Ok)),
                    Step::Complete(frames) => {
                        self.pending.extend(frames.into_iter().map(Ok));
                        self.complete();
                    }
                    Step::Fail(error) => self.fail(error),
                },
                Ok(LineRead::Eof) => {
                    let exit = process.group.wait_exit(self.grace).await;
                    process.stderr.wait_done(STDERR_DRAIN).await;
                    let stderr = process.stderr.lines();
                    let error = early_exit_error(
                        exit,
                        &stderr,
                        process.parser.resume_id(),
                        process.parser.saw_json(),
                    );
                    tracing::warn!(
                        pid = process.group.pid(),
                        %exit,
                        error.r#type = error.code(),
                        stderr_lines = stderr.len(),
                        "claude ended before the turn's result line"
                    );
                    self.fail(error);
                }
                Err(e) => self.fail(StreamError::Connection {
                    message: format!("reading claude's stdout failed: {e}"),
                }),
            }
        }
    }

    fn complete(&mut self) {
        self.finished = true;
        if let Some(process) = self.process.take() {
            match self.home.upgrade() {
                Some(home) => home.give_back(&self.key, self.turn_id, process),
                None => drop(process),
            }
        }
    }

    fn fail(&mut self, error: StreamError) {
        self.pending.push_back(Err(error));
        self.finished = true;
        if let Some(process) = self.process.take() {
            if let Some(home) = self.home.upgrade() {
                home.note_failed(&self.key, self.turn_id, &process);
            }
            drop(process);
        }
    }
}

/// A [`SourceFactory`] giving each session its own [`ClaudeSource`], so
/// that a session's shutdown (which drops its source) terminates its
/// process.
#[derive(Debug, Clone, Default)]
pub struct ClaudeSourceFactory {
    options: ClaudeOptions,
}

impl ClaudeSourceFactory {
    /// A factory whose sources use `options`.
    pub fn new(options: ClaudeOptions) -> Self {
        Self { options }
    }
}

impl SourceFactory for ClaudeSourceFactory {
    fn source_for(&self, _key: &SessionKey) -> Arc<dyn EventSource> {
        Arc::new(ClaudeSource::new(self.options.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_million_windows_come_from_the_1m_model_names() {
        assert_eq!(window_for_model("claude-sonnet-4-5"), None);
        assert_eq!(window_for_model("claude-sonnet-4-5[1m]"), Some(1_000_000));
        assert_eq!(window_for_model("Claude-Opus[1M]"), Some(1_000_000));
        assert_eq!(window_for_model("sonnet[1m]"), Some(1_000_000));
    }
}
