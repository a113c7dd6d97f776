//! A directory of the agent processes a warden process started, so that
//! the next warden on the same data directory ends the ones a `kill -9`
//! (or a crash) left behind.
//!
//! A process per turn (Codex, Gemini) has its stdin closed once the prompt
//! is in, so nothing tells it that warden died: measured with Codex
//! 0.169.0, a turn stalled upstream kept running after `kill -9` of
//! `warden serve`, and kept the thread's writer lock, so the restarted
//! warden's resume failed ("thread … already has an active writer") and the
//! conversation fell back to a fresh one. With
//! [`ProcessSettings::children_dir`](crate::ProcessSettings::children_dir)
//! set, every process started is an entry `<dir>/<pid>` holding
//! `<pid> <start time> <warden pid> <warden start time>` (start times from
//! `/proc/<pid>/stat`, so a reused pid is never taken for the process),
//! removed once its group is gone. [`end_orphaned_children`] ends the
//! groups of the entries whose warden is gone.

use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// `pid`'s start time (clock ticks since boot), from `/proc/<pid>/stat`;
/// `None` when the process is gone or `/proc` does not say.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 22; the fields after the command name (which may hold spaces
    // and parentheses) start at field 3.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether `pid` is alive and is the process that started at `start`.
fn is_same_process(pid: u32, start: u64) -> bool {
    start_time(pid) == Some(start)
}

/// Records the group led by `pid` in `dir`: the entry's path, or `None`
/// (logged) when it cannot be written.
pub(crate) fn record(dir: &Path, pid: u32) -> Option<PathBuf> {
    let me = std::process::id();
    let (Some(start), Some(my_start)) = (start_time(pid), start_time(me)) else {
        return None;
    };
    let path = dir.join(pid.to_string());
    let written = std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&path, format!("{pid} {start} {me} {my_start}\n")));
    match written {
        Ok(()) => Some(path),
        Err(e) => {
            tracing::warn!(dir = %dir.display(), pid, error = %e, "could not record an agent process; a crash of warden would leave it running");
            None
        }
    }
}

/// Ends the agent process groups recorded in `dir` by a warden process
/// that is gone (`SIGTERM` to the group, up to `grace` for it to empty,
/// then `SIGKILL`) and removes their entries, and the entries of groups
/// already gone: the pids whose groups were ended. Entries of a live
/// warden (another process on the same directory) are left alone.
/// Blocks for at most `grace` plus a second.
pub fn end_orphaned_children(dir: &Path, grace: Duration) -> Vec<u32> {
    let mut ended = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return ended;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let fields: Vec<u64> = text
            .split_whitespace()
            .filter_map(|f| f.parse().ok())
            .collect();
        let [pid, start, owner, owner_start] = fields[..] else {
            // Not ours, or torn by the crash: the group it named is unknown.
            let _ = std::fs::remove_file(&path);
            continue;
        };
        let (Ok(pid), Ok(owner)) = (u32::try_from(pid), u32::try_from(owner)) else {
            let _ = std::fs::remove_file(&path);
            continue;
        };
        if is_same_process(owner, owner_start) {
            continue;
        }
        if is_same_process(pid, start) {
            tracing::warn!(
                pid,
                "ending an agent process group left by a warden that is gone"
            );
            end_group(pid, grace);
            ended.push(pid);
        }
        let _ = std::fs::remove_file(&path);
    }
    ended
}

/// `SIGTERM` to the group, up to `grace` for it to empty, then `SIGKILL`
/// and up to a second more.
fn end_group(pid: u32, grace: Duration) {
    let Ok(raw) = i32::try_from(pid) else {
        return;
    };
    let pgid = Pid::from_raw(raw);
    let alive = || killpg(pgid, None).is_ok();
    let wait = |limit: Duration| {
        let until = Instant::now() + limit;
        while alive() && Instant::now() < until {
            thread::sleep(Duration::from_millis(10));
        }
    };
    let _ = killpg(pgid, Signal::SIGTERM);
    wait(grace);
    if alive() {
        let _ = killpg(pgid, Signal::SIGKILL);
        wait(Duration::from_secs(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_of_a_live_warden_are_kept_and_of_a_gone_one_ended() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .expect("sleep");
        let pid = child.id();
        let start = start_time(pid).expect("a start time");
        // Recorded by this (live) process: kept.
        let path = record(dir.path(), pid).expect("recorded");
        assert!(end_orphaned_children(dir.path(), Duration::from_secs(1)).is_empty());
        assert!(path.exists());
        // Recorded by a warden that is gone (pid 1 did not start then).
        let gone = format!("{pid} {start} 1 {}\n", u64::MAX);
        std::fs::write(&path, &gone).expect("write");
        assert_eq!(
            end_orphaned_children(dir.path(), Duration::from_secs(1)),
            [pid]
        );
        assert!(!path.exists());
        let status = child.wait().expect("wait");
        assert!(!status.success(), "ended by a signal: {status:?}");
        // An entry whose process is gone, or another one with the pid:
        // removed, nothing signalled.
        std::fs::write(&path, &gone).expect("write");
        assert!(end_orphaned_children(dir.path(), Duration::from_secs(1)).is_empty());
        assert!(!path.exists());
    }

    use std::os::unix::process::CommandExt as _;
}
