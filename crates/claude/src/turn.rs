//! One running agent process ([`AgentProcess`]) and one turn's stream over
//! it ([`Turn`]): the stream owns the process until the turn ends, and a
//! stream dropped earlier takes the process group down with it.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::io::{AsyncWriteExt, BufReader};
use tokio::task::JoinHandle;
use warden_core::{EventStream, Frame, SessionKey, StreamError, TurnRequest};

use crate::cli::{AgentCli, ProcessSettings, Step};
use crate::lines::LineParser;
use crate::process::{LineRead, ProcessGroup, StderrTail, read_line_limited};

/// How long to wait for stderr's end after an early exit (the process may
/// have left a child holding it).
const STDERR_DRAIN: Duration = Duration::from_millis(500);

/// A running agent CLI and the state that outlives one turn.
#[derive(Debug)]
pub(crate) struct AgentProcess<A: AgentCli> {
    pub(crate) group: Arc<ProcessGroup>,
    /// `None` once closed (after the one turn of a per-turn process).
    pub(crate) stdin: Option<tokio::process::ChildStdin>,
    pub(crate) stdout: BufReader<tokio::process::ChildStdout>,
    pub(crate) stderr: Arc<StderrTail>,
    pub(crate) stderr_task: JoinHandle<()>,
    pub(crate) parser: LineParser<A::Parser>,
    pub(crate) workspace: Option<PathBuf>,
    pub(crate) system_prompt: Option<String>,
    /// The model it was started with, if one was given.
    pub(crate) model: Option<String>,
    pub(crate) line: Vec<u8>,
    /// Whether a turn completed on this process.
    pub(crate) served: bool,
}

impl<A: AgentCli> Drop for AgentProcess<A> {
    fn drop(&mut self) {
        self.group.terminate();
        self.stderr_task.abort();
    }
}

impl<A: AgentCli> AgentProcess<A> {
    pub(crate) fn reusable(
        &self,
        resume_id: Option<&str>,
        workspace: Option<&Path>,
        prompt: Option<&str>,
        model: Option<&str>,
    ) -> bool {
        !self.group.has_exited()
            && self.stdin.is_some()
            && self.workspace.as_deref() == workspace
            && self.system_prompt.as_deref() == prompt
            && self.parser.session_id() == resume_id
            && self.model.as_deref() == model
    }

    /// Whether this process has served a turn before.
    pub(crate) fn reused(&self) -> bool {
        self.served
    }

    /// Writes one user turn to stdin; closes stdin after it when `close`.
    pub(crate) async fn send_user(
        &mut self,
        cli: &A,
        message: &str,
        close: bool,
    ) -> std::io::Result<()> {
        let bytes = cli.turn_input(message)?;
        let Some(stdin) = self.stdin.as_mut() else {
            return Err(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        };
        let written = async {
            stdin.write_all(&bytes).await?;
            stdin.flush().await
        }
        .await;
        if close {
            // Dropping the pipe is the end of input.
            self.stdin = None;
        }
        written
    }
}

/// Where a turn's process goes when the turn ends: what keeps processes
/// between turns ([`CliSource`](crate::CliSource)'s per-key slots). The
/// turn reports to it through this interface, declared here, so this file
/// names nothing above it.
pub(crate) trait Home<A: AgentCli>: Send + Sync {
    /// The turn completed on `process`: keep it for the session's next turn.
    fn give_back(&self, key: &SessionKey, turn_id: u64, process: AgentProcess<A>);

    /// The turn failed or was dropped on `process`, which goes down now:
    /// note the conversation id it announced, for the retry to resume.
    fn note_failed(&self, key: &SessionKey, turn_id: u64, process: &AgentProcess<A>);
}

/// The stream of one turn on `process` of the agent CLI called `name`.
pub(crate) fn turn_stream<A: AgentCli>(
    home: Weak<dyn Home<A>>,
    settings: &ProcessSettings,
    name: &str,
    process: AgentProcess<A>,
    request: &TurnRequest,
) -> EventStream {
    let turn = Turn {
        process: Some(process),
        home,
        key: request.session_key.clone(),
        turn_id: request.turn_id,
        pending: VecDeque::new(),
        finished: false,
        max_line: settings.max_line_bytes,
        grace: settings.grace_period,
        name: name.to_owned(),
    };
    Box::pin(futures_util::stream::unfold(turn, |mut turn| async move {
        turn.next().await.map(|item| (item, turn))
    }))
}

/// One turn's stream: owns the process until the turn completes.
struct Turn<A: AgentCli> {
    process: Option<AgentProcess<A>>,
    home: Weak<dyn Home<A>>,
    key: SessionKey,
    turn_id: u64,
    pending: VecDeque<Result<Frame, StreamError>>,
    finished: bool,
    max_line: usize,
    grace: Duration,
    name: String,
}

impl<A: AgentCli> Drop for Turn<A> {
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

impl<A: AgentCli> Turn<A> {
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
                    let error = process.parser.ended_early(exit, &stderr);
                    tracing::warn!(
                        agent = %self.name,
                        pid = process.group.pid(),
                        %exit,
                        error.r#type = error.code(),
                        stderr_lines = stderr.len(),
                        "the agent CLI ended before the turn did"
                    );
                    self.fail(error);
                }
                Err(e) => self.fail(StreamError::Connection {
                    message: format!("reading {}'s stdout failed: {e}", self.name),
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
