//! How many tests a test binary runs at once, for the binaries whose tests
//! mostly *wait* (on leases, timeouts, child processes, loopback peers)
//! rather than compute: libtest runs as many at once as the machine has
//! cores, which leaves two cores idle most of the time. Included by path
//! (`#[path = …] mod at_once;`) by the binaries that use it, each with the
//! number it measured; the crate needs `ctor` as a dev-dependency.

/// Before `main` (libtest reads `RUST_TEST_THREADS` when it starts and
/// gives `--test-threads` precedence over it), sets `RUST_TEST_THREADS` to
/// `$at_least` or the number of cores, whichever is more, unless it is set
/// already.
macro_rules! at_least_at_once {
    ($at_least:expr) => {
        #[ctor::ctor(unsafe)]
        #[allow(unsafe_code)]
        fn more_tests_at_once_than_cores() {
            if std::env::var_os("RUST_TEST_THREADS").is_none() {
                let cores = std::thread::available_parallelism().map_or(1, usize::from);
                let at_once: usize = $at_least;
                // SAFETY: before `main`, no other thread exists to read
                // the environment concurrently.
                unsafe { std::env::set_var("RUST_TEST_THREADS", cores.max(at_once).to_string()) };
            }
        }
    };
}
pub(crate) use at_least_at_once;
