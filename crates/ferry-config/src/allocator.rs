//! The one process-wide setting both daemons make before anything else: where glibc's malloc gets large blocks.
//!
//! The request paths allocate a buffer of up to a few MiB per gRPC message (the transport's receive and encode
//! buffers, a read of a log). By default glibc serves every block above its mmap threshold (128 KiB, raised
//! dynamically after frees) with a fresh `mmap`, and returns it with `munmap` when freed: each message then
//! page-faults its buffer in and zeroes it, which on the mirror's path cost about an eighth of its CPU. With the
//! threshold above the largest message such blocks come from the heap and are reused, and the heap's free top is
//! returned to the system only past the trim threshold, so a process keeps at most that much free memory more.

/// Blocks up to this size come from the heap, not from their own `mmap`: above the largest gRPC message of the
/// default limits (twice the 1 MiB batch limit plus 1 MiB).
pub const MMAP_THRESHOLD_BYTES: usize = 32 * 1024 * 1024;

/// Free memory at the top of the heap beyond this is returned to the system.
pub const TRIM_THRESHOLD_BYTES: usize = 32 * 1024 * 1024;

/// Applies [`MMAP_THRESHOLD_BYTES`] and [`TRIM_THRESHOLD_BYTES`] (glibc on Linux; elsewhere nothing). Call it
/// first thing in `main`, before other threads start.
// The workspace denies unsafe code; this is its one exception, two calls into glibc with constant arguments.
#[allow(unsafe_code)]
pub fn tune() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt takes two plain integers and changes only malloc's own parameters; it is called before the
    // process starts any thread.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES as libc::c_int);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES as libc::c_int);
    }
}
