//! Codex session files ("rollouts"): the last request's usage and the
//! context window, which `codex exec --json` does not print (its
//! `turn.completed.usage` is cumulative over the thread).

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use serde_json::Value;
use warden_core::Usage;

/// How much of a session file's end is read for its last `token_count`.
const TAIL_BYTES: u64 = 1024 * 1024;

/// The last request of a thread, from its session file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LastRequest {
    /// Its usage: `input_tokens` without the cached part, the cached part
    /// as `cache_read_input_tokens` (their sum is the context in use).
    pub(crate) usage: Usage,
    /// `model_context_window`, when reported.
    pub(crate) window: Option<u64>,
}

/// `<codex_home>/sessions/YYYY/MM/DD/rollout-…-<thread_id>.jsonl`, the
/// newest match.
pub(crate) fn find(codex_home: &Path, thread_id: &str) -> Option<PathBuf> {
    let suffix = format!("-{thread_id}.jsonl");
    let mut best: Option<PathBuf> = None;
    let mut dirs = vec![(codex_home.join("sessions"), 0)];
    while let Some((dir, depth)) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if depth < 3 && path.is_dir() {
                dirs.push((path, depth + 1));
            } else if path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("rollout-") && n.ends_with(&suffix))
                && best.as_ref().is_none_or(|b| path > *b)
            {
                best = Some(path);
            }
        }
    }
    best
}

/// The last `token_count` event of the session file at `path`.
pub(crate) fn last_request(path: &Path) -> Option<LastRequest> {
    let mut file = std::fs::File::open(path).ok()?;
    let len = file.metadata().ok()?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(TAIL_BYTES)))
        .ok()?;
    let mut tail = Vec::new();
    file.take(TAIL_BYTES).read_to_end(&mut tail).ok()?;
    tail.split(|b| *b == b'\n')
        .rev()
        .filter(|l| contains(l, b"token_count"))
        .find_map(|l| from_line(&serde_json::from_slice(l).ok()?))
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fn from_line(v: &Value) -> Option<LastRequest> {
    let payload = v.get("payload")?;
    if payload.get("type")?.as_str()? != "token_count" {
        return None;
    }
    let info = payload.get("info")?;
    let last = info.get("last_token_usage")?;
    let get = |k: &str| last.get(k).and_then(Value::as_u64).unwrap_or(0);
    let cached = get("cached_input_tokens");
    Some(LastRequest {
        usage: Usage {
            input_tokens: get("input_tokens").saturating_sub(cached),
            cache_read_input_tokens: cached,
            output_tokens: get("output_tokens"),
            ..Usage::default()
        },
        window: info.get("model_context_window").and_then(Value::as_u64),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_token_count_gives_the_last_request_and_the_window() {
        let dir = tempfile::tempdir().expect("tempdir");
        let day = dir.path().join("sessions/2026/12/06");
        std::fs::create_dir_all(&day).expect("mkdir");
        let id = "01a248eb-745c-7d71-9292-022ab8cab1e9";
        let path = day.join(format!("rollout-2026-12-06T01-15-20-{id}.jsonl"));
        let count = |input: u64, cached: u64| {
            format!(
                r#"{{"type":"event_msg","payload":{{"type":"token_count","info":{{"total_token_usage":{{"input_tokens":99999}},"last_token_usage":{{"input_tokens":{input},"cached_input_tokens":{cached},"output_tokens":15}},"model_context_window":258400}}}}}}"#
            )
        };
        let text = format!(
            "{{\"type\":\"session_meta\"}}\n{}\n{}\n{{\"type\":\"event_msg\",\"payload\":{{\"type\":\"token_count\",\"info\":null}}}}\n",
            count(9516, 0),
            count(10000, 9000)
        );
        std::fs::write(&path, text).expect("write");
        assert_eq!(find(dir.path(), id), Some(path.clone()));
        assert_eq!(find(dir.path(), "other"), None);
        let last = last_request(&path).expect("a token count");
        assert_eq!(last.usage.input_tokens, 1000);
        assert_eq!(last.usage.cache_read_input_tokens, 9000);
        assert_eq!(last.window, Some(258_400));
    }
}
