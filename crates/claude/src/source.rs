//! [`CliSource`]: the [`EventSource`] that runs any [`AgentCli`].

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use futures_util::future::BoxFuture;
use tokio::io::BufReader;
use warden_core::{
    Diagnostics, EventSource, EventStream, SessionKey, SourceFactory, StreamError, TurnRequest,
};

use crate::cli::{
    AgentCli, CliCommand, ProcessLifetime, ProcessSettings, SpawnRequest, TurnParser,
};
use crate::lines::{LineParser, clip};
use crate::process::{ProcessGroup, StderrTail, wait_gone};
use crate::turn::{AgentProcess, Home, turn_stream};

/// An [`EventSource`] that runs the agent CLI `A` as child processes, one
/// process group per session key at a time.
///
/// See the [crate docs](crate) for process ownership and termination, and
/// [`AgentCli`] for what the adapter decides.
#[derive(Debug)]
pub struct CliSource<A: AgentCli> {
    shared: Arc<Shared<A>>,
}

#[derive(Debug)]
pub(crate) struct Shared<A: AgentCli> {
    pub(crate) cli: A,
    pub(crate) settings: ProcessSettings,
    sessions: Mutex<HashMap<SessionKey, Slot<A>>>,
    last_stderr: Mutex<Option<Arc<StderrTail>>>,
    /// What each session's processes' command gets of their own.
    per_session: std::sync::OnceLock<PerSession>,
}

/// A session's own part of its processes' command
/// ([`CliSource::set_per_session`]).
type PerSessionFn = dyn Fn(&SessionKey, &mut CliCommand) + Send + Sync;

struct PerSession(Box<PerSessionFn>);

impl std::fmt::Debug for PerSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PerSession")
    }
}

/// What the source keeps per session key.
#[derive(Debug)]
struct Slot<A: AgentCli> {
    /// The process of the last complete turn (waiting for the next turn,
    /// or exiting after it).
    idle: Option<AgentProcess<A>>,
    /// The newest process started for the key, idle, busy or going down.
    last_group: Option<Arc<ProcessGroup>>,
    /// The newest session id announced, and the turn it was seen in.
    newest: Option<(String, u64)>,
}

impl<A: AgentCli> Default for Slot<A> {
    fn default() -> Self {
        Self {
            idle: None,
            last_group: None,
            newest: None,
        }
    }
}

impl<A: AgentCli> CliSource<A> {
    /// A source running the CLI as `cli` says.
    pub fn new(cli: A) -> Self {
        let settings = cli.settings();
        Self {
            shared: Arc::new(Shared {
                cli,
                settings,
                sessions: Mutex::new(HashMap::new()),
                last_stderr: Mutex::new(None),
                per_session: std::sync::OnceLock::new(),
            }),
        }
    }

    /// Gives each session's processes something of their own: `edit` is
    /// called with the session's key on the command the adapter made,
    /// before each process of the session starts (`warden serve` points
    /// each session's CLI at a route of its own on its wire layer). Set
    /// once, before the first process; `false` when it was set already.
    pub fn set_per_session(
        &self,
        edit: impl Fn(&SessionKey, &mut CliCommand) + Send + Sync + 'static,
    ) -> bool {
        self.shared
            .per_session
            .set(PerSession(Box::new(edit)))
            .is_ok()
    }

    /// The adapter (for Claude Code, its options).
    pub fn options(&self) -> &A {
        &self.shared.cli
    }

    /// The newest agent session id a process of `key` announced (a resume
    /// may fork the id: this is the one to resume next), if any.
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

    /// Ends the session `key` without waiting: forgets it and starts
    /// terminating its process (idle or busy), as dropping a
    /// [`CliSourceFactory`]'s source does. For a caller that cannot wait
    /// (a drop: `warden_wire` ends a session's CLI when the session's
    /// source goes, before it removes the session's route).
    pub fn end_session(&self, key: &SessionKey) {
        let slot = self.shared.sessions.lock().remove(key);
        if let Some(mut slot) = slot {
            drop(slot.idle.take());
            if let Some(group) = slot.last_group.take() {
                group.terminate();
            }
        }
    }

    /// Terminates every process of this source (idle or busy) and waits
    /// until their process groups are gone: at most about the grace period.
    /// A busy turn's stream then fails (`Truncated` or `Connection`).
    pub async fn shutdown(&self) {
        let slots: Vec<Slot<A>> = self
            .shared
            .sessions
            .lock()
            .drain()
            .map(|(_, slot)| slot)
            .collect();
        shut(slots).await;
    }
}

async fn shut<A: AgentCli>(slots: Vec<Slot<A>>) {
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

impl<A: AgentCli> EventSource for CliSource<A> {
    fn open(&self, request: TurnRequest) -> BoxFuture<'static, Result<EventStream, StreamError>> {
        let shared = self.shared.clone();
        Box::pin(async move { shared.open(request).await })
    }

    fn provider(&self) -> &str {
        match self.shared.cli.name() {
            "claude" => "claude-code",
            name => name,
        }
    }

    /// An agent CLI reads and edits the files of its working directory:
    /// a session without a workspace is refused, never run in warden's.
    fn runs_in_workspace(&self) -> bool {
        true
    }

    /// The CLI runs tools itself and a retry resumes its session, whose
    /// transcript holds their results: a retry does not hand a tool call
    /// to the caller again.
    fn restarts_repeat_tool_calls(&self) -> bool {
        false
    }

    fn context_window(&self, model: Option<&str>) -> Option<u64> {
        self.shared.cli.context_window(model)
    }

    fn fresh_start_note(&self) -> Option<String> {
        self.shared.cli.fresh_start_note()
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
        let transcript = self.shared.cli.transcript(session_id, workspace);
        d.transcript_path = transcript.path;
        d.transcript_bytes = transcript.bytes;
        d
    }
}

impl<A: AgentCli> Shared<A> {
    async fn open(self: Arc<Self>, request: TurnRequest) -> Result<EventStream, StreamError> {
        let prompt = self
            .cli
            .system_prompt(request.append_system_prompt.as_deref());
        let model = request
            .model
            .clone()
            .or_else(|| self.cli.default_model().map(str::to_owned));
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
        let one_per_turn = self.cli.lifetime() == ProcessLifetime::Turn;
        let mut process = match idle {
            Some(p)
                if !one_per_turn
                    && p.reusable(
                        resume_id.as_deref(),
                        request.workspace.as_deref(),
                        prompt.as_deref(),
                        model.as_deref(),
                    ) =>
            {
                tracing::debug!(
                    agent = self.cli.name(),
                    pid = p.group.pid(),
                    turn = request.turn_id,
                    "reusing agent process"
                );
                Some(p)
            }
            Some(p) if one_per_turn => {
                // The last turn's process finishes on its own (it may still
                // be writing its session file): give it the grace period.
                p.group.wait_exit(self.settings.grace_period).await;
                drop(p);
                None
            }
            other => {
                drop(other);
                None
            }
        };
        if process.is_none() {
            wait_gone(previous.as_ref(), self.settings.grace_period).await;
        }
        let mut attempts_left = 2;
        loop {
            attempts_left -= 1;
            let mut p = match process.take() {
                Some(p) => p,
                None => self.spawn(
                    &request,
                    resume_id.as_deref(),
                    prompt.clone(),
                    model.clone(),
                )?,
            };
            p.parser.begin_turn();
            match p.send_user(&self.cli, &request.message, one_per_turn).await {
                Ok(()) => return Ok(self.stream(p, &request)),
                Err(e) if attempts_left > 0 && p.reused() => {
                    // The idle process died since its last turn: start anew.
                    tracing::debug!(pid = p.group.pid(), error = %e, "idle agent process is gone; starting a new one");
                    let group = p.group.clone();
                    drop(p);
                    wait_gone(Some(&group), self.settings.grace_period).await;
                }
                Err(e) => {
                    // A fresh process that does not take input has exited or
                    // is exiting: its stdout and stderr say why.
                    tracing::debug!(pid = p.group.pid(), error = %e, "could not write the user message");
                    return Ok(self.stream(p, &request));
                }
            }
        }
    }

    fn spawn(
        &self,
        request: &TurnRequest,
        resume_id: Option<&str>,
        system_prompt: Option<String>,
        model: Option<String>,
    ) -> Result<AgentProcess<A>, StreamError> {
        let spawn = SpawnRequest {
            resume_id,
            model: model.as_deref(),
            system_prompt: system_prompt.as_deref(),
            workspace: request.workspace.as_deref(),
            message: Some(&request.message),
        };
        if let Some(id) = resume_id {
            if !A::Parser::is_session_id(id) {
                // Stored before ids were checked, or by another build: it
                // would not resume (or not even start the process).
                return Err(StreamError::UnknownSession {
                    session_id: id.to_owned(),
                    message: format!(
                        "{:?} is not a {} session id; a fresh conversation starts",
                        clip(id),
                        self.cli.name()
                    ),
                });
            }
            self.cli.before_resume(id, request.workspace.as_deref());
        }
        let mut command = self.cli.command(&spawn)?;
        if let Some(PerSession(edit)) = self.per_session.get() {
            edit(&request.session_key, &mut command);
        }
        let mut cmd = std::process::Command::new(&command.program);
        cmd.args(&command.args).envs(command.env.iter().cloned());
        if let Some(dir) = &request.workspace {
            cmd.current_dir(dir);
        }
        let failed = |e: std::io::Error| StreamError::Connection {
            message: format!("could not start {}: {e}", command.program.display()),
        };
        let grace = self.settings.grace_period;
        let (group, pipes) = ProcessGroup::spawn(cmd, grace).map_err(failed)?;
        if let Some(dir) = &self.settings.children_dir {
            group.record_in(dir);
        }
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
        let tail = StderrTail::new(self.settings.stderr_tail_lines);
        let stderr_task = tokio::spawn(tail.clone().read_from(BufReader::new(stderr)));
        tracing::info!(
            agent = self.cli.name(),
            pid = group.pid(),
            resume = resume_id.is_some(),
            gen_ai.conversation.id = resume_id.unwrap_or_default(),
            cwd = ?request.workspace,
            "agent process started"
        );
        {
            let mut sessions = self.sessions.lock();
            let slot = sessions.entry(request.session_key.clone()).or_default();
            slot.last_group = Some(group.clone());
        }
        *self.last_stderr.lock() = Some(tail.clone());
        let parser = LineParser::new(
            self.cli.parser(&spawn),
            self.cli.name(),
            self.settings.max_garbage_lines,
        );
        Ok(AgentProcess {
            group,
            stdin: Some(stdin),
            stdout: BufReader::new(stdout),
            stderr: tail,
            stderr_task,
            parser,
            workspace: request.workspace.clone(),
            system_prompt,
            model,
            line: Vec::new(),
            served: false,
        })
    }

    /// The stream of `request`'s turn on `process`, which comes back here
    /// when the turn ends.
    fn stream(self: &Arc<Self>, process: AgentProcess<A>, request: &TurnRequest) -> EventStream {
        let home: Weak<dyn Home<A>> = Arc::downgrade(self) as Weak<Self>;
        turn_stream(home, &self.settings, self.cli.name(), process, request)
    }
}

impl<A: AgentCli> Home<A> for Shared<A> {
    /// Puts a process whose turn completed back for the next turn.
    fn give_back(&self, key: &SessionKey, turn_id: u64, mut process: AgentProcess<A>) {
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
    fn note_failed(&self, key: &SessionKey, turn_id: u64, process: &AgentProcess<A>) {
        let mut sessions = self.sessions.lock();
        if let Some(slot) = sessions.get_mut(key) {
            note_id(slot, process, turn_id);
        }
    }
}

fn note_id<A: AgentCli>(slot: &mut Slot<A>, process: &AgentProcess<A>, turn_id: u64) {
    if let Some(id) = process.parser.session_id() {
        slot.newest = Some((id.to_owned(), turn_id));
    }
}

/// A [`SourceFactory`] giving each session its own [`CliSource`], so that
/// a session's shutdown (which drops its source) terminates its process.
#[derive(Debug, Clone, Default)]
pub struct CliSourceFactory<A> {
    cli: A,
}

impl<A: AgentCli + Clone> CliSourceFactory<A> {
    /// A factory whose sources run `cli`.
    pub fn new(cli: A) -> Self {
        Self { cli }
    }
}

impl<A: AgentCli + Clone> SourceFactory for CliSourceFactory<A> {
    fn source_for(&self, _key: &SessionKey) -> Arc<dyn EventSource> {
        Arc::new(CliSource::new(self.cli.clone()))
    }
}
