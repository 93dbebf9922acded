//! An append-only table whose entries never move: fixed segment pointers,
//! segments allocated on demand and never freed. Readers take two loads and
//! no lock; writers serialise among themselves.
//!
//! An entry is published by the table's length, not by a flag of its own:
//! a `OnceLock` per slot put its state word after the value, on another
//! cache line for the 192- and 200-byte function and probe records, so
//! every read of a cold record waited for two misses (a quarter of the
//! profiler's entry handler on SQLite). The length is one word that only
//! discovery writes.

use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};

pub(crate) const SEG_BITS: u32 = 12;
/// Entries per segment.
pub(crate) const SEG: usize = 1 << SEG_BITS;

type Slot<T> = UnsafeCell<MaybeUninit<T>>;

/// Entries whose pages a push faults in at once, ahead of writing them.
const POPULATE: usize = 256;

/// The table of at most `N` × [`SEG`] entries. `T` values live for the rest
/// of the process. Const-constructible, so it can be a `static`.
pub(crate) struct Segmented<T: 'static, const N: usize> {
    segs: [AtomicPtr<Slot<T>>; N],
    len: AtomicU32,
}

// SAFETY: slots below `len` are written once, before `len` passes them
// (Release), and only read after (Acquire); slots at or above `len` are
// touched by the one pushing thread only (callers serialise pushes). So a
// `T` is shared between threads only as `&T`: `Sync` needs `T: Sync`, and
// the value is made on one thread and read on others: `T: Send`.
unsafe impl<T: Send + Sync + 'static, const N: usize> Sync for Segmented<T, N> {}
// SAFETY: as above.
unsafe impl<T: Send + Sync + 'static, const N: usize> Send for Segmented<T, N> {}

impl<T: Send + Sync + 'static, const N: usize> Segmented<T, N> {
    /// An empty table.
    pub(crate) const fn new() -> Self {
        Segmented {
            segs: [const { AtomicPtr::new(std::ptr::null_mut()) }; N],
            len: AtomicU32::new(0),
        }
    }

    /// Entries published so far.
    pub(crate) fn len(&self) -> u32 {
        self.len.load(Ordering::Acquire)
    }

    /// Entry `i`, if published.
    #[inline(always)]
    pub(crate) fn get(&self, i: u32) -> Option<&T> {
        if i >= self.len.load(Ordering::Acquire) {
            return None;
        }
        let seg = self.segs[(i >> SEG_BITS) as usize].load(Ordering::Relaxed);
        // SAFETY: `i < len`: its segment and slot were written before `len`
        // passed it (Release, read Acquire above); segments are never freed
        // and published slots never written again: a `T` for good.
        unsafe {
            let slot: &Slot<T> = &*seg.add(i as usize & (SEG - 1));
            Some((*slot.get()).assume_init_ref())
        }
    }

    /// Where entry `i` is or will be, to prefetch: `None` while its segment
    /// does not exist. `wrapping_add`: the address is only hinted, never
    /// read through.
    #[inline(always)]
    fn slot_hint(&self, i: u32) -> Option<*const Slot<T>> {
        let seg = self.segs.get((i >> SEG_BITS) as usize)?.load(Ordering::Acquire);
        (!seg.is_null()).then(|| seg.wrapping_add(i as usize & (SEG - 1)).cast_const())
    }

    /// Starts loading the first line of entry `i`, without waiting for it.
    #[inline(always)]
    pub(crate) fn prefetch(&self, i: u32) {
        if let Some(slot) = self.slot_hint(i) {
            crate::prefetch::line(slot);
        }
    }

    /// Starts loading entry `i`'s lines for writing, without waiting for
    /// any of them.
    #[inline(always)]
    pub(crate) fn prefetch_for_write(&self, i: u32) {
        if let Some(slot) = self.slot_hint(i) {
            crate::prefetch::range_for_write(slot);
        }
    }

    /// Appends `v`; callers serialise pushes. `None` when full.
    pub(crate) fn push(&self, v: T) -> Option<u32> {
        self.push_with(|_| v).map(|(i, _)| i)
    }

    /// Appends the value `make` builds from its index; callers serialise
    /// pushes, so indices are dense. `None` when full.
    pub(crate) fn push_with(&self, make: impl FnOnce(u32) -> T) -> Option<(u32, &T)> {
        let i = self.len.load(Ordering::Relaxed);
        let slot_seg = self.segs.get((i >> SEG_BITS) as usize)?;
        let mut seg = slot_seg.load(Ordering::Relaxed);
        if seg.is_null() {
            let fresh: Box<[Slot<T>]> = (0..SEG).map(|_| UnsafeCell::new(MaybeUninit::uninit())).collect();
            seg = Box::leak(fresh).as_mut_ptr();
            // Published to readers by the `len` store below.
            slot_seg.store(seg, Ordering::Relaxed);
        }
        if (i as usize).is_multiple_of(POPULATE) {
            // The next entries' pages at once (see `mapping::populate`); a
            // batch, not the whole segment, so a small program's tables
            // stay small.
            let at = i as usize & (SEG - 1);
            let n = POPULATE.min(SEG - at);
            // `wrapping_add`: only an address, for the hint.
            let from = seg.wrapping_add(at) as usize;
            crate::mapping::populate(from, n * std::mem::size_of::<Slot<T>>());
        }
        let v = make(i);
        // SAFETY: slot `i` of a live segment (the index is below SEG),
        // unpublished (`i == len`), and only this thread pushes.
        let slot = unsafe { (*seg.add(i as usize & (SEG - 1))).get() };
        // SAFETY: as above; nothing reads the slot before `len` passes it.
        let v = unsafe { (*slot).write(v) };
        self.len.store(i + 1, Ordering::Release);
        Some((i, v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_get_across_segments() {
        let t: Segmented<u64, 2> = Segmented::new();
        for i in 0..(2 * SEG as u64) {
            assert_eq!(t.push(i * 3), Some(i as u32));
        }
        assert_eq!(t.push(0), None);
        assert_eq!(t.get(SEG as u32 + 5), Some(&((SEG as u64 + 5) * 3)));
        assert_eq!(t.get(2 * SEG as u32), None);
        assert_eq!(t.len(), 2 * SEG as u32);
    }

    #[test]
    fn readers_see_an_entry_whole_or_not_at_all() {
        let t: &'static Segmented<[u64; 8], 4> = Box::leak(Box::new(Segmented::new()));
        let total = 3 * SEG as u32;
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    let mut seen = 0;
                    while seen < total {
                        let n = t.len();
                        for i in seen..n {
                            let v = t.get(i).expect("below len");
                            assert!(v.iter().all(|&w| w == u64::from(i)), "entry {i} torn: {v:?}");
                        }
                        assert!(t.get(n + 1).is_none_or(|v| v[0] == u64::from(n + 1)));
                        seen = n;
                    }
                });
            }
            s.spawn(|| {
                for i in 0..total {
                    assert_eq!(t.push([u64::from(i); 8]), Some(i));
                }
            });
        });
    }
}
