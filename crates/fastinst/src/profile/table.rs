//! A small open-addressing hash table whose slot for a key can be
//! prefetched before it is looked at.
//!
//! The per-thread aggregates look up a call path's node and an edge on
//! every sample, between stretches of the program's own work that evict
//! them. With `HashMap` (hashbrown) each lookup was two dependent misses,
//! its control bytes then its bucket, and neither could be started early:
//! on SQLite's gcc build those two lookups were most of the time a sample
//! spent on its path and a third of folding its aggregates. Here a key
//! hashes to one slot, probed linearly, with the key and the value in the
//! slot itself: one line, which [`OpenTable::prefetch`] starts loading
//! while earlier samples are recorded ([`super::thread::Agg::fold`]).

use crate::prefetch;

/// What an [`OpenTable`] stores: a key and its value in one `Copy` slot,
/// with a key value that marks the slot empty.
pub(crate) trait Slot: Copy {
    /// The key.
    type Key: Copy + PartialEq;
    /// An empty slot.
    const EMPTY: Self;
    /// Its key, `None` when empty.
    fn key(&self) -> Option<Self::Key>;
    /// A slot holding `k` and the value's initial state.
    fn new(k: Self::Key) -> Self;
    /// The key's hash; its high bits pick the slot.
    fn hash(k: &Self::Key) -> u64;
}

/// Smallest table.
const MIN_BITS: u32 = 8;

/// Linear probing, at most half full: a lookup reads one slot, or a few
/// next to it, in one line or two.
pub(crate) struct OpenTable<S: Slot> {
    slots: Vec<S>,
    len: usize,
    bits: u32,
}

impl<S: Slot> Default for OpenTable<S> {
    fn default() -> Self {
        OpenTable {
            slots: Vec::new(),
            len: 0,
            bits: 0,
        }
    }
}

pub(crate) use fastinst_report::fx::mix;

impl<S: Slot> OpenTable<S> {
    /// The slot `k` hashes to.
    #[inline(always)]
    fn home(&self, k: &S::Key) -> usize {
        (S::hash(k) >> (64 - self.bits)) as usize
    }

    /// Starts loading the slot `k` hashes to.
    #[inline(always)]
    pub(crate) fn prefetch(&self, k: &S::Key) {
        if !self.slots.is_empty() {
            prefetch::line(&self.slots[self.home(k)]);
        }
    }

    /// Where `k` is, or the empty slot where it would go.
    #[inline]
    fn position(&self, k: &S::Key) -> (usize, bool) {
        let mask = self.slots.len() - 1;
        let mut i = self.home(k);
        loop {
            match self.slots[i].key() {
                Some(have) if have == *k => return (i, true),
                Some(_) => i = (i + 1) & mask,
                None => return (i, false),
            }
        }
    }

    /// The slot holding `k`.
    #[inline]
    pub(crate) fn get(&self, k: &S::Key) -> Option<&S> {
        if self.slots.is_empty() {
            return None;
        }
        match self.position(k) {
            (i, true) => Some(&self.slots[i]),
            _ => None,
        }
    }

    /// The slot holding `k`, made with [`Slot::new`] if there is none
    /// (the flag says which).
    #[inline]
    pub(crate) fn get_or_insert(&mut self, k: S::Key) -> (&mut S, bool) {
        if (self.len + 1) * 2 > self.slots.len() {
            self.grow();
        }
        let (i, found) = self.position(&k);
        if !found {
            self.slots[i] = S::new(k);
            self.len += 1;
        }
        (&mut self.slots[i], !found)
    }

    #[cold]
    fn grow(&mut self) {
        let bits = (self.bits + 1).max(MIN_BITS);
        let old = std::mem::replace(&mut self.slots, vec![S::EMPTY; 1 << bits]);
        self.bits = bits;
        for s in old {
            if let Some(k) = s.key() {
                let (i, _) = self.position(&k);
                self.slots[i] = s;
            }
        }
    }

    /// Keys held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Every full slot, in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &S> {
        self.slots.iter().filter(|s| s.key().is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[derive(Clone, Copy, Debug, PartialEq)]
    struct Pair {
        k: u64,
        v: u64,
    }

    impl Slot for Pair {
        type Key = u64;
        const EMPTY: Pair = Pair { k: 0, v: 0 };
        fn key(&self) -> Option<u64> {
            (self.k != 0).then_some(self.k)
        }
        fn new(k: u64) -> Pair {
            Pair { k, v: 0 }
        }
        fn hash(k: &u64) -> u64 {
            mix(0, *k)
        }
    }

    #[test]
    fn agrees_with_a_hash_map_through_growth_and_collisions() {
        let mut t = OpenTable::<Pair>::default();
        let mut want = HashMap::new();
        assert!(t.get(&5).is_none());
        // Keys that share their high hash bits collide; multiples of a
        // large power of two stress the probing too.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for i in 0..20_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let k = if i % 3 == 0 { (i % 500 + 1) << 40 } else { x % 5_000 + 1 };
            let (s, new) = t.get_or_insert(k);
            assert_eq!(new, !want.contains_key(&k));
            s.v += i;
            *want.entry(k).or_insert(0) += i;
            t.prefetch(&k);
        }
        assert_eq!(t.len(), want.len());
        for (k, v) in &want {
            assert_eq!(t.get(k).map(|s| s.v), Some(*v), "key {k}");
        }
        let mut got: Vec<_> = t.iter().map(|s| (s.k, s.v)).collect();
        got.sort_unstable();
        let mut all: Vec<_> = want.into_iter().collect();
        all.sort_unstable();
        assert_eq!(got, all);
        assert!(t.get(&(1 << 62)).is_none());
    }
}
