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
//!
//! It is built without transparent huge pages (libmimalloc-sys's `no_thp`):
//! by default mimalloc advises its whole heap `MADV_HUGEPAGE`, so on a host
//! whose THP setting is `madvise` (or `always`) every 2 MiB region any
//! thread touched became resident whole. Many threads each touching a
//! little made a first small turn cost ~20 MB, and a client that stops
//! reading a 50 MB reply took a debug `warden serve` from ~75 MB to
//! 113-120 MB peak RSS; without huge pages it stays at 73-78 MB (the idle
//! server's anonymous memory 25 MB instead of 47). On an `always` host the
//! kernel may still back the heap with huge pages unasked:
//! `MIMALLOC_ALLOW_THP=0` turns that off for the process too.

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
