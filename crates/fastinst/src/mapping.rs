//! Memory of the runtime's own, straight from the kernel.

/// A fresh private anonymous mapping of `len` bytes with protection
/// `prot`, zero-filled; the runtime's one way to memory of its own (the
/// preload library's heap, the raw sampler's stack, the sled shadow stacks). It allocates
/// nothing, not even for its error, so the allocator and signal handlers
/// may call it.
pub fn map(len: usize, prot: i32) -> std::io::Result<usize> {
    // SAFETY: a fresh private anonymous mapping; no existing memory is
    // touched.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            prot,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(p as usize)
    }
}
