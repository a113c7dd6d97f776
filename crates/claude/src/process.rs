//! The child process: its own process group, SIGTERM → grace → SIGKILL,
//! reaped by a dedicated thread.
//!
//! # How a process group is ended
//!
//! The child is spawned with `process_group(0)`: it leads a new process
//! group whose id is its pid, and everything it starts (tool shells, their
//! children) is in that group unless it moves itself out.
//!
//! A *keeper* thread (one per process, blocked in `wait`) owns the
//! `std::process::Child` and reaps the leader the moment it exits, so a
//! leader never stays a zombie. [`ProcessGroup::terminate`] (called when
//! the owning stream or source is dropped, or on shutdown) runs, on a
//! thread of its own so that `Drop` never blocks:
//!
//! 1. `killpg(pgid, SIGTERM)`;
//! 2. wait until the leader is reaped and no process is left in the group
//!    (`killpg(pgid, 0)` answers `ESRCH`), at most the grace period;
//! 3. if anything is left, `killpg(pgid, SIGKILL)`;
//! 4. wait until the leader is reaped, then report the group gone.
//!
//! The same sequence runs when the leader exits on its own, so the group
//! never outlives its leader (no orphaned tool processes). Members whose
//! parent was the leader are re-parented to init, which reaps them.
//!
//! Threads rather than tokio tasks: termination must run to the end even
//! when the tokio runtime is shutting down (a source dropped at the end of
//! `main` or of a test).
//!
//! A group id is only signalled while the group may still exist: the kernel
//! keeps a pid number allocated while any process uses it as its group id,
//! and allocates pids cyclically, so a group id is not handed to another
//! group in the instant between the last member's exit and a signal.

use std::collections::VecDeque;
use std::io;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncBufRead, AsyncBufReadExt};
use tokio::sync::watch;

use crate::cli::ExitInfo;

/// A child process leading its own process group.
#[derive(Debug)]
pub(crate) struct ProcessGroup {
    pgid: Pid,
    grace: Duration,
    reaped: Mutex<bool>,
    reaped_cond: Condvar,
    terminating: AtomicBool,
    exit: watch::Sender<Option<ExitInfo>>,
    gone: watch::Sender<bool>,
    /// The group's entry in a children directory, removed once it is gone.
    entry: Mutex<Option<std::path::PathBuf>>,
}

/// The pipes of a freshly spawned child.
pub(crate) struct Pipes {
    pub(crate) stdin: ChildStdin,
    pub(crate) stdout: ChildStdout,
    pub(crate) stderr: ChildStderr,
}

impl ProcessGroup {
    /// Spawns `cmd` as the leader of a new process group with piped stdio,
    /// and its keeper thread.
    pub(crate) fn spawn(mut cmd: Command, grace: Duration) -> io::Result<(Arc<Self>, Pipes)> {
        cmd.process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // The keeper thread exists before the child does: if no thread can
        // be started, no child is left without a reaper.
        let (tx, rx) = std::sync::mpsc::channel::<(Child, Arc<ProcessGroup>)>();
        thread::Builder::new()
            .name("warden-claude-keeper".into())
            .stack_size(64 * 1024)
            .spawn(move || {
                if let Ok((child, group)) = rx.recv() {
                    group.keep(child);
                }
            })?;
        let mut child = cmd.spawn()?;
        let pid = i32::try_from(child.id()).map_err(io::Error::other)?;
        let group = Arc::new(Self {
            pgid: Pid::from_raw(pid),
            grace,
            reaped: Mutex::new(false),
            reaped_cond: Condvar::new(),
            terminating: AtomicBool::new(false),
            exit: watch::channel(None).0,
            gone: watch::channel(false).0,
            entry: Mutex::new(None),
        });
        let pipes = match (child.stdin.take(), child.stdout.take(), child.stderr.take()) {
            (Some(stdin), Some(stdout), Some(stderr)) => Pipes {
                stdin,
                stdout,
                stderr,
            },
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(io::Error::other("child has no piped stdio"));
            }
        };
        if let Err(std::sync::mpsc::SendError((mut child, _))) = tx.send((child, group.clone())) {
            // The keeper thread is gone: end the child here.
            let _ = killpg(group.pgid, Signal::SIGKILL);
            let _ = child.wait();
            return Err(io::Error::other("keeper thread exited early"));
        }
        Ok((group, pipes))
    }

    /// The leader's pid (also the group id).
    pub(crate) fn pid(&self) -> u32 {
        self.pgid.as_raw().unsigned_abs()
    }

    /// Records the group in `dir` (see [`crate::children`]) until it is gone.
    pub(crate) fn record_in(&self, dir: &std::path::Path) {
        let Some(path) = crate::children::record(dir, self.pid()) else {
            return;
        };
        let mut entry = self.entry.lock();
        if self.is_gone() {
            // Gone while being recorded: termination will not remove it.
            let _ = std::fs::remove_file(&path);
        } else {
            *entry = Some(path);
        }
    }

    /// Whether the leader has exited (and been reaped).
    pub(crate) fn has_exited(&self) -> bool {
        self.exit.borrow().is_some()
    }

    /// Waits at most `timeout` for the leader's exit.
    pub(crate) async fn wait_exit(&self, timeout: Duration) -> ExitInfo {
        let mut rx = self.exit.subscribe();
        let waited = tokio::time::timeout(timeout, rx.wait_for(Option::is_some)).await;
        match waited {
            Ok(Ok(exit)) => exit.unwrap_or(ExitInfo::Unknown),
            Ok(Err(_)) => ExitInfo::Unknown,
            Err(_) => ExitInfo::StillRunning,
        }
    }

    /// Waits until the group has been terminated and the leader reaped.
    /// Does not start termination.
    pub(crate) async fn wait_gone(&self) {
        let mut rx = self.gone.subscribe();
        let _ = rx.wait_for(|gone| *gone).await;
    }

    /// Whether termination has finished.
    pub(crate) fn is_gone(&self) -> bool {
        *self.gone.borrow()
    }

    /// Starts terminating the group (see the module docs); returns at once.
    /// Idempotent.
    pub(crate) fn terminate(self: &Arc<Self>) {
        if self.terminating.swap(true, Ordering::SeqCst) {
            return;
        }
        tracing::debug!(
            pid = self.pid(),
            grace_ms = self.grace.as_millis() as u64,
            "terminating claude process group"
        );
        let me = self.clone();
        let started = thread::Builder::new()
            .name("warden-claude-terminate".into())
            .stack_size(64 * 1024)
            .spawn(move || me.run_termination());
        if started.is_err() {
            // No thread for the grace period: kill at once. The keeper
            // still reaps the leader.
            tracing::warn!(
                pid = self.pid(),
                "no thread for a graceful stop; sending SIGKILL"
            );
            let _ = killpg(self.pgid, Signal::SIGKILL);
        }
    }

    /// The keeper: reap the leader, then make sure its group goes too.
    fn keep(&self, mut child: Child) {
        let exit = match child.wait() {
            Ok(status) => match (status.code(), status.signal()) {
                (Some(code), _) => ExitInfo::Code(code),
                (None, Some(signal)) => ExitInfo::Signal(signal),
                (None, None) => ExitInfo::Unknown,
            },
            Err(_) => ExitInfo::Unknown,
        };
        *self.reaped.lock() = true;
        self.reaped_cond.notify_all();
        self.exit.send_replace(Some(exit));
        tracing::debug!(pid = self.pid(), %exit, "claude process exited");
        if !self.terminating.swap(true, Ordering::SeqCst) {
            self.run_termination();
        }
    }

    /// SIGTERM, grace, SIGKILL, reaped. Runs once per group.
    fn run_termination(&self) {
        let deadline = Instant::now() + self.grace;
        self.signal(Signal::SIGTERM);
        let mut reaped = self.reaped.lock();
        while !*reaped {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            self.reaped_cond.wait_for(&mut reaped, deadline - now);
        }
        let leader_reaped = *reaped;
        drop(reaped);
        while Instant::now() < deadline && self.group_alive() {
            thread::sleep(Duration::from_millis(5));
        }
        if !leader_reaped || self.group_alive() {
            tracing::debug!(
                pid = self.pid(),
                "claude process group outlived the grace period; sending SIGKILL"
            );
            self.signal(Signal::SIGKILL);
        }
        let mut reaped = self.reaped.lock();
        while !*reaped {
            self.reaped_cond
                .wait_for(&mut reaped, Duration::from_secs(1));
        }
        drop(reaped);
        let mut entry = self.entry.lock();
        if let Some(path) = entry.take() {
            let _ = std::fs::remove_file(path);
        }
        self.gone.send_replace(true);
    }

    fn signal(&self, signal: Signal) {
        // ESRCH: nothing left in the group.
        let _ = killpg(self.pgid, signal);
    }

    /// Whether any process (zombies included) is still in the group.
    fn group_alive(&self) -> bool {
        killpg(self.pgid, None).is_ok()
    }
}

/// The last lines a process wrote to stderr, bounded.
#[derive(Debug)]
pub(crate) struct StderrTail {
    lines: Mutex<VecDeque<String>>,
    cap: usize,
    done: watch::Sender<bool>,
}

/// Longest stderr line kept, in bytes.
const MAX_STDERR_LINE: usize = 2000;

impl StderrTail {
    /// An empty tail keeping `cap` lines.
    pub(crate) fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self {
            lines: Mutex::new(VecDeque::with_capacity(cap.min(64))),
            cap,
            done: watch::channel(false).0,
        })
    }

    /// Adds a line, dropping the oldest past the cap.
    pub(crate) fn push(&self, line: String) {
        if self.cap == 0 {
            return;
        }
        let mut lines = self.lines.lock();
        if lines.len() == self.cap {
            lines.pop_front();
        }
        lines.push_back(line);
    }

    /// The kept lines, oldest first.
    pub(crate) fn lines(&self) -> Vec<String> {
        self.lines.lock().iter().cloned().collect()
    }

    /// Reads `stderr` to its end into the tail.
    pub(crate) async fn read_from<R: AsyncBufRead + Unpin>(self: Arc<Self>, mut stderr: R) {
        let mut buf = Vec::new();
        while let Ok(LineRead::Line(_)) =
            read_line_limited(&mut stderr, &mut buf, MAX_STDERR_LINE, false).await
        {
            let line = String::from_utf8_lossy(&buf).trim_end().to_owned();
            self.push(line);
        }
        self.done.send_replace(true);
    }

    /// Waits at most `timeout` for stderr's end.
    pub(crate) async fn wait_done(&self, timeout: Duration) {
        let mut rx = self.done.subscribe();
        let _ = tokio::time::timeout(timeout, rx.wait_for(|d| *d)).await;
    }
}

/// What [`read_line_limited`] read.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum LineRead {
    /// A line of this many bytes (its newline excluded); the buffer holds
    /// at most the limit. With `stop_over`, a line over the limit returns
    /// as soon as it is over, with the bytes seen so far.
    Line(usize),
    /// End of the stream, nothing read.
    Eof,
}

/// Reads one `\n`-terminated line into `buf` (cleared first, newline
/// dropped) keeping at most `limit` bytes; a last line without a newline
/// counts as a line.
pub(crate) async fn read_line_limited<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    buf: &mut Vec<u8>,
    limit: usize,
    stop_over: bool,
) -> io::Result<LineRead> {
    buf.clear();
    let mut total = 0usize;
    let mut any = false;
    loop {
        let chunk = reader.fill_buf().await?;
        if chunk.is_empty() {
            return Ok(if any {
                LineRead::Line(total)
            } else {
                LineRead::Eof
            });
        }
        any = true;
        let (part, used, ended) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (&chunk[..i], i + 1, true),
            None => (chunk, chunk.len(), false),
        };
        total = total.saturating_add(part.len());
        let room = limit.saturating_sub(buf.len());
        buf.extend_from_slice(&part[..part.len().min(room)]);
        reader.consume(used);
        if ended || (stop_over && total > limit) {
            return Ok(LineRead::Line(total));
        }
    }
}

/// Extra time over the grace period to wait for an old process group to be
/// gone before starting its successor.
const GONE_MARGIN: Duration = Duration::from_secs(1);

/// Waits (bounded) until an old process group is gone, so that its
/// successor never finds the conversation "already in use".
pub(crate) async fn wait_gone(group: Option<&Arc<ProcessGroup>>, grace: Duration) {
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
            "previous agent process still running; starting a new one anyway"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_are_read_whole_cut_at_the_limit_or_stopped_when_over() {
        let data: &[u8] = b"one\ntwo-long-line\nlast";
        let mut r = tokio::io::BufReader::with_capacity(4, data);
        let mut buf = Vec::new();
        assert_eq!(
            read_line_limited(&mut r, &mut buf, 100, true).await.ok(),
            Some(LineRead::Line(3))
        );
        assert_eq!(buf, b"one");
        assert_eq!(
            read_line_limited(&mut r, &mut buf, 5, false).await.ok(),
            Some(LineRead::Line(13))
        );
        assert_eq!(buf, b"two-l");
        assert_eq!(
            read_line_limited(&mut r, &mut buf, 100, true).await.ok(),
            Some(LineRead::Line(4))
        );
        assert_eq!(buf, b"last");
        assert_eq!(
            read_line_limited(&mut r, &mut buf, 100, true).await.ok(),
            Some(LineRead::Eof)
        );

        let data: &[u8] = b"0123456789abcdef\n";
        let mut r = tokio::io::BufReader::with_capacity(4, data);
        match read_line_limited(&mut r, &mut buf, 6, true).await {
            Ok(LineRead::Line(n)) => assert!(n > 6 && n <= 8, "stopped early at {n}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_stderr_tail_keeps_only_the_last_lines() {
        let tail = StderrTail::new(3);
        for i in 0..10 {
            tail.push(format!("line {i}"));
        }
        assert_eq!(tail.lines(), ["line 7", "line 8", "line 9"]);
        let none = StderrTail::new(0);
        none.push("x".into());
        assert!(none.lines().is_empty());
    }

    #[tokio::test]
    async fn stderr_lines_are_clipped_and_the_end_is_signalled() {
        let long = "x".repeat(MAX_STDERR_LINE * 2);
        let data = format!("a\n{long}\nb");
        let tail = StderrTail::new(50);
        tail.clone()
            .read_from(tokio::io::BufReader::new(data.as_bytes()))
            .await;
        tail.wait_done(Duration::from_millis(10)).await;
        let lines = tail.lines();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[1].len(), MAX_STDERR_LINE);
        assert_eq!(lines[2], "b");
        assert!(*tail.done.borrow());
    }
}
