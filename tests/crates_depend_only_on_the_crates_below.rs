//! Which warden crates each crate may depend on (normal dependencies; tests
//! and benchmarks may use anything). The ports live in `warden-core`, so an
//! adapter (a store, a source, an HTTP surface) needs core alone: a
//! database adapter never pulls in an HTTP stack, and no library depends on
//! the binary's crates. Read from `cargo metadata`, so a new dependency in a
//! Cargo.toml is checked without touching this file, and a new crate must be
//! listed here.
//!
//! A binary of its own, not a module of `tests/it`: the working rules run
//! the three house-rule tests by name (`cargo test -p warden-suite --test
//! <name>`) before every commit, and that command stays as it is.

use std::collections::BTreeMap;
use std::process::Command;

/// Crate → the warden crates it may depend on.
const ALLOWED: &[(&str, &[&str])] = &[
    ("warden-core", &[]),
    ("warden-mock", &[]),
    ("warden-browser", &[]),
    ("warden-telemetry", &[]),
    ("warden-http", &[]),
    ("warden-store", &["warden-core"]),
    ("warden-llm", &["warden-core"]),
    ("warden-claude", &["warden-core"]),
    ("warden-serve", &["warden-core"]),
    ("warden-pg", &["warden-core"]),
    (
        "warden-proxy",
        &["warden-core", "warden-llm", "warden-http"],
    ),
    // The wire layer under an agent CLI: the engine under the CLI adapters.
    (
        "warden-wire",
        &[
            "warden-core",
            "warden-claude",
            "warden-proxy",
            "warden-http",
        ],
    ),
    ("warden-suite", &["warden-core", "warden-store"]),
    // The binary and the benchmarks put the pieces together.
    (
        "warden",
        &[
            "warden-core",
            "warden-store",
            "warden-llm",
            "warden-mock",
            "warden-claude",
            "warden-telemetry",
            "warden-serve",
            "warden-proxy",
            "warden-pg",
            "warden-http",
            "warden-wire",
        ],
    ),
    (
        "warden-bench",
        &[
            "warden-core",
            "warden-store",
            "warden-llm",
            "warden-mock",
            "warden-claude",
            "warden-telemetry",
            "warden-serve",
            "warden-proxy",
            "warden-pg",
            "warden-browser",
        ],
    ),
];

/// Each workspace package → its normal (non-dev, non-build) warden
/// dependencies.
fn workspace_dependencies() -> BTreeMap<String, Vec<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata is JSON");
    let packages = meta["packages"].as_array().expect("packages");
    let mut map = BTreeMap::new();
    for p in packages {
        let name = p["name"].as_str().expect("name").to_owned();
        let deps = p["dependencies"]
            .as_array()
            .expect("dependencies")
            .iter()
            .filter(|d| d["kind"].is_null()) // normal: not "dev" or "build"
            .filter_map(|d| d["name"].as_str())
            .filter(|n| n.starts_with("warden"))
            .map(str::to_owned)
            .collect();
        map.insert(name, deps);
    }
    map
}

#[test]
fn every_crate_depends_only_on_the_warden_crates_it_may() {
    let actual = workspace_dependencies();
    assert!(actual.len() >= 12, "the workspace's crates: {actual:?}");
    for (name, deps) in &actual {
        let allowed = ALLOWED
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, a)| *a)
            .unwrap_or_else(|| panic!("{name} is not in ALLOWED: say what it may depend on"));
        for dep in deps {
            assert!(
                allowed.contains(&dep.as_str()),
                "{name} depends on {dep}, which the layering forbids (allowed: {allowed:?})"
            );
        }
    }
}

#[test]
fn adapters_need_the_core_alone() {
    let actual = workspace_dependencies();
    for adapter in [
        "warden-store",
        "warden-pg",
        "warden-llm",
        "warden-claude",
        "warden-serve",
    ] {
        assert_eq!(
            actual.get(adapter).map(Vec::as_slice),
            Some(&["warden-core".to_owned()][..]),
            "{adapter}"
        );
    }
}
