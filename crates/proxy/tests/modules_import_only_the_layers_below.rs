//! The proxy's modules form layers: records, configuration, headers and
//! the upstreams at the bottom; the splice strategies (one per protocol)
//! above them, knowing their wire format and nothing of HTTP; the driver
//! (`run`) that sends attempts and uses a strategy; `lib.rs` with the routes
//! on top. Each file imports only the modules listed for it, so there is no
//! circle between the driver and the strategies.

use std::path::Path;

/// Module (file under `src/`) → the crate modules it may import.
const ALLOWED: &[(&str, &[&str])] = &[
    ("access", &[]),
    ("config", &["access"]),
    ("headers", &[]),
    ("spans", &[]),
    ("upstream", &[]),
    ("splice/mod", &["upstream"]),
    ("splice/anthropic", &[]),
    ("splice/chat", &[]),
    ("splice/responses", &[]),
    (
        "run",
        &["access", "config", "headers", "spans", "splice", "upstream"],
    ),
];

const MODULES: &[&str] = &[
    "access", "config", "headers", "spans", "upstream", "splice", "run",
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
        assert!(
            !code.contains("crate::{") && !code.contains("crate::Proxy"),
            "{module} imports from the crate root"
        );
    }
}

#[test]
fn the_splice_strategies_know_nothing_of_http() {
    for module in [
        "splice/mod",
        "splice/anthropic",
        "splice/chat",
        "splice/responses",
    ] {
        let code = code(module);
        for http in ["reqwest", "axum"] {
            assert!(
                !code.contains(http),
                "{module} uses {http}; sending belongs to run"
            );
        }
    }
}

#[test]
fn the_route_decides_the_protocol_once() {
    // The driver is told the protocol; it never looks at the path again.
    let run = code("run");
    for path in [
        "\"/v1/messages\"",
        "\"/v1/chat/completions\"",
        "\"/v1/responses\"",
    ] {
        assert!(!run.contains(path), "run matches the path {path}");
    }
}
