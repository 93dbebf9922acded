//! The functions counted whole that were called since the sampler last
//! looked: a bitmap with a bit per function, set by the entry handler of a
//! function's first counted call of an epoch and taken whole, word by word,
//! by the sampler, which folds those functions' counts.
//!
//! The sampler once scanned every function each epoch to find these (a
//! miss per function, 3,700 on SQLite, a hundred times a second); then it
//! followed a lock-free stack threaded through the function records, whose
//! every link was a miss that had to land before the next one could start:
//! 49-61% of the epoch's own time waited on that one load (perf annotate,
//! SQLite and QuickJS, gcc `-finstrument-functions` and sled builds), the
//! epoch being the largest single item of the runtime's own time on those
//! runs. A bitmap is read in order, a line holds 512 functions, and the
//! records of the functions it names are then prefetched together
//! (`prefetch_epoch`), so their misses overlap.
//!
//! Layout: a block of [`WORDS`] words per segment of the function table
//! ([`SEG`] functions), made when the segment's first function is
//! discovered ([`Due::reserve`]), never freed, and a summary word per
//! segment whose bit `w` says that word `w` may have a bit set. A push sets
//! the function's bit, then the word's summary bit; a take swaps a summary
//! to zero, then each word it names. A push whose summary bit lands after
//! the take swapped that summary leaves its function bit for the next
//! take (if this take did not find it through another bit of the same
//! word): a function is handed over late by at most one epoch, never lost,
//! and never twice for one push. A function is pushed by the first count
//! of each epoch (threads that count it together may push it twice, which
//! one take hands over once), and by the call that passes its whole-count
//! overflow, after that call switched its probe off. A take is an
//! iterator that swaps each word as it reaches it; dropped before its end,
//! it puts back what it swapped out and did not hand over.

use crate::segmented::{SEG, SEG_BITS};
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

/// Words of one segment's block: a bit per function.
const WORDS: usize = SEG / 64;
const _: () = assert!(WORDS == 64, "a summary word has a bit per word of the block");

type Block = [AtomicU64; WORDS];

/// The due functions of a function table of at most `N` segments
/// (`Segmented<Func, N>`).
pub(crate) struct Due<const N: usize> {
    blocks: [AtomicPtr<Block>; N],
    summary: [AtomicU64; N],
}

impl<const N: usize> Default for Due<N> {
    fn default() -> Self {
        Due {
            blocks: [const { AtomicPtr::new(std::ptr::null_mut()) }; N],
            summary: [const { AtomicU64::new(0) }; N],
        }
    }
}

impl<const N: usize> Due<N> {
    /// Makes room for function `fi`'s bit. Called when the function is
    /// discovered, before any handler can push it (its probes are switched
    /// on after); callers serialise calls (discovery's lock). Allocates at
    /// most once per segment, so the handlers and the sampler never do.
    pub(crate) fn reserve(&self, fi: u32) {
        let Some(slot) = self.blocks.get((fi >> SEG_BITS) as usize) else {
            return;
        };
        if slot.load(Ordering::Acquire).is_null() {
            let block: Box<Block> = Box::new([const { AtomicU64::new(0) }; WORDS]);
            slot.store(Box::leak(block), Ordering::Release);
        }
    }

    /// The block of segment `seg`, if reserved.
    fn block(&self, seg: usize) -> Option<&Block> {
        let p = self.blocks.get(seg)?.load(Ordering::Acquire);
        // SAFETY: a non-null block pointer came from `Box::leak` in
        // `reserve` and is never freed or replaced: a `Block` for good.
        (!p.is_null()).then(|| unsafe { &*p })
    }

    /// Hands function `fi` to the next take.
    /// Whether it could: `false` only for a function never
    /// [`reserve`](Self::reserve)d, a bug the caller reports.
    pub(crate) fn push(&self, fi: u32) -> bool {
        let seg = (fi >> SEG_BITS) as usize;
        let Some(block) = self.block(seg) else { return false };
        let w = (fi as usize & (SEG - 1)) / 64;
        // Release: the take that finds the bit sees what the handler wrote
        // before it (its epoch's first count).
        block[w].fetch_or(1 << (fi % 64), Ordering::Release);
        self.summary[seg].fetch_or(1 << w, Ordering::Release);
        true
    }

    /// Takes every function pushed so far, `len` being the function
    /// table's length, as an iterator in index order. Each word is swapped
    /// to zero once, when the iterator reaches it: a function pushed again
    /// behind it (counted in the next epoch meanwhile) waits for the next take,
    /// so one take hands a function over at most once, as a snapshot
    /// would. It allocates nothing.
    pub(crate) fn take(&self, len: u32) -> Taken<'_, N> {
        Taken {
            e: self,
            segs: (len as usize).div_ceil(SEG).min(N),
            seg: None,
            words: 0,
            w: 0,
            bits: 0,
        }
    }

    /// Forgets every push (a forked child, whose functions were all reset).
    pub(crate) fn clear(&self) {
        for (seg, s) in self.summary.iter().enumerate() {
            if s.swap(0, Ordering::Relaxed) != 0 {
                if let Some(block) = self.block(seg) {
                    block.iter().for_each(|w| w.store(0, Ordering::Relaxed));
                }
            }
        }
    }
}

/// The functions [`Due::take`] takes.
pub(crate) struct Taken<'a, const N: usize> {
    e: &'a Due<N>,
    /// Segments to look at.
    segs: usize,
    /// The segment being taken (`None` before the first).
    seg: Option<usize>,
    /// Its summary's bits not yet taken.
    words: u64,
    /// The word being taken, and its bits not yet handed out.
    w: usize,
    bits: u64,
}

impl<const N: usize> Iterator for Taken<'_, N> {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        loop {
            if self.bits != 0 {
                let b = self.bits.trailing_zeros();
                self.bits &= self.bits - 1;
                let seg = self.seg.expect("bits come from a segment");
                return Some(((seg << SEG_BITS) + self.w * 64) as u32 + b);
            }
            if self.words != 0 {
                self.w = self.words.trailing_zeros() as usize;
                self.words &= self.words - 1;
                let seg = self.seg.expect("words come from a segment");
                if let Some(block) = self.e.block(seg) {
                    // Acquire: pairs with the push's Release.
                    self.bits = block[self.w].swap(0, Ordering::Acquire);
                }
                continue;
            }
            let seg = self.seg.map_or(0, |s| s + 1);
            if seg >= self.segs {
                return None;
            }
            self.seg = Some(seg);
            let summary = &self.e.summary[seg];
            if summary.load(Ordering::Relaxed) != 0 {
                self.words = summary.swap(0, Ordering::Acquire);
            }
        }
    }
}

impl<const N: usize> Drop for Taken<'_, N> {
    /// A take dropped before its end puts back what it swapped out and did
    /// not hand over, for the next take.
    fn drop(&mut self) {
        let Some(seg) = self.seg else { return };
        if self.bits != 0 {
            if let Some(block) = self.e.block(seg) {
                block[self.w].fetch_or(self.bits, Ordering::Release);
            }
            self.words |= 1 << self.w;
        }
        if self.words != 0 {
            self.e.summary[seg].fetch_or(self.words, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn take_all<const N: usize>(e: &Due<N>, len: u32) -> Vec<u32> {
        e.take(len).collect()
    }

    #[test]
    fn every_push_is_taken_once_across_threads_and_segments() {
        let e = std::sync::Arc::new(Due::<4>::default());
        let len = 3 * SEG as u32 + 10;
        for fi in 0..len {
            e.reserve(fi);
        }
        std::thread::scope(|s| {
            for t in 0..4u32 {
                let e = e.clone();
                s.spawn(move || {
                    for fi in (t..len).step_by(4) {
                        assert!(e.push(fi));
                    }
                });
            }
        });
        let out = take_all(&e, len);
        assert_eq!(out, (0..len).collect::<Vec<_>>(), "all of them, in index order");
        assert!(take_all(&e, len).is_empty());
    }

    #[test]
    fn a_take_taken_in_parts_hands_each_function_once() {
        let e = Due::<2>::default();
        let len = SEG as u32 + 100;
        for fi in 0..len {
            e.reserve(fi);
        }
        let pushed: Vec<u32> = (0..len).filter(|i| i % 3 != 1).collect();
        for &fi in &pushed {
            e.push(fi);
        }
        let mut taken = e.take(len);
        let first: Vec<u32> = taken.by_ref().take(70).collect();
        // Pushed again behind the iterator (counted again in the next
        // epoch while the sampler takes): left for the next take.
        e.push(0);
        e.push(pushed[69]);
        let rest: Vec<u32> = taken.collect();
        assert_eq!([first, rest].concat(), pushed);
        assert_eq!(take_all(&e, len), vec![0, pushed[69]]);
    }

    #[test]
    fn pushes_while_taking_are_taken_exactly_once() {
        let e = std::sync::Arc::new(Due::<2>::default());
        let len = 2 * SEG as u32;
        for fi in 0..len {
            e.reserve(fi);
        }
        let mut seen = vec![0u32; len as usize];
        std::thread::scope(|s| {
            for t in 0..2u32 {
                let pusher = e.clone();
                // Each function once, two threads interleaving over the
                // same words, while the take below runs.
                s.spawn(move || {
                    for fi in (t..len).step_by(2) {
                        pusher.push(fi);
                    }
                });
            }
            for _ in 0..200 {
                for fi in e.take(len).take(100) {
                    seen[fi as usize] += 1;
                }
                std::thread::yield_now();
            }
        });
        for fi in take_all(&e, len) {
            seen[fi as usize] += 1;
        }
        let wrong: Vec<(usize, u32)> = seen.iter().copied().enumerate().filter(|&(_, n)| n != 1).collect();
        assert!(wrong.is_empty(), "taken other than once (function, times): {wrong:?}");
    }

    #[test]
    fn an_unreserved_function_is_refused_and_clear_forgets() {
        let e = Due::<2>::default();
        assert!(!e.push(5));
        e.reserve(5);
        assert!(e.push(5));
        e.clear();
        assert!(take_all(&e, 6).is_empty());
        assert!(!e.push(SEG as u32 * 2), "past the table");
    }
}
