//! The test source is for tests: `testing` is a module only with its
//! feature, and no crate of the workspace turns the feature on for what it
//! ships (its `[dependencies]`), only for its tests (`[dev-dependencies]`)
//! — the benchmark binary, which measures an unsupervised session, aside.
//! Fault injection (`SessionHandle::fail`) needs no feature. Read from the
//! sources, so a change that undoes any of it fails here, naming it.

use std::path::Path;

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_testing_module_exists_only_with_its_feature() {
    let lib = read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs"));
    let at = lib
        .find("pub mod testing;")
        .expect("lib.rs declares testing");
    let before = lib[..at].trim_end();
    assert!(
        before.ends_with("#[cfg(feature = \"testing\")]"),
        "`pub mod testing` must be behind its feature"
    );
}

#[test]
fn fault_injection_needs_no_feature() {
    let handle = read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src/session/handle.rs"));
    let at = handle.find("pub fn fail(").expect("SessionHandle::fail");
    let attributes: Vec<&str> = handle[..at]
        .lines()
        .rev()
        .skip(1)
        .take_while(|l| l.trim_start().starts_with("#[") || l.trim_start().starts_with("///"))
        .filter(|l| l.trim_start().starts_with("#["))
        .collect();
    assert!(
        attributes.is_empty(),
        "SessionHandle::fail is gated: {attributes:?}"
    );
}

#[test]
fn no_crate_ships_with_the_testing_feature() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut manifests = vec![root.join("Cargo.toml")];
    for entry in std::fs::read_dir(root.join("crates")).expect("crates/") {
        let manifest = entry.expect("entry").path().join("Cargo.toml");
        if manifest.exists() {
            manifests.push(manifest);
        }
    }
    for manifest in manifests {
        let text = read(&manifest);
        if text.contains("name = \"warden-bench\"") {
            continue; // a benchmark binary, never shipped
        }
        let mut section = String::new();
        for line in text.lines() {
            let line = line.trim();
            if line.starts_with('[') {
                section = line.to_owned();
            } else if line.starts_with("warden-core")
                && line.contains("\"testing\"")
                && section != "[dev-dependencies]"
            {
                panic!("{} enables `testing` in {section}", manifest.display());
            }
        }
    }
}
