//! The core's modules form layers with no circle between them: errors,
//! events, the transitions' names and the source port at the bottom; the watchdog, the stream
//! task, policies and the stores above them; transitions, then sessions,
//! then the supervisor on top. Read from the sources, so a new
//! `use crate::…` that closes a circle fails here, naming it; the files
//! inside a module (`session/actor.rs`, `session/run.rs`, …) are checked
//! for circles, `super::` paths included, by the workspace's
//! `tests/modules_import_only_the_layers_below.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Modules that may import nothing else of the crate but these.
const LEAVES: &[(&str, &[&str])] = &[
    ("error", &[]),
    ("event", &[]),
    ("names", &[]),
    ("context", &[]),
    ("spans", &[]),
    ("workspace", &["names", "source"]),
    ("source", &["error", "event"]),
    ("lifecycle", &["error", "names", "source", "store"]),
];

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Top-level module → the top-level modules its code (tests left out)
/// names through `crate::`.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut all = Vec::new();
    files(&src, &mut all);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for path in all {
        let rel = path.strip_prefix(&src).expect("under src");
        let top = rel
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .expect("a name")
            .trim_end_matches(".rs")
            .to_owned();
        let name = rel.to_string_lossy();
        if top == "lib" || name.ends_with("tests.rs") || name.contains("/tests") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read");
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        let deps = graph.entry(top.clone()).or_default();
        for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for (i, _) in line.match_indices("crate::") {
                let rest = &line[i + "crate::".len()..];
                let module: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                if !module.is_empty() && module != top {
                    deps.insert(module);
                }
            }
        }
    }
    let modules: BTreeSet<String> = graph.keys().cloned().collect();
    for deps in graph.values_mut() {
        deps.retain(|d| modules.contains(d));
    }
    graph
}

/// A path from `from` back to itself, if there is one.
fn circle(graph: &BTreeMap<String, BTreeSet<String>>, from: &str) -> Option<Vec<String>> {
    fn walk(
        graph: &BTreeMap<String, BTreeSet<String>>,
        start: &str,
        at: &str,
        path: &mut Vec<String>,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        for next in graph.get(at).into_iter().flatten() {
            if next == start {
                path.push(next.clone());
                return true;
            }
            if seen.insert(next.clone()) {
                path.push(next.clone());
                if walk(graph, start, next, path, seen) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    let mut path = vec![from.to_owned()];
    let mut seen = BTreeSet::new();
    walk(graph, from, from, &mut path, &mut seen).then_some(path)
}

#[test]
fn no_two_modules_need_each_other() {
    let graph = graph();
    assert!(graph.len() > 15, "the crate's modules: {graph:?}");
    for module in graph.keys() {
        if let Some(path) = circle(&graph, module) {
            panic!("import circle: {}", path.join(" -> "));
        }
    }
}

#[test]
fn the_bottom_layers_import_only_what_is_below_them() {
    let graph = graph();
    for (module, allowed) in LEAVES {
        let deps = graph
            .get(*module)
            .unwrap_or_else(|| panic!("no module {module}"));
        for dep in deps {
            assert!(
                allowed.contains(&dep.as_str()),
                "{module} imports {dep}, which sits above it"
            );
        }
    }
}
