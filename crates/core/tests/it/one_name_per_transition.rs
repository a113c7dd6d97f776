//! One name per transition: the docs table is the list in core.
//!
//! `docs/runtime-semantics.md` ("Transitions") lists every transition of
//! `warden_core::names::TRANSITIONS` with how it shows in a trace and whether
//! it is published (on `GET /v1/events`, counted in `/metrics`). The table is
//! checked row by row; on a difference this test prints the table to paste,
//! and with `WARDEN_BLESS=1` writes it there itself.

use warden_core::names::TRANSITIONS;

const DOC: &str = include_str!("../../../../docs/runtime-semantics.md");
const HEADER: &str = "| name | in a trace | on `/v1/events`, in `/metrics` | what happened |";

fn expected() -> Vec<String> {
    let mut rows = vec![HEADER.to_owned(), "|---|---|---|---|".to_owned()];
    for t in TRANSITIONS {
        rows.push(format!(
            "| `{}` | {} | {} | {} |",
            t.name,
            t.traced.as_str(),
            if t.published { "yes" } else { "no" },
            t.meaning.trim()
        ));
    }
    rows
}

#[test]
fn the_docs_table_lists_every_transition_under_its_one_name() {
    let start = DOC.lines().position(|l| l == HEADER).unwrap_or_else(|| {
        panic!(
            "docs/runtime-semantics.md has no transitions table; paste:\n{}",
            expected().join("\n")
        )
    });
    let table: Vec<&str> = DOC
        .lines()
        .skip(start)
        .take_while(|l| l.starts_with('|'))
        .collect();
    let expected = expected();
    if std::env::var_os("WARDEN_BLESS").is_some() {
        let lines: Vec<&str> = DOC.lines().collect();
        let after = &lines[start + table.len()..];
        let mut blessed: Vec<&str> = lines[..start].to_vec();
        blessed.extend(expected.iter().map(String::as_str));
        blessed.extend(after);
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docs/runtime-semantics.md"
        );
        std::fs::write(path, blessed.join("\n") + "\n").expect("write docs/runtime-semantics.md");
        return;
    }
    assert_eq!(
        table,
        expected,
        "docs/runtime-semantics.md's table differs from names::TRANSITIONS; run this test with \
         WARDEN_BLESS=1 to write it, or paste:\n{}",
        expected.join("\n")
    );
}
