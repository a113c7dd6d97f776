//! `clients/openapi.json` is the contract the client packages are
//! generated from (TypeScript) and checked against (both): it must be
//! exactly the document `/openapi.json` serves. After changing the API,
//! run this test with `WARDEN_BLESS=1` to write the new copy, and
//! regenerate `clients/typescript/src/api.ts` (`npm run gen` there).

use std::path::PathBuf;

#[test]
fn the_committed_openapi_document_is_the_one_served() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../clients/openapi.json");
    let served =
        serde_json::to_string_pretty(&warden_serve::openapi_document()).expect("serialises") + "\n";
    if std::env::var_os("WARDEN_BLESS").is_some() {
        std::fs::write(&path, &served).expect("write clients/openapi.json");
        return;
    }
    let committed = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (write it with WARDEN_BLESS=1)", path.display()));
    let committed_json: serde_json::Value =
        serde_json::from_str(&committed).expect("clients/openapi.json is JSON");
    assert!(
        committed_json == warden_serve::openapi_document() && committed == served,
        "clients/openapi.json differs from the document /openapi.json serves: run \
         `WARDEN_BLESS=1 cargo test -p warden-serve --test \
         the_clients_copy_of_the_contract_is_current`, then `npm run gen` in \
         clients/typescript, and review the diff"
    );
}
