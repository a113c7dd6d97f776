//! The root package's in-process integration tests as one binary (one link
//! instead of one per file): each module was a test file of its own and its
//! tests keep their names under the module's (run one file's tests with
//! `cargo test -p warden-suite --test it <module>::`). They run as threads of
//! one process: each builds its own supervisor, store and mock on a port the
//! system picks, on tokio's paused clock or short real timeouts, and none sets
//! the environment, the current directory, signals or a global subscriber.
//!
//! Kept as binaries of their own, each saying why in its doc: the real agent
//! CLIs (`real_*_through_warden`, `codex_faults_through_warden`), the network
//! namespace (`silent_drop_in_a_network_namespace`), the two that re-run their
//! own binary as a child to SIGKILL it mid-write
//! (`crash_recovery_keeps_acknowledged_messages`,
//! `resume_fallback_clears_the_id_durably`), and the three house rules
//! (`no_source_file_is_over_500_lines`, `modules_import_only_the_layers_below`,
//! `crates_depend_only_on_the_crates_below`), which the working rules and CI
//! run by their own names.

#[path = "../common/mod.rs"]
mod common;

mod a_break_in_thinking_or_tool_input_restarts;
mod a_broken_http_reply_is_continued;
mod a_broken_reply_is_continued_not_replayed;
mod a_broken_response_is_reattached;
mod a_byte_trickle_is_not_a_sign_of_life;
mod a_foreign_stream_is_watched_and_retried;
mod a_session_whose_lease_moved_stops_here;
mod a_slow_consumer_holds_the_stream_back;
mod a_turn_is_cancelled_by_its_own_handle;
mod a_turn_reads_as_a_stream_of_text_edits;
mod a_watchdog_failure_is_fatal_to_the_supervisor;
mod broken_replies_end_whole_and_once;
mod cancel_races_the_watchdog;
mod context_indicator_tracks_the_last_usage;
mod fuzz_store_records_decode_or_fail_typed;
mod http_stall_is_killed_and_retried;
mod idle_sessions_are_reaped_and_resumed;
mod keys_and_specs_before_the_supervisor;
mod live_sessions_are_bounded;
mod progress_and_deadline_bound_a_turn;
mod recovered_turns_reach_their_relay;
mod resume_failure_falls_back_to_a_fresh_session;
mod session_retries_a_stream_killed_by_the_watchdog;
mod sessions_of_one_supervisor_can_differ;
mod sessions_survive_a_supervisor_restart;
mod streams_release_everything_they_hold;
mod streams_wait_for_admission_not_the_watchdog;
mod stuck_sessions_are_listed_and_recovered;
mod supervisor_restarts_sessions_per_policy;
mod the_lifecycle_bus_is_a_source_of_truth;
mod tool_runs_get_the_ten_minute_allowance;
mod watchdog_kills_stream_after_silence;
mod workspace_spellings_reach_one_session;
