//! warden-core's integration tests as one binary (one link instead of one
//! per file): each module was a test file of its own and its tests keep
//! their names under the module's. They run as threads of one process;
//! they only read the sources, the manifests and the docs, so nothing of
//! the process (environment, current directory, subscriber) is shared.

mod modules_import_only_the_layers_below;
mod one_name_per_transition;
mod test_doubles_stay_out_of_shipped_builds;
