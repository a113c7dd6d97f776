# List the recipes.
default:
    @just --list

# Run what CI runs: format check, lints, docs, tests.
ready:
    bash .ci/run

# Run the tests (the README's test command).
test:
    cargo test --workspace

# Run the orchestrator example (the README's run command).
run:
    cargo run --release --example orchestrator

# Format the code.
fmt:
    cargo fmt --all

# Lint with warnings denied.
lint:
    cargo clippy --workspace --all-targets -- -D warnings

# Build the docs with warnings denied.
doc:
    RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps
