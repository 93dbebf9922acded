//! An append-only table whose entries never move: fixed segment pointers,
//! segments allocated on demand and never freed. Readers take two loads and
//! no lock; writers serialise among themselves.

use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};
use std::sync::OnceLock;

pub(crate) const SEG_BITS: u32 = 12;
/// Entries per segment.
pub(crate) const SEG: usize = 1 << SEG_BITS;

/// The table of at most `N` × [`SEG`] entries. `T` values live for the rest
/// of the process. Const-constructible, so it can be a `static`.
pub(crate) struct Segmented<T: 'static, const N: usize> {
    segs: [AtomicPtr<OnceLock<T>>; N],
    len: AtomicU32,
}

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
        let seg = self.segs.get((i >> SEG_BITS) as usize)?.load(Ordering::Acquire);
        if seg.is_null() {
            return None;
        }
        // SAFETY: a non-null segment pointer was published (Release) after
        // its SEG slots were initialised, and segments are never freed.
        unsafe { &*seg.add(i as usize & (SEG - 1)) }.get()
    }

    /// Starts loading entry `i`'s lines for writing, without waiting for
    /// any of them (reading the entry would wait for the line of its
    /// published flag first).
    #[inline(always)]
    pub(crate) fn prefetch_for_write(&self, i: u32) {
        let Some(seg) = self.segs.get((i >> SEG_BITS) as usize) else {
            return;
        };
        let seg = seg.load(Ordering::Acquire);
        if !seg.is_null() {
            // `wrapping_add`: the address is only hinted, never read here.
            crate::prefetch::range_for_write(seg.wrapping_add(i as usize & (SEG - 1)));
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
        let si = (i >> SEG_BITS) as usize;
        let slot_seg = self.segs.get(si)?;
        let mut seg = slot_seg.load(Ordering::Acquire);
        if seg.is_null() {
            let fresh: Box<[OnceLock<T>]> = (0..SEG).map(|_| OnceLock::new()).collect();
            seg = Box::leak(fresh).as_mut_ptr();
            slot_seg.store(seg, Ordering::Release);
        }
        // SAFETY: as in `get`; the index is below SEG.
        let slot = unsafe { &*seg.add(i as usize & (SEG - 1)) };
        slot.set(make(i)).ok()?;
        self.len.store(i + 1, Ordering::Release);
        Some((i, slot.get()?))
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
}
