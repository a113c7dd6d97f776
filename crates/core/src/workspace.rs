//! Workspace path normalization: two spellings of one directory must reach
//! the same session (and the same agent transcript).
//!
//! [`normalize_workspace`] makes the path absolute (against the current
//! directory), then resolves it with the operating system (symlinks, `.`,
//! `..`, duplicate and trailing separators). When the path does not exist
//! yet, it is cleaned lexically and its longest existing ancestor is
//! resolved, so `link/new-dir` and `real/new-dir` still agree.

use std::io;
use std::path::{Component, Path, PathBuf};

/// Normalizes a workspace path; see the module docs. Fails only when the
/// current directory is needed and unavailable.
pub fn normalize_workspace(path: impl AsRef<Path>) -> io::Result<PathBuf> {
    let path = path.as_ref();
    let absolute = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()?.join(path)
    };
    let normalized = match std::fs::canonicalize(&absolute) {
        Ok(p) => p,
        Err(_) => resolve_existing_prefix(&clean(&absolute)),
    };
    if normalized.as_os_str() != path.as_os_str() {
        tracing::debug!(
            event = "workspace.normalize",
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
    use super::*;

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
