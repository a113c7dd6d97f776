//! The module map of the crate docs holds: each source file imports only
//! the modules listed for it, so the graph has no cycle; the wire formats
//! and the decoder stay free of HTTP, and the decoder names no provider.

use std::path::Path;

/// Module → the crate modules it may import (children of `wire` may also
/// import `wire` through `super`).
const ALLOWED: &[(&str, &[&str])] = &[
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

const MODULES: &[&str] = &[
    "provider",
    "sse",
    "json",
    "classify",
    "wire",
    "decode",
    "transcript",
    "options",
    "transport",
    "continuation",
    "source",
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
            if other == module || allowed.contains(other) {
                continue;
            }
            assert!(
                !code.contains(&format!("crate::{other}")),
                "{module} imports {other}, which the module map forbids"
            );
        }
    }
}

#[test]
fn wire_formats_and_the_decoder_know_nothing_of_http() {
    for module in [
        "wire",
        "wire/anthropic",
        "wire/openai",
        "wire/responses",
        "decode",
    ] {
        assert!(
            !code(module).contains("reqwest"),
            "{module} uses reqwest; HTTP belongs to transport"
        );
    }
}

#[test]
fn the_decoder_names_no_provider() {
    let code = code("decode").to_ascii_lowercase();
    for name in ["anthropic", "openai"] {
        assert!(!code.contains(name), "decode names {name}");
    }
}
