//! warden-llm's integration tests as one binary (one link instead of one
//! per file): each module was a test file of its own and its tests keep
//! their names under the module's (`just fuzz` selects `fuzz_sse_decoder::`).
//! They run as threads of one process: each serves from its own loopback
//! listener on a port the system picks and writes under its own temporary
//! directory, and none sets the environment, the current directory or a
//! global subscriber.

mod a_bom_and_cr_line_ends_are_valid_sse;
mod a_re_delivered_turn_is_answered_once;
mod a_torn_transcript_tail_costs_at_most_one_turn;
mod answers_that_are_not_event_streams_are_fatal_and_say_why;
mod anthropic_stream_maps_events_in_order;
mod decoder_survives_random_and_truncated_bytes;
mod dropping_the_stream_closes_the_connection;
mod fuzz_sse_decoder;
mod http_errors_are_classified_like_the_sdks;
mod mid_stream_failures_end_the_stream;
mod openai_stream_ends_with_done_and_reports_usage;
mod pings_and_comments_yield_keepalives;
mod support;
mod transcripts_resume_conversations;
