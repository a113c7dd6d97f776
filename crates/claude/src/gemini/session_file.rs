//! Gemini CLI session files: the last request's prompt tokens, which
//! `result.stats` (a sum over the turn's requests) does not give.
//!
//! A conversation lives in `<gemini dir>/tmp/<project>/chats/session-<time>-<id8>.jsonl`
//! (`<id8>`: the session id's first 8 characters); each `--resume` writes
//! another such file, so the newest one whose first record names the id
//! is the conversation now. Its `"type":"gemini"` records carry each
//! response's `tokens` (`input`: the prompt, `cached` part of it).

use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde_json::Value;
use warden_core::Usage;

/// How much of a session file's end is read for its last response.
const TAIL_BYTES: u64 = 1024 * 1024;

/// The newest session file of `session_id` under `gemini_dir`.
pub(crate) fn find(gemini_dir: &Path, session_id: &str) -> Option<PathBuf> {
    let short = session_id.get(..8)?;
    let suffix = format!("-{short}.jsonl");
    let mut best: Option<(SystemTime, PathBuf)> = None;
    let projects = std::fs::read_dir(gemini_dir.join("tmp")).ok()?;
    for project in projects.flatten() {
        let Ok(chats) = std::fs::read_dir(project.path().join("chats")) else {
            continue;
        };
        for entry in chats.flatten() {
            let path = entry.path();
            let named = path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("session-") && n.ends_with(&suffix));
            if !named || !names(&path, session_id) {
                continue;
            }
            let modified = entry
                .metadata()
                .and_then(|m| m.modified())
                .unwrap_or(SystemTime::UNIX_EPOCH);
            if best
                .as_ref()
                .is_none_or(|(t, p)| (modified, &path) > (*t, p))
            {
                best = Some((modified, path));
            }
        }
    }
    best.map(|(_, p)| p)
}

/// Whether the file's first record is session `id`'s.
fn names(path: &Path, id: &str) -> bool {
    let Ok(file) = std::fs::File::open(path) else {
        return false;
    };
    let mut first = String::new();
    let read = BufReader::new(file.take(64 * 1024)).read_line(&mut first);
    read.is_ok()
        && serde_json::from_str::<Value>(&first)
            .ok()
            .and_then(|v| v.get("sessionId")?.as_str().map(|s| s == id))
            .unwrap_or(false)
}

/// The usage of the last `"type":"gemini"` record with tokens: the prompt
/// as input (its cached part as `cache_read_input_tokens`) and the output.
pub(crate) fn last_request(path: &Path) -> Option<Usage> {
    let mut file = std::fs::File::open(path).ok()?;
    let len = file.metadata().ok()?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(TAIL_BYTES)))
        .ok()?;
    let mut tail = Vec::new();
    file.take(TAIL_BYTES).read_to_end(&mut tail).ok()?;
    tail.split(|b| *b == b'\n')
        .rev()
        .filter(|l| l.windows(8).any(|w| w == b"\"gemini\""))
        .find_map(|l| from_record(&serde_json::from_slice(l).ok()?))
}

fn from_record(v: &Value) -> Option<Usage> {
    if v.get("type")?.as_str()? != "gemini" {
        return None;
    }
    let tokens = v.get("tokens")?;
    let get = |k: &str| tokens.get(k).and_then(Value::as_u64).unwrap_or(0);
    let input = tokens.get("input")?.as_u64()?;
    let cached = get("cached").min(input);
    Some(Usage {
        input_tokens: input - cached,
        cache_read_input_tokens: cached,
        output_tokens: get("output") + get("thoughts"),
        ..Usage::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3444ea42-15e7-456d-aad9-56aa4be86122";

    fn record(input: u64, cached: u64) -> String {
        format!(
            r#"{{"id":"x","type":"gemini","content":"Hello","tokens":{{"input":{input},"output":5,"cached":{cached},"thoughts":0,"tool":0,"total":1}},"model":"gemini-2.5-pro"}}"#
        )
    }

    #[test]
    fn the_newest_file_of_the_id_gives_the_last_responses_prompt_tokens() {
        let dir = tempfile::tempdir().expect("tempdir");
        let chats = dir.path().join("tmp/project/chats");
        std::fs::create_dir_all(&chats).expect("mkdir");
        let head = format!(r#"{{"sessionId":"{ID}","projectHash":"h","kind":"main"}}"#);
        let old = chats.join("session-2026-12-06T02-58-3444ea42.jsonl");
        std::fs::write(&old, format!("{head}\n{}\n", record(100, 0))).expect("write");
        // A later resume: another file with the same suffix.
        std::thread::sleep(std::time::Duration::from_millis(20));
        let new = chats.join("session-2026-12-06T02-59-3444ea42.jsonl");
        let text = format!(
            "{head}\n{}\n{{\"id\":\"u\",\"type\":\"user\",\"content\":[]}}\n{}\n{{\"$set\":{{\"lastUpdated\":\"t\"}}}}\n",
            record(100, 0),
            record(230, 30)
        );
        std::fs::write(&new, text).expect("write");
        // Same suffix, another session: not ours.
        let other = chats.join("session-2026-12-06T03-00-3444ea42.jsonl");
        std::fs::write(&other, "{\"sessionId\":\"3444ea42-0000\"}\n").expect("write");
        assert_eq!(find(dir.path(), ID), Some(new.clone()));
        assert_eq!(
            find(dir.path(), "ffffffff-15e7-456d-aad9-56aa4be86122"),
            None
        );
        let usage = last_request(&new).expect("a gemini record");
        assert_eq!(usage.input_tokens, 200);
        assert_eq!(usage.cache_read_input_tokens, 30);
        assert_eq!(usage.output_tokens, 5);
        assert_eq!(last_request(&other), None);
    }
}
