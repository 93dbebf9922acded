//! The latency profiler (`FASTINST_TOOL=profile`, the default tool): the
//! paper's §9 case study.
//!
//! Bursty sampling: every function starts with its entry and exit probes
//! on. The entry handler counts the calls of the current window; the K-th
//! (`FASTINST_PROFILE_SAMPLES`, default 10) switches the entry probe off
//! from inside its own handler (one callpatch store: cheap and safe, the
//! hook call is already under way). The exit probe stays on until the
//! function's sampled calls in flight have exited, then switches itself off;
//! a sled function's exit probe instead follows its entry probe
//! (`crate::sled::follow_entry`) and stays on: it sees the returns of the
//! calls sampled while the entry probe was on, and no others.
//! Copies of a function that gcc's `-finstrument-functions` left inlined in
//! other functions (hooks in another function's code, not in the function's
//! clones or `.cold` parts: [`ProbeMeta::inlined`]) are switched off at
//! discovery and never sampled unless `FASTINST_PROFILE_INLINED=1`; see
//! [`Settings::inlined`] for why.
//! A sampler thread re-activates exhausted functions every epoch
//! (`FASTINST_PROFILE_EPOCH_MS`, default 10) and closes their window for the
//! call estimate (`functions`). It is made with `clone(2)`, unknown to
//! glibc, which therefore keeps its single-threaded `malloc` in a
//! single-threaded program (`rawthread.rs`, [`Sampler`]); so its epoch
//! allocates nothing and never parks. Pairing, call paths
//! and their limits are in `thread`; the reports in [`report`].

mod decimal;
mod exhausted;
mod flame;
mod functions;
pub(crate) mod hist;
mod json;
mod local;
mod paths;
mod pathtree;
pub mod report;
mod svg;
mod table;
#[cfg(test)]
mod test_rng;
mod thread;

use crate::probe::{ProbeId, ProbeKind, ProbeMeta};
use crate::registry;
use crate::segmented::Segmented;
use crate::sitetable::{self, key};
use crate::Strategy;
use exhausted::Exhausted;
use functions::Func;
use local::with_local;
use parking_lot::Mutex;
pub use paths::MAX_PATH_NODES;
use std::cell::UnsafeCell;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use thread::{Agg, Frame, Shadow, MAX_DEPTH, NO_NODE};
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
    /// functions (`FASTINST_PROFILE_INLINED=1`), not only its own code.
    ///
    /// Off by default. gcc's `-finstrument-functions` keeps the hooks of
    /// every inlined copy (clang's after-inlining form and sled builds have
    /// none), and sampling them cost more than it showed, measured on
    /// Table 3's gcc builds (QuickJS, SQLite):
    /// - they are mostly helpers a few instructions long (QuickJS's
    ///   `JS_FreeValue`, 1.2 M calls), whose sampled durations are mostly
    ///   the hooks' own time;
    /// - they doubled the samples per second (QuickJS 84,000/s against
    ///   44,000/s; SQLite 95,000/s against 57,000/s) and tripled the
    ///   sampler's re-arming (QuickJS 60,000 toggles/s against 17,000/s):
    ///   the handlers and the sampler took 4.3% of QuickJS's CPU and 3.7%
    ///   of SQLite's, and take 2.3% and 2.7% without them (CPU samples,
    ///   `fastinst-shares`, 4 runs each);
    /// - their call paths filled the per-thread path table, so 32-55% of
    ///   the samples were shown as `[...];function` (0-10% without them).
    ///
    /// Left off, an inlined copy's time is its caller's self time, as in
    /// clang and sled builds of the same program, so the reports of the
    /// three builds name the same functions.
    pub inlined: bool,
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
        }
    }
}

impl Settings {
    /// Reads `FASTINST_PROFILE_SAMPLES`, `FASTINST_PROFILE_EPOCH_MS`,
    /// `FASTINST_PROFILE_SIGNAL` (`USR1`, `USR2` or a number) and
    /// `FASTINST_PROFILE_SAMPLER` (`clone`, `pthread`) and
    /// `FASTINST_PROFILE_INLINED` (`0`, `1`); an invalid value is reported
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
        if let Ok(v) = std::env::var("FASTINST_PROFILE_INLINED") {
            match v.trim() {
                "0" => s.inlined = false,
                "1" => s.inlined = true,
                _ => crate::log::error(format_args!("FASTINST_PROFILE_INLINED: `{v}` is not 0 or 1; using 0")),
            }
        }
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
    pub handler_ticks: AtomicU64,
    pub unmatched_exits: AtomicU64,
    pub abandoned: AtomicU64,
    pub too_deep: AtomicU64,
    pub no_cfa: AtomicU64,
    pub no_thread: AtomicU64,
    pub inlined_off: AtomicU64,
}

impl Counters {
    /// Adds `v` to counter `c` of the calling thread's own set: a plain
    /// load and store, where a shared counter took a locked add (and, with
    /// threads, its cache line moving between them) four times a sample.
    #[inline(always)]
    pub(crate) fn add_own(c: &AtomicU64, v: u64) {
        c.store(c.load(Ordering::Relaxed).wrapping_add(v), Ordering::Relaxed);
    }

    fn all(&self) -> [&AtomicU64; 9] {
        [
            &self.samples,
            &self.toggles,
            &self.handler_ticks,
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
    exhausted: Exhausted<FUNC_SEGMENTS>,
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
    pub out: PathBuf,
    pub program: String,
}

impl Profiler {
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
    let t_in = tsc::now();
    let Some(p) = get() else { return };
    let Some((f, fi)) = func_of(p, id) else { return };
    let n = f.count.fetch_add(1, Ordering::AcqRel) + 1;
    let mut toggled = 0;
    if n == 1 {
        if let Some(clock) = local::handler_clock() {
            f.first_call(clock);
        }
    }
    if n >= p.settings.samples {
        // This probe fired, so it is on; another copy of the function's
        // entry may have filled the quota.
        let switched_off = crate::deactivate(id).is_ok();
        toggled = u64::from(switched_off);
        if n == p.settings.samples {
            // Handed to the sampler only now that the probe is off: handed
            // over first, the function could be re-armed in the moment
            // before the switch, which would leave the probe off for good
            // (see `reopened`).
            f.kth_call(t_in, local::handler_clock());
            f.exhausted.store(true, Ordering::Release);
            let handed = p.exhausted.push(fi);
            // `discovered` reserved its bit before switching any of its
            // probes on.
            debug_assert!(handed, "function {fi} has no exhausted bit");
        } else if switched_off && reopened(f) && crate::activate(id, on_entry).is_ok() {
            toggled += 1;
        }
    }
    let ctx = crate::hooks::context();
    let Some(cfa) = crate::hooks::cfa(ctx) else {
        p.counters.no_cfa.fetch_add(1, Ordering::Relaxed);
        return;
    };
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
        let t0 = tsc::now();
        sh.frames.push(Frame {
            exit_gen: f.exit_gen.load(Ordering::SeqCst),
            func: fi,
            cfa,
            caller: ctx.call_site as u64,
            from: called_from(f, id, ctx.call_site as u64),
            entry: id,
            t0,
            child: 0,
            node: NO_NODE,
            node_epoch: 0,
            open: false,
        });
        f.prefetch_exit(ctx.call_site as u64);
        Counters::add_own(&store.counts.handler_ticks, t0 - t_in);
    });
    if pushed.is_none() {
        p.counters.no_thread.fetch_add(1, Ordering::Relaxed);
        p.counters.toggles.fetch_add(toggled, Ordering::Relaxed);
    }
}

extern "C" fn on_exit(id: ProbeId) {
    let t = tsc::now();
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
            Counters::add_own(&c.handler_ticks, tsc::now() - t);
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
                Counters::add_own(&store.counts.handler_ticks, tsc::now() - t);
                return;
            }
        }
        let mut done = sh.frames.pop().expect("checked above");
        if done.from == 0 {
            done.from = called_from(f, done.entry, done.caller);
        }
        let dur = t.saturating_sub(done.t0);
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
        if agg.log(fi, done.from, dur, self_ticks, end) {
            agg.fold();
        }
        drop(agg);
        let c = &store.counts;
        Counters::add_own(&c.samples, 1);
        let left = f.outstanding.fetch_sub(1, Ordering::AcqRel) - 1;
        if left <= 0 && f.exhausted.load(Ordering::Acquire) && exit_off(p, f, id) {
            Counters::add_own(&c.toggles, 1);
        }
        Counters::add_own(&c.handler_ticks, tsc::now() - t);
    });
    if r.is_none() {
        p.counters.no_thread.fetch_add(1, Ordering::Relaxed);
    }
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
                let Some(fi) = p.funcs.push(Func::new(m.function, m.name(), tsc::now())) else {
                    crate::log::warn(format_args!("profile: function table full; {} not profiled", m.name()));
                    return;
                };
                map.insert(m.function, fi);
                // Before any of its probes is on, so before its quota can
                // fill (see `Exhausted::push`).
                p.exhausted.reserve(fi);
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

/// Opens `f`'s next window and switches its probes back on, exits first
/// so that no sampled entry misses its exit; returns how many it switched.
/// On the raw sampler (`raw`) a probe whose switch would take a word patch
/// is left off and counted ([`Profiler::rearm_skipped`]).
fn rearm(p: &Profiler, f: &Func, raw: bool) -> u64 {
    let mut toggles = 0;
    for entry in [false, true] {
        if entry {
            f.open_window(tsc::now());
            // Pairs with the fence in `reopened`.
            std::sync::atomic::fence(Ordering::SeqCst);
        }
        f.probes.for_each(|id, is_entry| {
            if is_entry != entry {
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
/// one, each of ~100 functions per epoch waited for ~10 misses in turn
/// (the sampler was ~1% of SQLite's run). With the probe lists read in
/// place ([`functions::FuncProbes`]) and the code lines added as the last
/// stage, the epoch's work fell from 15.5 to 11.3 us on
/// QuickJS's gcc sled build and from 22.8 to 19.5 us on SQLite's, and by
/// 5-8% on their `-finstrument-functions` builds, whose ~70 us is mostly
/// the misses themselves (medians of 5 runs each).
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

/// One epoch of the sampler: closes the window of every function whose
/// quota filled and switches its probes back on.
///
/// It allocates nothing and takes no lock that parks, so it can run on a
/// thread the C library does not know ([`crate::rawthread`]): `due` is
/// filled up to its capacity, never past it.
fn epoch(p: &'static Profiler, due: &mut Vec<u32>, raw: bool) {
    let now = tsc::now();
    let mut toggles = 0;
    let mut taken = p.exhausted.take(p.funcs.len());
    loop {
        due.clear();
        due.extend(taken.by_ref().take(due.capacity()));
        if due.is_empty() {
            break;
        }
        prefetch_epoch(p, due);
        for &i in due.iter() {
            let Some(f) = p.funcs.get(i) else { continue };
            f.close_window(p.settings.samples, now);
            toggles += rearm(p, f, raw);
        }
    }
    // Once per epoch: the handlers update this counter too.
    p.counters.toggles.fetch_add(toggles, Ordering::Relaxed);
}

/// The sampler as a regular thread: with an on-demand report signal
/// (whose report it writes, which allocates), with a word strategy (whose
/// waits may call into libc), or where `clone` failed.
fn sampler_pthread() {
    let Some(p) = get() else { return };
    let mut due = Vec::with_capacity(BATCH);
    let mut dumping = 0;
    while !p.stop.load(Ordering::Relaxed) {
        std::thread::sleep(p.settings.epoch);
        epoch(p, &mut due, false);
        if p.dump.swap(false, Ordering::AcqRel) {
            let before = crate::rawthread::thread_cpu_ns();
            write_reports(true);
            dumping += crate::rawthread::thread_cpu_ns().saturating_sub(before);
        }
        let used = crate::rawthread::thread_cpu_ns().saturating_sub(dumping);
        p.sampler_ns.store(used, Ordering::Relaxed);
    }
}

/// The sampler on a raw thread ([`crate::rawthread`]). `arg` is its batch
/// buffer, a leaked `Vec<u32>` with capacity [`BATCH`].
extern "C" fn sampler_raw(arg: usize) {
    // SAFETY: `start_sampler` leaked this Vec for this thread alone.
    let due = unsafe { &mut *(arg as *mut Vec<u32>) };
    let Some(p) = get() else { return };
    while !p.stop.load(Ordering::Relaxed) {
        crate::rawthread::sleep(p.settings.epoch);
        if p.stop.load(Ordering::Relaxed) {
            break;
        }
        epoch(p, due, true);
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
        exhausted: Exhausted::default(),
        path_epoch: AtomicU32::new(0),
        threads: Mutex::new(Vec::new()),
        counters: Counters::default(),
        start: Mutex::new((tsc::now(), Instant::now())),
        stop: AtomicBool::new(false),
        dump: AtomicBool::new(false),
        rearm_skipped: AtomicU64::new(0),
        sampler_ns: AtomicU64::new(0),
        out,
        program,
    });
    if fresh.is_err() {
        return Ok(());
    }
    crate::on_discovery(discovered)?;
    start_sampler();
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
    let now = tsc::now();
    *p.start.lock() = (now, Instant::now());
    // Functions whose quota filled in the parent have their entry probes
    // off: re-armed now, so the child's first calls are counted too (the
    // child is one thread until it returns from fork).
    p.exhausted.clear();
    let mut rearmed = 0;
    for i in 0..p.funcs.len() {
        if let Some(f) = p.funcs.get(i) {
            if f.reset(now) {
                rearmed += rearm(p, f, false);
            }
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
    let me = local::current();
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
    let began = Instant::now();
    let r = report::collect(p);
    crate::log::debug(format_args!("profile: report collected in {:?}", began.elapsed()));
    let written = report::write_all(&r, &p.out);
    crate::log::debug(format_args!(
        "profile: report collected and written in {:?}",
        began.elapsed()
    ));
    match written {
        Ok(paths) => {
            // One line, made whole first: stderr is unbuffered, and
            // `eprintln!` writes each piece with a system call of its own
            // (9 here), between which the program's own output could fall.
            let line = format!(
                "fastinst: profile of {} functions ({} samples) written to {} (also {})\n",
                r.functions.len(),
                r.overhead.samples,
                paths[0].display(),
                paths[1..]
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
        }
        Err(e) => crate::log::error(format_args!("cannot write the profile to {}: {e}", p.out.display())),
    }
    if !on_demand {
        // The process is exiting: handing the report's ~200,000 blocks
        // (a name per frame per path) back to malloc one by one took ~1.5
        // ms of SQLite's exit, for memory about to go anyway.
        std::mem::forget(r);
    }
}
