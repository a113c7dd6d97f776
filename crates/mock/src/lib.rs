//! warden-mock: work in progress.
