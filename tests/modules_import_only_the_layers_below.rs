//! Each crate that has layers keeps them: every source file imports only
//! the crate modules listed for it, so no two modules need each other, and
//! the lower layers know nothing of what sits above (HTTP, providers,
//! forwarding). One table per crate; `warden-core`'s own test
//! (`crates/core/tests/`) checks its module graph for circles instead.
//!
//! A binary of its own, not a module of `tests/it`: the working rules run
//! the three house-rule tests by name (`cargo test -p warden-suite --test
//! <name>`) before every commit, and that command stays as it is.

use std::path::{Path, PathBuf};

/// A crate's source file → the crate modules it may import.
type Table = &'static [(&'static str, &'static [&'static str])];

/// `warden-llm`: the module map of its crate docs.
const LLM: Table = &[
    ("provider", &[]),
    ("sse", &[]),
    ("json", &[]),
    ("classify", &["json"]),
    ("wire", &["provider", "sse", "json", "classify"]),
    ("wire/anthropic", &["provider", "sse", "json", "classify"]),
    ("wire/openai", &["provider", "sse", "json", "classify"]),
    ("wire/responses", &["provider", "sse", "json", "classify"]),
    ("decode", &["provider", "sse", "wire"]),
    ("transcript", &["json"]),
    ("transcript/conversation", &[]),
    ("options", &["provider", "transcript"]),
    (
        "transport",
        &["provider", "classify", "decode", "transcript", "options"],
    ),
    ("continuation", &[]),
    (
        "source",
        &[
            "provider",
            "wire",
            "transcript",
            "options",
            "transport",
            "continuation",
        ],
    ),
];

/// `warden-serve`: records and rules at the bottom (config, errors, ids,
/// views), the turns and their SSE above them, the cluster's forwarding
/// beside them, the shared state, the routes on top; `lib.rs` wires them.
const SERVE: Table = &[
    ("config", &[]),
    ("error", &[]),
    ("ids", &[]),
    ("views", &[]),
    ("openapi", &[]),
    ("metrics", &[]),
    ("turns", &["ids"]),
    ("turns/log", &[]),
    ("turns/pump", &[]),
    ("turns/encode", &[]),
    ("history", &["turns", "views"]),
    ("sse", &["turns"]),
    ("cluster", &["error", "ids"]),
    (
        "state",
        &["cluster", "config", "history", "metrics", "turns"],
    ),
    (
        "routes/ops",
        &["cluster", "error", "history", "metrics", "state"],
    ),
    ("routes/agent_choice", &["config", "error"]),
    ("routes/sessions", &["cluster", "error", "state", "views"]),
    (
        "routes/turns",
        &["cluster", "error", "ids", "sse", "state", "turns"],
    ),
];

/// `warden-proxy`: records, configuration, headers and the upstreams at
/// the bottom; the splice strategies (one per protocol) and the replay of
/// a whole answer as a stream above them; the driver (`run`) that sends attempts and uses a strategy; `lib.rs` with
/// the routes on top.
const PROXY: Table = &[
    ("access", &[]),
    ("assemble", &[]),
    ("config", &["access"]),
    ("headers", &[]),
    ("spans", &[]),
    ("upstream", &[]),
    ("splice/mod", &["upstream"]),
    ("splice/anthropic", &[]),
    ("splice/chat", &[]),
    ("splice/responses", &[]),
    // (its tests assemble what it replays)
    ("replay", &["upstream", "assemble"]),
    (
        "run",
        &[
            "access", "assemble", "config", "headers", "replay", "spans", "splice", "upstream",
        ],
    ),
];

fn src(krate: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("crates")
        .join(krate)
        .join("src")
}

/// The code of `module` of `krate`, comments and doc comments left out.
fn code(krate: &str, module: &str) -> String {
    let path = src(krate).join(format!("{module}.rs"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    text.lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Checks `table` for `krate`: every other module of the table is out of
/// bounds unless listed (a file may name its own parent, `splice` for
/// `splice/chat`), and nothing imports from the crate root.
fn check(krate: &str, table: Table) {
    let modules: Vec<&str> = table
        .iter()
        .map(|(m, _)| m.split('/').next().unwrap_or(m))
        .collect();
    for (module, allowed) in table {
        let code = code(krate, module);
        for other in &modules {
            if module.starts_with(other) || allowed.contains(other) {
                continue;
            }
            assert!(
                !code.contains(&format!("crate::{other}")),
                "{krate}: {module} imports {other}, which the layering forbids"
            );
        }
        assert!(
            !code.contains("crate::{"),
            "{krate}: {module} imports from the crate root"
        );
    }
}

#[test]
fn every_module_imports_only_the_modules_below_it() {
    check("llm", LLM);
    check("serve", SERVE);
    check("proxy", PROXY);
}

#[test]
fn llm_wire_formats_and_the_decoder_know_nothing_of_http_or_providers() {
    for module in [
        "wire",
        "wire/anthropic",
        "wire/openai",
        "wire/responses",
        "decode",
    ] {
        assert!(
            !code("llm", module).contains("reqwest"),
            "{module} uses reqwest; HTTP belongs to transport"
        );
    }
    let decode = code("llm", "decode").to_ascii_lowercase();
    for name in ["anthropic", "openai"] {
        assert!(!decode.contains(name), "decode names {name}");
    }
}

#[test]
fn serve_forwards_only_through_its_cluster_module() {
    for (module, _) in SERVE {
        if *module == "cluster" {
            continue;
        }
        let code = code("serve", module);
        assert!(
            !code.contains("reqwest"),
            "{module} uses reqwest: forwarding belongs to cluster"
        );
        assert!(
            !code.contains(".place("),
            "{module} places sessions itself: ask the Cluster extractor"
        );
        assert!(
            !code.contains("crate::AppState") && !code.contains("crate::router"),
            "{module} imports from the crate root"
        );
    }
}

#[test]
fn proxy_strategies_know_nothing_of_http_and_the_route_decides_the_protocol() {
    for module in [
        "splice/mod",
        "splice/anthropic",
        "splice/chat",
        "splice/responses",
    ] {
        let code = code("proxy", module);
        for http in ["reqwest", "axum"] {
            assert!(
                !code.contains(http),
                "{module} uses {http}; sending belongs to run"
            );
        }
    }
    let run = code("proxy", "run");
    for path in [
        "\"/v1/messages\"",
        "\"/v1/chat/completions\"",
        "\"/v1/responses\"",
    ] {
        assert!(!run.contains(path), "run matches the path {path}");
    }
    assert!(
        !run.contains("crate::Proxy"),
        "run imports from the crate root"
    );
}

/// The circles still known, per crate (each to be broken; the test fails
/// when one is gone, so the list only shrinks). Every other crate's files
/// have none.
const KNOWN_FILE_CIRCLES: &[(&str, &[&str])] = &[];

/// A crate's source files as module paths (`session/actor`; `mod.rs`,
/// `lib.rs` and `main.rs` are their directory's module), each with its
/// code: comments and everything from the first `#[cfg(test)]` left out.
fn file_modules(krate: &str) -> std::collections::BTreeMap<Vec<String>, String> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("read src") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let root = src(krate);
    let mut paths = Vec::new();
    walk(&root, &mut paths);
    let mut modules = std::collections::BTreeMap::new();
    for path in paths {
        let rel = path
            .strip_prefix(&root)
            .expect("under src")
            .with_extension("");
        let mut parts: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if parts.last().is_some_and(|p| p == "mod") || parts == ["lib"] || parts == ["main"] {
            parts.pop();
        }
        if parts.iter().any(|p| p == "tests" || p.ends_with("_tests"))
            || parts.first().is_some_and(|p| p == "bin")
        {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read");
        let code = text
            .split("#[cfg(test)]")
            .next()
            .unwrap_or("")
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        modules.insert(parts, code);
    }
    modules
}

/// The paths a `use` tree at the start of `s` names under `prefix`
/// (`a::b`, `{a, b::{c, d}}`); how far it read.
fn use_tree(s: &[u8], mut i: usize, prefix: &[String], out: &mut Vec<Vec<String>>) -> usize {
    let is_ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    while i < s.len() && s[i].is_ascii_whitespace() {
        i += 1;
    }
    if s.get(i) == Some(&b'{') {
        i += 1;
        loop {
            while i < s.len() && (s[i].is_ascii_whitespace() || s[i] == b',') {
                i += 1;
            }
            if i >= s.len() || s[i] == b'}' {
                return i + 1;
            }
            i = use_tree(s, i, prefix, out);
        }
    }
    let start = i;
    while i < s.len() && is_ident(s[i]) {
        i += 1;
    }
    if start == i {
        out.push(prefix.to_vec());
        return i;
    }
    let mut path = prefix.to_vec();
    path.push(String::from_utf8_lossy(&s[start..i]).into_owned());
    if s[i..].starts_with(b"::") {
        return use_tree(s, i + 2, &path, out);
    }
    out.push(path);
    i
}

/// File → the files of the same crate it names through `crate::`,
/// `super::` or `self::`, an item a module re-exports from its child
/// counted as the child's (`super::Pump` in `run/attempt.rs` is
/// `run/pump.rs`'s when `run.rs` has `use pump::Pump`); its ancestors are
/// left out otherwise (a file may use what its parent module declares),
/// and so are the crate root's re-exports (the crate's public face).
fn file_graph(
    krate: &str,
) -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    let modules = file_modules(krate);
    // What each module re-exports from its own children (`use pump::Pump;`
    // in `run.rs`): `super::Pump` in `run/attempt.rs` names `run/pump`.
    let mut reexports = std::collections::BTreeMap::new();
    for (module, code) in &modules {
        for (at, _) in code.match_indices("use ") {
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                continue;
            }
            let mut paths = Vec::new();
            use_tree(code.as_bytes(), at + "use ".len(), &[], &mut paths);
            for path in paths {
                let Some(item) = path.last() else { continue };
                let mut child = module.clone();
                child.push(path[0].clone());
                if path.len() < 2 || !modules.contains_key(&child) {
                    continue;
                }
                let mut full = module.clone();
                full.extend(path[..path.len() - 1].iter().cloned());
                let owner = (0..=full.len())
                    .rev()
                    .map(|k| full[..k].to_vec())
                    .find(|p| modules.contains_key(p))
                    .unwrap_or_default();
                reexports.insert((module.clone(), item.clone()), owner);
            }
        }
    }
    let mut graph = std::collections::BTreeMap::new();
    for (module, code) in &modules {
        let mut deps = std::collections::BTreeSet::new();
        let bytes = code.as_bytes();
        let starts = ["crate::", "self::", "super::"]
            .into_iter()
            .flat_map(|head| code.match_indices(head).map(move |(at, _)| (at, head)));
        for (at, head) in starts {
            // Only a path's first segment (not `a::super::`, not `my_crate::`).
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let mut base: Vec<String> = match head {
                "crate::" => Vec::new(),
                _ => module.clone(),
            };
            if head == "super::" {
                base.pop();
            }
            let mut i = at + head.len();
            while code[i..].starts_with("super::") {
                base.pop();
                i += "super::".len();
            }
            let mut paths = Vec::new();
            use_tree(bytes, i, &base, &mut paths);
            for path in paths {
                let mut target = (0..=path.len())
                    .rev()
                    .map(|k| path[..k].to_vec())
                    .find(|p| modules.contains_key(p))
                    .unwrap_or_default();
                // Through a parent (not the crate root, whose re-exports
                // are the crate's public face): the child that defines it.
                if let Some(owner) = path
                    .get(target.len())
                    .filter(|_| !target.is_empty())
                    .and_then(|item| reexports.get(&(target.clone(), item.clone())))
                {
                    target = owner.clone();
                }
                let ancestor = module.starts_with(&target);
                if !target.is_empty() && !ancestor {
                    deps.insert(target.join("/"));
                }
            }
        }
        graph.insert(module.join("/"), deps);
    }
    graph
}

/// The strongly connected groups of more than one file (Tarjan's).
fn circles(
    graph: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
) -> Vec<Vec<String>> {
    struct Walk<'g> {
        graph: &'g std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
        index: std::collections::BTreeMap<&'g str, usize>,
        low: std::collections::BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        found: Vec<Vec<String>>,
    }
    impl<'g> Walk<'g> {
        fn visit(&mut self, v: &'g str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            for w in self.graph.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.graph.contains_key(w) {
                    continue;
                }
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.stack.contains(&w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut group = Vec::new();
                while let Some(w) = self.stack.pop() {
                    group.push(w.to_owned());
                    if w == v {
                        break;
                    }
                }
                if group.len() > 1 {
                    group.sort();
                    self.found.push(group);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: Default::default(),
        low: Default::default(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.found
}

/// No two source files call each other, directly or around a longer
/// circle, through `crate::`, `super::` or `self::` paths: each handler
/// returns what happens next to its loop instead of calling back into a
/// sibling file.
#[test]
fn no_source_files_call_each_other_in_a_circle() {
    let crates = std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("crates"))
        .expect("read crates/")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|k| src(k).is_dir())
        .collect::<Vec<_>>();
    assert!(crates.len() > 10, "the workspace's crates: {crates:?}");
    for krate in &crates {
        let krate = krate.as_str();
        let graph = file_graph(krate);
        assert!(!graph.is_empty(), "{krate}: no source files found");
        let known: Vec<Vec<String>> = KNOWN_FILE_CIRCLES
            .iter()
            .filter(|(k, _)| *k == krate)
            .map(|(_, files)| files.iter().map(|f| (*f).to_owned()).collect())
            .collect();
        let found = circles(&graph);
        for group in &found {
            let edges: Vec<String> = group
                .iter()
                .map(|f| {
                    let to: Vec<&str> = graph[f]
                        .iter()
                        .filter(|t| group.contains(t))
                        .map(String::as_str)
                        .collect();
                    format!("{f} -> {}", to.join(", "))
                })
                .collect();
            assert!(
                known.contains(group),
                "{krate}: these files call each other in a circle:\n  {}",
                edges.join("\n  ")
            );
        }
        for group in &known {
            assert!(
                found.contains(group),
                "{krate}: the circle {group:?} is gone: take it off KNOWN_FILE_CIRCLES"
            );
        }
    }
}

/// The circle finder sees `super::` paths and grouped imports: two files
/// that name each other that way are a circle, one direction is not.
#[test]
fn the_circle_finder_sees_super_paths_and_grouped_imports() {
    let mut out = Vec::new();
    use_tree(b"{a::{B, c}, d}", 0, &["x".to_owned()], &mut out);
    assert_eq!(
        out,
        [vec!["x", "a", "B"], vec!["x", "a", "c"], vec!["x", "d"]]
            .map(|p| p.into_iter().map(str::to_owned).collect::<Vec<_>>())
    );
    let two = |a: &[&str], b: &[&str]| {
        std::collections::BTreeMap::from([
            ("a".to_owned(), a.iter().map(|s| (*s).to_owned()).collect()),
            ("b".to_owned(), b.iter().map(|s| (*s).to_owned()).collect()),
        ])
    };
    assert_eq!(
        circles(&two(&["b"], &["a"])),
        [vec!["a".to_owned(), "b".to_owned()]]
    );
    assert!(circles(&two(&["b"], &[])).is_empty());
}
