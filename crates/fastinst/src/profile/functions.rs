//! Per-function profiling state: which of its calls are timed, the exit
//! probes' bookkeeping, and the counting window ([`super::window`]).
//!
//! A function's calls are counted (whole, or inside its counting windows)
//! and, among the counted ones, each is timed by an independent draw with
//! the chance [`Func::chance`] that the sampler set for the window or the
//! epoch ([`super::choose`]): its entry and exit are paired and its
//! duration, caller and path recorded, weighted by the inverse of that
//! chance. A function counted whole keeps its entry probe on throughout
//! (every call counted); a windowed one has it on only while a window is
//! open.

use super::exitlog::ExitLog;
use super::spread::Spread;
use super::window::Window;
use crate::probe::ProbeId;
use crate::sled::counter::Counter;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU8, AtomicUsize, Ordering};

/// Exits per window that may match no sampled call before a closed
/// function's exit probes go off even though a sampled call is still in
/// flight. Without a bound, one long sampled call of a hot recursive
/// function (an interpreter's `JS_CallInternal` entered by `main`) keeps
/// the exit probe on for the whole run, and every return of every nested
/// call pays the hook and the frame search: measured on QuickJS, 34 M
/// unmatched exits in 1.9 s, +165% CPU. With the bound, such a call is
/// still measured if it returns while a later window has the probe on;
/// otherwise it is dropped and counted ("left without exit"), never
/// misattributed. (Sled functions' exit probes follow their entry probes
/// and see only sampled calls: they need no budget and stay on.)
pub const EXIT_BUDGET: u32 = 64;

// What a sample reads and writes is the first line.
const _: () = assert!(std::mem::offset_of!(Func, exits_follow_entry) < 64);

/// A gap no run reaches: a counter armed with it sends no call on.
const NEVER: u64 = 1 << 62;

/// [`Func::hint_exit`]'s flag for a tail-jump exit.
pub(crate) const TAIL_HINT: u32 = 1 << 30;
/// Set in every hint, so that slot 0 is a hint too.
const EXIT_HINT: u32 = 1 << 31;
const _: () = assert!(crate::sitetable::CAPACITY <= TAIL_HINT as usize);

/// The parts of a function's state that only its timed calls and the
/// sampler touch.
pub(crate) struct Timed {
    /// When its exit probes went off, by watch stamp: the censoring time
    /// of a timed call that then lost its exit.
    pub exit_log: ExitLog,
    /// How its timed durations spread, which sets how many calls are
    /// timed ([`super::spread`]).
    pub spread: Spread,
}

/// One instrumented function.
///
/// The fields a handler reads and writes come first and share one cache
/// line (`repr(C)`, aligned): a function is sampled a few times per epoch,
/// between which the program evicts it, so each line it spans is a miss.
#[repr(C, align(64))]
pub(crate) struct Func {
    /// Entry address.
    pub addr: usize,
    /// End of the function's code, 0 until resolved from its symbol.
    pub end: AtomicUsize,
    /// The chance that a counted call is timed, as a power of two: `2^-chance`
    /// (set by the sampler for each window, or each epoch of a function
    /// counted whole; see [`super::choose`]).
    pub chance: AtomicU8,
    /// Calls timed at the current chance, and how many may be before the
    /// chance halves ([`Func::took`]).
    pub taken: AtomicU32,
    pub budget: AtomicU32,
    /// Sampled calls entered and not yet exited.
    pub outstanding: AtomicI32,
    /// Bumped each time one of the function's exit probes is switched off
    /// or on: a sampled call whose stamp differs may have exited unseen
    /// (see [`Frame::exit_gen`](super::thread::Frame::exit_gen)).
    pub exit_gen: AtomicU32,
    /// What only timed calls touch, boxed away from the line the
    /// handlers read.
    pub timed: Box<Timed>,
    /// Exits in this window that matched no sampled call (see
    /// [`EXIT_BUDGET`]).
    pub unmatched: AtomicU32,
    /// One of its exit probes, for [`Func::prefetch_exit`] (0 with no
    /// hint: see `exit_slot`).
    exit_probe: AtomicU32,
    /// The site-table slot where that probe's hook call finds it, with
    /// [`TAIL_HINT`] for a tail-jump exit (found by the function, after a
    /// look for its caller's return address); 0: no hint.
    exit_slot: AtomicU32,
    /// No call is being chosen for timing: the function's window is
    /// closed (a windowed function), or its entry probe went off for the
    /// rest of the epoch (one counted whole past its overflow). Its exit
    /// probes then go off once no timed call is in flight.
    pub closed: AtomicBool,
    /// Its exit probe follows its entry probe (a sled function: see
    /// `crate::sled::follow_entry`): it sees exactly the returns of the
    /// calls entered while the entry probe was on, so it stays on for the
    /// whole run and is never switched off here.
    pub exits_follow_entry: AtomicBool,
    /// The counting window and the call estimate.
    pub window: Window,
    /// Demangled name (may be empty): the probe's own name where it is
    /// UTF-8, which lives for the process (discovery leaks each name
    /// once), not a copy of it per function.
    pub name: std::borrow::Cow<'static, str>,
    /// Its probes: one pair per copy of the function's code, and an
    /// inlined function has a copy in each caller.
    pub probes: FuncProbes,
    /// Where the function's body lies when its entry is a sled function
    /// that jumps to it (`#[fastinst::instrument]`: see
    /// [`crate::sled::body_of`]): `[start, end]`, both 0 when it has none.
    pub body: (AtomicUsize, AtomicUsize),
}

impl Func {
    pub(crate) fn new(addr: usize, name: impl Into<std::borrow::Cow<'static, str>>) -> Func {
        Func {
            addr,
            end: AtomicUsize::new(0),
            chance: AtomicU8::new(0),
            taken: AtomicU32::new(0),
            budget: AtomicU32::new(u32::MAX),
            outstanding: AtomicI32::new(0),
            exit_gen: AtomicU32::new(0),
            timed: Box::new(Timed {
                exit_log: ExitLog::new(),
                spread: Spread::default(),
            }),
            unmatched: AtomicU32::new(0),
            exit_probe: AtomicU32::new(0),
            exit_slot: AtomicU32::new(0),
            closed: AtomicBool::new(false),
            exits_follow_entry: AtomicBool::new(false),
            body: (AtomicUsize::new(0), AtomicUsize::new(0)),
            window: Window::new(),
            name: name.into(),
            probes: FuncProbes::default(),
        }
    }

    /// Sets the chance of timing a call to `2^-chance`, for a stretch (a
    /// window, or an epoch of a function counted whole) that should time
    /// about `budget` calls.
    pub(crate) fn set_chance(&self, chance: u8, budget: u32) {
        self.taken.store(0, Ordering::Relaxed);
        self.budget.store(budget.max(1), Ordering::Relaxed);
        self.chance.store(chance, Ordering::Relaxed);
    }

    /// Notes a call timed at shift `j`: once the stretch's budget is
    /// spent, the chance halves. The chance was set from the calls the
    /// stretch was expected to hold, and a function that turned busy since
    /// would otherwise time hundreds of calls a window. Each timed call
    /// keeps the weight of the chance it was drawn with, which was fixed
    /// before its call began, so the weighted sums stay unbiased
    /// ([`super::choose`]).
    #[inline]
    pub(crate) fn took(&self, j: u8) {
        let n = self.taken.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= self.budget.load(Ordering::Relaxed) && j < super::choose::MAX_SHIFT {
            self.taken.store(0, Ordering::Relaxed);
            // Only from `j`: threads that spent the budget together halve
            // it once.
            let _ = self
                .chance
                .compare_exchange(j, j + 1, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    /// Counts an exit that matched no sampled call; true once the window's
    /// budget of them is spent.
    pub(crate) fn unmatched_over_budget(&self) -> bool {
        self.unmatched.fetch_add(1, Ordering::Relaxed) >= EXIT_BUDGET
    }

    /// Forgets the timing chance and the counts (a forked child profiles
    /// its own calls).
    pub(crate) fn reset(&self) {
        self.set_chance(0, u32::MAX);
        self.outstanding.store(0, Ordering::Relaxed);
        self.unmatched.store(0, Ordering::Relaxed);
        self.closed.store(false, Ordering::Relaxed);
        self.timed.exit_log.reset();
        self.timed.spread.reset();
        self.window.reset();
        // A window open when the parent forked left them armed.
        self.disarm_counters();
    }

    /// Calls `each` with the counter of every entry probe of it whose
    /// stub counts (`crate::sled::counter`).
    fn for_each_counter(&self, mut each: impl FnMut(&'static Counter)) {
        self.probes.for_each(|id, is_entry| {
            if let Some(c) = is_entry.then(|| crate::sled::counter_of(id)).flatten() {
                each(c);
            }
        });
    }

    /// Arms its entry stubs' counters for a window that times a call with
    /// chance `2^-chance`, its first drawn from the seed `draw` (for a
    /// count alone, timing none, with `None`); notes
    /// where their count starts ([`Func::counted_since_open`]). For one
    /// thread at a time: the schedule's lock holder, before the probes go
    /// on, or the handler that won [`Window::start_whole_counting`].
    pub(crate) fn arm_counters(&self, chance: Option<u8>, draw: u64) {
        let mut from = 0;
        let mut state = super::choose::seed(draw);
        self.for_each_counter(|c| {
            from += match chance {
                Some(j) => c.arm(j, || super::choose::gap(j, super::choose::draw(&mut state))),
                // No call is ever sent on: none is drawn, and a call sent
                // on would find no window to claim it in, so `next` would
                // stay behind and every later call would run the full hook
                // and be counted twice.
                None => c.arm(0, || NEVER),
            }
        });
        self.window.counted_from.store(from, Ordering::Relaxed);
    }

    /// Whether every entry probe of it counts in its stub.
    pub(crate) fn counts_in_stubs(&self) -> bool {
        let (mut entries, mut counting) = (0, 0);
        self.probes.for_each(|id, is_entry| {
            entries += u32::from(is_entry);
            counting += u32::from(is_entry && crate::sled::counter_of(id).is_some());
        });
        entries > 0 && entries == counting
    }

    /// Notes what its entry stubs' counters read now: where
    /// [`Func::counted_since_open`] counts from.
    pub(crate) fn mark_counters(&self) {
        let mut from = 0;
        self.for_each_counter(|c| from += c.calls());
        self.window.counted_from.store(from, Ordering::Relaxed);
    }

    /// Disarms its entry stubs' counters: every call runs the full hook.
    pub(crate) fn disarm_counters(&self) {
        self.for_each_counter(|c| c.disarm());
    }

    /// The calls its entry stubs have counted since [`Func::arm_counters`].
    pub(crate) fn counted_since_open(&self) -> u64 {
        let mut now = 0;
        self.for_each_counter(|c| now += c.calls());
        now.saturating_sub(self.window.counted_from.load(Ordering::Relaxed))
    }

    /// Notes exit probe `id`, found by its hook call at site-table slot
    /// `slot` (with [`TAIL_HINT`] for a tail jump), for
    /// [`prefetch_exit`](Self::prefetch_exit). The first exit probe the
    /// function has keeps it: most have one.
    pub(crate) fn hint_exit(&self, id: ProbeId, slot: u32) {
        if self.exit_slot.load(Ordering::Relaxed) == 0 {
            self.exit_probe.store(id.get(), Ordering::Relaxed);
            self.exit_slot.store(slot | EXIT_HINT, Ordering::Release);
        }
    }

    /// Starts loading what the exit of a sampled call just entered, from
    /// `caller` (its return address), will read first: its hook's
    /// site-table slot (and, for a tail jump, the slot of `caller`, which it
    /// looks at first) and the exit probe's record.
    ///
    /// Most sampled calls return within a few microseconds, before the
    /// program evicts those lines again; left to the exit hook, they were a
    /// miss after a miss before its handler could start (the probe's id,
    /// then its record).
    #[inline(always)]
    pub(crate) fn prefetch_exit(&self, caller: u64) {
        let slot = self.exit_slot.load(Ordering::Acquire);
        if slot == 0 {
            return;
        }
        crate::registry::prefetch_hot(ProbeId::new(self.exit_probe.load(Ordering::Relaxed)));
        crate::sitetable::prefetch_slot(slot & !(EXIT_HINT | TAIL_HINT));
        if slot & TAIL_HINT != 0 {
            crate::sitetable::prefetch_slot(crate::sitetable::slot_of(crate::sitetable::key::ret(caller)));
        }
    }

    /// Whether a hook site at `site` belongs to a copy of this function
    /// inlined elsewhere (it lies outside the function); `None` while the
    /// function's extent is not yet known.
    pub(crate) fn is_inlined_site(&self, site: usize) -> Option<bool> {
        match self.end.load(Ordering::Relaxed) {
            0 => None,
            end => Some(site < self.addr || site >= end),
        }
    }

    /// Whether `ret` (a return address) lies inside this function.
    pub(crate) fn contains(&self, ret: usize) -> bool {
        let end = self.end.load(Ordering::Relaxed);
        if end != 0 && ret > self.addr && ret <= end {
            return true;
        }
        let (b, e) = (self.body.0.load(Ordering::Relaxed), self.body.1.load(Ordering::Relaxed));
        e != 0 && ret > b && ret <= e
    }
}

/// A function's probes, (id, is entry). The first two (one copy's entry
/// and exit, all that most functions have) are kept inline, beside the
/// function's hot line, for the daemon that re-arms them every epoch;
/// more go to a list of [`Chunk`]s. Pushes are serialised by the discovery
/// lock; readers take no lock at all.
///
/// The list used to sit behind a spin lock and was copied out 32 ids at a
/// time, three times per function per epoch (a prefetch pass and the two
/// switch passes of [`rearm`](super::rearm)), each time taking the lock
/// with a locked update. Published by its length, it is read in place, its
/// lines can be prefetched with the rest of an epoch
/// ([`prefetch_epoch`](super::prefetch_epoch)), and a fork has no lock of
/// it to take.
#[derive(Default)]
pub(crate) struct FuncProbes {
    /// Probes published: a reader sees every id below it (Release/Acquire).
    len: AtomicU32,
    /// Probe id, with [`ENTRY_BIT`] for an entry probe.
    inline: [AtomicU32; 2],
    /// The probes past the inline two.
    more: AtomicPtr<Chunk>,
}

/// Ids per [`Chunk`]: one cache line with the link.
const CHUNK_IDS: usize = 14;

/// A line of a function's probe list; never freed (a function's record
/// lives as long as the process).
#[repr(C, align(64))]
#[derive(Default)]
struct Chunk {
    ids: [AtomicU32; CHUNK_IDS],
    next: AtomicPtr<Chunk>,
}

/// Probe ids are below [`crate::registry::MAX_PROBES`] (2^24), so the top
/// bit is free.
const ENTRY_BIT: u32 = 1 << 31;
const _: () = assert!(crate::registry::MAX_PROBES <= ENTRY_BIT as usize);

impl FuncProbes {
    /// Adds probe `id` (discovery only: pushes are serialised).
    pub(crate) fn push(&self, id: ProbeId, entry: bool) {
        let word = id.get() | if entry { ENTRY_BIT } else { 0 };
        let n = self.len.load(Ordering::Relaxed) as usize;
        if let Some(slot) = self.inline.get(n) {
            slot.store(word, Ordering::Relaxed);
        } else {
            let k = n - self.inline.len();
            let mut link = &self.more;
            for _ in 0..k / CHUNK_IDS {
                // SAFETY: links below `len` were published (and are never
                // freed) by earlier pushes, which this thread serialises.
                link = unsafe { &(*link.load(Ordering::Relaxed)).next };
            }
            if k.is_multiple_of(CHUNK_IDS) {
                link.store(Box::into_raw(Box::default()), Ordering::Relaxed);
            }
            // SAFETY: as above; the chunk for slot `k` exists now.
            let chunk = unsafe { &*link.load(Ordering::Relaxed) };
            chunk.ids[k % CHUNK_IDS].store(word, Ordering::Relaxed);
        }
        self.len.store(n as u32 + 1, Ordering::Release);
    }

    /// Calls `f` with each probe (id, is entry), in the order pushed.
    /// Allocates nothing and takes no lock: the sampler may run on a
    /// thread the C library does not know ([`crate::rawthread`]).
    #[inline]
    pub(crate) fn for_each(&self, mut f: impl FnMut(ProbeId, bool)) {
        let n = self.len.load(Ordering::Acquire) as usize;
        let mut each = |word: u32| f(ProbeId::new(word & !ENTRY_BIT), word & ENTRY_BIT != 0);
        for slot in &self.inline[..n.min(self.inline.len())] {
            each(slot.load(Ordering::Relaxed));
        }
        let mut left = n.saturating_sub(self.inline.len());
        let mut chunk = self.more.load(Ordering::Acquire);
        while left > 0 && !chunk.is_null() {
            // SAFETY: a chunk published before `len` (read Acquire above)
            // is never freed or moved.
            let c = unsafe { &*chunk };
            for slot in &c.ids[..left.min(CHUNK_IDS)] {
                each(slot.load(Ordering::Relaxed));
            }
            left = left.saturating_sub(CHUNK_IDS);
            chunk = c.next.load(Ordering::Acquire);
        }
    }

    /// Starts loading the list's first line past the inline ids, if it
    /// has one (for the daemon's epoch prefetch).
    #[inline]
    pub(crate) fn prefetch_more(&self) {
        let chunk = self.more.load(Ordering::Acquire);
        if !chunk.is_null() {
            crate::prefetch::line(chunk);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_touches_one_cache_line_of_its_function() {
        let f = Func::new(0x1000, "");
        let base = &f as *const Func as usize;
        assert_eq!(base % 64, 0);
        for last in [
            std::ptr::addr_of!(f.closed) as usize,
            std::ptr::addr_of!(f.chance) as usize,
            std::ptr::addr_of!(f.exits_follow_entry) as usize,
        ] {
            assert!(last - base < 64);
        }
    }

    #[test]
    fn a_function_lists_every_probe_pushed() {
        let probes = FuncProbes::default();
        let want = [(7, true), (8, false), (1 << 23, true), (9, false), (0, false)];
        for (i, &(id, entry)) in want.iter().enumerate() {
            probes.push(ProbeId::new(id), entry);
            let mut out = Vec::new();
            probes.for_each(|id, entry| out.push((id.get(), entry)));
            assert_eq!(out, want[..=i]);
        }
    }

    #[test]
    fn a_function_with_many_probes_lists_them_all_in_order() {
        // Past the two inline ones, the list runs over several chunks.
        let probes = FuncProbes::default();
        let want: Vec<(u32, bool)> = (0..100).map(|i| (i * 3, i % 2 == 0)).collect();
        for &(id, entry) in &want {
            probes.push(ProbeId::new(id), entry);
        }
        let mut out = Vec::new();
        probes.for_each(|id, entry| out.push((id.get(), entry)));
        assert_eq!(out, want);
    }

    #[test]
    fn a_reader_sees_a_prefix_of_the_list_while_it_grows() {
        // One thread pushes (as discovery does, serialised), another reads
        // as the sampler does: every read is the first n probes pushed.
        let probes: &'static FuncProbes = Box::leak(Box::default());
        let want: Vec<(u32, bool)> = (0..2_000).map(|i| (i * 7 + 1, i % 3 == 0)).collect();
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                for &(id, entry) in &want {
                    probes.push(ProbeId::new(id), entry);
                }
                done.store(true, Ordering::Release);
            });
            let mut reads = 0;
            loop {
                let finished = done.load(Ordering::Acquire);
                let mut out = Vec::new();
                probes.for_each(|id, entry| out.push((id.get(), entry)));
                assert_eq!(out[..], want[..out.len()], "read {reads} is not a prefix");
                reads += 1;
                if finished {
                    assert_eq!(out.len(), want.len());
                    break;
                }
            }
        });
    }
}
