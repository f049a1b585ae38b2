//! The C allocator's settings for a process whose memory is mostly one long-lived cache.
//!
//! glibc's malloc gives each thread that meets contention an arena of its own (up to 8 per CPU)
//! and keeps freed pages: a list of 100,000 tasks, parsed on whatever worker thread runs, leaves
//! tens of MB free but resident in several arenas. Measured on the 100,000-task backlog
//! (`ax-bench memory`), two arenas and a periodic trim keep RSS near what the caches hold.

/// Allows at most two malloc arenas. Called first thing in `main`, before threads allocate.
pub fn limit_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets a malloc parameter; M_ARENA_MAX takes any positive count.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// Returns freed memory to the system: after a cache's first list, and now and then.
pub fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim walks the allocator's own free lists; it takes no pointers of ours.
    unsafe {
        libc::malloc_trim(0);
    }
}
