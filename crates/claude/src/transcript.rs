//! Where Claude Code keeps a session's transcript.
//!
//! `${CLAUDE_CONFIG_DIR:-$HOME/.claude}/projects/<key>/<session_id>.jsonl`,
//! where `<key>` is made from the working directory's real path (symlinks
//! resolved) by [`project_key`].
//!
//! warden looks the file up before a resume and when a resume fails: a
//! missing transcript usually means the agent runs in another directory
//! than the one the conversation was started in (Claude Code 2.1.197 then
//! answered "No conversation found…"; 2.1.332 finds it from another
//! directory too, `docs/wire-formats.md`).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// Longest project key Claude Code keeps before it cuts the key and adds a
/// hash.
pub const MAX_KEY_LEN: usize = 200;

/// The project directory name Claude Code uses for a working directory.
///
/// Every character outside `[a-zA-Z0-9]` becomes `-` (as JavaScript's
/// `path.replace(/[^a-zA-Z0-9]/g, '-')` does, one `-` per UTF-16 code unit,
/// so a character outside the Basic Multilingual Plane gives two):
/// `/home/u/a.b_c` → `-home-u-a-b-c`.
///
/// A key longer than [`MAX_KEY_LEN`] characters is cut to that length and
/// followed by `-` and a short hash of the *whole path*. The hash is a
/// **best effort**: Claude Code's Node build uses a 32-bit Java-style string
/// hash (`h = h * 31 + unit`, wrapping, over UTF-16 code units, then the
/// absolute value in base 36), which is what this function computes; its
/// Bun-compiled native build uses `Bun.hash` instead, which this crate does
/// not reproduce. [`find_transcript`] therefore also matches any directory
/// that starts with the cut key and `-`.
///
/// `path` should already be the real path; see [`real_path`].
pub fn project_key(path: &Path) -> String {
    let text = path.to_string_lossy();
    let mut key = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii_alphanumeric() {
            key.push(c);
        } else {
            for _ in 0..c.len_utf16() {
                key.push('-');
            }
        }
    }
    if key.len() <= MAX_KEY_LEN {
        return key;
    }
    // The key is ASCII: cutting at a byte index is cutting at a character.
    key.truncate(MAX_KEY_LEN);
    key.push('-');
    key.push_str(&short_hash(&text));
    key
}

/// `Math.abs(h).toString(36)` of the Java-style 32-bit string hash over
/// UTF-16 code units.
fn short_hash(text: &str) -> String {
    let mut h: i32 = 0;
    for unit in text.encode_utf16() {
        h = h
            .wrapping_shl(5)
            .wrapping_sub(h)
            .wrapping_add(i32::from(unit));
    }
    let mut n = i64::from(h).unsigned_abs();
    if n == 0 {
        return "0".to_owned();
    }
    let digits = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    while n > 0 {
        // `n % 36` is below 36: the index is in range.
        out.push(digits[(n % 36) as usize]);
        n /= 36;
    }
    out.reverse();
    String::from_utf8_lossy(&out).into_owned()
}

/// The real path of a working directory: symlinks resolved, or the path as
/// given when it cannot be resolved (it does not exist).
pub fn real_path(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Claude Code's configuration directory: `CLAUDE_CONFIG_DIR`, else
/// `$HOME/.claude`, looked up in `env` (the child's extra environment)
/// first and in this process's environment second. `None` when neither
/// variable is set anywhere.
pub fn config_dir(env: &[(OsString, OsString)]) -> Option<PathBuf> {
    let lookup = |name: &str| -> Option<OsString> {
        env.iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .or_else(|| std::env::var_os(name))
            .filter(|v| !v.is_empty())
    };
    if let Some(dir) = lookup("CLAUDE_CONFIG_DIR") {
        return Some(PathBuf::from(dir));
    }
    lookup("HOME").map(|home| PathBuf::from(home).join(".claude"))
}

/// The transcript path of `session_id` for the working directory `cwd`
/// (which should be the real path) under the configuration directory
/// `config_dir`.
pub fn transcript_path(config_dir: &Path, cwd: &Path, session_id: &str) -> PathBuf {
    config_dir
        .join("projects")
        .join(project_key(cwd))
        .join(format!("{session_id}.jsonl"))
}

/// Finds the transcript of `session_id` for `cwd`: the path of
/// [`transcript_path`] when it exists; for a key longer than
/// [`MAX_KEY_LEN`], any `projects/<cut key>-*/<id>.jsonl` (the hash suffix
/// is not reproduced exactly, see [`project_key`]). Returns the path and
/// its size, or `None` when no file is there.
pub fn find_transcript(config_dir: &Path, cwd: &Path, session_id: &str) -> Option<(PathBuf, u64)> {
    let expected = transcript_path(config_dir, cwd, session_id);
    if let Ok(meta) = std::fs::metadata(&expected) {
        return Some((expected, meta.len()));
    }
    let key = project_key(cwd);
    if key.len() <= MAX_KEY_LEN {
        return None;
    }
    let prefix = format!("{}-", &key[..MAX_KEY_LEN]);
    let file = format!("{session_id}.jsonl");
    let entries = std::fs::read_dir(config_dir.join("projects")).ok()?;
    entries.flatten().find_map(|entry| {
        let name = entry.file_name();
        if !name.to_string_lossy().starts_with(&prefix) {
            return None;
        }
        let candidate = entry.path().join(&file);
        let meta = std::fs::metadata(&candidate).ok()?;
        Some((candidate, meta.len()))
    })
}

/// Looks for `<session_id>.jsonl` under every project directory: where the
/// transcript is when it is not where [`transcript_path`] says (the
/// conversation was started in another working directory).
pub fn find_transcript_anywhere(config_dir: &Path, session_id: &str) -> Option<PathBuf> {
    let file = format!("{session_id}.jsonl");
    let entries = std::fs::read_dir(config_dir.join("projects")).ok()?;
    entries
        .flatten()
        .map(|entry| entry.path().join(&file))
        .find(|candidate| candidate.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_character_outside_ascii_alphanumerics_becomes_a_dash() {
        assert_eq!(project_key(Path::new("/home/u/a.b_c")), "-home-u-a-b-c");
        assert_eq!(project_key(Path::new("/w")), "-w");
        assert_eq!(
            project_key(Path::new("/tmp/My Project (2)/x~y")),
            "-tmp-My-Project--2--x-y"
        );
    }

    #[test]
    fn non_ascii_characters_become_one_dash_per_utf16_unit() {
        assert_eq!(project_key(Path::new("/é")), "--");
        // U+1F600 is two UTF-16 code units in JavaScript.
        assert_eq!(project_key(Path::new("/\u{1F600}")), "---");
    }

    #[test]
    fn a_key_of_exactly_200_characters_is_kept_whole() {
        let path = format!("/{}", "a".repeat(199));
        let key = project_key(Path::new(&path));
        assert_eq!(key.len(), 200);
        assert_eq!(key, format!("-{}", "a".repeat(199)));
    }

    #[test]
    fn a_longer_key_is_cut_to_200_and_gets_a_dash_and_a_hash() {
        let path = format!("/{}", "b".repeat(300));
        let key = project_key(Path::new(&path));
        let (head, tail) = key.split_at(200);
        assert_eq!(head, format!("-{}", "b".repeat(199)));
        assert!(tail.starts_with('-'), "{tail}");
        let hash = &tail[1..];
        assert!(!hash.is_empty() && hash.len() <= 7, "{hash}");
        assert!(
            hash.chars()
                .all(|c| c.is_ascii_digit() || c.is_ascii_lowercase())
        );
        // Same path, same key; another path with the same first 200, another hash.
        assert_eq!(project_key(Path::new(&path)), key);
        let other = format!("/{}c", "b".repeat(299));
        assert_ne!(project_key(Path::new(&other)), key);
    }

    #[test]
    fn the_hash_is_the_java_style_string_hash_in_base_36() {
        // "a" → 97 → "2p"; "ab" → 97*31+98 = 3105 → "2e9".
        assert_eq!(short_hash("a"), "2p");
        assert_eq!(short_hash("ab"), "2e9");
        assert_eq!(short_hash(""), "0");
        // Wrapping arithmetic: a long string overflows i32 without panicking.
        assert!(!short_hash(&"z".repeat(1000)).is_empty());
    }

    #[test]
    fn transcript_path_joins_config_dir_projects_key_and_id() {
        let p = transcript_path(Path::new("/cfg"), Path::new("/home/u/a.b_c"), "abc-123");
        assert_eq!(
            p,
            PathBuf::from("/cfg/projects/-home-u-a-b-c/abc-123.jsonl")
        );
    }

    #[test]
    fn config_dir_prefers_claude_config_dir_then_home_from_the_child_env() {
        let env = vec![(OsString::from("HOME"), OsString::from("/h"))];
        assert_eq!(config_dir(&env), Some(PathBuf::from("/h/.claude")));
        let env = vec![
            (OsString::from("HOME"), OsString::from("/h")),
            (OsString::from("CLAUDE_CONFIG_DIR"), OsString::from("/c")),
        ];
        assert_eq!(config_dir(&env), Some(PathBuf::from("/c")));
    }

    #[test]
    fn find_transcript_matches_a_cut_key_whatever_its_hash() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cwd = PathBuf::from(format!("/{}", "d".repeat(250)));
        let key = project_key(&cwd);
        let cut = &key[..MAX_KEY_LEN];
        let project = dir.path().join("projects").join(format!("{cut}-otherhash"));
        std::fs::create_dir_all(&project).expect("mkdir");
        std::fs::write(project.join("s1.jsonl"), b"{}\n{}\n").expect("write");
        let (found, bytes) = find_transcript(dir.path(), &cwd, "s1").expect("found");
        assert_eq!(found, project.join("s1.jsonl"));
        assert_eq!(bytes, 6);
        assert!(find_transcript(dir.path(), &cwd, "s2").is_none());
        assert_eq!(
            find_transcript_anywhere(dir.path(), "s1"),
            Some(project.join("s1.jsonl"))
        );
    }
}
