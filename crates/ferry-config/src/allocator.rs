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
// The workspace denies unsafe code; this file holds its exceptions: two calls into glibc with constant arguments
// here, and the global allocator below.
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

/// Blocks of at least this size are reserved lazily by [`LazyHuge`].
pub const HUGE_BYTES: usize = 1 << 30;

/// The broker's global allocator: the system's, except that a block of at least [`HUGE_BYTES`] is its own
/// `mmap` with `MAP_NORESERVE`, so that memory is committed only as pages are touched.
///
/// Why: a wire decoder that trusts a length prefix (the pinned `kafka-protocol` crate sizes a `Vec` by an array's
/// count before reading its elements) can be made to ask for hundreds of GiB by a 20-byte request. The system
/// allocator refuses such a block and the process aborts; reserved lazily, the block costs nothing, the decoder
/// fails at the next element (the frame has no more bytes), and the block is unmapped. Legitimate requests never
/// come near this size (their frames are bounded in MiB). Under `vm.overcommit_memory = 2` the kernel ignores
/// `MAP_NORESERVE` and such a block is refused as before.
#[derive(Debug, Clone, Copy, Default)]
pub struct LazyHuge;

#[cfg(target_os = "linux")]
const PAGE: usize = 4096;

/// Whether a layout is served by its own lazily reserved mapping.
#[cfg(target_os = "linux")]
fn huge(layout: std::alloc::Layout) -> bool {
    layout.size() >= HUGE_BYTES && layout.align() <= PAGE
}

#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
// SAFETY: each block goes back to the allocator that made it, since `huge` of the layout given back to dealloc
// and realloc is `huge` of the layout it was allocated with: mapped blocks to munmap with their size, the others
// to the system allocator. mmap returns page-aligned memory, which serves any alignment up to a page.
unsafe impl std::alloc::GlobalAlloc for LazyHuge {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        if !huge(layout) {
            // SAFETY: the caller's contract (a non-zero-size layout) is passed on unchanged.
            return unsafe { std::alloc::System.alloc(layout) };
        }
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        // SAFETY: a fresh anonymous private mapping aliases nothing.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), layout.size(), prot, flags, -1, 0) };
        if p == libc::MAP_FAILED { std::ptr::null_mut() } else { p.cast() }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        if huge(layout) {
            // SAFETY: `ptr` is a mapping of `layout.size()` bytes made by `alloc`, no longer used by the caller.
            unsafe { libc::munmap(ptr.cast(), layout.size()) };
        } else {
            // SAFETY: `ptr` came from the system allocator with this layout.
            unsafe { std::alloc::System.dealloc(ptr, layout) };
        }
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        if huge(layout) {
            // SAFETY: as `alloc`; fresh anonymous pages are zero.
            unsafe { self.alloc(layout) }
        } else {
            // SAFETY: the caller's contract is passed on unchanged.
            unsafe { std::alloc::System.alloc_zeroed(layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        let Ok(new) = std::alloc::Layout::from_size_align(new_size, layout.align()) else {
            return std::ptr::null_mut();
        };
        if !huge(layout) && !huge(new) {
            // SAFETY: `ptr` came from the system allocator with `layout`, and the new block stays with it.
            return unsafe { std::alloc::System.realloc(ptr, layout, new_size) };
        }
        // SAFETY: `new` has a non-zero size (the caller's contract).
        let fresh = unsafe { self.alloc(new) };
        if !fresh.is_null() {
            // SAFETY: both blocks are valid for the copied length and distinct; the old one is freed with its
            // layout and not used again.
            unsafe {
                std::ptr::copy_nonoverlapping(ptr, fresh, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
        }
        fresh
    }
}

#[cfg(test)]
mod tests {
    #[test]
    #[cfg(target_os = "linux")]
    fn a_huge_block_is_reserved_lazily_and_given_back() {
        use std::alloc::{GlobalAlloc, Layout};
        let a = super::LazyHuge;
        // 256 GiB: more than this machine has, so the system allocator would refuse it.
        let layout = Layout::from_size_align(256 << 30, 8).unwrap();
        #[allow(unsafe_code)]
        // SAFETY: the block is used within its size and freed with its layout.
        unsafe {
            let p = a.alloc(layout);
            assert!(!p.is_null());
            p.write(7);
            p.add((256 << 30) - 1).write(9);
            assert_eq!((p.read(), p.add((256 << 30) - 1).read()), (7, 9));
            a.dealloc(p, layout);
            let small = Layout::from_size_align(64, 8).unwrap();
            let q = a.alloc(small);
            q.write(1);
            let q = a.realloc(q, small, 128);
            assert_eq!(q.read(), 1);
            a.dealloc(q, Layout::from_size_align(128, 8).unwrap());
        }
    }
}
