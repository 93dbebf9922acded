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
    let from = (site + len) as i64;
    [page, page + 8].iter().all(|&t| i32::try_from(t as i64 - from).is_ok())
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

/// Free pages nearest to `site`, from the gaps between mappings.
fn candidates(site: usize, len: usize) -> Vec<usize> {
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
    let (lo, hi) = (0x10_0000usize, 0x7FFF_FFFF_0000usize);
    let mut gaps = Vec::new();
    let mut prev = lo;
    for &(a, b) in &used {
        if a > prev {
            gaps.push((prev, a));
        }
        prev = prev.max(b);
    }
    if hi > prev {
        gaps.push((prev, hi));
    }
    let want = site & !(PAGE_SIZE - 1);
    let mut out: Vec<usize> = gaps
        .into_iter()
        .filter(|&(a, b)| b - a >= PAGE_SIZE)
        .map(|(a, b)| want.clamp(a, b - PAGE_SIZE))
        .filter(|&p| reaches(p, site, len))
        .collect();
    out.sort_unstable_by_key(|&p| p.abs_diff(site));
    out
}

fn allocate(site: usize, len: usize) -> Option<usize> {
    for hint in candidates(site, len).into_iter().take(64) {
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping; on a
        // kernel that ignores the flag the result is checked and unmapped.
        let p = unsafe {
            libc::mmap(
                hint as *mut libc::c_void,
                PAGE_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            continue;
        }
        let page = p as usize;
        if page != hint || !reaches(page, site, len) {
            // SAFETY: we just mapped this page and nothing else refers to it.
            unsafe { libc::munmap(p, PAGE_SIZE) };
            continue;
        }
        // SAFETY: the page is ours, writable, and not yet visible to anyone.
        unsafe {
            *(page as *mut u8) = 0xC3;
            *((page + 8) as *mut u64) = page as u64;
            if libc::mprotect(p, PAGE_SIZE, libc::PROT_READ | libc::PROT_EXEC) != 0 {
                libc::munmap(p, PAGE_SIZE);
                continue;
            }
        }
        return Some(page);
    }
    None
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
