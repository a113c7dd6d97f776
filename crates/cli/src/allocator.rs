//! The process's allocator: mimalloc, tuned to give freed memory back.
//!
//! With glibc's malloc, a served turn's reply (one allocation per event)
//! stayed in the process after its events expired — 10 MB of text in
//! 100-byte deltas left `warden serve` 110 MB larger, and every such turn
//! added more (per-thread arenas, fragmented). mimalloc reuses that memory
//! instead of growing, and returns it to the OS once it has been free for
//! a moment: its default waits a second, and only purges when a thread
//! allocates again, so an idle server never gave it back; 10 ms does (the
//! measurement is in docs/performance.md).

/// How long freed memory waits before it is returned to the OS, in
/// milliseconds.
const PURGE_DELAY_MS: std::os::raw::c_long = 10;

/// `mi_option_purge_delay` in the pinned mimalloc's (v3) `mimalloc.h`
/// enum; libmimalloc-sys names no constant for it.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Applies the tuning, unless `MIMALLOC_PURGE_DELAY` says otherwise.
#[allow(unsafe_code)]
pub(crate) fn tune() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return;
    }
    // SAFETY: `mi_option_set` stores a number in mimalloc's option table;
    // it may be called at any time from any thread.
    unsafe {
        libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS);
    }
}
