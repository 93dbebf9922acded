//! W^X: code written through a second, writable mapping of the same memory.
//!
//! In [`WriteMode::Alias`] no page this crate writes is ever both writable
//! and executable. The first patch in an executable mapping copies the
//! mapping's bytes into a `memfd`, maps that memory writable somewhere else
//! (the *alias*), and maps it again over the code, shared, with the code's
//! own protection (`r-x`). Every later store goes to the alias; instruction
//! fetch sees it through the code mapping, the same physical page, so the
//! cross-modification model is unchanged (the `stress` crate runs every
//! protocol in this mode too).
//!
//! Replacing the code mapping while threads run it is safe because the new
//! mapping holds the very bytes of the old one: the kernel swaps the page
//! tables under the mm lock, a thread that faults meanwhile waits for it,
//! and a thread still running on the old pages runs the same bytes.
//!
//! What it costs, and what changes for other tools:
//! - the whole mapping becomes shared memory of the process (its size in
//!   RAM), no longer backed by the file;
//! - `/proc/PID/maps` names it `/memfd:fastinst-code:OFFSET:PATH (deleted)`
//!   (offset in hex) and shows the alias as `rw-s` with the same name, so a
//!   tool that reads the maps can still find the file ([`memfd_name`]);
//! - a `fork` child would share the code with its parent, so the fork
//!   handlers (`crate::fork`) give the child a copy of its own.

use crate::error::Error;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

/// The protection of aliased code: only mappings that are read+execute
/// (not writable) are aliased, and they keep it.
pub(crate) const CODE_PROT: i32 = libc::PROT_READ | libc::PROT_EXEC;

/// The most mappings that can be aliased at once.
pub const MAX_REGIONS: usize = 256;

/// One aliased run of code pages: `len` bytes at `start`, writable at
/// `alias`. A free slot has `len` 0.
pub(crate) struct Region {
    pub(crate) start: AtomicUsize,
    pub(crate) len: AtomicUsize,
    pub(crate) alias: AtomicUsize,
    /// The file offset of `start`, and the file's path (cut as
    /// [`memfd_name`] cuts it), for the names of a fork child's copies.
    file_off: AtomicUsize,
    path: [AtomicU8; PATH_ROOM],
    path_len: AtomicUsize,
}

/// Room for a path in a region: what a `memfd` name leaves after the
/// longest prefix (`fastinst-code:` and 16 hex digits and `:`).
const PATH_ROOM: usize = 249 - 32;

/// The aliased regions. Changed only with the page set's lock held and the
/// fork gate passed; read by the fork handlers with the gate closed.
pub(crate) static REGIONS: [Region; MAX_REGIONS] = [const { Region::new() }; MAX_REGIONS];

impl Region {
    /// A free slot.
    const fn new() -> Region {
        Region {
            start: AtomicUsize::new(0),
            len: AtomicUsize::new(0),
            alias: AtomicUsize::new(0),
            file_off: AtomicUsize::new(0),
            path: [const { AtomicU8::new(0) }; PATH_ROOM],
            path_len: AtomicUsize::new(0),
        }
    }

    /// Fills a free slot (the caller has found `len` 0 and holds the lock).
    fn fill(&self, start: usize, len: usize, alias: usize, file_off: usize, path: &[u8]) {
        let path = &path[path.len().saturating_sub(PATH_ROOM)..];
        for (d, &b) in self.path.iter().zip(path) {
            d.store(b, Ordering::Relaxed);
        }
        self.path_len.store(path.len(), Ordering::Relaxed);
        self.file_off.store(file_off, Ordering::Relaxed);
        self.start.store(start, Ordering::Relaxed);
        self.alias.store(alias, Ordering::Relaxed);
        self.len.store(len, Ordering::Release);
    }
}

/// Writes region `r`'s [`memfd_name`] into `out`, NUL-terminated, without
/// allocating (the fork handlers call it); returns its length.
pub(crate) fn name_of(r: &Region, out: &mut [u8; 256]) -> usize {
    let mut n = 0;
    let mut put = |b: u8| {
        if n < 255 {
            out[n] = b;
            n += 1;
        }
    };
    b"fastinst-code:".iter().for_each(|&b| put(b));
    let off = r.file_off.load(Ordering::Relaxed);
    let digits = (usize::BITS - off.leading_zeros()).div_ceil(4).max(1);
    for k in (0..digits).rev() {
        put(b"0123456789abcdef"[(off >> (4 * k)) & 15]);
    }
    put(b':');
    for b in r.path.iter().take(r.path_len.load(Ordering::Relaxed)) {
        put(b.load(Ordering::Relaxed));
    }
    out[n] = 0;
    n
}

/// The `memfd` name of an aliased mapping of `path` at file offset
/// `offset`: `fastinst-code:OFFSET:PATH`, `OFFSET` in hex. The kernel keeps
/// at most 249 bytes of it; a longer path is cut at the front.
pub fn memfd_name(offset: u64, path: &str) -> String {
    let head = format!("fastinst-code:{offset:x}:");
    let room = 249 - head.len();
    let mut from = path.len().saturating_sub(room);
    while !path.is_char_boundary(from) {
        from += 1;
    }
    format!("{head}{}", &path[from..])
}

/// Parses what [`memfd_name`] wrote, as `/proc/PID/maps` shows it
/// (`/memfd:NAME (deleted)`): the file offset and path of the code.
pub fn parse_memfd_name(shown: &str) -> Option<(u64, &str)> {
    let name = shown.strip_prefix("/memfd:fastinst-code:")?;
    let name = name.strip_suffix(" (deleted)").unwrap_or(name);
    let (offset, path) = name.split_once(':')?;
    Some((u64::from_str_radix(offset, 16).ok()?, path))
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Aliases `len` bytes of code at `start` (page-aligned, one mapping,
/// readable, not writable, mapped [`CODE_PROT`]), mapped from `path` at
/// `file_off` (empty for anonymous code). Returns the alias's address.
/// The caller holds the page set's lock, which keeps every other writer of
/// this crate off these pages until they are recorded.
pub(crate) fn create(start: usize, len: usize, file_off: usize, path: &str) -> Result<usize, Error> {
    let _pass = crate::gate::pass();
    let slot = REGIONS
        .iter()
        .position(|r| r.len.load(Ordering::Acquire) == 0)
        .ok_or(Error::TooManyAliases { limit: MAX_REGIONS })?;
    let fail = |step: &'static str, e: i32| Error::Alias {
        page: start,
        step,
        errno: e,
    };
    let cname = std::ffi::CString::new(memfd_name(file_off as u64, path)).unwrap_or_default();
    let fd = new_memfd(&cname, len).map_err(|e| fail("memfd", e))?;
    // SAFETY: maps the fresh memfd (ours, `len` bytes) at an address the
    // kernel chooses: no existing mapping is touched.
    let alias = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if alias == libc::MAP_FAILED {
        let e = errno();
        // SAFETY: our own descriptor.
        unsafe { libc::close(fd) };
        return Err(fail("mmap alias", e));
    }
    // SAFETY: the code range is mapped and readable (the caller checked the
    // mapping), the alias is `len` fresh bytes of ours. No writer of this
    // crate touches untracked pages, and they are not writable to anyone
    // else, so the copy is of bytes that stay as they are.
    unsafe { std::ptr::copy_nonoverlapping(start as *const u8, alias as *mut u8, len) };
    // SAFETY: replaces the code mapping with a shared mapping of the same
    // bytes (just copied) and the same protection. A thread running these
    // pages meanwhile runs identical bytes from the old or the new pages
    // (module doc).
    let mapped = unsafe { map_over(start, len, CODE_PROT, fd) };
    let e = errno();
    // SAFETY: our own descriptor; the mappings keep the memory.
    unsafe { libc::close(fd) };
    if !mapped {
        // SAFETY: the alias is ours and nothing refers to it yet.
        unsafe { libc::munmap(alias, len) };
        return Err(fail("mmap code", e));
    }
    REGIONS[slot].fill(start, len, alias as usize, file_off, path.as_bytes());
    Ok(alias as usize)
}

/// Maps `len` bytes of `memfd` `fd` (from its start) shared at `addr`, in
/// place of whatever is mapped there, with protection `prot`. Whether it
/// was mapped.
///
/// # Safety
/// What is mapped at `addr` now may be replaced: it is this crate's (an
/// alias, or code being aliased with the same bytes).
pub(crate) unsafe fn map_over(addr: usize, len: usize, prot: i32, fd: i32) -> bool {
    // SAFETY: the caller answers for the range; `fd` is a descriptor.
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len,
            prot,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd,
            0,
        )
    };
    p != libc::MAP_FAILED
}

/// A fresh `memfd` of `len` bytes; the errno on failure.
pub(crate) fn new_memfd(name: &std::ffi::CStr, len: usize) -> Result<i32, i32> {
    // SAFETY: a NUL-terminated name; creates a descriptor of ours.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: sizes our own descriptor.
    if unsafe { libc::ftruncate(fd, len as libc::off_t) } != 0 {
        let e = errno();
        // SAFETY: our own descriptor.
        unsafe { libc::close(fd) };
        return Err(e);
    }
    Ok(fd)
}

/// Drops the aliases of the pages in `[from, to)` (page-aligned), about to
/// be unmapped: their alias pages are unmapped and the regions trimmed or
/// split. The caller holds the page set's lock.
pub(crate) fn forget(from: usize, to: usize) {
    let _pass = crate::gate::pass();
    // A region split below lands in a later free slot, and is visited
    // again: it lies outside the forgotten range, so that is a no-op.
    for r in &REGIONS {
        let len = r.len.load(Ordering::Acquire);
        if len == 0 {
            continue;
        }
        let (start, alias) = (r.start.load(Ordering::Relaxed), r.alias.load(Ordering::Relaxed));
        let (lo, hi) = (from.max(start), to.min(start + len));
        if lo >= hi {
            continue;
        }
        // SAFETY: the part of our own alias mapping that aliases code about
        // to be unmapped; nothing of this crate writes it any more (its
        // pages are being forgotten under the same lock).
        unsafe { libc::munmap((alias + lo - start) as *mut libc::c_void, hi - lo) };
        let file_off = r.file_off.load(Ordering::Relaxed);
        let mut path = [0u8; PATH_ROOM];
        let path_len = r.path_len.load(Ordering::Relaxed);
        for (d, s) in path.iter_mut().zip(&r.path) {
            *d = s.load(Ordering::Relaxed);
        }
        r.len.store(0, Ordering::Release);
        // What is left below and above the forgotten part.
        for (s, e) in [(start, lo), (hi, start + len)] {
            if s < e {
                add_region(s, e - s, alias + s - start, file_off + s - start, &path[..path_len]);
            }
        }
    }
}

fn add_region(start: usize, len: usize, alias: usize, file_off: usize, path: &[u8]) {
    // A split frees one slot and takes at most two; with every slot taken
    // the rest of the region cannot be recorded, and a fork child would
    // then share those pages: rare enough (256 regions) to accept.
    if let Some(r) = REGIONS.iter().find(|r| r.len.load(Ordering::Acquire) == 0) {
        r.fill(start, len, alias, file_off, path);
    }
}

/// Pages aliased so far, summed over the regions.
pub fn aliased_bytes() -> usize {
    REGIONS.iter().map(|r| r.len.load(Ordering::Acquire)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memfd_names_round_trip_and_long_paths_keep_their_end() {
        let n = memfd_name(0x1000, "/usr/bin/my prog");
        assert_eq!(n, "fastinst-code:1000:/usr/bin/my prog");
        let shown = format!("/memfd:{n} (deleted)");
        assert_eq!(parse_memfd_name(&shown), Some((0x1000, "/usr/bin/my prog")));
        let long = format!("/{}", "é".repeat(200));
        let n = memfd_name(0, &long);
        assert!(n.len() <= 249 && n.ends_with('é'), "{n}");
        assert_eq!(parse_memfd_name("/memfd:other (deleted)"), None);
    }

    #[test]
    fn a_region_s_name_written_without_allocating_is_memfd_name() {
        let r = Region::new();
        for (off, path) in [(0usize, ""), (0x1000, "/usr/bin/my prog"), (0xdead_beef, "/x")] {
            r.fill(1, 1, 1, off, path.as_bytes());
            let mut buf = [0u8; 256];
            let n = name_of(&r, &mut buf);
            assert_eq!(std::str::from_utf8(&buf[..n]).unwrap(), memfd_name(off as u64, path));
            assert_eq!(buf[n], 0);
        }
    }
}
