//! The latency profiler (`FASTINST_TOOL=profile`, the default tool): the
//! paper's §9 case study, made to tell the truth on real programs.
//!
//! Time is cut into epochs (`FASTINST_PROFILE_EPOCH_MS`, default 10, each
//! drawn from half to one and a half times it), alternately *timing* and
//! *counting*:
//! - In a timing epoch every function's probes are on until it has timed
//!   its first K calls (`FASTINST_PROFILE_SAMPLES`, default 10): entry and
//!   exit paired, each duration in the program's own time (the hooks'
//!   time taken off, `crate::clock`), with its caller and call path. Then
//!   its entry probe switches itself off from inside its handler.
//! - In a counting epoch, calls are counted in windows (`schedule`):
//!   stretches of time the sampler thread places at random, in which a
//!   function's entry probe is on and every call counted; the windows'
//!   counts over their exposure, the program's own CPU time
//!   (`exposure`), estimate every call (`window`). A function with
//!   few calls is counted whole, every call of every epoch, and timed in
//!   every epoch too.
//!
//! Self time comes from CPU samples of each thread (`cpusample`),
//! inclusive time from the timed calls, each outermost activation once;
//! calls still in flight when their thread or the process ends are timed
//! to that end. The report ([`report`]) gives each call estimate with its
//! standard deviation, and marks what it could not measure well.
//!
//! Copies of a function that gcc's `-finstrument-functions` left inlined in
//! other functions (hooks in another function's code, not in the function's
//! clones or `.cold` parts: [`ProbeMeta::inlined`]) are switched off at
//! discovery and never sampled unless `FASTINST_INLINED=1`; see
//! [`Settings::inlined`] for why. The sampler thread is made with
//! `clone(2)`, unknown to glibc, which therefore keeps its single-threaded
//! `malloc` in a single-threaded program (`rawthread.rs`, [`Sampler`]); so
//! its epoch allocates nothing and never parks. Pairing, call paths and
//! their limits are in `thread`.

mod counts;
mod cpusample;
mod exhausted;
mod exposure;
mod functions;
pub(crate) mod hist;
mod local;
mod paths;
pub mod report;
mod schedule;
mod table;
mod thread;
mod window;

use crate::probe::{ProbeId, ProbeKind, ProbeMeta};
use crate::registry;
use crate::segmented::Segmented;
use crate::sitetable::{self, key};
use crate::Strategy;
use exhausted::Exhausted;
use functions::Func;
use functions::Sample;
use local::with_local;
use parking_lot::Mutex;
pub use paths::MAX_PATH_NODES;
use schedule::Schedule;
use std::cell::UnsafeCell;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use thread::{Agg, Frame, Shadow, MAX_DEPTH, NO_NODE};
use window::Kind;
use wordpatch::tsc;

/// Profiler settings, from the environment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Samples per function per window (K >= 2).
    pub samples: u32,
    /// Epoch between re-activations.
    pub epoch: Duration,
    /// Signal that writes the reports on demand (0: none).
    pub signal: i32,
    /// What kind of thread the sampler is.
    pub sampler: Sampler,
    /// Whether to sample the copies of a function inlined into other
    /// functions (`FASTINST_INLINED=1`, formerly `FASTINST_PROFILE_INLINED`),
    /// not only its own code.
    ///
    /// Off by default. gcc's `-finstrument-functions` keeps the hooks of
    /// every inlined copy (clang's after-inlining form and sled builds have
    /// none), and sampling them cost more than it showed on Table 3's gcc
    /// builds (measured in `crates/benches/results/history.md`):
    /// - they are mostly helpers a few instructions long, whose sampled
    ///   durations are mostly the hooks' own time;
    /// - they about doubled the samples per second and the handlers' and
    ///   sampler's share of the CPU;
    /// - their call paths filled the per-thread path table, so much of the
    ///   flame graph was cut to `[...];function`.
    ///
    /// Left off, an inlined copy's time is its caller's self time, as in
    /// clang and sled builds of the same program, so the reports of the
    /// three builds name the same functions.
    pub inlined: bool,
    /// Whether to take CPU samples for self time
    /// (`FASTINST_PROFILE_CPU`, default 1; see `cpusample`).
    pub cpu_samples: bool,
    /// Counting windows per windowed function per counting epoch
    /// (`FASTINST_PROFILE_WINDOWS`, default 2; see `schedule`): more
    /// windows, a tighter call estimate and more counting.
    pub windows: usize,
}

impl Settings {
    /// The epoch's length over the default's, at least 1: the calls per
    /// epoch that make a function windowed scale with it, so that what
    /// decides is a rate, the cost of counting it whole.
    pub fn epoch_scale(&self) -> f64 {
        (self.epoch.as_secs_f64() / 0.010).max(1.0)
    }
}

/// The sampler thread's kind (`FASTINST_PROFILE_SAMPLER`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sampler {
    /// `clone`, the default: a thread the C library does not know
    /// (`rawthread.rs`), so a single-threaded program keeps glibc's
    /// single-threaded `malloc`. Used unless an on-demand report signal is
    /// set (the sampler writes that report, which allocates) or the
    /// strategy is a word strategy (whose waits may enter libc).
    Clone,
    /// `pthread`: a regular thread, as a debugger expects one.
    Pthread,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            samples: 10,
            epoch: Duration::from_millis(10),
            signal: 0,
            sampler: Sampler::Clone,
            inlined: false,
            windows: 2,
            cpu_samples: true,
        }
    }
}

impl Settings {
    /// Reads `FASTINST_PROFILE_SAMPLES`, `FASTINST_PROFILE_EPOCH_MS`,
    /// `FASTINST_PROFILE_SIGNAL` (`USR1`, `USR2` or a number) and
    /// `FASTINST_PROFILE_SAMPLER` (`clone`, `pthread`) and
    /// `FASTINST_PROFILE_WINDOWS` (1 to 64) and `FASTINST_PROFILE_CPU`
    /// (`0`, `1`), and `FASTINST_INLINED` as every tool does
    /// ([`crate::tools::inlined_from_env`]); an invalid value is reported
    /// and the default kept.
    pub fn from_env() -> Settings {
        let mut s = Settings::default();
        if let Ok(v) = std::env::var("FASTINST_PROFILE_SAMPLES") {
            match v.trim().parse::<u32>() {
                Ok(n) if n >= 2 => s.samples = n,
                _ => crate::log::error(format_args!(
                    "FASTINST_PROFILE_SAMPLES: `{v}` is not a number >= 2; using 10"
                )),
            }
        }
        if let Ok(v) = std::env::var("FASTINST_PROFILE_EPOCH_MS") {
            match v.trim().parse::<f64>() {
                Ok(ms) if ms > 0.0 && ms <= 60_000.0 => s.epoch = Duration::from_secs_f64(ms / 1000.0),
                _ => crate::log::error(format_args!(
                    "FASTINST_PROFILE_EPOCH_MS: `{v}` is not a number of ms in (0, 60000]; using 10"
                )),
            }
        }
        if let Ok(v) = std::env::var("FASTINST_PROFILE_SAMPLER") {
            match v.trim() {
                "clone" => s.sampler = Sampler::Clone,
                "pthread" => s.sampler = Sampler::Pthread,
                _ => crate::log::error(format_args!(
                    "FASTINST_PROFILE_SAMPLER: `{v}` is not clone or pthread; using clone"
                )),
            }
        }
        if let Ok(v) = std::env::var("FASTINST_PROFILE_WINDOWS") {
            match v.trim().parse::<usize>() {
                Ok(n) if (1..=64).contains(&n) => s.windows = n,
                _ => crate::log::error(format_args!(
                    "FASTINST_PROFILE_WINDOWS: `{v}` is not a number in [1, 64]; using 2"
                )),
            }
        }
        if let Ok(v) = std::env::var("FASTINST_PROFILE_CPU") {
            match v.trim() {
                "0" => s.cpu_samples = false,
                "1" => s.cpu_samples = true,
                _ => crate::log::error(format_args!("FASTINST_PROFILE_CPU: `{v}` is not 0 or 1; using 1")),
            }
        }
        // The setting every tool shares (its older name included).
        s.inlined = crate::tools::inlined_from_env();
        if let Ok(v) = std::env::var("FASTINST_PROFILE_SIGNAL") {
            match v.trim().trim_start_matches("SIG") {
                "" | "none" => {}
                "USR1" => s.signal = libc::SIGUSR1,
                "USR2" => s.signal = libc::SIGUSR2,
                n => match n.parse::<i32>() {
                    Ok(n) if n > 0 && n < 65 => s.signal = n,
                    _ => crate::log::error(format_args!(
                        "FASTINST_PROFILE_SIGNAL: `{v}` is not USR1, USR2 or a signal number; no signal"
                    )),
                },
            }
        }
        s
    }
}

/// Counters of what the profiler did and dropped.
///
/// The profiler keeps one set, for the sampler thread and rare events,
/// and each thread one of its own for what its handlers count on every
/// sample ([`Counters::add_own`]); the report sums them.
#[derive(Default)]
pub(crate) struct Counters {
    pub samples: AtomicU64,
    pub toggles: AtomicU64,
    pub unmatched_exits: AtomicU64,
    pub abandoned: AtomicU64,
    pub too_deep: AtomicU64,
    pub no_cfa: AtomicU64,
    pub no_thread: AtomicU64,
    pub inlined_off: AtomicU64,
    pub open_at_exit: AtomicU64,
    pub windows_planned: AtomicU64,
    pub windows_opened: AtomicU64,
    pub windows_void: AtomicU64,
}

impl Counters {
    /// Adds `v` to counter `c` of the calling thread's own set: a plain
    /// load and store, where a shared counter took a locked add (and, with
    /// threads, its cache line moving between them) four times a sample.
    #[inline(always)]
    pub(crate) fn add_own(c: &AtomicU64, v: u64) {
        c.store(c.load(Ordering::Relaxed).wrapping_add(v), Ordering::Relaxed);
    }

    fn all(&self) -> [&AtomicU64; 12] {
        [
            &self.windows_void,
            &self.windows_planned,
            &self.windows_opened,
            &self.open_at_exit,
            &self.samples,
            &self.toggles,
            &self.unmatched_exits,
            &self.abandoned,
            &self.too_deep,
            &self.no_cfa,
            &self.no_thread,
            &self.inlined_off,
        ]
    }

    /// Sets every counter to 0.
    pub(crate) fn reset(&self) {
        for c in self.all() {
            c.store(0, Ordering::Relaxed);
        }
    }
}

/// A thread's store: its shadow stack (owner only) and aggregates.
pub(crate) struct ThreadStore {
    pub tid: i32,
    shadow: UnsafeCell<Shadow>,
    pub agg: Mutex<Agg>,
    pub exited: AtomicBool,
    /// What this thread's handlers counted; only this thread writes them
    /// ([`Counters::add_own`]).
    pub counts: Counters,
    /// Its call counters ([`counts`]).
    pub calls: counts::Counts,
    /// When it exited (TSC; 0 while it runs).
    pub died: AtomicU64,
    /// Where the exposure clock last counted it to: CPU time (ns), wall
    /// TSC and hook ticks; and its CPU clock's last reading and when
    /// ([`exposure`]; the schedule's lock holder only).
    pub x_cpu: AtomicU64,
    pub x_wall: AtomicU64,
    pub x_hooks: AtomicU64,
    pub x_cpu_read: AtomicU64,
    pub x_cpu_at: AtomicU64,
    /// Its CPU time when it exited (ns; 0 while it runs).
    pub cpu_final: AtomicU64,
    /// Its program clock ([`crate::clock::ThreadClock`], as an address; 0
    /// until its first clocked hook).
    pub clock: std::sync::atomic::AtomicUsize,
}

impl ThreadStore {
    /// Notes this thread's program clock (on the owning thread, in a hook).
    #[cold]
    fn link_clock(&self) {
        if let Some(c) = crate::clock::current() {
            self.clock
                .store(c as *const crate::clock::ThreadClock as usize, Ordering::Release);
        }
    }

    /// The thread's hook time at wall time `now` (0 before it has a clock).
    pub(crate) fn hooks_at(&self, now: u64) -> u64 {
        match self.clock.load(Ordering::Acquire) {
            0 => 0,
            // SAFETY: a thread clock is never freed.
            c => unsafe { &*(c as *const crate::clock::ThreadClock) }.hook_ticks_at(now),
        }
    }
}

// SAFETY: `shadow` is only touched by the owning thread (through its
// thread-local handle, or by its destructor on that thread); everything
// else is atomics or behind the mutex.
unsafe impl Sync for ThreadStore {}
// SAFETY: as above.
unsafe impl Send for ThreadStore {}

/// Segments of the function table (of `segmented::SEG` functions each).
const FUNC_SEGMENTS: usize = 1024;

pub(crate) struct Profiler {
    pub settings: Settings,
    pub funcs: Segmented<Func, FUNC_SEGMENTS>,
    by_addr: Mutex<thread::FxMap<usize, u32>>,
    /// The functions the sampler folds and re-arms at its next tick: those
    /// counted in the epoch, or whose window was closed.
    due: Exhausted<FUNC_SEGMENTS>,
    /// The epoch's counting windows in time.
    schedule: Schedule,
    /// Every thread's store, for readers that take no lock (the window
    /// schedule, the sampler).
    stores: Segmented<&'static ThreadStore, 256>,
    stores_lock: AtomicBool,
    /// When the current epoch began (TSC).
    epoch_start: AtomicU64,
    /// TSC ticks per ns (f64 bits; see [`ticks_per_ns`]).
    tpn: AtomicU64,
    /// Moves whenever a live frame's call path may have changed; see
    /// [`Shadow::path_end`] and [`paths_may_change`].
    path_epoch: AtomicU32,
    pub threads: Mutex<Vec<Arc<ThreadStore>>>,
    pub counters: Counters,
    pub start: Mutex<(u64, Instant)>,
    stop: AtomicBool,
    dump: AtomicBool,
    /// Probes the raw sampler left off because switching them on takes a
    /// word patch (a sled with no `ret` trampoline in reach).
    rearm_skipped: AtomicU64,
    /// CPU time the sampler thread has used (ns), on-demand reports aside:
    /// its re-arming and its wake-ups, a cost the handlers' time does not
    /// show.
    sampler_ns: AtomicU64,
    /// [`window::WHOLE_OVERFLOW`] for this epoch length (see
    /// [`Settings::epoch_scale`]), kept for the counting handler.
    whole_overflow: u64,
    pub out: PathBuf,
    pub program: String,
}

impl Profiler {
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
    fn take_counted(&self, fi: u32) -> u64 {
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

static PROFILER: OnceLock<Profiler> = OnceLock::new();

pub(crate) fn get() -> Option<&'static Profiler> {
    PROFILER.get()
}

fn func_of(p: &'static Profiler, id: ProbeId) -> Option<(&'static Func, u32)> {
    let fi = registry::get(id)?.tool.load(Ordering::Relaxed).checked_sub(1)? as u32;
    Some((p.funcs.get(fi)?, fi))
}

/// Where an activation of `f` entered through probe `id` was called from:
/// the return address, unless the probe is a copy of `f` inlined into
/// another function ([`ProbeMeta::inlined`]), whose hooks pass *that*
/// function's return address; then the hook site itself, which lies in
/// the function it was inlined into (so `spin_us -> now_ns`, not `after ->
/// now_ns`). A clone of `f` (`f.constprop.0`) also lies outside `f`'s
/// extent but is called as `f` is: its return address names the caller
/// (`check -> scale`, not `scale.constprop.0 -> scale`, a call that never
/// happened). 0 while `f`'s extent is unknown (`Frame::from`).
#[inline]
fn called_from(f: &Func, id: ProbeId, ret: u64) -> u64 {
    let Some(probe) = registry::get(id) else { return 0 };
    match f.is_inlined_site(probe.meta.site) {
        None => 0,
        Some(true) if probe.meta.inlined => probe.meta.site as u64,
        Some(_) => ret,
    }
}

/// Pops the frames that cannot be live below an activation whose CFA is
/// `cfa` and whose return address is `caller`: a live caller's CFA is
/// higher, and the one activation at a given CFA has one return address
/// (an inlined function's hooks share both with the function they are
/// inlined into). What is popped was left by `longjmp`, an exception, or an
/// exit that was not seen; it is dropped and counted.
///
/// Sled probes (`exact`: the provider gives the CFA) add one more live
/// case: a function entered by a tail jump from a frame whose exit is
/// watched shares that frame's CFA, and the provider names its caller by
/// the tail-calling function's sled end ([`crate::sled`]'s chained caller).
/// Both frames are live until the callee returns, then both exit in turn.
///
/// A frame at the same CFA is dead too when its call may have returned
/// unseen ([`Frame::watched`]), and, on entering `entering`, when it is an
/// activation of that same function with the same return address: the one
/// frame there cannot hold two of them (gcc inlining a function into
/// itself aside, where dropping the outer one loses a sample but invents
/// nothing). Both keep a later exit from pairing with a call that is over.
fn pop_dead(p: &Profiler, sh: &mut Shadow, cfa: u64, caller: u64, exact: bool, entering: Option<u32>) {
    let tail_called_from = |f: &Frame| {
        exact && registry::get(f.entry).is_some_and(|e| (e.meta.site + providers::patchable::SLED_LEN) as u64 == caller)
    };
    while let Some(top) = sh.frames.last() {
        let live_here = top.cfa == cfa
            && (top.caller == caller || tail_called_from(top))
            && p.funcs.get(top.func).is_some_and(|f| top.watched(f))
            && !(entering == Some(top.func) && top.caller == caller);
        if top.cfa > cfa || live_here {
            break;
        }
        if let Some(g) = p.funcs.get(top.func) {
            g.outstanding.fetch_sub(1, Ordering::Relaxed);
        }
        p.counters.abandoned.fetch_add(1, Ordering::Relaxed);
        sh.frames.pop();
    }
}

/// Switches exit probe `id` of `f` off, then stamps the change: a sampled
/// call entered before the stamp may now return unseen. Whether it
/// switched (a toggle for the caller to count). Exit probes that follow
/// their entry probe stay on.
fn exit_off(p: &Profiler, f: &Func, id: ProbeId) -> bool {
    if f.exits_follow_entry.load(Ordering::Relaxed) {
        return false;
    }
    let switched = crate::deactivate(id).is_ok();
    if switched {
        exit_watch_changed(p, f);
        if reopened(f) && crate::activate(id, on_exit).is_ok() {
            exit_watch_changed(p, f);
        }
    }
    switched
}

/// Whether `f`'s window has been reopened since a handler, which has
/// just switched one of `f`'s probes off, read it as exhausted; the probe
/// must then go back on at once.
///
/// A handler decides to switch its probe off from what it read of the
/// window (the quota filled), and the sampler may close that window and
/// switch the function's probes on between the read and the switch. The
/// probe would then stay off through the new window, and an entry probe
/// that is the function's only one for good: its calls no longer counted,
/// its quota never fills again to have it re-armed. Threads that enter a
/// function together make it common (another thread's call counted past
/// the quota switches the same probe off again): before this check, with
/// 50 us epochs, 6 to 8 of `tests/c/rearm.c`'s 8 functions were lost in
/// every run, and 1 to 3 functions of one-threaded QuickJS and SQLite;
/// none since. At the default 10 ms epochs it is rarer, not impossible.
///
/// The sampler reopens the window, fences, then reads the entry probes'
/// state; the handler switches, fences, then reads `exhausted`: with both
/// fences `SeqCst`, the sampler finds an entry probe off or the handler
/// finds the window reopened (if both, the second switch-on is a no-op).
/// Exit probes are switched on before the window reopens (so that no
/// sampled entry misses its exit), so for them the check narrows the gap
/// without closing it: an exit switched off in it stays off for one
/// window, until the function's next re-arm finds it off. That costs the
/// window's samples of the function (dropped as left without exit, never
/// misattributed), never the function.
fn reopened(f: &Func) -> bool {
    std::sync::atomic::fence(Ordering::SeqCst);
    !f.exhausted.load(Ordering::Relaxed)
}

/// Stamps a switch of one of `f`'s exit probes (see [`Frame::exit_gen`]);
/// if a sampled call of `f` may be in flight, the paths through it may
/// change too.
///
/// Both steps are `SeqCst`, as is the entry's count-then-stamp: either the
/// entry reads the new stamp (its frame is unaffected), or this reads its
/// count and moves the path epoch. Most switches happen with nothing in
/// flight and leave every thread's kept path nodes valid.
fn exit_watch_changed(p: &Profiler, f: &Func) {
    f.exit_gen.fetch_add(1, Ordering::SeqCst);
    if f.outstanding.load(Ordering::SeqCst) > 0 {
        paths_may_change(p);
    }
}

/// Invalidates every path node kept in a shadow-stack frame.
fn paths_may_change(p: &Profiler) {
    p.path_epoch.fetch_add(1, Ordering::SeqCst);
}

extern "C" fn on_entry(id: ProbeId) {
    let Some(p) = get() else { return };
    let Some((f, fi)) = func_of(p, id) else { return };
    let (epoch, _) = crate::clock::period();
    match f.window.kind() {
        // A function counted whole is also timed in every epoch: its few
        // calls cost the counting windows nothing that matters, and a
        // function called a few times a run is sampled every time.
        Kind::Whole => count_whole(p, f, fi, epoch, id),
        Kind::Windowed if counting_epoch(epoch) => {
            // Counting: a light handler, no exit watched.
            crate::hooks::decline_exit();
            if f.window.is_open() {
                count_call(fi);
            }
            // Between its windows the sampler keeps it off.
            return;
        }
        Kind::Windowed => {}
    }
    // Timing epochs run with the hooks timing themselves: this thread's
    // clock exists (the hook made it), unless the epoch began while this
    // hook was starting (then it is timed from the next call).
    let ctx = crate::hooks::context();
    let now = ctx.started;
    let Some(clock) = crate::clock::current() else { return };
    if now == 0 {
        return;
    }
    let mut toggled = 0;
    let gen = f.window.gen.load(Ordering::SeqCst);
    let Sample::Take { n, last } = f.take_sample(epoch, p.settings.samples) else {
        crate::hooks::decline_exit();
        if f.window.kind() == Kind::Windowed {
            switch_off(p, f, fi, id, gen);
        }
        return;
    };
    if n == 1 {
        // A new epoch's first timed call: its exits must be watched (a
        // function the sampler did not re-arm may have them off).
        f.exhausted.store(false, Ordering::SeqCst);
        toggled += exits_on(p, f);
    }
    if last {
        f.exhausted.store(true, Ordering::Release);
        if f.window.kind() == Kind::Windowed {
            switch_off(p, f, fi, id, gen);
        }
    }
    let Some(cfa) = crate::hooks::cfa(ctx) else {
        p.counters.no_cfa.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let h0 = clock.hook_ticks();
    let pushed = with_local(|store, sh| {
        if toggled > 0 {
            Counters::add_own(&store.counts.toggles, toggled);
        }
        pop_dead(p, sh, cfa, ctx.call_site as u64, ctx.cfa != 0, Some(fi));
        if sh.frames.len() >= MAX_DEPTH {
            p.counters.too_deep.fetch_add(1, Ordering::Relaxed);
            return;
        }
        // SeqCst: see `exit_watch_changed`.
        f.outstanding.fetch_add(1, Ordering::SeqCst);
        sh.frames.push(Frame {
            exit_gen: f.exit_gen.load(Ordering::SeqCst),
            func: fi,
            cfa,
            caller: ctx.call_site as u64,
            from: called_from(f, id, ctx.call_site as u64),
            entry: id,
            t0: now,
            h0,
            child: 0,
            node: NO_NODE,
            node_epoch: 0,
            open: false,
        });
        f.prefetch_exit(ctx.call_site as u64);
    });
    if pushed.is_none() {
        p.counters.no_thread.fetch_add(1, Ordering::Relaxed);
        p.counters.toggles.fetch_add(toggled, Ordering::Relaxed);
    }
}

/// Whether epoch `e` counts calls (even epochs) or times them (odd).
///
/// The two are kept apart. Timing samples are heavy (their exits, and the
/// exits of calls that were not sampled, are hooked too) and crowd the
/// start of an epoch, when windows open; a window's rate, corrected only
/// for its own calls' counting, read the bundled demo's calls 1.7 to 1.9
/// times their count with both in one epoch. A counting epoch times
/// nothing and runs its hooks without their clock.
#[inline(always)]
pub(crate) fn counting_epoch(e: u32) -> bool {
    e.is_multiple_of(2)
}

/// Counts a call of function `fi` on this thread; returns its calls on
/// the thread since its count was last marked.
#[inline(always)]
fn count_call(fi: u32) -> u64 {
    with_local(|store, _| {
        if store.clock.load(Ordering::Relaxed) == 0 {
            store.link_clock();
        }
        store.calls.bump(fi)
    })
    .unwrap_or(0)
}

/// Counts a call of a function counted whole (through entry probe `id`,
/// stamped `now`); its first of an epoch hands it to the sampler, which
/// folds the epoch's count. Past [`window::WHOLE_OVERFLOW`] calls on this
/// thread in the epoch its probe goes off, and the sampler makes it
/// windowed.
#[inline(always)]
fn count_whole(p: &Profiler, f: &Func, fi: u32, epoch: u32, id: ProbeId) {
    let k = count_call(fi);
    if f.window.counted_epoch.load(Ordering::Relaxed) != epoch {
        f.window.counted_epoch.store(epoch, Ordering::Relaxed);
        p.due.push(fi);
    }
    if k > p.whole_overflow
        && f.window
            .overflow_at
            .compare_exchange(0, tsc::now(), Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        && crate::deactivate(id).is_ok()
    {
        add_toggles(p, 1);
    }
}

/// Adds `n` toggles to this thread's count (or the profiler's, on a
/// thread that is exiting).
fn add_toggles(p: &Profiler, n: u64) {
    if with_local(|store, _| Counters::add_own(&store.counts.toggles, n)).is_none() {
        p.counters.toggles.fetch_add(n, Ordering::Relaxed);
    }
}

/// Entry probe `id` of windowed function `f` (function `fi`) goes off
/// until it is armed again: its timing quota is filled, or it has no
/// window open. `gen` is the function's arming count read before the
/// handler decided.
///
/// The schedule or the sampler may arm the function between that read
/// and the switch: then the probe goes back on. Arming bumps the count
/// (`SeqCst`), then switches on; this switches off, fences, then reads it:
/// either the arming's switch-on comes after this switch-off, or this
/// reads the new count.
fn switch_off(p: &Profiler, f: &Func, fi: u32, id: ProbeId, gen: u64) {
    if crate::deactivate(id).is_ok() {
        p.due.push(fi);
        let mut toggles = 1;
        std::sync::atomic::fence(Ordering::SeqCst);
        if f.window.gen.load(Ordering::Relaxed) != gen && crate::activate(id, on_entry).is_ok() {
            toggles += 1;
        }
        add_toggles(p, toggles);
    }
}

/// Switches `f`'s exit probes that are off back on (exits that follow
/// their entry never go off); returns how many.
fn exits_on(p: &Profiler, f: &Func) -> u64 {
    if f.exits_follow_entry.load(Ordering::Relaxed) {
        return 0;
    }
    let mut toggles = 0;
    f.probes.for_each(|id, is_entry| {
        if !is_entry && matches!(crate::is_active(id), Ok(false)) && crate::activate(id, on_exit).is_ok() {
            exit_watch_changed(p, f);
            toggles += 1;
        }
    });
    toggles
}

extern "C" fn on_exit(id: ProbeId) {
    let Some(p) = get() else { return };
    let Some((f, fi)) = func_of(p, id) else { return };
    // The common case once the quota is filled: nothing sampled is in
    // flight, so this probe has no more work until the next window; it goes
    // off before the frame search.
    if f.exhausted.load(Ordering::Acquire) && f.outstanding.load(Ordering::Acquire) <= 0 {
        let switched = exit_off(p, f, id);
        let counted = with_local(|store, _| {
            let c = &store.counts;
            Counters::add_own(&c.unmatched_exits, 1);
            Counters::add_own(&c.toggles, u64::from(switched));
        });
        if counted.is_none() {
            // An exiting thread: its own counters are gone.
            p.counters.unmatched_exits.fetch_add(1, Ordering::Relaxed);
            p.counters.toggles.fetch_add(u64::from(switched), Ordering::Relaxed);
        }
        return;
    }
    let ctx = crate::hooks::context();
    let Some(cfa) = crate::hooks::cfa(ctx) else {
        p.counters.no_cfa.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let t = ctx.started;
    let h1 = crate::clock::current().map_or(0, |c| c.hook_ticks());
    let r = with_local(|store, sh| {
        pop_dead(p, sh, cfa, ctx.call_site as u64, ctx.cfa != 0, None);
        match sh.frames.last() {
            Some(top) if top.cfa == cfa && top.func == fi => {}
            _ => {
                Counters::add_own(&store.counts.unmatched_exits, 1);
                // An exit of a call entered before the window or through
                // another copy: once nothing sampled is in flight, or the
                // window's budget of such exits is spent, this probe has no
                // more work until the next window.
                if f.exhausted.load(Ordering::Acquire)
                    && (f.outstanding.load(Ordering::Acquire) <= 0 || f.unmatched_over_budget())
                    && exit_off(p, f, id)
                {
                    Counters::add_own(&store.counts.toggles, 1);
                }
                return;
            }
        }
        finish_frame(p, store, sh, t, h1);
        let c = &store.counts;
        let left = f.outstanding.fetch_sub(1, Ordering::AcqRel) - 1;
        if left <= 0 && f.exhausted.load(Ordering::Acquire) && exit_off(p, f, id) {
            Counters::add_own(&c.toggles, 1);
        }
    });
    if r.is_none() {
        p.counters.no_thread.fetch_add(1, Ordering::Relaxed);
    }
}

/// Pops the thread's top sampled frame and records it as a call that
/// returned at `t`, when the thread's hook time was `h1`; returns its
/// function.
fn finish_frame(p: &Profiler, store: &ThreadStore, sh: &mut Shadow, t: u64, h1: u64) -> Option<u32> {
    let mut done = sh.frames.pop()?;
    let fi = done.func;
    let f = p.funcs.get(fi)?;
    if done.from == 0 {
        done.from = called_from(f, done.entry, done.caller);
    }
    // The program's own time: the hooks' time in between (this call's
    // entry, every sampled or counted call under it) is not in it.
    let dur = crate::clock::program_ticks(done.t0, done.h0, t, h1);
    if let Some(parent) = sh.frames.last_mut() {
        if p.funcs
            .get(parent.func)
            .is_some_and(|pf| pf.contains(done.from as usize))
        {
            parent.child += dur;
        }
    }
    let self_ticks = dur.saturating_sub(done.child);
    // Read before any frame's watch stamp (see `Shadow::path_end`).
    let epoch = p.path_epoch.load(Ordering::SeqCst);
    let mut agg = store.agg.lock();
    let end = sh.path_end(&done, &mut agg.paths, epoch, |i| get().and_then(|p| p.funcs.get(i)));
    // Outermost unless an activation of the same function encloses it
    // (counted once, in the outermost: recursion is not time twice).
    let outer = !sh.frames.iter().any(|fr| fr.func == fi);
    if agg.log(fi, done.from, dur, self_ticks, end, outer) {
        agg.fold();
    }
    drop(agg);
    Counters::add_own(&store.counts.samples, 1);
    Some(fi)
}

/// Records the thread's sampled calls still in flight as ending now (the
/// thread or the process is ending: `main` when the program calls `exit`,
/// a thread body that calls `pthread_exit`), innermost first; returns how
/// many.
pub(crate) fn close_open_frames(p: &Profiler, store: &ThreadStore, sh: &mut Shadow) -> u64 {
    let t = tsc::now();
    let h = crate::clock::current().map_or(0, |c| c.hook_ticks());
    let mut n = 0;
    while let Some(fi) = finish_frame(p, store, sh, t, h) {
        if let Some(f) = p.funcs.get(fi) {
            f.outstanding.fetch_sub(1, Ordering::Relaxed);
        }
        n += 1;
    }
    p.counters.open_at_exit.fetch_add(n, Ordering::Relaxed);
    n
}

/// The discovery callback: a function per entry address, both probes on
/// with the profiler's handlers.
fn discovered(m: &ProbeMeta) {
    let Some(p) = get() else { return };
    let fi = {
        let mut map = p.by_addr.lock();
        match map.get(&m.function) {
            Some(&fi) => fi,
            None => {
                let Some(fi) = p.funcs.push(Func::new(m.function, m.name())) else {
                    crate::log::warn(format_args!("profile: function table full; {} not profiled", m.name()));
                    return;
                };
                map.insert(m.function, fi);
                // Before any of its probes is on, so before a handler can
                // hand it to the sampler (see `Exhausted::push`).
                p.due.reserve(fi);
                // Every thread's counter for it, so that a window can mark
                // it from the raw sampler (which must not allocate).
                for t in p.stores() {
                    t.calls.reserve(fi + 1);
                }
                if let Some(f) = p.funcs.get(fi) {
                    f.end.store(function_end(m.function), Ordering::Release);
                }
                fi
            }
        }
    };
    let f = p.funcs.get(fi).expect("just pushed");
    if !p.settings.inlined && m.inlined {
        // Off for good: never on the function's probe list, so never
        // re-armed. Off at once too: a discovered probe left on would run
        // the hook, with no handler, on every call.
        match crate::deactivate(m.id) {
            Ok(()) => {
                p.counters.inlined_off.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => crate::log::warn(format_args!("profile: inlined copy's probe {}: {e}", m.id)),
        }
        return;
    }
    if let Some(probe) = registry::get(m.id) {
        probe.tool.store(fi as u64 + 1, Ordering::Relaxed);
    }
    let entry = m.kind == ProbeKind::Entry;
    f.probes.push(m.id, entry);
    if !entry && m.provider == crate::probe::Provider::Finstrument && m.site != 0 {
        f.hint_exit(m.id, exit_slot(m));
    }
    if !entry && crate::sled::follow_entry(m.id) {
        f.exits_follow_entry.store(true, Ordering::Relaxed);
    }
    if let Err(e) = crate::activate(m.id, if entry { on_entry } else { on_exit }) {
        crate::log::warn(format_args!("profile: probe {}: {e}", m.id));
    }
}

/// Where exit probe `m`'s hook call finds it in the site table (see
/// `hooks::hook`): by its return address, or for a tail jump by its
/// function.
fn exit_slot(m: &ProbeMeta) -> u32 {
    if m.form.is_some_and(|f| f.is_tail()) {
        sitetable::slot_of(key::function(
            m.function as u64,
            providers::finstrument::HookKind::Exit as u8,
        )) | functions::TAIL_HINT
    } else {
        sitetable::slot_of(key::ret((m.site + m.site_len as usize) as u64))
    }
}

/// One past the last byte of the function at `f`, from the extent
/// discovery published ([`key::extent`]); `usize::MAX` when no symbol
/// gives it (then no return address is taken for its inlined copies').
fn function_end(f: usize) -> usize {
    sitetable::get(key::extent(f as u64)).map_or(usize::MAX, |size| f + size as usize)
}

/// Switches `f`'s probes that are off back on for the epoch starting,
/// exits first so that no timed entry misses its exit; returns how many
/// it switched. On the raw sampler (`raw`) a probe whose switch would take
/// a word patch is left off and counted ([`Profiler::rearm_skipped`]).
fn rearm(p: &Profiler, f: &Func, raw: bool, timing: bool) -> u64 {
    let mut toggles = 0;
    for entry in [false, true] {
        if entry {
            // Pairs with the fence in `reopened`. A counting epoch times
            // nothing: its quota is filled from the start.
            f.exhausted.store(!timing, Ordering::SeqCst);
            // Pairs with `switch_off`'s check.
            f.window.gen.fetch_add(1, Ordering::SeqCst);
        }
        f.probes.for_each(|id, is_entry| {
            if is_entry != entry || (!entry && !timing) {
                return;
            }
            let h: crate::Handler = if entry { on_entry } else { on_exit };
            if raw && registry::get(id).is_some_and(crate::toggle::activation_needs_word_patch) {
                p.rearm_skipped.fetch_add(1, Ordering::Relaxed);
                return;
            }
            if matches!(crate::is_active(id), Ok(false)) && crate::activate(id, h).is_ok() {
                if !entry {
                    // Calls entered while it was off would otherwise look
                    // watched from here on.
                    exit_watch_changed(p, f);
                }
                toggles += 1;
            }
        });
    }
    toggles
}

/// Starts loading what re-arming the functions `due` touches, in stages,
/// each reading only what the one before it loaded: each function's
/// record (and the first line of its longer probe lists), then its
/// probes' records, then the code (and sled) lines of those that are off.
/// A function is re-armed once per epoch, so all of it is cold; one by
/// one, each of ~100 functions per epoch waited for ~10 misses in turn.
fn prefetch_epoch(p: &Profiler, due: &[u32]) {
    let funcs = || due.iter().filter_map(|&i| p.funcs.get(i));
    for f in funcs() {
        crate::prefetch::object(f);
    }
    for f in funcs() {
        f.probes.prefetch_more();
    }
    for f in funcs() {
        f.probes.for_each(|id, _| registry::prefetch_for_toggle(id));
    }
    for f in funcs() {
        f.probes.for_each(|id, _| registry::prefetch_code_for_activation(id));
    }
}

/// Functions the sampler re-arms per batch (its one buffer, sized once).
const BATCH: usize = 1024;

/// One tick of the sampler: the epoch that was running ends now, and the
/// next, of about `len` ticks, begins. Counting and timing epochs
/// alternate ([`counting_epoch`]).
///
/// Ending a counting epoch, its windows that are still open close now and
/// every windowed function folds the epoch ([`window`]); one whose rate
/// now predicts few calls an epoch goes back to being counted whole.
/// Every function counted whole that was called folds its count, and goes
/// windowed if the epoch held many calls. Then the next epoch is armed:
/// a counting epoch's windows are planned ([`schedule::plan`]); in a
/// timing epoch every function's probes go on, and its first calls are
/// timed.
///
/// It allocates nothing and takes no lock that parks, so it can run on a
/// thread the C library does not know ([`crate::rawthread`]): `due` is
/// filled up to its capacity, never past it, and the schedule's buffers
/// were made with theirs.
fn epoch(p: &'static Profiler, due: &mut Vec<u32>, raw: bool, rng: &mut u64, len: u64) {
    let tpn = ticks_per_ns(p);
    let mut s = p.schedule.hold();
    s.exposure.set_rate(tpn);
    let (ended, _) = crate::clock::period();
    if counting_epoch(ended) {
        schedule::finish(p, &mut s);
    }
    let x = s.exposure.advance(p);
    let (now, x_now) = (x.at, x.x());
    let epoch_x = s.epoch_x;
    let t0 = p.epoch_start.load(Ordering::Relaxed);
    let p_epoch = (x_now - epoch_x).max(0.0);
    if counting_epoch(ended) {
        s.fold(p, x_now);
        let mut k = 0;
        while k < s.windowed.len() {
            let fi = s.windowed[k];
            let Some(f) = p.funcs.get(fi) else {
                k += 1;
                continue;
            };
            // SAFETY: the schedule's lock is held.
            let e = unsafe { f.window.estimate_mut() };
            if e.slow_rate() * p_epoch < window::WHOLE_BELOW {
                e.go_whole(x_now);
                p.open_counts(fi);
                f.window.set_kind(Kind::Whole);
                s.windowed.swap_remove(k);
                p.due.push(fi);
            } else {
                k += 1;
            }
        }
    }
    let next = crate::clock::advance_period(now);
    p.epoch_start.store(now, Ordering::Relaxed);
    s.epoch_x = x_now;
    let counting = counting_epoch(next);
    let mut toggles = 0;
    let mut taken = p.due.take(p.funcs.len());
    loop {
        due.clear();
        due.extend(taken.by_ref().take(due.capacity()));
        if due.is_empty() {
            break;
        }
        prefetch_epoch(p, due);
        for &i in due.iter() {
            let Some(f) = p.funcs.get(i) else { continue };
            if f.window.kind() != Kind::Whole {
                // Windowed: armed below.
                continue;
            }
            let n = p.take_counted(i);
            // SAFETY: the schedule's lock is held.
            let e = unsafe { f.window.estimate_mut() };
            e.counted += n as f64;
            let overflow = f.window.overflow_at.swap(0, Ordering::AcqRel);
            if (overflow != 0 || n as f64 > window::WINDOWED_ABOVE * p.settings.epoch_scale())
                && p_epoch > 0.0
                && s.windowed.len() < schedule::MAX_WINDOWED
            {
                if overflow != 0 {
                    // Counted until `overflow` only: the exposure then, by
                    // the wall time into the epoch.
                    let frac = (overflow.saturating_sub(t0) as f64 / now.saturating_sub(t0).max(1) as f64).min(1.0);
                    let at = epoch_x + p_epoch * frac;
                    e.go_windowed_from(at, n as f64 / (p_epoch * frac).max(1.0));
                } else {
                    e.go_windowed(x_now, n as f64 / p_epoch);
                }
                f.window.set_kind(Kind::Windowed);
                s.windowed.push(i);
                continue;
            }
            toggles += rearm(p, f, raw, !counting);
        }
    }
    s.raw = raw;
    if counting {
        schedule::plan(p, &mut s, next, now, len, p.settings.windows, tpn, rng);
        schedule::wake(p, &mut s);
    } else {
        schedule::idle(&mut s, next);
        for k in 0..s.windowed.len() {
            if let Some(f) = p.funcs.get(s.windowed[k]) {
                toggles += rearm(p, f, raw, true);
            }
        }
    }
    drop(s);
    // Once per epoch: the handlers update this counter too.
    p.counters.toggles.fetch_add(toggles, Ordering::Relaxed);
}

/// TSC ticks per nanosecond, measured since the profiler started (the
/// last figure while a report holds the start).
fn ticks_per_ns(p: &Profiler) -> f64 {
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

/// The profiler stops: the running epoch ends now, so that the estimates
/// are complete (the report at exit). Every function counted whole folds
/// its count; windowed functions fold the counting epoch, or carry their
/// last rate to now.
pub(crate) fn final_fold(p: &'static Profiler) {
    let mut s = p.schedule.hold();
    let (ended, _) = crate::clock::period();
    let counting = counting_epoch(ended) && s.counting;
    if counting {
        schedule::finish(p, &mut s);
    }
    let x_now = s.exposure.advance(p).x();
    if counting {
        s.fold(p, x_now);
    }
    schedule::idle(&mut s, ended);
    for i in p.due.take(p.funcs.len()) {
        let Some(f) = p.funcs.get(i) else { continue };
        if f.window.kind() != Kind::Whole {
            continue;
        }
        let n = p.take_counted(i);
        // SAFETY: the schedule's lock is held.
        unsafe { f.window.estimate_mut() }.counted += n as f64;
    }
}

/// The sampler's generator (xorshift64), seeded by the clock on first use.
fn next_random(rng: &mut u64) -> u64 {
    if *rng == 0 {
        *rng = tsc::now() | 1;
    }
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    *rng
}

/// The length of the next epoch: the setting times a factor uniform in
/// [0.5, 1.5), from a generator seeded by the clock, so that epochs do not
/// keep step with a periodic pattern of the program's calls.
fn next_sleep(p: &Profiler, rng: &mut u64) -> Duration {
    let u = (next_random(rng) >> 11) as f64 / (1u64 << 53) as f64;
    p.settings.epoch.mul_f64(0.5 + u)
}

/// The first epoch, where every function is counted whole, is short:
/// the busy ones are windowed from the second.
fn first_sleep(p: &Profiler) -> Duration {
    p.settings.epoch.min(Duration::from_millis(1))
}

/// Sleeps through an epoch of `d`, waking about every
/// [`schedule::WAKE_US`] in a counting epoch to open its windows.
fn sleep_epoch(p: &Profiler, d: Duration, raw: bool, rng: &mut u64) {
    let end = Instant::now() + d;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() || p.stop.load(Ordering::Relaxed) {
            return;
        }
        let counting = counting_epoch(crate::clock::period().0);
        let nap = if counting {
            let u = (next_random(rng) >> 11) as f64 / (1u64 << 53) as f64;
            left.min(Duration::from_micros(schedule::WAKE_US).mul_f64(0.5 + u))
        } else {
            left
        };
        if raw {
            crate::rawthread::sleep(nap);
        } else {
            std::thread::sleep(nap);
        }
        if counting && !p.stop.load(Ordering::Relaxed) {
            let mut s = p.schedule.hold();
            schedule::wake(p, &mut s);
        }
    }
}

fn sampler_pthread() {
    let Some(p) = get() else { return };
    crate::rawthread::set_timer_slack(1_000);
    let mut due = Vec::with_capacity(BATCH);
    let mut dumping = 0;
    let mut rng = 0;
    let mut cur = first_sleep(p);
    while !p.stop.load(Ordering::Relaxed) {
        sleep_epoch(p, cur, false, &mut rng);
        cur = next_sleep(p, &mut rng);
        epoch(p, &mut due, false, &mut rng, duration_ticks(p, cur));
        if p.dump.swap(false, Ordering::AcqRel) {
            let before = crate::rawthread::thread_cpu_ns();
            write_reports(true);
            dumping += crate::rawthread::thread_cpu_ns().saturating_sub(before);
        }
        let used = crate::rawthread::thread_cpu_ns().saturating_sub(dumping);
        p.sampler_ns.store(used, Ordering::Relaxed);
    }
}

/// `d` in TSC ticks.
fn duration_ticks(p: &Profiler, d: Duration) -> u64 {
    (d.as_nanos() as f64 * ticks_per_ns(p)) as u64
}

/// The sampler on a raw thread ([`crate::rawthread`]). `arg` is its batch
/// buffer, a leaked `Vec<u32>` with capacity [`BATCH`].
extern "C" fn sampler_raw(arg: usize) {
    // SAFETY: `start_sampler` leaked this Vec for this thread alone.
    let due = unsafe { &mut *(arg as *mut Vec<u32>) };
    let Some(p) = get() else { return };
    crate::rawthread::set_timer_slack(1_000);
    let mut rng = 0;
    let mut cur = first_sleep(p);
    while !p.stop.load(Ordering::Relaxed) {
        sleep_epoch(p, cur, true, &mut rng);
        if p.stop.load(Ordering::Relaxed) {
            break;
        }
        cur = next_sleep(p, &mut rng);
        epoch(p, due, true, &mut rng, duration_ticks(p, cur));
        p.sampler_ns.store(crate::rawthread::thread_cpu_ns(), Ordering::Relaxed);
    }
}

extern "C" fn on_signal(_: libc::c_int) {
    // Async-signal-safe: one atomic store; the daemon writes the reports.
    if let Some(p) = get() {
        p.dump.store(true, Ordering::Release);
    }
}

/// Starts the profiler: the discovery callback, the daemon, the signal.
pub fn install(out: PathBuf) -> crate::Result<()> {
    let settings = Settings::from_env();
    let program = std::env::args().next().unwrap_or_default();
    let fresh = PROFILER.set(Profiler {
        settings,
        funcs: Segmented::new(),
        by_addr: Mutex::new(thread::FxMap::default()),
        due: Exhausted::default(),
        schedule: Schedule::default(),
        stores: Segmented::new(),
        stores_lock: AtomicBool::new(false),
        epoch_start: AtomicU64::new(0),
        tpn: AtomicU64::new(0),
        path_epoch: AtomicU32::new(0),
        threads: Mutex::new(Vec::new()),
        counters: Counters::default(),
        start: Mutex::new((tsc::now(), Instant::now())),
        stop: AtomicBool::new(false),
        dump: AtomicBool::new(false),
        rearm_skipped: AtomicU64::new(0),
        sampler_ns: AtomicU64::new(0),
        whole_overflow: (window::WHOLE_OVERFLOW as f64 * settings.epoch_scale()) as u64,
        out,
        program,
    });
    if fresh.is_err() {
        return Ok(());
    }
    // The hooks time themselves (the program clock), and the first epoch
    // starts now.
    crate::clock::start_clock();
    crate::clock::advance_period(tsc::now());
    if let Some(p) = get() {
        p.epoch_start.store(tsc::now(), Ordering::Relaxed);
    }
    crate::on_discovery(discovered)?;
    start_sampler();
    if settings.cpu_samples {
        cpusample::start();
    }
    if settings.signal != 0 {
        // SAFETY: installs a handler that only stores to an atomic.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as usize;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigaction(settings.signal, &sa, std::ptr::null_mut());
        }
    }
    Ok(())
}

/// Starts the sampler: on a raw thread ([`crate::rawthread`]) unless the
/// settings need a regular one (see [`Sampler`]) or `clone` fails.
fn start_sampler() {
    let Some(p) = get() else { return };
    let word = matches!(crate::strategy(), Strategy::WordSync | Strategy::WordAsync);
    if p.settings.sampler == Sampler::Clone && p.settings.signal == 0 && !word {
        let due = Box::into_raw(Box::new(Vec::<u32>::with_capacity(BATCH))) as usize;
        // SAFETY: `sampler_raw` and `epoch` allocate nothing, park on no
        // lock and call no libc function (see `epoch`); the buffer is
        // leaked to the thread, which runs until the process exits.
        match unsafe { crate::rawthread::spawn(sampler_raw, due, crate::tls::depth()) } {
            Ok(_) => return,
            Err(e) => crate::log::warn(format_args!(
                "profile: cannot start the raw sampler thread ({e}); using a regular thread"
            )),
        }
    }
    if let Err(e) = std::thread::Builder::new()
        .name("fastinst-profile".into())
        .spawn(sampler_pthread)
    {
        crate::log::error(format_args!(
            "profile: cannot start the sampling thread: {e}; probes stay on after their first 10 samples are taken"
        ));
    }
}

/// Before fork: take every profiler lock, so none is held by a thread that
/// will not exist in the child. Order: the discovery lock (taken by the
/// caller first), the function map, the thread list, each thread's
/// aggregates; no other path takes two of them in another order.
pub(crate) fn fork_prepare() {
    let Some(p) = get() else { return };
    std::mem::forget(p.by_addr.lock());
    let threads = p.threads.lock();
    for t in threads.iter() {
        std::mem::forget(t.agg.lock());
    }
    std::mem::forget(threads);
}

fn fork_unlock(p: &Profiler) {
    // SAFETY: fork_prepare locked each of these on this thread and forgot
    // the guards; the thread list is stable while its lock is held.
    unsafe {
        let threads = &*p.threads.data_ptr();
        for t in threads.iter() {
            t.agg.force_unlock();
        }
        p.threads.force_unlock();
        p.by_addr.force_unlock();
    }
}

/// After fork, in the parent.
pub(crate) fn fork_parent() {
    if let Some(p) = get() {
        fork_unlock(p);
    }
}

/// After fork, in the child: release the locks, forget the parent's
/// samples and threads, restart the daemon (threads do not survive fork).
pub(crate) fn fork_child() {
    let Some(p) = get() else { return };
    fork_unlock(p);
    // SAFETY: the child has one thread, this one, which holds no lock.
    unsafe { p.schedule.force_unlock() };
    let now = tsc::now();
    // The parent's other threads do not exist here.
    let me = local::current();
    for t in p.stores() {
        if me.as_ref().is_some_and(|m| std::ptr::eq(Arc::as_ptr(m), t)) {
            // Its CPU clock starts again at 0, and its counts are the
            // child's from here.
            exposure::start_thread(t);
            for i in 0..p.funcs.len() {
                t.calls.open(i);
            }
        } else {
            t.died.store(now.max(1), Ordering::Release);
            t.cpu_final
                .store(t.x_cpu.load(Ordering::Relaxed).max(1), Ordering::Release);
        }
    }
    {
        let mut s = p.schedule.hold();
        s.windowed.clear();
        schedule::idle(&mut s, crate::clock::period().0);
        s.epoch_x = s.exposure.advance(p).x();
    }
    *p.start.lock() = (now, Instant::now());
    // Functions whose quota filled in the parent have their entry probes
    // off: re-armed now, so the child's first calls are counted too (the
    // child is one thread until it returns from fork).
    // Its epochs start afresh: every function counted whole from now.
    p.due.clear();
    crate::clock::advance_period(now);
    let mut rearmed = 0;
    for i in 0..p.funcs.len() {
        if let Some(f) = p.funcs.get(i) {
            f.reset();
            rearmed += rearm(p, f, false, !counting_epoch(crate::clock::period().0));
        }
    }
    // The reset forgot this thread's sampled calls in flight, which the
    // child still exits; and its kept path nodes index the parent's
    // tables, which the child starts afresh.
    with_local(|_, sh| {
        for fr in &sh.frames {
            if let Some(f) = p.funcs.get(fr.func) {
                f.outstanding.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    paths_may_change(p);
    let mut threads = p.threads.lock();
    threads.retain(|t| me.as_ref().is_some_and(|m| Arc::ptr_eq(m, t)));
    for t in threads.iter() {
        *t.agg.lock() = Agg::default();
        t.counts.reset();
    }
    drop(threads);
    p.counters.reset();
    // The child's own toggles, counted after the parent's are forgotten.
    p.counters.toggles.store(rearmed, Ordering::Relaxed);
    // Its sampler is a new thread, whose CPU clock starts at 0.
    p.sampler_ns.store(0, Ordering::Relaxed);
    start_sampler();
    // Its timers were reset by fork.
    cpusample::reset();
    if p.settings.cpu_samples {
        cpusample::start();
    }
}

/// Writes the reports (at exit, or on the signal) and prints where.
pub(crate) fn write_reports(on_demand: bool) {
    let Some(p) = get() else { return };
    if !on_demand {
        p.stop.store(true, Ordering::Relaxed);
    }
    if registry::count() == 0 {
        return;
    }
    let skipped = p.rearm_skipped.load(Ordering::Relaxed);
    if skipped > 0 {
        crate::log::warn(format_args!(
            "profile: {skipped} re-activations skipped: those probes need a word patch, which the clone sampler does not make; FASTINST_PROFILE_SAMPLER=pthread samples them"
        ));
    }
    if !on_demand {
        cpusample::stop();
        // This thread's calls still in flight (main's, at exit) end now.
        with_local(|store, sh| close_open_frames(p, store, sh));
        final_fold(p);
    }
    let began = Instant::now();
    let r = report::collect(p);
    crate::log::debug(format_args!("profile: report collected in {:?}", began.elapsed()));
    let written = report::write_all(&r, &p.out);
    crate::log::debug(format_args!(
        "profile: report collected and written in {:?}",
        began.elapsed()
    ));
    report::announce(
        &format!(
            "profile of {} functions ({} samples)",
            r.functions.len(),
            r.overhead.samples
        ),
        &p.out,
        written,
    );
    if !on_demand {
        // The process is exiting: handing the report's ~200,000 blocks
        // (a name per frame per path) back to malloc one by one took ~1.5
        // ms of SQLite's exit, for memory about to go anyway.
        std::mem::forget(r);
    }
}
