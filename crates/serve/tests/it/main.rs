//! warden-serve's integration tests as one binary (one link instead of one
//! per file): each module was a test file of its own and its tests keep
//! their names under the module's (regenerate the clients' copy of the
//! contract with `WARDEN_BLESS=1 cargo test -p warden-serve --test it
//! the_clients_copy_of_the_contract_is_current`). They run as threads of
//! one process: each server listens on a loopback port the system picks
//! and has a store of its own, and none sets the environment, the current
//! directory or a global subscriber.

mod a_session_keeps_the_agent_it_was_started_with;
mod a_slow_client_pauses_its_turn;
mod an_idempotency_key_reused_with_another_body_is_refused;
mod an_outage_is_a_typed_503_database_unreachable;
mod probes_answer_without_the_token;
mod the_clients_copy_of_the_contract_is_current;
mod turns_over_http;
