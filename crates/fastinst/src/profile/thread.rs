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
use super::hist::Hist;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::Ordering;

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

/// One function's samples on one thread: one cache line, indexed by the
/// function's index (no hashing), with its histogram's few lines beside it.
#[derive(Clone)]
#[repr(align(64))]
pub(crate) struct FnAgg {
    pub n: u64,
    pub sum: u64,
    pub min: u64,
    pub max: u64,
    pub hist: Hist,
}

impl Default for FnAgg {
    fn default() -> Self {
        FnAgg {
            n: 0,
            sum: 0,
            min: u64::MAX,
            max: 0,
            hist: Hist::default(),
        }
    }
}

impl FnAgg {
    pub(crate) fn record(&mut self, d: u64) {
        self.n += 1;
        self.sum += d;
        self.min = self.min.min(d);
        self.max = self.max.max(d);
        self.hist.add(d);
    }

    pub(crate) fn merge(&mut self, o: &FnAgg) {
        self.n += o.n;
        self.sum += o.sum;
        self.min = self.min.min(o.min);
        self.max = self.max.max(o.max);
        self.hist.merge(&o.hist);
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

/// Words of samples a thread logs before it folds them into its
/// aggregates (about 400 samples of typical depth).
const FOLD_WORDS: usize = 8192;

/// A thread's aggregates.
///
/// A sample is first appended to a log, and the log is folded into the
/// aggregates a few hundred samples at a time (and before a report reads
/// them). Each sample updates a function's counters and histogram, an edge
/// and a call path: lines the program has evicted since that function's
/// last sample. Recorded one by one, between stretches of the program's
/// own work, each update waited for its misses in turn (a third of a
/// sample's cost on SQLite); folded in a batch, the aggregates are
/// prefetched for the whole batch first and the misses overlap.
#[derive(Default)]
pub(crate) struct Agg {
    /// By function index; `n == 0` for a function not sampled here.
    pub fns: Vec<FnAgg>,
    /// (call site, callee) -> (sampled calls, ticks).
    pub edges: FxMap<(u64, u32), (u64, u64)>,
    /// path -> (samples, self ticks); the last item is the sampled function.
    pub stacks: FxMap<Box<[u64]>, (u64, u64)>,
    /// Samples not yet folded: per sample `[function, from, duration, self
    /// ticks, path length, path...]` (see [`Agg::log`]).
    pending: Vec<u64>,
}

/// Header words of a logged sample.
const HEADER: usize = 5;

impl Agg {
    /// Logs a sampled call of function `fi` that lasted `dur` ticks,
    /// `self_ticks` of them outside its sampled children, called from
    /// `from` (0: unknown), along `path`. True when the log should be
    /// [folded](Agg::fold).
    #[inline]
    pub(crate) fn log(&mut self, fi: u32, from: u64, dur: u64, self_ticks: u64, path: &[u64]) -> bool {
        if self.pending.capacity() == 0 {
            self.pending.reserve_exact(FOLD_WORDS + HEADER + 64);
        }
        self.pending
            .extend_from_slice(&[u64::from(fi), from, dur, self_ticks, path.len() as u64]);
        self.pending.extend_from_slice(path);
        self.pending.len() >= FOLD_WORDS
    }

    /// Folds the logged samples into the aggregates; returns how many new
    /// paths were past [`MAX_STACKS`] and kept as `[...];function`.
    pub(crate) fn fold(&mut self) -> u64 {
        let mut log = std::mem::take(&mut self.pending);
        let samples = || logged(&log);
        // Every function's counters first, so their misses overlap; then
        // the histograms' lines, which those counters locate.
        for (fi, ..) in samples() {
            prefetch(self.function(fi));
        }
        for (fi, _, dur, ..) in samples() {
            if let Some(c) = self.fns[fi as usize].hist.slot(dur) {
                prefetch(c);
            }
        }
        let mut merged = 0;
        for (fi, from, dur, self_ticks, path) in samples() {
            self.fns[fi as usize].record(dur);
            // An edge needs to know its caller; before the function's
            // extent is known (its first epoch) the sample has none.
            if from != 0 {
                let e = self.edges.entry((from, fi)).or_default();
                e.0 += 1;
                e.1 += dur;
            }
            // One hash and probe when the path is known (the common case);
            // a key is allocated only for a path seen for the first time.
            if let Some(s) = self.stacks.get_mut(path) {
                s.0 += 1;
                s.1 += self_ticks;
                continue;
            }
            let short = [GAP, u64::from(fi)];
            let key = if self.stacks.len() < MAX_STACKS {
                path
            } else {
                // A thread's distinct paths are bounded (an interpreter's
                // recursion makes hundreds of thousands, and the reports
                // grew to 90 MB): past the bound, a new path is kept as
                // `[...];function`, which claims no caller.
                merged += 1;
                &short[..]
            };
            match self.stacks.get_mut(key) {
                Some(s) => {
                    s.0 += 1;
                    s.1 += self_ticks;
                }
                None => {
                    self.stacks.insert(key.into(), (1, self_ticks));
                }
            }
        }
        // The log's buffer is reused.
        log.clear();
        self.pending = log;
        merged
    }

    /// Function `fi`'s aggregate on this thread.
    #[inline]
    fn function(&mut self, fi: u32) -> &mut FnAgg {
        let i = fi as usize;
        if i >= self.fns.len() {
            // Whole pages of room: functions are discovered in bursts.
            self.fns.resize_with((i + 64).next_multiple_of(64), FnAgg::default);
        }
        &mut self.fns[i]
    }

    /// The functions sampled on this thread, by index (after a fold).
    pub(crate) fn sampled(&self) -> impl Iterator<Item = (u32, &FnAgg)> {
        self.fns
            .iter()
            .enumerate()
            .filter(|(_, a)| a.n > 0)
            .map(|(i, a)| (i as u32, a))
    }
}

/// The samples of a log: (function, from, duration, self ticks, path).
fn logged(log: &[u64]) -> impl Iterator<Item = (u32, u64, u64, u64, &[u64])> {
    let mut at = 0;
    std::iter::from_fn(move || {
        let h = log.get(at..at + HEADER)?;
        let path = &log[at + HEADER..at + HEADER + h[4] as usize];
        at += HEADER + path.len();
        Some((h[0] as u32, h[1], h[2], h[3], path))
    })
}

/// Starts loading the cache line at `p`.
#[inline(always)]
fn prefetch<T>(p: *const T) {
    // SAFETY: a prefetch is a hint: it never faults and changes no state
    // the program can see, whatever the address.
    unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast::<i8>()) };
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
