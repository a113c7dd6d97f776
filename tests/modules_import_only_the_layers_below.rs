//! Each crate that has layers keeps them: every source file imports only
//! the crate modules listed for it, so no two modules need each other, and
//! the lower layers know nothing of what sits above (HTTP, providers,
//! forwarding). One table per crate; `warden-core`'s own test
//! (`crates/core/tests/`) checks its module graph for circles instead.

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
    ("routes/sessions", &["cluster", "error", "state", "views"]),
    (
        "routes/turns",
        &["cluster", "error", "ids", "sse", "state", "turns"],
    ),
];

/// `warden-proxy`: records, configuration, headers and the upstreams at
/// the bottom; the splice strategies (one per protocol) above them; the
/// driver (`run`) that sends attempts and uses a strategy; `lib.rs` with
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
    (
        "run",
        &[
            "access", "assemble", "config", "headers", "spans", "splice", "upstream",
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
