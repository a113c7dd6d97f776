//! The server's modules form layers: the records and rules at the bottom
//! (config, errors, ids, views), the turns and their SSE above them, the
//! cluster's forwarding beside them, the shared state, the routes on top; `lib.rs` only wires
//! them. Each source file imports only the modules listed for it, so the
//! graph has no cycle and no handler reaches around the cluster extractor.

use std::path::Path;

/// Module → the crate modules it may import.
const ALLOWED: &[(&str, &[&str])] = &[
    ("config", &[]),
    ("error", &[]),
    ("ids", &[]),
    ("views", &[]),
    ("openapi", &[]),
    ("metrics", &[]),
    ("turns", &["ids"]),
    ("sse", &["turns"]),
    ("cluster", &["error", "ids"]),
    ("state", &["cluster", "config", "metrics", "turns"]),
    ("routes/ops", &["error", "state", "views"]),
    ("routes/sessions", &["cluster", "error", "state", "views"]),
    (
        "routes/turns",
        &["cluster", "error", "sse", "state", "turns"],
    ),
];

const MODULES: &[&str] = &[
    "config", "error", "ids", "views", "openapi", "metrics", "turns", "sse", "state", "cluster",
    "routes",
];

/// The code of `module`, comments and doc comments left out.
fn code(module: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src")
        .join(format!("{module}.rs"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    text.lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn every_module_imports_only_the_modules_below_it() {
    for (module, allowed) in ALLOWED {
        let code = code(module);
        for other in MODULES {
            if module.starts_with(other) || allowed.contains(other) {
                continue;
            }
            assert!(
                !code.contains(&format!("crate::{other}")),
                "{module} imports {other}, which the layering forbids"
            );
        }
        // The crate root is the wiring, never a dependency.
        assert!(
            !code.contains("crate::AppState") && !code.contains("crate::router"),
            "{module} imports from the crate root"
        );
    }
}

#[test]
fn only_the_cluster_module_forwards_requests() {
    for (module, _) in ALLOWED {
        if *module == "cluster" {
            continue;
        }
        let code = code(module);
        assert!(
            !code.contains("reqwest"),
            "{module} uses reqwest: forwarding belongs to cluster"
        );
        assert!(
            !code.contains(".place("),
            "{module} places sessions itself: ask the Cluster extractor"
        );
    }
}
