# List the recipes.
default:
    @just --list

# Run what CI runs: format check, lints, docs, tests.
ready:
    bash .ci/run

# Run the tests (the README's test command).
test:
    cargo test --workspace

# Run the demo (the README's run command); e.g. `just run --quick`.
run *ARGS:
    cargo run --release -p warden -- demo {{ARGS}}

# Format the code.
fmt:
    cargo fmt --all

# Lint with warnings denied.
lint:
    cargo clippy --workspace --all-targets -- -D warnings

# Build the docs with warnings denied.
doc:
    RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps

# Run the Jaeger example against a local Jaeger (see docs/jaeger.md).
jaeger:
    OTEL_EXPORTER_OTLP_ENDPOINT=${OTEL_EXPORTER_OTLP_ENDPOINT:-http://127.0.0.1:4317} OTEL_SERVICE_NAME=${OTEL_SERVICE_NAME:-warden-demo} cargo run --example jaeger

# Start Jaeger v2 in docker, the release CI builds from Go (UI and query API on :16686, OTLP/gRPC on :4317).
jaeger-up:
    docker run --rm -d --name jaeger -p 16686:16686 -p 4317:4317 jaegertracing/jaeger:2.12.0

# Run the benchmarks (quick mode: `just bench --quick`).
bench *ARGS:
    cargo bench -p warden-bench -- {{ARGS}}

# Fuzz the SSE decoder, the Claude JSONL parser and the store's record decoder with long proptest runs (not in CI); e.g. `just fuzz 50000`.
fuzz CASES="200000":
    PROPTEST_CASES={{CASES}} cargo test --release -p warden-llm --test it -- fuzz_sse_decoder::fuzz_
    PROPTEST_CASES={{CASES}} cargo test --release -p warden-claude --lib -- fuzz_
    PROPTEST_CASES={{CASES}} cargo test --release -p warden-suite --test it -- fuzz_store_records_decode_or_fail_typed::fuzz_

# Mutation testing of warden-core with cargo-mutants (slow, not in CI; `cargo install cargo-mutants`); e.g. `just mutants --file crates/core/src/policy/retry.rs`.
mutants *ARGS:
    cargo mutants -p warden-core {{ARGS}}
