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

/// Faults in, writable, the whole pages inside `start..start + len` of
/// memory this process owns and is about to fill, in one system call
/// rather than a page fault per page (`MADV_POPULATE_WRITE`).
///
/// Why: the runtime's start writes records for every function of the
/// program (probe and function records, megabytes for tens of thousands
/// of functions), and a page fault per page of them was a large part of
/// the start's time. Only a hint: on a kernel without it (before 5.14)
/// the pages fault in as they are written, as before. Allocates nothing.
pub fn populate(start: usize, len: usize) {
    const PAGE: usize = 4096;
    let lo = start.next_multiple_of(PAGE);
    let hi = (start + len) & !(PAGE - 1);
    if hi > lo {
        // SAFETY: whole pages inside memory the caller owns; populating
        // writable pages changes no byte of them (a fresh page is zero, a
        // present one is left as it is).
        unsafe { libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_POPULATE_WRITE) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn populating_part_of_a_mapping_keeps_every_byte() {
        // Ends inside pages: only the whole pages between are populated,
        // and nothing outside the range is touched or changed.
        let len = 16 * 4096;
        let p = map(len, libc::PROT_READ | libc::PROT_WRITE).unwrap();
        // SAFETY: `p..p + len` is the fresh mapping just made, unshared.
        let bytes = unsafe { std::slice::from_raw_parts_mut(p as *mut u8, len) };
        bytes[4096 * 3 + 7] = 0xab;
        populate(p + 100, 9 * 4096 - 50);
        populate(p + 15 * 4096 + 1, 10);
        assert_eq!(bytes[4096 * 3 + 7], 0xab);
        assert_eq!(bytes.iter().filter(|&&b| b != 0).count(), 1);
        // SAFETY: the mapping made above, no longer referred to.
        unsafe { libc::munmap(p as *mut libc::c_void, len) };
    }
}
