//! No crate source file is over 500 lines: a file that grows past that is
//! split by job (style.md). What counts is a file's code before its test
//! module (a top-level `#[cfg(test)] mod`: inline unit tests do not count); test files
//! (`tests.rs`, `*_tests.rs`) and the benchmarks (`crates/bench`) are left
//! out. The files still over are listed with their current length, and the
//! list may only shrink: a listed file that grows fails, and so does one
//! that is back under the limit and still listed (take it off the list).
//!
//! A binary of its own, not a module of `tests/it`: the working rules run
//! the three house-rule tests by name (`cargo test -p warden-suite --test
//! <name>`) before every commit, and that command stays as it is.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The most lines a source file may have before its tests.
const LIMIT: usize = 500;

/// Files still over [`LIMIT`], with their length when listed: each may
/// shrink (lower its figure when you can), none may grow, and none may be
/// added.
const STILL_OVER: &[(&str, usize)] = &[];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries =
        std::fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()));
    for entry in entries {
        let path = entry
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
            .path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

/// Whether `path` is a file of tests rather than of code.
fn is_test_file(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    name == "tests.rs" || name.ends_with("_tests.rs")
}

/// The lines of `text` before its test module: the first top-level
/// `#[cfg(test)]` that is followed (after any other attributes) by a `mod`.
/// A test-only item elsewhere (a `#[cfg(test)] use`) does not end the code.
fn code_lines(text: &str) -> usize {
    let lines: Vec<&str> = text.lines().collect();
    let is_test_module = |at: usize| {
        lines[at].trim_end() == "#[cfg(test)]"
            && lines[at + 1..]
                .iter()
                .find(|line| !line.starts_with("#["))
                .is_some_and(|line| line.trim_start_matches("pub(crate) ").starts_with("mod "))
    };
    (0..lines.len())
        .find(|&at| is_test_module(at))
        .unwrap_or(lines.len())
}

/// Each crate source file (relative to the workspace, `/`-separated) → its
/// code lines, the benchmarks and test files left out.
fn lengths() -> BTreeMap<String, usize> {
    let crates = root().join("crates");
    let mut files = Vec::new();
    let entries = std::fs::read_dir(&crates).expect("crates/ is readable");
    for entry in entries {
        let dir = entry.expect("crates/ is readable").path();
        if dir.file_name().is_some_and(|name| name == "bench") {
            continue;
        }
        let src = dir.join("src");
        if src.is_dir() {
            rust_files(&src, &mut files);
        }
    }
    files
        .into_iter()
        .filter(|path| !is_test_file(path))
        .map(|path| {
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
            let relative = path
                .strip_prefix(root())
                .expect("under the workspace")
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join("/");
            (relative, code_lines(&text))
        })
        .collect()
}

#[test]
fn no_source_file_is_over_500_lines_unless_listed_and_none_listed_grows() {
    let lengths = lengths();
    assert!(
        lengths.len() > 50,
        "found only {} source files: is the walk broken?",
        lengths.len()
    );
    let listed: BTreeMap<&str, usize> = STILL_OVER.iter().copied().collect();
    let mut problems = Vec::new();
    for (path, &lines) in &lengths {
        match listed.get(path.as_str()) {
            None if lines > LIMIT => problems.push(format!(
                "{path} has {lines} lines before its tests (limit {LIMIT}): split it by job"
            )),
            Some(&allowed) if lines > allowed => problems.push(format!(
                "{path} grew to {lines} lines (listed at {allowed}, limit {LIMIT}): split it by job"
            )),
            Some(_) if lines <= LIMIT => problems.push(format!(
                "{path} is down to {lines} lines: take it off STILL_OVER"
            )),
            _ => {}
        }
    }
    for path in listed.keys() {
        if !lengths.contains_key(*path) {
            problems.push(format!(
                "{path} is listed in STILL_OVER but no longer exists"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn code_before_the_top_level_test_module_is_what_counts() {
    let text = "a\n    #[cfg(test)]\nb\n#[cfg(test)]\nuse c;\n#[cfg(test)]\n#[path = \"t.rs\"]\nmod tests;\n";
    assert_eq!(code_lines(text), 5);
    assert_eq!(code_lines("a\n#[cfg(test)]\nmod tests {}\n"), 1);
    assert_eq!(code_lines("a\nb\n"), 2);
}
