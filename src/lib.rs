//! The warden workspace's end-to-end tests (`tests/`) and examples
//! (`examples/`). Nothing here is published; the libraries are the
//! `warden-*` crates under `crates/`.
