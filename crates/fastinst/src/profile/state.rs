//! The profiler's shared state: its functions, every thread's store, its
//! counters and clocks: what the handlers, the window schedule, the
//! sampler and the report read.

use super::due::Due;
use super::functions::Func;
use super::live::Live;
use super::settings::Settings;
use super::store::{Counters, ThreadStore};
use super::thread;
use super::window::StubCount;
use crate::probe::ProbeId;
use crate::registry;
use crate::segmented::Segmented;
use parking_lot::Mutex;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;
use wordpatch::tsc;

/// Segments of the function table (of `segmented::SEG` functions each).
pub(super) const FUNC_SEGMENTS: usize = 1024;

pub(crate) struct State {
    pub(crate) settings: Settings,
    /// The sampling settings as they stand (`settings` as changed while
    /// running).
    pub(crate) live: Live,
    /// The functions, by index: one table for the life of the process,
    /// which each profiler generation takes over and resets (an attach
    /// after a detach), so that a new generation allocates none of it.
    pub(crate) funcs: &'static Segmented<Func, FUNC_SEGMENTS>,
    /// Function index by entry address, kept with `funcs`.
    pub(crate) by_addr: &'static Mutex<thread::FxMap<usize, u32>>,
    /// The functions the sampler folds and re-arms at its next tick: those
    /// counted in the epoch, or whose window was closed.
    pub(crate) due: Due<FUNC_SEGMENTS>,
    /// Every thread's store, for readers that take no lock (the window
    /// schedule, the sampler).
    pub(crate) stores: Segmented<&'static ThreadStore, 256>,
    pub(crate) stores_lock: AtomicBool,
    /// When the current epoch began (TSC).
    pub(crate) epoch_start: AtomicU64,
    /// When the first thread's exposure began (TSC; 0: none yet): its
    /// first hook, after the runtime's start-up. Before it, an epoch's wall
    /// time holds no exposure at all.
    pub(crate) exposure_began: AtomicU64,
    /// TSC ticks per ns (f64 bits; see [`ticks_per_ns`]).
    pub(crate) tpn: AtomicU64,
    /// Moves whenever a live frame's call path may have changed; see
    /// [`Shadow::path_end`] and [`paths_may_change`].
    pub(crate) path_epoch: AtomicU32,
    pub(crate) threads: Mutex<Vec<Arc<ThreadStore>>>,
    pub(crate) counters: Counters,
    pub(crate) start: Mutex<(u64, Instant)>,
    pub(crate) stop: AtomicBool,
    /// The word the sampler sleeps on between its wake-ups
    /// ([`crate::rawthread::wait`]): moved by [`State::request_stop`], so
    /// that a sampler sleeping to its next window or the epoch's end
    /// leaves at once.
    pub(crate) nap: AtomicU32,
    pub(crate) dump: AtomicBool,
    /// Probes the raw sampler left off because switching them on takes a
    /// word patch (a sled with no `ret` trampoline in reach).
    pub(crate) rearm_skipped: AtomicU64,
    /// CPU time the sampler thread has used (ns), on-demand reports aside:
    /// its re-arming and its wake-ups, a cost the handlers' time does not
    /// show.
    pub(crate) sampler_ns: AtomicU64,
    /// The sampler thread has left its loop, for good (set once [`State::stop`]
    /// is seen): what a detach waits for.
    pub(crate) sampler_done: AtomicBool,
    pub(crate) out: PathBuf,
    pub(crate) program: String,
    /// Every thread's hook ticks when this profiler started: an earlier
    /// profiler's (an attach before a detach) are not this one's.
    pub(crate) hook_ticks_before: u64,
    /// The timed calls kept for the timeline.
    pub(crate) timeline: crate::timeline::Log,
}

impl State {
    /// Stops the sampler: it leaves its loop at its next look at
    /// [`State::stop`], woken from its sleep for it.
    pub(crate) fn request_stop(&self) {
        self.stop.store(true, Ordering::Release);
        crate::rawthread::wake_all(&self.nap);
    }

    /// Adds a thread's store to the lock-free list.
    pub(crate) fn add_store(&self, s: &'static ThreadStore) {
        crate::spin::acquire(&self.stores_lock);
        if self.stores.push(s).is_none() {
            crate::log::warn(format_args!("profile: thread table full; thread {} not counted", s.tid));
        }
        crate::spin::release(&self.stores_lock);
    }

    /// Every thread's store.
    pub(crate) fn stores(&self) -> impl Iterator<Item = &'static ThreadStore> + '_ {
        (0..self.stores.len()).filter_map(|i| self.stores.get(i).copied())
    }

    /// Function `fi`'s calls counted on every thread since its counters
    /// were last opened.
    pub(crate) fn counted(&self, fi: u32) -> u64 {
        self.stores().map(|t| t.calls.since_open(fi)).sum()
    }

    /// Opens function `fi`'s counters on every thread: counting starts
    /// again from here.
    pub(crate) fn open_counts(&self, fi: u32) {
        for t in self.stores() {
            t.calls.open(fi);
        }
    }

    /// [`Profiler::counted`], then [`Profiler::open_counts`].
    pub(crate) fn take_counted(&self, fi: u32) -> u64 {
        self.stores()
            .map(|t| {
                let n = t.calls.since_open(fi);
                t.calls.open(fi);
                n
            })
            .sum()
    }

    /// Counter `field` summed over the profiler's set and every thread's.
    pub(crate) fn total(&self, field: fn(&Counters) -> &AtomicU64) -> u64 {
        let threads = self.threads.lock();
        threads
            .iter()
            .map(|t| field(&t.counts).load(Ordering::Relaxed))
            .fold(field(&self.counters).load(Ordering::Relaxed), u64::wrapping_add)
    }
}

/// The function probe `id` is of, its index, and the probe's record.
pub(super) fn func_of(p: &'static State, id: ProbeId) -> Option<(&'static Func, u32, &'static registry::Probe)> {
    let probe = registry::get(id)?;
    let fi = probe.tool.load(Ordering::Relaxed).checked_sub(1)? as u32;
    Some((p.funcs.get(fi)?, fi, probe))
}

/// TSC ticks per nanosecond, measured since the profiler started (the
/// last figure while a report holds the start).
pub(super) fn ticks_per_ns(p: &State) -> f64 {
    if let Some(start) = p.start.try_lock() {
        let (t0, i0) = *start;
        let ns = i0.elapsed().as_nanos() as f64;
        if ns >= 1e6 {
            let r = tsc::now().saturating_sub(t0) as f64 / ns;
            p.tpn.store(r.to_bits(), Ordering::Relaxed);
        }
    }
    match f64::from_bits(p.tpn.load(Ordering::Relaxed)) {
        r if r > 0.0 => r,
        _ => 1.0,
    }
}

impl State {
    /// Stamps a switch of one of `f`'s exit probes (`off`: it went off;
    /// see [`Frame::exit_gen`](super::thread::Frame::exit_gen)) and logs
    /// when ([`Timed::exit_log`](super::functions::Timed::exit_log)); if a sampled
    /// call of `f` may be in flight, the paths through it may change too.
    ///
    /// Both steps are `SeqCst`, as is the entry's count-then-stamp: either
    /// the entry reads the new stamp (its frame is unaffected), or this
    /// reads its count and moves the path epoch. Most switches happen with
    /// nothing in flight and leave every thread's kept path nodes valid.
    pub(super) fn exit_watch_changed(&self, f: &Func, off: bool) {
        let stamp = f.exit_gen.fetch_add(1, Ordering::SeqCst).wrapping_add(1);
        f.timed.exit_log.note(stamp, off, wordpatch::tsc::now());
        if f.outstanding.load(Ordering::SeqCst) > 0 {
            self.paths_may_change();
        }
    }

    /// Switches exit probe `id` of `f` off and stamps the change (a
    /// sampled call entered before the stamp may now return unseen);
    /// whether it switched. Exit probes that follow their entry probe
    /// stay on.
    pub(super) fn exit_probe_off(&self, f: &Func, id: ProbeId) -> bool {
        if f.exits_follow_entry.load(Ordering::Relaxed) {
            return false;
        }
        let switched = crate::deactivate(id).is_ok();
        if switched {
            self.exit_watch_changed(f, true);
        }
        switched
    }

    /// Invalidates every path node kept in a shadow-stack frame.
    pub(super) fn paths_may_change(&self) {
        self.path_epoch.fetch_add(1, Ordering::SeqCst);
    }

    /// Switches `f`'s probes that are off on, exits first so that no timed
    /// entry misses its exit, with `entry` and `exit` as handlers, after
    /// setting the chance of timing a call to `2^-chance` for a stretch
    /// that should time about `budget` calls (a window, or an epoch of a
    /// function counted whole). On the raw sampler (`raw`) a probe whose
    /// switch would take a word patch is left off. Returns the probes
    /// switched on and whether any was left off.
    pub(super) fn arm(
        &self,
        f: &Func,
        chance: u8,
        budget: u32,
        raw: bool,
        entry: crate::Handler,
        exit: crate::Handler,
    ) -> (u64, bool) {
        f.set_chance(chance, budget);
        f.unmatched.store(0, Ordering::Relaxed);
        let (mut toggles, mut skipped) = (0, false);
        for entries in [false, true] {
            if entries {
                // Pairs with the fence in `handlers::reopened`.
                f.closed.store(false, Ordering::SeqCst);
            }
            f.probes.for_each(|id, is_entry| {
                if is_entry != entries {
                    return;
                }
                let Some(probe) = registry::get(id) else { return };
                if matches!(crate::is_active(id), Ok(true)) {
                    return;
                }
                if raw && crate::toggle::activation_needs_word_patch(probe) {
                    skipped = true;
                    return;
                }
                if crate::activate(id, if is_entry { entry } else { exit }).is_ok() {
                    if !is_entry {
                        // Calls entered while it was off would otherwise
                        // look watched from here on.
                        self.exit_watch_changed(f, false);
                    }
                    toggles += 1;
                }
            });
        }
        (toggles, skipped)
    }
}

/// What [`State::fold_whole`] folded.
pub(crate) struct Folded {
    /// Calls counted since the last fold.
    pub n: u64,
    /// The TSC at which its count overflowed and its probe went off (0:
    /// it did not, or its stubs took over the count).
    pub overflow: u64,
    /// A handler is handing its count over to its stubs right now: it
    /// must stay whole, and its stubs' count waits for the next fold.
    pub handing_over: bool,
}

impl State {
    /// Adds the calls of whole function `f` (index `fi`) counted since its
    /// last fold to its estimate (its stubs' too, where they took over its
    /// count). The schedule's lock is held.
    pub(crate) fn fold_whole(&self, f: &Func, fi: u32) -> Folded {
        let mut n = self.take_counted(fi);
        let stubs = f.window.take_stub_count();
        if stubs == StubCount::Counting {
            // Its stubs counted the rest: nothing was missed.
            f.disarm_counters();
            n += f.counted_since_open();
        }
        // SAFETY: the caller holds the schedule's lock.
        unsafe { f.window.estimate_mut() }.counted += n as f64;
        Folded {
            n,
            overflow: f.window.overflow_at.swap(0, Ordering::AcqRel),
            handing_over: stubs == StubCount::Arming,
        }
    }

    /// Where in the running epoch (begun at TSC `t0`, now `now`) exposure
    /// can have grown from: not before the first thread's began.
    pub(crate) fn exposed_from(&self, t0: u64) -> u64 {
        t0.max(self.exposure_began.load(Ordering::Relaxed))
    }
}
