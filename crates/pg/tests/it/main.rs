//! warden-pg's integration tests as one binary (one link instead of one per
//! file): each module was a test file of its own and its tests keep their
//! names under the module's. They run as threads of one process against the
//! one PostgreSQL server `WARDEN_PG_URL` names, each in a database of its
//! own ([`common::fresh_db`]; roles, cluster-wide, get names of their own
//! too). None stops, restarts or reconfigures the server: an outage here is
//! one database refusing connections and its own backends cut
//! ([`common::Outage`]), so the tests need no lock between them. None sets
//! the environment, the current directory or a global subscriber; the test
//! that counts what a node logs through an outage installs one, so it is a
//! binary of its own (`tests/an_outage_is_logged_once_and_nothing_said_moved.rs`).

mod a_drained_node_is_left_and_a_silent_one_dead_by_its_ttl;
mod a_keyed_turn_keeps_its_requests_fingerprint;
mod a_node_holds_a_lease_only_for_a_session_it_runs;
mod a_node_joins_reports_and_leaves;
mod a_refused_write_names_the_epoch_it_had;
mod a_session_says_why_it_came_to_its_node;
mod common;
mod failovers_and_outages_are_timed;
mod leases_fence_every_write;
mod only_idle_sessions_are_handed_over;
mod sessions_go_home_after_an_outage;
mod the_least_privileged_role_is_enough;
mod tls_connections_verify_the_server;
