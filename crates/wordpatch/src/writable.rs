//! Making code pages writable: lazily, once per page, tracked.
//!
//! The first patch that touches a page checks `/proc/self/maps` (the page must
//! be mapped and executable) and, if the page is not writable yet, `mprotect`s
//! it to read+write+execute. The page is recorded in a fixed lock-free set, so
//! every later patch on it costs one hash probe and no syscall. Pages are never
//! made read-only again: code may be toggled again at any moment, and a second
//! `mprotect` per toggle would cost far more than the toggle itself.
//!
//! Another patcher that makes such a page read-only again (around its own
//! write) would make this crate's next write fault; `crate::reprotect`
//! makes it writable again on that fault.
//!
//! Costs, stated in the README too: each touched page of a file-backed text
//! segment becomes a private copy (4 KiB of anonymous memory per page, no
//! longer shared with other processes mapping the same file), and the page
//! stays writable and executable (W^X is given up for patched pages only).
//!
//! In [`WriteMode::Alias`](crate::WriteMode::Alias) a page's mapping is
//! aliased instead (`crate::alias`) and stays read+execute; the set records
//! for each page how far its alias lies, and every store adds that
//! ([`target`]).

use crate::error::Error;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::geometry::PAGE_SIZE;

const CAPACITY: usize = 1 << 16;
/// A forgotten page: lookups probe past it, inserts may reuse it.
const TOMBSTONE: usize = usize::MAX;
static PAGES: Pages = Pages([const { AtomicUsize::new(0) }; CAPACITY]);
/// For each slot of `PAGES`, how far the page's writable alias lies from it
/// (wrapping; 0: written in place). Stored before the page is published.
static DELTAS: [AtomicUsize; CAPACITY] = [const { AtomicUsize::new(0) }; CAPACITY];
/// Whether any page has an alias: until then a store's address is its own.
static ALIASES: AtomicBool = AtomicBool::new(false);

// Page-aligned, so a group of slots is one page of memory.
#[repr(align(4096))]
struct Pages([AtomicUsize; CAPACITY]);
static GROW: Mutex<usize> = Mutex::new(0);

/// Pages per group (log2): 512 slots, one 4 KiB page of the set.
const GROUP: u32 = 9;

/// A page's home slot: groups of 512 neighbouring code pages (2 MiB of
/// code) share one page of the set, placed by a Fibonacci hash of the group.
/// Why not hash each page: a provider makes a whole text segment writable
/// at start-up, and scattered slots touched a fresh page of this 512 KiB set
/// (two page faults: read, then write) for nearly every code page: 250 of
/// QuickJS's 2,500 start-up faults.
fn slot_of(page: usize) -> usize {
    let n = page / PAGE_SIZE;
    let group = (n >> GROUP).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - (CAPACITY.trailing_zeros() - GROUP));
    (group << GROUP) | (n & ((1 << GROUP) - 1))
}

fn known(page: usize) -> bool {
    find(page).is_some()
}

/// Whether `page` (page-aligned) is one this crate made (or found)
/// writable. Lock-free: the fault handler asks it.
pub(crate) fn is_tracked(page: usize) -> bool {
    known(page)
}

fn find(page: usize) -> Option<usize> {
    let mut i = slot_of(page);
    for _ in 0..CAPACITY {
        match PAGES.0[i].load(Ordering::Acquire) {
            0 => return None,
            p if p == page => return Some(i),
            _ => i = (i + 1) % CAPACITY,
        }
    }
    None
}

/// Where a store meant for code byte `addr` must go: its alias in
/// [`WriteMode::Alias`](crate::WriteMode::Alias), else `addr` itself.
/// Lock-free and async-signal-safe.
#[inline]
pub(crate) fn target(addr: usize) -> usize {
    if !ALIASES.load(Ordering::Acquire) {
        return addr;
    }
    aliased(addr)
}

fn aliased(addr: usize) -> usize {
    match find(addr & !(PAGE_SIZE - 1)) {
        Some(i) => addr.wrapping_add(DELTAS[i].load(Ordering::Relaxed)),
        None => addr,
    }
}

/// Forgets the pages of `len` bytes at `addr`: call it before code there is
/// unmapped (`munmap`, `dlclose`). Otherwise a new mapping that later appears
/// at the same address would be taken for writable and the first patch of it
/// would fault. Sites in forgotten pages must not be patched again unless
/// they are mapped again, when they are checked afresh.
pub fn forget_pages(addr: *const u8, len: usize) {
    let start = addr as usize & !(PAGE_SIZE - 1);
    let end = addr as usize + len.max(1);
    let mut count = GROW.lock().unwrap_or_else(|e| e.into_inner());
    if ALIASES.load(Ordering::Acquire) {
        crate::alias::forget(start, (end + PAGE_SIZE - 1) & !(PAGE_SIZE - 1));
    }
    let mut page = start;
    while page < end {
        if let Some(i) = find(page) {
            PAGES.0[i].store(TOMBSTONE, Ordering::Release);
            *count -= 1;
        }
        page += PAGE_SIZE;
    }
}

/// Makes every page of `len` bytes at `addr` writable if it is not already,
/// after checking it is mapped and executable. Cheap after the first call for
/// a page. Patching functions call it themselves; call it up front to take
/// the one-time cost out of a hot toggle path.
///
/// One call reads `/proc/self/maps` once and `mprotect`s each run of
/// consecutive pages once, however many pages it covers: a provider about to
/// patch many sites of one text segment should make their whole extent
/// writable in one call (a read of the maps file per page costs tens of
/// microseconds, and grows with the number of mappings). Pages that are only
/// made writable, never written, stay shared with the file: the kernel
/// copies a page on its first write.
///
/// On an error, pages before the failing one may have been made writable
/// (and are tracked); none after it are.
pub fn make_writable(addr: *const u8, len: usize) -> Result<(), Error> {
    let start = addr as usize & !(PAGE_SIZE - 1);
    let end = addr as usize + len.max(1);
    let mut page = start;
    while page < end {
        if !known(page) {
            return add_pages(page, end);
        }
        page += PAGE_SIZE;
    }
    Ok(())
}

struct Mapping<'a> {
    start: usize,
    end: usize,
    readable: bool,
    writable: bool,
    executable: bool,
    offset: usize,
    path: &'a str,
}

fn find_mapping(maps: &str, page: usize) -> Option<Mapping<'_>> {
    for line in maps.lines() {
        let mut parts = line.split_whitespace();
        let (Some(range), Some(perms), Some(offset)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) else {
            continue;
        };
        if a <= page && page < b {
            let p = perms.as_bytes();
            // The path: what follows the device and inode fields.
            let path = line
                .splitn(6, char::is_whitespace)
                .nth(5)
                .map(str::trim_start)
                .unwrap_or("");
            return Some(Mapping {
                start: a,
                end: b,
                readable: p.first() == Some(&b'r'),
                writable: p.get(1) == Some(&b'w'),
                executable: p.get(2) == Some(&b'x'),
                offset: usize::from_str_radix(offset, 16).unwrap_or(0),
                path,
            });
        }
    }
    None
}

/// Adds the pages from `first` (page-aligned) up to `end` that are not yet
/// known, in runs that lie in one mapping each.
#[cold]
fn add_pages(first: usize, end: usize) -> Result<(), Error> {
    let mut count = GROW.lock().unwrap_or_else(|e| e.into_inner());
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let mut page = first;
    while page < end {
        if known(page) {
            page += PAGE_SIZE;
            continue;
        }
        let m = find_mapping(&maps, page).ok_or(Error::NotMapped { addr: page })?;
        if !m.executable {
            return Err(Error::NotExecutable { addr: page });
        }
        crate::illegal::ensure_installed();
        // The run: this mapping's pages up to `end`.
        let run_end = m.end.min((end + PAGE_SIZE - 1) & !(PAGE_SIZE - 1));
        let fresh = (page..run_end).step_by(PAGE_SIZE).filter(|&p| !known(p)).count();
        if *count + fresh > CAPACITY * 3 / 4 {
            return Err(Error::TooManyPages {
                limit: CAPACITY * 3 / 4,
            });
        }
        if !m.writable && crate::mode::write_mode() == crate::mode::WriteMode::Alias {
            page = alias_mapping(&m, &mut count)?;
            continue;
        }
        if !m.writable {
            crate::reprotect::ensure_installed(is_tracked);
            // SAFETY: the run lies in one mapping that is mapped and
            // executable (checked above); adding write permission to code
            // changes no byte of it. Known pages in the run are writable
            // already, so their protection does not change.
            let rc = unsafe {
                libc::mprotect(
                    page as *mut libc::c_void,
                    run_end - page,
                    libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC,
                )
            };
            if rc != 0 {
                return Err(Error::Protect {
                    page,
                    errno: std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
                });
            }
        }
        while page < run_end {
            if !known(page) {
                insert(page);
                *count += 1;
            }
            page += PAGE_SIZE;
        }
    }
    Ok(())
}

/// Aliases the whole of mapping `m` (W^X) and records its pages; returns
/// the mapping's end. The caller holds `GROW` (`count`).
fn alias_mapping(m: &Mapping<'_>, count: &mut usize) -> Result<usize, Error> {
    if !m.readable {
        return Err(Error::Alias {
            page: m.start,
            step: "read the code (the mapping is execute-only)",
            errno: 0,
        });
    }
    if (m.start..m.end).step_by(PAGE_SIZE).any(known) {
        return Err(Error::Alias {
            page: m.start,
            step: "alias a mapping with pages already patched in place",
            errno: 0,
        });
    }
    let pages = (m.end - m.start) / PAGE_SIZE;
    if *count + pages > CAPACITY * 3 / 4 {
        return Err(Error::TooManyPages {
            limit: CAPACITY * 3 / 4,
        });
    }
    // Before any page is published: a store that finds one of them must
    // look for its alias.
    ALIASES.store(true, Ordering::Release);
    let path = if m.path.starts_with('/') { m.path } else { "" };
    let alias = crate::alias::create(m.start, m.end - m.start, m.offset, path)?;
    let delta = alias.wrapping_sub(m.start);
    for page in (m.start..m.end).step_by(PAGE_SIZE) {
        insert_with(page, delta);
        *count += 1;
    }
    Ok(m.end)
}

/// Records `page` (the caller holds `GROW` and has checked capacity).
fn insert(page: usize) {
    insert_with(page, 0);
}

/// Records `page` with its alias `delta`, the delta first, so that a
/// lookup that finds the page finds its delta.
fn insert_with(page: usize, delta: usize) {
    let mut i = slot_of(page);
    while !matches!(PAGES.0[i].load(Ordering::Relaxed), 0 | TOMBSTONE) {
        i = (i + 1) % CAPACITY;
    }
    DELTAS[i].store(delta, Ordering::Relaxed);
    PAGES.0[i].store(page, Ordering::Release);
}

/// Number of code pages this process has made writable (or found writable) so far.
pub fn pages_tracked() -> usize {
    *GROW.lock().unwrap_or_else(|e| e.into_inner())
}

/// Reads one byte to fault in the page early; used by tests.
#[cfg(test)]
pub(crate) fn touch(addr: usize) -> u8 {
    // SAFETY: tests pass addresses of their own mapped pages.
    unsafe { crate::raw::load_u8(addr) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neighbouring_code_pages_share_a_page_of_the_set() {
        let first = 0x5555_0000_0000usize;
        let slots: Vec<usize> = (0..512).map(|i| slot_of(first + i * PAGE_SIZE)).collect();
        assert!(slots.windows(2).all(|w| w[1] == w[0] + 1), "{slots:?}");
        assert!(slots.iter().all(|&s| s / 512 == slots[0] / 512));
        assert!(slots.iter().all(|&s| s < CAPACITY));
    }

    #[test]
    fn maps_parsing() {
        let maps = "00400000-00401000 r-xp 00000000 08:01 1 /bin/x\n\
                    00601000-00602000 rw-p 00000000 08:01 1 /bin/x\n";
        let m = find_mapping(maps, 0x400000).unwrap();
        assert!(m.executable && !m.writable && m.end == 0x401000);
        let m = find_mapping(maps, 0x601000).unwrap();
        assert!(!m.executable && m.writable);
        assert!(find_mapping(maps, 0x500000).is_none());
    }

    #[test]
    fn data_is_refused_and_unmapped_is_refused() {
        let data = Box::new([0u8; 64]);
        assert!(matches!(
            make_writable(data.as_ptr(), 1),
            Err(Error::NotExecutable { .. })
        ));
        assert!(matches!(make_writable(8 as *const u8, 1), Err(Error::NotMapped { .. })));
    }

    #[test]
    fn code_page_becomes_writable_once() {
        let m = memmap2::MmapOptions::new()
            .len(PAGE_SIZE)
            .map_anon()
            .unwrap()
            .make_exec()
            .unwrap();
        let p = m.as_ptr();
        let _ = touch(p as usize);
        make_writable(p, 1).unwrap();
        let before = pages_tracked();
        make_writable(p, 16).unwrap();
        assert_eq!(pages_tracked(), before, "second call must not add the page again");
        // SAFETY: the page was just made writable.
        unsafe { crate::raw::xchg_u8(p as usize, 0x90) };
        forget_pages(p, 1);
        assert!(!known(p as usize));
    }

    #[test]
    fn a_range_is_made_writable_in_one_call_and_stops_at_data() {
        // Four code pages, then (reserved next to them) a data page.
        let mut m = memmap2::MmapOptions::new().len(5 * PAGE_SIZE).map_anon().unwrap();
        m[0] = 1;
        let base = m.as_ptr() as usize;
        assert_eq!(
            // SAFETY: the first four pages of our own mapping become r-x.
            unsafe {
                libc::mprotect(
                    base as *mut libc::c_void,
                    4 * PAGE_SIZE,
                    libc::PROT_READ | libc::PROT_EXEC,
                )
            },
            0
        );
        make_writable((base + 100) as *const u8, 3 * PAGE_SIZE).unwrap();
        for k in 0..4 {
            assert!(known(base + k * PAGE_SIZE), "page {k} of the run");
        }
        // SAFETY: page 3 was made writable by the call above.
        unsafe { crate::raw::xchg_u8(base + 3 * PAGE_SIZE, 0x90) };
        forget_pages(base as *const u8, 4 * PAGE_SIZE);
        let e = make_writable(base as *const u8, 5 * PAGE_SIZE).unwrap_err();
        assert!(
            matches!(e, Error::NotExecutable { addr } if addr == base + 4 * PAGE_SIZE),
            "{e:?}"
        );
        assert!(
            known(base) && known(base + 3 * PAGE_SIZE),
            "the code pages before the data page are tracked"
        );
        forget_pages(base as *const u8, 5 * PAGE_SIZE);
        drop(m);
    }
}
