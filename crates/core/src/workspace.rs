//! Workspace path normalization: two spellings of one directory must reach
//! the same session (and the same agent transcript).
//!
//! [`normalize_workspace`] makes the path absolute (against the current
//! directory), then resolves it with the operating system (symlinks, `.`,
//! `..`, duplicate and trailing separators). When the path does not exist
//! yet, it is cleaned lexically and its longest existing ancestor is
//! resolved, so `link/new-dir` and `real/new-dir` still agree.
//!
//! A path that can never be a workspace is refused at the door, before a
//! session (and an agent working in that directory) starts: one with a NUL
//! byte, one longer than `PATH_MAX` (4,096 bytes), and one that names
//! something other than a directory (a regular file, also reached through
//! `..`). A directory that does not exist yet is accepted: agents that keep
//! no files there (the HTTP APIs) need none, and one that does (Claude
//! Code) fails its start with a clear error.

use std::io;
use std::path::{Component, Path, PathBuf};

use crate::source::SessionKey;

impl SessionKey {
    /// The key of the workspace at `path`, as a supervisor keys it
    /// ([`Supervisor::key_for`](crate::Supervisor::key_for)), without one:
    /// for a `specs` factory or a record seeded before the supervisor
    /// starts. The path is [normalized](normalize_workspace); the key is
    /// its text when it is UTF-8 (every such key is unchanged), else
    /// `path-bytes:` and its bytes with each byte that is not UTF-8, and
    /// `%`, written `%XX` — distinct for distinct paths, where a lossy
    /// conversion gave two such directories one key (and one transcript).
    pub fn for_workspace(path: impl AsRef<Path>) -> io::Result<SessionKey> {
        Ok(Self::of_normalized(&normalize_workspace(path)?))
    }

    /// The key of an already normalized workspace path.
    pub(crate) fn of_normalized(path: &Path) -> SessionKey {
        if let Some(text) = path.to_str() {
            return SessionKey::new(text);
        }
        let mut key = String::from("path-bytes:");
        for chunk in path.as_os_str().as_encoded_bytes().utf8_chunks() {
            key.push_str(&chunk.valid().replace('%', "%25"));
            for byte in chunk.invalid() {
                key.push_str(&format!("%{byte:02X}"));
            }
        }
        SessionKey::new(key)
    }
}

/// The longest workspace path accepted, in bytes (Linux's `PATH_MAX`).
pub(crate) const MAX_WORKSPACE_PATH: usize = 4096;

/// Normalizes a workspace path; see the module docs. Fails
/// (`InvalidInput`) for a path that can never be a workspace, or when the
/// current directory is needed and unavailable.
pub fn normalize_workspace(path: impl AsRef<Path>) -> io::Result<PathBuf> {
    let path = path.as_ref();
    let refuse = |why: String| Err(io::Error::new(io::ErrorKind::InvalidInput, why));
    if path.as_os_str().as_encoded_bytes().contains(&0) {
        return refuse("the path contains a NUL byte".to_owned());
    }
    if path.as_os_str().len() > MAX_WORKSPACE_PATH {
        return refuse(format!(
            "the path is {} bytes long, over the {MAX_WORKSPACE_PATH}-byte limit",
            path.as_os_str().len()
        ));
    }
    let absolute = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()?.join(path)
    };
    let normalized = match std::fs::canonicalize(&absolute) {
        Ok(p) => p,
        Err(_) => resolve_existing_prefix(&clean(&absolute)),
    };
    if normalized.exists() && !normalized.is_dir() {
        return refuse(format!("{} is not a directory", normalized.display()));
    }
    if normalized.as_os_str() != path.as_os_str() {
        tracing::debug!(
            event = crate::names::WORKSPACE_NORMALIZED,
            original = %path.display(),
            normalized = %normalized.display(),
            "workspace path normalized"
        );
    }
    Ok(normalized)
}

/// Lexical cleaning: drops `.`, applies `..` to the previous component,
/// collapses separators. Never touches the file system.
pub(crate) fn clean(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() && !path.is_absolute() {
                    out.push("..");
                }
            }
            other => out.push(other.as_os_str()),
        }
    }
    if out.as_os_str().is_empty() {
        out.push(if path.is_absolute() { "/" } else { "." });
    }
    out
}

fn resolve_existing_prefix(cleaned: &Path) -> PathBuf {
    let mut existing = cleaned.to_path_buf();
    let mut rest = Vec::new();
    while !existing.exists() {
        match (
            existing.file_name().map(|n| n.to_os_string()),
            existing.parent(),
        ) {
            (Some(name), Some(parent)) => {
                rest.push(name);
                existing = parent.to_path_buf();
            }
            _ => return cleaned.to_path_buf(),
        }
    }
    let mut resolved = std::fs::canonicalize(&existing).unwrap_or(existing);
    for name in rest.into_iter().rev() {
        resolved.push(name);
    }
    resolved
}

#[cfg(test)]
mod tests {
    #[cfg(unix)]
    #[test]
    fn workspace_keys_are_distinct_for_distinct_paths_and_unchanged_for_utf8() {
        use std::ffi::OsStr;
        use std::os::unix::ffi::OsStrExt as _;

        use crate::source::SessionKey;

        let dir = std::env::temp_dir().join(format!("warden-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let dir = std::fs::canonicalize(&dir).expect("canonical");
        let utf8 = dir.join("café 100%");
        assert_eq!(
            SessionKey::for_workspace(&utf8).expect("key").as_str(),
            utf8.to_str().expect("UTF-8"),
            "a UTF-8 path is its own key"
        );
        let mut keys = std::collections::HashSet::new();
        for name in [&b"\xff"[..], b"\xfe", b"%FF", b"\xff%"] {
            let path = dir.join(OsStr::from_bytes(name));
            let key = SessionKey::for_workspace(&path).expect("key");
            assert!(keys.insert(key.clone()), "{key} twice");
        }
        let lossy: std::collections::HashSet<_> = [&b"\xff"[..], b"\xfe"]
            .iter()
            .map(|n| {
                dir.join(OsStr::from_bytes(n))
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        assert_eq!(lossy.len(), 1, "the lossy keys it replaces collided");
        let _ = std::fs::remove_dir_all(&dir);
    }

    use super::*;

    #[test]
    fn paths_that_can_never_be_a_workspace_are_refused() {
        let dir = std::env::temp_dir().join(format!("warden-ws-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("a-file");
        std::fs::write(&file, b"x").expect("file");
        let long = format!("/{}", "a".repeat(MAX_WORKSPACE_PATH));
        for (path, why) in [
            (PathBuf::from("/tmp/a\0b"), "NUL"),
            (PathBuf::from(&long), "limit"),
            (file.clone(), "not a directory"),
            (dir.join("sub/../a-file"), "not a directory"),
        ] {
            let err = normalize_workspace(&path).expect_err(why);
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{why}");
            assert!(err.to_string().contains(why), "{err}");
        }
        // A directory, existing or not yet, is fine.
        assert!(normalize_workspace(&dir).is_ok());
        assert!(normalize_workspace(dir.join("not-yet")).is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn lexical_cleaning() {
        assert_eq!(clean(Path::new("/a/./b//c/")), PathBuf::from("/a/b/c"));
        assert_eq!(clean(Path::new("/a/b/../c")), PathBuf::from("/a/c"));
        assert_eq!(clean(Path::new("/../a")), PathBuf::from("/a"));
        assert_eq!(clean(Path::new("/")), PathBuf::from("/"));
        assert_eq!(clean(Path::new("a/../..")), PathBuf::from(".."));
    }

    #[test]
    fn missing_paths_fall_back_to_the_cleaned_absolute_path() {
        let p = normalize_workspace("/definitely/not/here/./x/../y/").expect("normalize");
        assert_eq!(p, PathBuf::from("/definitely/not/here/y"));
    }
}
