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
use super::paths::{PathEnd, Paths, Segment, ROOT};
use super::table::{mix, OpenTable, Slot};
use crate::prefetch::line as prefetch;
use crate::probe::ProbeId;

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
    pub entry: ProbeId,
    /// The stack pointer its entry hook was called at (its call of the
    /// hook: `crate::hooks::HookContext::stack`), which its own exit
    /// hook's call is at or above and every callee's below (see
    /// `crate::clock::ThreadClock::set_timed`).
    pub sp: u64,
    /// Entry time (TSC: the entry hook's stamp).
    pub t0: u64,
    /// The thread's hook ticks at the entry hook's stamp (before its own).
    pub h0: u64,
    /// Ticks spent in sampled direct children.
    pub child: u64,
    /// The calls it stands for ([`super::choose::weight`]).
    pub weight: u32,
    /// The function's [`Func::exit_gen`] when it was entered. If it has
    /// changed, an exit probe of the function was off for a while during
    /// this call, so the call may have returned unseen: it must not be
    /// paired with a later exit (which would time two calls as one), nor
    /// shown on a path.
    pub exit_gen: u32,
    /// The interned path that ends at this frame ([`NO_NODE`]: not yet
    /// worked out), valid while the profiler's path epoch is still
    /// `node_epoch` (see [`Shadow::path_end`]).
    pub node: u32,
    /// The path epoch `node` was worked out in.
    pub node_epoch: u32,
    /// Whether this frame is on its own path (it was watched then), so
    /// that the next frame up may be joined to it as its callee.
    pub open: bool,
}

/// [`Frame::node`] not yet worked out.
pub(crate) const NO_NODE: u32 = u32::MAX;
/// [`Frame::node`] when the path table was full: no path through this
/// frame has a node either (the table is prefix-closed and never shrinks).
const FULL: u32 = u32::MAX - 1;

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
    /// Timed calls.
    pub n: u64,
    /// The calls they stand for (each its weight, see
    /// [`super::choose`]), and the sum of the weights' squares (for the
    /// mean's spread).
    pub w: u64,
    pub w2: u64,
    /// Their durations, each times its weight.
    pub sum: u64,
    /// Weighted durations of the samples that were the outermost sampled
    /// activation of their function on their thread (a recursive
    /// function's nested activations are in them already), and how many
    /// samples were nested.
    pub outer_sum: u64,
    pub nested: u64,
    pub min: u64,
    pub max: u64,
    /// The hooks' charges inside the timed calls (between their entry and
    /// exit stamps), each times its call's weight: how much of the time
    /// they measure was taken off as hook time (`super::range`).
    pub hooks_in: u64,
    pub hist: Hist,
    /// Timed calls whose exit went unwatched, each at the time it is known
    /// to have lasted (censored: see [`super::survival`]), weighted.
    pub censored: Hist,
    /// The weighted censored durations of those that were their
    /// function's outermost activation: the inclusive time they are known
    /// to hold (an interpreter's main loop, censored once, is all of it).
    pub outer_censored: u64,
}

impl Default for FnAgg {
    fn default() -> Self {
        FnAgg {
            n: 0,
            w: 0,
            w2: 0,
            sum: 0,
            outer_sum: 0,
            nested: 0,
            min: u64::MAX,
            max: 0,
            hooks_in: 0,
            hist: Hist::default(),
            censored: Hist::default(),
            outer_censored: 0,
        }
    }
}

impl FnAgg {
    /// Records a timed call of `d` ticks that stands for `w` calls, and
    /// inside which `hooks` ticks were charged to hooks.
    pub(crate) fn record(&mut self, d: u64, outer: bool, w: u32, hooks: u32) {
        let w = u64::from(w);
        self.hooks_in = self.hooks_in.saturating_add(u64::from(hooks) * w);
        self.n += 1;
        self.w += w;
        self.w2 += w * w;
        // Saturating: a sum past 2^64 ticks would be centuries of calls.
        self.sum = self.sum.saturating_add(d.saturating_mul(w));
        if outer {
            self.outer_sum = self.outer_sum.saturating_add(d.saturating_mul(w));
        } else {
            self.nested += 1;
        }
        self.min = self.min.min(d);
        self.max = self.max.max(d);
        self.hist.add_weighted(d, w);
    }

    /// Records a timed call known only to have lasted at least `c` ticks,
    /// standing for `w` calls; `outer`: its function's outermost
    /// activation on its thread.
    pub(crate) fn censor(&mut self, c: u64, w: u32, outer: bool) {
        self.censored.add_weighted(c, u64::from(w));
        if outer {
            self.outer_censored = self.outer_censored.saturating_add(c.saturating_mul(u64::from(w)));
        }
    }

    /// Whether any timed call of the function was recorded, whole or
    /// censored.
    pub(crate) fn any(&self) -> bool {
        self.n > 0 || !self.censored.is_empty()
    }

    /// The calls the censored ones stand for.
    pub(crate) fn censored_w(&self) -> u64 {
        self.censored.iter().map(|(_, c)| c).sum()
    }

    pub(crate) fn merge(&mut self, o: &FnAgg) {
        self.n += o.n;
        self.w += o.w;
        self.w2 += o.w2;
        self.sum += o.sum;
        self.outer_sum += o.outer_sum;
        self.nested += o.nested;
        self.min = self.min.min(o.min);
        self.max = self.max.max(o.max);
        self.hooks_in = self.hooks_in.saturating_add(o.hooks_in);
        self.hist.merge(&o.hist);
        self.censored.merge(&o.censored);
        self.outer_censored = self.outer_censored.saturating_add(o.outer_censored);
    }
}

pub(crate) use fastinst_report::fx::FxMap;

/// Samples a thread logs before it folds them into its aggregates.
const FOLD_SAMPLES: usize = 512;

/// How many samples ahead of the one it records [`Agg::fold`] starts
/// loading a sample's lines, for each of its two stages.
const FOLD_AHEAD: usize = 8;

/// A caller -> callee edge's samples on one thread: a call site (a return
/// address, or an inlined copy's hook site), the callee's function index,
/// the sampled calls, the calls they stand for, and their ticks (each
/// times its weight). One slot of an [`OpenTable`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Edge {
    pub from: u64,
    pub func: u32,
    pub calls: u64,
    pub w: u64,
    pub ticks: u64,
}

impl Slot for Edge {
    type Key = (u64, u32);
    /// Edges are only kept for a known call site, never 0.
    const EMPTY: Edge = Edge {
        from: 0,
        func: 0,
        calls: 0,
        w: 0,
        ticks: 0,
    };
    #[inline(always)]
    fn key(&self) -> Option<(u64, u32)> {
        (self.from != 0).then_some((self.from, self.func))
    }
    fn new((from, func): (u64, u32)) -> Edge {
        Edge {
            from,
            func,
            calls: 0,
            w: 0,
            ticks: 0,
        }
    }
    #[inline(always)]
    fn hash(k: &(u64, u32)) -> u64 {
        mix(mix(0, k.0), u64::from(k.1))
    }
}

/// A thread's aggregates.
///
/// A sample is first appended to a log, and the log is folded into the
/// aggregates a few hundred samples at a time (and before a report reads
/// them). Each sample updates a function's counters and histogram, an edge
/// and a call path: lines the program has evicted since that function's
/// last sample. Recorded one by one, between stretches of the program's
/// own work, each update waited for its misses in turn (a third of a
/// sample's cost on SQLite); folded in a batch, each sample's lines are
/// loaded a few samples before it is recorded, and the misses overlap.
/// The last step of its call path is looked up there too
/// ([`PathEnd`]): in the exit handler it was two misses a sample.
#[derive(Default)]
pub(crate) struct Agg {
    /// By function index; `n == 0` for a function not sampled here.
    pub fns: Vec<FnAgg>,
    /// Edges, by (call site, callee).
    pub edges: OpenTable<Edge>,
    /// The call paths, with each path's samples and self ticks.
    pub paths: Paths,
    /// Samples whose path needed a node when the path table was full, so
    /// shown as `[...];function`.
    pub stacks_merged: u64,
    /// Samples not yet folded.
    pending: Vec<Logged>,
}

/// A sample waiting in the log.
#[derive(Clone, Copy)]
struct Logged {
    func: u32,
    /// Its path's node, once the fold has resolved `end`.
    node: u32,
    end: PathEnd,
    from: u64,
    dur: u64,
    self_ticks: u64,
    /// The calls it stands for.
    weight: u32,
    /// Hook ticks charged inside it (saturated).
    hooks: u32,
    /// The outermost sampled activation of its function on its thread.
    outer: bool,
}

impl Agg {
    /// Logs a sampled call of function `fi` that lasted `dur` ticks,
    /// `self_ticks` of them outside its sampled children, with `hooks`
    /// ticks charged to hooks inside it, called from
    /// `from` (0: unknown), whose call path ends at `end` of
    /// [`Agg::paths`], and that stands for `weight` calls. True when the
    /// log should be [folded](Agg::fold).
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn log(
        &mut self,
        fi: u32,
        from: u64,
        dur: u64,
        self_ticks: u64,
        hooks: u64,
        end: PathEnd,
        outer: bool,
        weight: u32,
    ) -> bool {
        if self.pending.capacity() == 0 {
            self.pending.reserve_exact(FOLD_SAMPLES);
        }
        self.pending.push(Logged {
            func: fi,
            node: ROOT,
            end,
            from,
            dur,
            self_ticks,
            weight,
            hooks: u32::try_from(hooks).unwrap_or(u32::MAX),
            outer,
        });
        self.pending.len() >= FOLD_SAMPLES
    }

    /// Folds the logged samples into the aggregates.
    ///
    /// A pipeline of three stages, [`FOLD_AHEAD`] samples apart: start
    /// loading a sample's function counters, its path's last lookup and its
    /// edge; later, resolve its path node and start loading that node's
    /// counters and its histogram line (which the function's counters
    /// locate); later still, record it. Prefetching the whole log at once,
    /// as before, asked for more lines than the first-level cache holds
    /// and the loads in flight stalled the loop.
    pub(crate) fn fold(&mut self) {
        let mut log = std::mem::take(&mut self.pending);
        let n = log.len();
        for i in 0..n + 2 * FOLD_AHEAD {
            if let Some(s) = log.get(i) {
                prefetch(self.function(s.func));
                if let PathEnd::Child(parent, seg) = s.end {
                    self.paths.prefetch_child(parent, seg);
                }
                if s.from != 0 {
                    self.edges.prefetch(&(s.from, s.func));
                }
            }
            if let Some(s) = i.checked_sub(FOLD_AHEAD).and_then(|j| log.get_mut(j)) {
                s.node = match self.paths.resolve(s.end) {
                    Some(node) => node,
                    None => {
                        self.stacks_merged += 1;
                        self.paths.merged(s.func)
                    }
                };
                prefetch(self.paths.slot(s.node));
                if let Some(c) = self.fns[s.func as usize].hist.slot(s.dur) {
                    prefetch(c);
                }
            }
            if let Some(s) = i.checked_sub(2 * FOLD_AHEAD).and_then(|j| log.get(j)) {
                self.fns[s.func as usize].record(s.dur, s.outer, s.weight, s.hooks);
                // An edge needs to know its caller; before the function's
                // extent is known (its first epoch) the sample has none.
                if s.from != 0 {
                    let (e, _) = self.edges.get_or_insert((s.from, s.func));
                    e.calls += 1;
                    e.w += u64::from(s.weight);
                    e.ticks = e.ticks.saturating_add(s.dur.saturating_mul(u64::from(s.weight)));
                }
                self.paths.add(s.node, s.self_ticks.saturating_mul(u64::from(s.weight)));
            }
        }
        // The log's buffer is reused.
        log.clear();
        self.pending = log;
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

    /// Records a censored call of function `fi` (see [`FnAgg::censor`]).
    pub(crate) fn censor(&mut self, fi: u32, c: u64, w: u32, outer: bool) {
        self.function(fi).censor(c, w, outer);
    }

    /// The functions sampled on this thread, by index (after a fold).
    pub(crate) fn sampled(&self) -> impl Iterator<Item = (u32, &FnAgg)> {
        self.fns
            .iter()
            .enumerate()
            .filter(|(_, a)| a.any())
            .map(|(i, a)| (i as u32, a))
    }
}

/// The shadow stack; only its thread touches it.
pub(crate) struct Shadow {
    pub frames: Vec<Frame>,
    /// Scratch for a path's segments.
    segs: Vec<Segment>,
}

/// Sampled frames a path shows before it is cut to its innermost ones
/// behind a `[...]`.
const MAX_PATH: usize = 48;

impl Shadow {
    pub(crate) fn new() -> Shadow {
        Shadow {
            frames: Vec::with_capacity(MAX_DEPTH),
            segs: Vec::with_capacity(MAX_PATH + 2),
        }
    }

    /// The call path ending at `done` (just popped), worked out from the
    /// whole stack into `self.segs`: the sampled frames below it, outermost
    /// first, with a direct caller named by return address and a [`GAP`]
    /// wherever frames in between were not sampled. Never joins two frames
    /// that were not caller and callee.
    fn full_path(&mut self, done: &Frame, func: impl Fn(u32) -> Option<&'static Func>) {
        self.segs.clear();
        let frames = &self.frames;
        let start = frames.len().saturating_sub(MAX_PATH);
        if start > 0 {
            self.segs.push(Segment::GAP);
        }
        let mut prev: Option<&Frame> = None;
        for fr in frames[start..].iter().chain(std::iter::once(done)) {
            let (seg, on) = segment(prev, fr, &func);
            self.segs.extend(seg);
            prev = on.then_some(fr);
        }
    }

    /// [`full_path`](Self::full_path)'s items.
    #[cfg(test)]
    fn build_path(&mut self, done: &Frame, func: impl Fn(u32) -> Option<&'static Func>) -> Vec<u64> {
        self.full_path(done, func);
        self.segs.iter().flat_map(|s| s.items()).collect()
    }

    /// Where the path [`full_path`](Self::full_path) works out for `done`
    /// ends in `paths`: a node, or a node and the segment `done` adds to
    /// it, whose lookup [`Agg::fold`] makes ([`Paths::resolve`]);
    /// [`PathEnd::Merged`] when it needs a new node on the way and the
    /// table is full.
    ///
    /// A frame keeps the node of the path that ends at it, so a path is its
    /// parent's node extended by one frame's items: a lookup or two, not a
    /// walk of the whole stack. A kept node is used only while `epoch`
    /// (the profiler's path epoch, read before any frame is looked at) has
    /// not moved since it was worked out: the epoch moves whenever
    /// something a path depends on may have changed for a live frame (an
    /// exit probe of a function with a sampled call in flight switched, a
    /// function's extent resolved, a fork), and the nodes of the frames
    /// above the deepest still-valid one are worked out again.
    pub(crate) fn path_end(
        &mut self,
        done: &Frame,
        paths: &mut Paths,
        epoch: u32,
        func: impl Fn(u32) -> Option<&'static Func>,
    ) -> PathEnd {
        if self.frames.len() > MAX_PATH {
            // Cut paths start at a different frame for each depth: no
            // parent node to extend.
            self.full_path(done, func);
            let Some((&last, rest)) = self.segs.split_last() else {
                return PathEnd::At(ROOT);
            };
            return paths
                .intern(rest)
                .map_or(PathEnd::Merged, |node| PathEnd::Child(node, last));
        }
        let frames = &mut self.frames;
        let valid = |f: &Frame| f.node != NO_NODE && f.node_epoch == epoch;
        let first = frames.iter().rposition(valid).map_or(0, |i| i + 1);
        let (mut node, mut prev) = match first.checked_sub(1) {
            Some(i) => (frames[i].node, frames[i].open.then_some(i)),
            None => (ROOT, None),
        };
        if node == FULL {
            return PathEnd::Merged;
        }
        for k in first..frames.len() {
            let (seg, on) = segment(prev.map(|i| &frames[i]), &frames[k], &func);
            let next = seg.map_or(Some(node), |seg| paths.child(node, seg));
            let fr = &mut frames[k];
            // Kept even when the table is full, so that the samples above
            // this frame give up at once instead of walking to here again.
            fr.node = next.unwrap_or(FULL);
            fr.node_epoch = epoch;
            fr.open = on;
            let Some(next) = next else { return PathEnd::Merged };
            node = next;
            prev = on.then_some(k);
        }
        match segment(prev.map(|i| &frames[i]), done, &func) {
            (Some(seg), _) => PathEnd::Child(node, seg),
            (None, _) => PathEnd::At(node),
        }
    }

    /// The node of [`path_end`](Self::path_end), looked up at once.
    #[cfg(test)]
    fn path_node(
        &mut self,
        done: &Frame,
        paths: &mut Paths,
        epoch: u32,
        func: impl Fn(u32) -> Option<&'static Func>,
    ) -> Option<u32> {
        let end = self.path_end(done, paths, epoch, func);
        paths.resolve(end)
    }
}

/// What frame `fr` adds to a path after `prev` (the frame below it, when
/// that one is on the path), and whether `fr` is on the path itself.
#[inline]
fn segment(prev: Option<&Frame>, fr: &Frame, func: &impl Fn(u32) -> Option<&'static Func>) -> (Option<Segment>, bool) {
    if !func(fr.func).is_some_and(|f| fr.watched(f)) {
        // A call that may have returned unseen is not on a path.
        return (prev.is_some().then_some(Segment::GAP), false);
    }
    let direct = fr.from != 0 && prev.is_some_and(|p| func(p.func).is_some_and(|f| f.contains(fr.from as usize)));
    let seg = if direct {
        Segment {
            caller: 0,
            func: fr.func,
            gap: false,
        }
    } else {
        Segment {
            caller: fr.from,
            func: fr.func,
            gap: prev.is_some() || fr.from == 0,
        }
    };
    (Some(seg), true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::paths::{CALLER_TAG, GAP};
    use testkit::Rng;

    /// The path of `done` on `frames` as the module doc defines it, item by
    /// item, written independently of `segment`.
    fn reference_path(frames: &[Frame], done: &Frame, func: impl Fn(u32) -> Option<&'static Func>) -> Vec<u64> {
        let mut path = Vec::new();
        let start = frames.len().saturating_sub(MAX_PATH);
        if start > 0 {
            path.push(GAP);
        }
        let mut prev: Option<&Frame> = None;
        for fr in frames[start..].iter().chain(std::iter::once(done)) {
            if !func(fr.func).is_some_and(|f| fr.watched(f)) {
                if prev.is_some() {
                    path.push(GAP);
                }
                prev = None;
                continue;
            }
            let direct =
                fr.from != 0 && prev.is_some_and(|p| func(p.func).is_some_and(|f| f.contains(fr.from as usize)));
            if !direct {
                if prev.is_some() || fr.from == 0 {
                    path.push(GAP);
                }
                if fr.from != 0 {
                    path.push(CALLER_TAG | fr.from);
                }
            }
            path.push(u64::from(fr.func));
            prev = Some(fr);
        }
        path
    }

    #[test]
    fn kept_path_nodes_name_the_path_built_from_the_whole_stack() {
        // Eight functions of 0x100 bytes each; extents start unknown.
        let funcs: &'static [Func] = Box::leak((0..8).map(|i| Func::new(0x1000 + i * 0x100, "")).collect());
        let func = |i: u32| funcs.get(i as usize);
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut sh = Shadow::new();
        let mut paths = Paths::default();
        let mut epoch = 0u32;
        let (mut checked, mut refused) = (0, 0);
        for _ in 0..200_000 {
            match rng.below(16) {
                0..=6 if sh.frames.len() < 60 => {
                    let fi = rng.below(8) as u32;
                    // Called from inside the function below, from elsewhere,
                    // or from an unknown place.
                    let from = match (rng.below(4), sh.frames.last()) {
                        (0 | 1, Some(top)) => funcs[top.func as usize].addr as u64 + 1 + rng.below(0xff),
                        (2, _) => 0x9000 + rng.below(4),
                        _ => 0,
                    };
                    sh.frames.push(Frame {
                        func: fi,
                        cfa: 0,
                        caller: 0,
                        from,
                        entry: ProbeId::new(0),
                        sp: 0,
                        t0: 0,
                        h0: 0,
                        child: 0,
                        weight: 1,
                        exit_gen: funcs[fi as usize].exit_gen.load(Ordering::Relaxed),
                        node: NO_NODE,
                        node_epoch: 0,
                        open: false,
                    });
                }
                7..=11 => {
                    let Some(done) = sh.frames.pop() else { continue };
                    let want = reference_path(&sh.frames, &done, func);
                    assert_eq!(sh.build_path(&done, func), want);
                    match sh.path_node(&done, &mut paths, epoch, func) {
                        Some(node) => {
                            assert_eq!(paths.path_of(node), want);
                            checked += 1;
                        }
                        None => {
                            assert!(paths.is_full(), "refused a path with room in the table");
                            refused += 1;
                            // Full for a while, then a new table, as a
                            // forked child starts; the epoch retires the
                            // kept nodes.
                            if refused % 64 == 0 {
                                paths = Paths::default();
                                epoch += 1;
                            }
                        }
                    }
                }
                12 | 13 => {
                    // An exit probe switched: the epoch moves only if a
                    // call of that function is in flight.
                    let fi = rng.below(8) as u32;
                    funcs[fi as usize].exit_gen.fetch_add(1, Ordering::Relaxed);
                    if sh.frames.iter().any(|f| f.func == fi) {
                        epoch += 1;
                    }
                }
                14 => {
                    let f = &funcs[rng.below(8) as usize];
                    if f.end.load(Ordering::Relaxed) == 0 {
                        f.end.store(f.addr + 0x100, Ordering::Relaxed);
                        epoch += 1;
                    }
                }
                _ => {
                    sh.frames.pop();
                }
            }
        }
        assert!(
            checked > 50_000 && refused > 500,
            "{checked} paths checked, {refused} refused"
        );
    }
}
