//! The `warden` binary's tests as one binary (one link instead of one per
//! file): each module was a test file of its own and its tests keep their
//! names under the module's (run one file's tests with `cargo test -p warden
//! --test it <module>::`). Nearly all of them are slow real-process tests:
//! they run the real `warden` binary, and many the real agent CLIs, the
//! official SDKs, PostgreSQL, Jaeger or Chromium beside it, and mostly
//! *wait* — on stream timeouts, outages, leases, child processes — rather
//! than compute (measured on two cores, as 43 binaries one after the other:
//! 840 s of wall time, 434 s of CPU time, a quarter of what two cores
//! give). So this binary runs more of them at once than the machine has
//! cores: [`AT_LEAST_AT_ONCE`], unless `--test-threads` or
//! `RUST_TEST_THREADS` says otherwise.
//!
//! They can share one process because none sets the environment, the
//! current directory or signal handlers of the test process; every child
//! gets its own temp directories, a port the system picks, and what it
//! needs in its own environment; the processes a test counts are found by
//! a path or variable of its own ([`common::cancel`]); each PostgreSQL test
//! has a database of its own on the shared server, and the two that stop or
//! restart the whole server a server of their own
//! ([`common::OwnServer`]); the Jaeger test that restarts Jaeger starts its
//! own.

#[path = "../../../../tests/support/at_once.rs"]
mod at_once;
mod clients;
mod common;

mod a_200_that_is_not_an_event_stream_exits_3;
mod a_bad_stream_timeout_is_a_usage_error;
mod a_damaged_turn_log_loses_no_turn_silently;
mod a_database_restart_loses_no_acknowledged_turn;
mod a_reused_idempotency_key_is_refused_after_kill_9;
mod a_reused_idempotency_key_is_refused_on_every_cluster_node;
mod a_short_database_outage_leaves_no_turn_hanging;
mod agent_cli_streams_are_continued_at_the_wire;
mod agent_turns_survive_a_kill_9_of_warden;
mod aider_chat_resumes_its_conversation;
mod an_outage_tells_the_operator_the_truth;
mod chat_resumes_the_workspace_session;
mod chat_survives_crash_leftovers;
mod client_packages_against_serve;
mod clients_installed_as_their_readmes_say;
mod cluster_commands_tell_the_operator_the_truth;
mod cluster_nodes_share_sessions_on_postgres;
mod console_draws_a_turns_watchdog_story;
mod console_holds_through_restarts_and_hostile_names;
mod console_in_a_real_browser;
mod demo_exports_spans_over_otlp;
mod demo_recovers_every_fault;
mod demo_runs_one_session_per_installed_agent;
mod deploy_files_are_valid;
mod gemini_chat_resumes_its_session;
mod load_spreads_to_a_returning_node;
mod openapi_document_generates_a_typed_client;
mod opencode_chat_resumes_its_session;
mod oversized_input_is_a_usage_error_naming_the_limit;
mod proxy_in_front_of_real_clients;
mod proxy_reports_what_it_does_on_stderr;
mod proxy_shutdown_is_bounded;
mod qwen_code_chat_under_both_layers;
mod serve_answers_and_survives_a_restart;
mod serve_on_a_full_disk;
mod serve_runs_a_session_per_agent;
mod servers_bound_their_connections;
mod sessions_and_mock_commands;
mod sessions_go_home_after_a_database_outage;
mod sessions_repair_salvages_a_damaged_database;
mod stream_survives_a_silent_server;
mod traces_in_a_real_jaeger;
mod urls_without_a_usable_host_are_usage_errors;

/// How many tests this binary runs at once at least (more where the
/// machine has more cores). Measured on two cores: 840 s one binary after
/// the other (two at once within each), 370-380 s at six at once, 445 s at
/// four with a busy loop beside them — but six with that busy loop failed
/// four tests (Gemini CLI killed for silence while it started, a take-over
/// window), so four: the agent CLIs' start-up is CPU-bound, and their
/// tests' stream timeouts count it as silence.
const AT_LEAST_AT_ONCE: usize = 4;

at_once::at_least_at_once!(AT_LEAST_AT_ONCE);
