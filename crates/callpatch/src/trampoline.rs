//! `ret` trampolines within ±2 GiB of call sites (paper §6, the 1|4 split).
//!
//! One page per 2 GiB neighbourhood, allocated on first need in the nearest
//! free gap of the address space and cached; every site within reach reuses
//! it. The page holds `C3` (`ret`) at offset 0 and, at offset 8, the address
//! of that `ret`, which `call [rip+disp32]` sites use. It is read+execute only.

use crate::form::Trampoline;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use wordpatch::PAGE_SIZE;

const MAX: usize = 256;
static PAGES: [AtomicUsize; MAX] = [const { AtomicUsize::new(0) }; MAX];
static COUNT: AtomicUsize = AtomicUsize::new(0);
static ALLOC: Mutex<()> = Mutex::new(());

fn tramp(page: usize) -> Trampoline {
    Trampoline {
        ret_at: page,
        ptr_at: page + 8,
    }
}

fn reaches(page: usize, site: usize, len: usize) -> bool {
    reaches_all(page, 16, site, site, len)
}

/// True if every byte of `[start, start + size)` is within `rel32` reach of
/// an instruction of `len` bytes at any address in `[lo, hi]`.
fn reaches_all(start: usize, size: usize, lo: usize, hi: usize, len: usize) -> bool {
    let ok = |from: usize, to: usize| i32::try_from(to as i64 - (from + len) as i64).is_ok();
    ok(lo, start) && ok(lo, start + size) && ok(hi, start) && ok(hi, start + size)
}

/// A trampoline in reach of `len` bytes at `site`, allocating one if needed.
/// `None` when no page near the site can be mapped.
pub fn near(site: usize, len: usize) -> Option<Trampoline> {
    if let Some(t) = cached(site, len) {
        return Some(t);
    }
    let _g = ALLOC.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(t) = cached(site, len) {
        return Some(t);
    }
    let n = COUNT.load(Ordering::Acquire);
    if n >= MAX {
        return None;
    }
    let page = allocate(site, len)?;
    PAGES[n].store(page, Ordering::Release);
    COUNT.store(n + 1, Ordering::Release);
    Some(tramp(page))
}

fn cached(site: usize, len: usize) -> Option<Trampoline> {
    let n = COUNT.load(Ordering::Acquire);
    PAGES[..n]
        .iter()
        .map(|p| p.load(Ordering::Acquire))
        .find(|&p| reaches(p, site, len))
        .map(tramp)
}

/// Free places for `size` bytes nearest to `[lo, hi]` and in reach of it,
/// from the gaps between mappings.
fn candidates(lo: usize, hi: usize, len: usize, size: usize) -> Vec<usize> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let mut used: Vec<(usize, usize)> = maps
        .lines()
        .filter_map(|l| {
            let (a, b) = l.split_whitespace().next()?.split_once('-')?;
            Some((usize::from_str_radix(a, 16).ok()?, usize::from_str_radix(b, 16).ok()?))
        })
        .collect();
    used.sort_unstable();
    // Stay off the zero page area and below the canonical user-space top.
    let (floor, top) = (0x10_0000usize, 0x7FFF_FFFF_0000usize);
    let mut gaps = Vec::new();
    let mut prev = floor;
    for &(a, b) in &used {
        if a > prev {
            gaps.push((prev, a));
        }
        prev = prev.max(b);
    }
    if top > prev {
        gaps.push((prev, top));
    }
    let want = lo & !(PAGE_SIZE - 1);
    let mut out: Vec<usize> = gaps
        .into_iter()
        .filter(|&(a, b)| b - a >= size)
        .map(|(a, b)| want.clamp(a, b - size))
        .filter(|&p| reaches_all(p, size, lo, hi, len))
        .collect();
    out.sort_unstable_by_key(|&p| p.abs_diff(lo));
    out
}

/// Maps `size` bytes (rounded up to pages) of private anonymous read+write
/// memory where every byte is within `rel32` reach of a `len`-byte
/// instruction anywhere in `[lo, hi]`: for code that sites in that range
/// call or jump to. The caller fills it and makes it executable
/// (`mprotect`). `None` when no such place can be mapped.
pub fn map_near(lo: usize, hi: usize, len: usize, size: usize) -> Option<usize> {
    let size = size.div_ceil(PAGE_SIZE) * PAGE_SIZE;
    for hint in candidates(lo, hi, len, size).into_iter().take(64) {
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping; on a
        // kernel that ignores the flag the result is checked and unmapped.
        let p = unsafe {
            libc::mmap(
                hint as *mut libc::c_void,
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            continue;
        }
        if p as usize != hint || !reaches_all(p as usize, size, lo, hi, len) {
            // SAFETY: we just mapped this range and nothing else refers to it.
            unsafe { libc::munmap(p, size) };
            continue;
        }
        return Some(p as usize);
    }
    None
}

fn allocate(site: usize, len: usize) -> Option<usize> {
    let page = map_near(site, site, len, PAGE_SIZE)?;
    let p = page as *mut libc::c_void;
    // SAFETY: the page is ours, writable, and not yet visible to anyone.
    unsafe {
        *(page as *mut u8) = 0xC3;
        *((page + 8) as *mut u64) = page as u64;
        if libc::mprotect(p, PAGE_SIZE, libc::PROT_READ | libc::PROT_EXEC) != 0 {
            libc::munmap(p, PAGE_SIZE);
            return None;
        }
    }
    Some(page)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn near_is_cached_and_in_reach() {
        let site = near as *const () as usize;
        let a = near(site, 5).expect("trampoline");
        assert!(reaches(a.ret_at, site, 5));
        // SAFETY: the trampoline page is mapped readable.
        assert_eq!(unsafe { *(a.ret_at as *const u8) }, 0xC3);
        // SAFETY: as above.
        assert_eq!(unsafe { *(a.ptr_at as *const u64) }, a.ret_at as u64);
        let b = near(site + 4096, 5).unwrap();
        assert_eq!(a, b, "a second site nearby reuses the page");
    }
}
