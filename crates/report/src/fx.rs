//! FxHash, as rustc uses it: a rotate, a xor and a multiply per word.
//!
//! The profiler hashes call paths on every sample and the report merges
//! them by name; with std's SipHash that hashing was the largest part of
//! both. Resistance to chosen-key flooding buys nothing for keys made of a
//! program's own call sites and paths.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// FxHash's step: the hash `h` after word `w`.
#[inline(always)]
pub fn mix(h: u64, w: u64) -> u64 {
    (h.rotate_left(5) ^ w).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95)
}

/// A [`Hasher`] taking one [`mix`] per 8 bytes.
#[derive(Clone, Copy, Default)]
pub struct FxHasher(u64);

impl FxHasher {
    #[inline(always)]
    fn add(&mut self, w: u64) {
        self.0 = mix(self.0, w);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for w in words.by_ref() {
            self.add(u64::from_le_bytes(w.try_into().expect("8 bytes")));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut b = [0u8; 8];
            b[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(b));
        }
    }
    #[inline]
    fn write_u32(&mut self, v: u32) {
        self.add(u64::from(v));
    }
    #[inline]
    fn write_u64(&mut self, v: u64) {
        self.add(v);
    }
    #[inline]
    fn write_usize(&mut self, v: usize) {
        self.add(v as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// A map hashed with [`FxHasher`].
pub type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::Hash;

    #[test]
    fn equal_keys_hash_equal_and_words_matter() {
        let h = |k: &(u64, u32)| {
            let mut s = FxHasher::default();
            k.hash(&mut s);
            s.finish()
        };
        assert_eq!(h(&(1, 2)), h(&(1, 2)));
        assert_ne!(h(&(1, 2)), h(&(2, 1)));
        let mut m: FxMap<u64, u32> = FxMap::default();
        for i in 0..1000 {
            m.insert(i * 4096, i as u32);
        }
        assert!((0..1000).all(|i| m[&(i * 4096)] == i as u32));
    }
}
