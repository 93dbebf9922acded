//! Per-thread state: the shadow stack of sampled calls and the thread's
//! aggregates. Only the owning thread touches its shadow stack; the
//! aggregates sit behind a mutex that only the report takes besides it, so
//! recording a sample costs an uncontended lock.
//!
//! Pairing. Each sampled entry pushes a frame keyed by the function's CFA:
//! the address just above its return-address slot, found by scanning up
//! from the function's stack pointer at the hook for the `call_site` value
//! the compiler passed (its own return address). Entry and exit of one
//! activation find the same slot, whatever the stack pointer did in between.
//! An exit first pops frames whose CFA lies below its own: activations that
//! were left without an exit (`longjmp`, an exception unwinding through
//! them, a probe switched off mid-call); they are dropped and counted. Then
//! the top frame must be this function at this CFA, or the exit is counted
//! as unmatched (its entry was not sampled) and dropped. A pair is never
//! made across activations, so a duration is never misattributed.

use super::functions::Func;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::Ordering;

/// Histogram buckets: 16 exact, then 16 per power of two (6% wide).
pub(crate) const BUCKETS: usize = 1024;

/// Bucket of a duration in ticks.
pub(crate) fn bucket(x: u64) -> usize {
    if x < 16 {
        return x as usize;
    }
    let e = 63 - x.leading_zeros() as usize;
    let m = ((x >> (e - 4)) & 15) as usize;
    ((e - 3) * 16 + m).min(BUCKETS - 1)
}

/// Middle of a bucket's range, in ticks.
pub(crate) fn bucket_mid(b: usize) -> f64 {
    if b < 16 {
        return b as f64;
    }
    let e = b / 16 + 3;
    let m = (b % 16) as u64;
    let lo = (16 + m) << (e - 4);
    lo as f64 + (1u64 << (e - 4)) as f64 / 2.0
}

/// A sampled activation on the shadow stack.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Frame {
    /// Function index.
    pub func: u32,
    /// Canonical frame address (see the module doc).
    pub cfa: u64,
    /// Its return address, in the caller.
    pub caller: u64,
    /// Where it was called from, for edges and paths: the return address,
    /// or for a copy inlined into another function (whose hooks pass that
    /// function's return address) the hook site, which lies in the
    /// function it was inlined into. 0 while the function's extent is not
    /// yet known (its first epoch): paths then show a gap there, and the
    /// exit works it out from `entry` if it can by then.
    pub from: u64,
    /// The entry probe it came through.
    pub entry: u32,
    /// Entry time (TSC).
    pub t0: u64,
    /// Ticks spent in sampled direct children.
    pub child: u64,
    /// The function's [`Func::exit_gen`] when it was entered. If it has
    /// changed, an exit probe of the function was off for a while during
    /// this call, so the call may have returned unseen: it must not be
    /// paired with a later exit (which would time two calls as one), nor
    /// shown on a path.
    pub exit_gen: u32,
}

impl Frame {
    /// Whether every exit of this call would have been seen so far.
    pub(crate) fn watched(&self, f: &Func) -> bool {
        f.exit_gen.load(Ordering::Acquire) == self.exit_gen
    }
}

/// Deepest shadow stack kept; deeper sampled calls are dropped and counted.
pub(crate) const MAX_DEPTH: usize = 512;

/// One function's samples on one thread.
pub(crate) struct FnAgg {
    pub n: u64,
    pub sum: u64,
    pub min: u64,
    pub max: u64,
    pub hist: Box<[u32; BUCKETS]>,
}

impl FnAgg {
    fn new() -> FnAgg {
        FnAgg {
            n: 0,
            sum: 0,
            min: u64::MAX,
            max: 0,
            hist: Box::new([0; BUCKETS]),
        }
    }

    pub(crate) fn record(&mut self, d: u64) {
        self.n += 1;
        self.sum += d;
        self.min = self.min.min(d);
        self.max = self.max.max(d);
        self.hist[bucket(d)] += 1;
    }

    pub(crate) fn merge(&mut self, o: &FnAgg) {
        self.n += o.n;
        self.sum += o.sum;
        self.min = self.min.min(o.min);
        self.max = self.max.max(o.max);
        for (a, b) in self.hist.iter_mut().zip(o.hist.iter()) {
            *a += b;
        }
    }
}

impl Default for FnAgg {
    fn default() -> Self {
        FnAgg::new()
    }
}

/// Path items: a function index, or these markers.
pub(crate) const GAP: u64 = u64::MAX;
/// Tag of a caller named by its return address (an unsampled frame).
pub(crate) const CALLER_TAG: u64 = 1 << 63;

/// FxHash, as rustc uses: a rotate, a xor and a multiply per word. The
/// aggregates are hashed on every sample (a call path of up to 48 words
/// among them), and with std's SipHash that hashing was the largest part
/// of a sample's cost; resistance to chosen-key flooding buys nothing for
/// keys made of the program's own call paths.
#[derive(Clone, Copy, Default)]
pub(crate) struct FxHasher(u64);

impl FxHasher {
    #[inline(always)]
    fn add(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
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
pub(crate) type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

/// A thread's aggregates.
#[derive(Default)]
pub(crate) struct Agg {
    pub fns: FxMap<u32, FnAgg>,
    /// (call site, callee) -> (sampled calls, ticks).
    pub edges: FxMap<(u64, u32), (u64, u64)>,
    /// path -> (samples, self ticks); the last item is the sampled function.
    pub stacks: FxMap<Box<[u64]>, (u64, u64)>,
}

/// The shadow stack; only its thread touches it.
pub(crate) struct Shadow {
    pub frames: Vec<Frame>,
    /// Scratch for building a path without allocating.
    pub path: Vec<u64>,
}

/// Distinct call paths kept per thread; see `stacks_merged` in the report.
pub const MAX_STACKS: usize = 4096;

impl Shadow {
    pub(crate) fn new() -> Shadow {
        Shadow {
            frames: Vec::with_capacity(MAX_DEPTH),
            path: Vec::with_capacity(64),
        }
    }

    /// Builds the call path ending at `done` (just popped) into `self.path`:
    /// the sampled frames below it, outermost first, with a direct caller
    /// named by return address and a [`GAP`] wherever frames in between were
    /// not sampled. Never joins two frames that were not caller and callee.
    pub(crate) fn build_path(&mut self, done: &Frame, func: impl Fn(u32) -> Option<&'static Func>) {
        const MAX_PATH: usize = 48;
        self.path.clear();
        let frames = &self.frames;
        let start = frames.len().saturating_sub(MAX_PATH);
        let chain = frames[start..].iter().chain(std::iter::once(done));
        let mut prev: Option<&Frame> = None;
        if start > 0 {
            self.path.push(GAP);
        }
        for fr in chain {
            if !func(fr.func).is_some_and(|f| fr.watched(f)) {
                // A call that may have returned unseen is not on a path.
                if prev.is_some() {
                    self.path.push(GAP);
                }
                prev = None;
                continue;
            }
            let direct =
                fr.from != 0 && prev.is_some_and(|p| func(p.func).is_some_and(|f| f.contains(fr.from as usize)));
            if !direct {
                if prev.is_some() || fr.from == 0 {
                    self.path.push(GAP);
                }
                if fr.from != 0 {
                    self.path.push(CALLER_TAG | fr.from);
                }
            }
            self.path.push(fr.func as u64);
            prev = Some(fr);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotone_and_tight() {
        let mut last = 0;
        for x in (1..1_000_000u64).step_by(7) {
            let b = bucket(x);
            assert!(b >= last);
            last = b;
            let mid = bucket_mid(b);
            assert!((mid - x as f64).abs() <= 0.035 * x as f64 + 1.0, "{x} -> {b} mid {mid}");
        }
    }
}
