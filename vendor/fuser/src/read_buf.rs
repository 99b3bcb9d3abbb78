use std::mem::align_of;

use crate::ll::fuse_abi as abi;
use crate::session::MAX_WRITE_SIZE;

/// Size of the buffer for reading a request from the kernel. Since the kernel may send
/// up to `MAX_WRITE_SIZE` bytes in a write request, we use that value plus some extra space.
const BUFFER_SIZE: usize = MAX_WRITE_SIZE + 4096;

/// A buffer that provides an aligned sub-slice for FUSE operations.
///
/// sheaf patch: the buffer is its own anonymous mapping, not a `Vec`. Its
/// pages cost nothing until a request is read into them (most requests use
/// one), whereas a zeroed 16 MiB `Vec` came from the heap once glibc had
/// raised its mmap threshold past that size (freeing the handshake's
/// buffer did), and `calloc` then cleared the 128 KiB of heap it had
/// reserved before: 33 page faults and a memset per thread as a mount
/// started.
#[derive(Debug)]
pub(crate) struct FuseReadBuf {
    /// The start of a mapping of `BUFFER_SIZE` bytes.
    ptr: *mut u8,
}

// SAFETY: the mapping is owned by this value and only reached through it.
unsafe impl Send for FuseReadBuf {}

impl FuseReadBuf {
    /// Creates a new `FuseReadBuf` with the default buffer size.
    pub(crate) fn new() -> Self {
        // SAFETY: a fresh private anonymous mapping; no existing memory is named.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                BUFFER_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            // As a failed allocation of the Vec this replaces would.
            std::alloc::handle_alloc_error(
                std::alloc::Layout::from_size_align(BUFFER_SIZE, 4096).expect("valid layout"),
            );
        }
        Self { ptr: p.cast() }
    }

    /// Returns a mutable reference to the aligned portion of the buffer (a
    /// mapping is page-aligned, so that is all of it).
    pub(crate) fn as_mut(&mut self) -> &mut [u8] {
        debug_assert_eq!(self.ptr as usize % align_of::<abi::fuse_in_header>(), 0);
        // SAFETY: `ptr` maps `BUFFER_SIZE` readable, writable bytes for as
        // long as `self` lives, and `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, BUFFER_SIZE) }
    }
}

impl Drop for FuseReadBuf {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `new` made, no longer referenced.
        unsafe { libc::munmap(self.ptr.cast(), BUFFER_SIZE) };
    }
}
