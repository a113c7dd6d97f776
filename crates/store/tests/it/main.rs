//! warden-store's integration tests as one binary (one link instead of one
//! per file): each module was a test file of its own and its tests keep
//! their names under the module's. They run as threads of one process:
//! each store lives in its own temporary directory (the full-disk test on
//! a tmpfs it mounts there), the crash test re-runs this binary for its
//! one test by that test's full name, and none sets the environment, the
//! current directory or a global subscriber.

mod a_full_disk_fails_saves_and_the_store_reopens;
mod a_turn_whose_end_was_lost_ends_with_a_typed_error;
mod an_unfinished_snapshot_does_not_brick_the_store;
mod salvage_copies_every_readable_record;
mod turn_logs_survive_a_reopen;
