//! warden-claude's integration tests as one binary (one link instead of
//! one per file): each module was a test file of its own and its tests keep
//! their names under the module's. They run as threads of one process:
//! each drives `fake-claude` processes of its own, in a process group of
//! their own, and reads their pids and transcripts from a temporary
//! directory of its own ([`common::Fixture`]); none sets the environment
//! (the agent's is set per child), the current directory or a global
//! subscriber, and none signals a process it did not start.

mod common;
mod diagnostics_report_the_transcript;
mod dropping_a_stream_mid_turn_kills_the_process_group;
mod garbage_and_oversized_lines;
mod one_process_serves_consecutive_turns;
mod resume_failures_become_typed_errors;
mod stream_json_lines_map_to_events_in_order;
mod warden_sessions_drive_the_agent_process;
