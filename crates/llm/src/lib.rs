//! warden-llm: work in progress.
