//! warden-mock's integration tests as one binary (one link instead of one
//! per file): each module was a test file of its own and its tests keep
//! their names under the module's. They run as threads of one process:
//! each mock listens on a loopback port the system picks and keeps its own
//! journal, and none sets the environment, the current directory or a
//! global subscriber.

mod anthropic_messages_api;
mod common;
mod faults_are_played_and_observed;
mod gemini_api;
mod openai_chat_completions_api;
mod openai_responses_api;
mod scenarios_are_selected_per_request;
