//! Each thread's call counters: a counter per function, bumped by the
//! thread's own counting handler with a plain add (no lock, no shared
//! line), read by the sampler and the window schedule from other threads.
//!
//! A window's count is the difference of the counters between its opening
//! and its closing: each slot keeps the value the window opened at
//! (`open`, written by whoever opens the window) beside the running count
//! (`count`, written by the owner only). Counters only grow.

use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

/// Functions per segment.
const SEG_BITS: u32 = 10;
const SEG: usize = 1 << SEG_BITS;
/// Segments: up to 2^20 functions, as the function table.
const SEGS: usize = 1024;

/// One function's counter on one thread.
#[derive(Default)]
#[repr(C)]
pub(crate) struct Slot {
    /// Calls counted on this thread (owner writes).
    pub count: AtomicU64,
    /// `count` when the function's current window opened (the opener
    /// writes).
    pub open: AtomicU64,
}

/// One thread's counters.
pub(crate) struct Counts {
    segs: [AtomicPtr<[Slot; SEG]>; SEGS],
}

impl Default for Counts {
    fn default() -> Self {
        Counts {
            segs: [const { AtomicPtr::new(std::ptr::null_mut()) }; SEGS],
        }
    }
}

impl Counts {
    /// The slot of function `fi`, if its segment exists.
    #[inline(always)]
    pub(crate) fn slot(&self, fi: u32) -> Option<&Slot> {
        let seg = self.segs.get((fi >> SEG_BITS) as usize)?.load(Ordering::Acquire);
        // SAFETY: a non-null segment was leaked by `bump` and is never
        // freed (a thread's counters live as long as the process).
        (!seg.is_null()).then(|| unsafe { &(*seg)[fi as usize & (SEG - 1)] })
    }

    /// Counts a call of function `fi` (the owning thread only); returns
    /// its calls on this thread since the function's mark.
    #[inline(always)]
    pub(crate) fn bump(&self, fi: u32) -> u64 {
        let s = match self.slot(fi) {
            Some(s) => s,
            None => match self.grow(fi) {
                Some(s) => s,
                None => return 0,
            },
        };
        let c = s.count.load(Ordering::Relaxed) + 1;
        s.count.store(c, Ordering::Release);
        c.saturating_sub(s.open.load(Ordering::Relaxed))
    }

    #[cold]
    #[inline(never)]
    fn grow(&self, fi: u32) -> Option<&Slot> {
        self.reserve(fi + 1);
        self.slot(fi)
    }

    /// Makes the slots of functions `0..n` exist, so that a window can
    /// mark them (from any thread; not on the raw sampler, which must not
    /// allocate: the profiler reserves when a function or a thread is
    /// registered).
    pub(crate) fn reserve(&self, n: u32) {
        for cell in self.segs.iter().take((n as usize).div_ceil(SEG)) {
            if cell.load(Ordering::Acquire).is_null() {
                let seg: *mut [Slot; SEG] = Box::leak(Box::new(std::array::from_fn(|_| Slot::default())));
                if cell
                    .compare_exchange(std::ptr::null_mut(), seg, Ordering::AcqRel, Ordering::Acquire)
                    .is_err()
                {
                    // SAFETY: `seg` was leaked just above and never shared.
                    drop(unsafe { Box::from_raw(seg) });
                }
            }
        }
    }

    /// Marks function `fi`'s count now: its count so far is the start of
    /// a window, or of a whole function's epoch (counts before it are
    /// outside). A thread whose table has no segment for `fi` yet counts
    /// from 0.
    pub(crate) fn open(&self, fi: u32) {
        if let Some(s) = self.slot(fi) {
            s.open.store(s.count.load(Ordering::Acquire), Ordering::Relaxed);
        }
    }

    /// [`Counts::open`] for every function: a new profiler generation
    /// counts from here.
    pub(crate) fn open_all(&self) {
        for seg in &self.segs {
            let p = seg.load(Ordering::Acquire);
            if p.is_null() {
                continue;
            }
            // SAFETY: a published segment is never freed or moved.
            for slot in unsafe { &*p }.iter() {
                slot.open.store(slot.count.load(Ordering::Relaxed), Ordering::Relaxed);
            }
        }
    }

    /// Calls of function `fi` counted since its window opened.
    pub(crate) fn since_open(&self, fi: u32) -> u64 {
        self.slot(fi).map_or(0, |s| {
            s.count
                .load(Ordering::Acquire)
                .saturating_sub(s.open.load(Ordering::Relaxed))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_counts_what_came_after_it_opened() {
        let c = Counts::default();
        assert_eq!(c.since_open(5), 0);
        c.bump(5);
        c.bump(5);
        c.open(5);
        assert_eq!(c.since_open(5), 0);
        assert_eq!(c.bump(5), 1, "one call since the mark");
        assert_eq!(c.bump(3000), 1);
        assert_eq!(c.since_open(5), 1);
        assert_eq!(c.since_open(3000), 1, "a function never opened counts from 0");
    }
}
