//! The latency profiler (`FASTINST_TOOL=profile`, the default tool): the
//! paper's §9 case study, made to tell the truth on real programs.
//!
//! Time is cut into epochs (`FASTINST_PROFILE_EPOCH_MS`, default 10, each
//! drawn from half to one and a half times it). In each:
//! - Calls are counted in windows (`schedule`): stretches of time the
//!   sampler thread places at random, in which a function's probes are on
//!   and every call counted; the windows' counts over their exposure, the
//!   program's own CPU time (`exposure`), estimate every call (`window`).
//!   A function with few calls is counted whole, every call of every
//!   epoch. In a sled build the function's stub counts a window's calls
//!   itself (`crate::sled::counter`), at a fraction of a hook's cost, and
//!   sends on only the calls drawn for timing.
//! - Among the counted calls, each is timed by an independent draw
//!   (`choose`), about K a function an epoch (`FASTINST_PROFILE_SAMPLES`,
//!   default 10): entry and exit paired, its duration in the program's own
//!   time (the hooks' time taken off, `crate::clock`), with its caller and
//!   call path, weighted by the calls it stands for. So the timed calls
//!   are a sample of all calls, each as likely as any other.
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

mod budget;
mod choose;
mod counts;
mod cpusample;
mod due;
mod exitlog;
mod exposure;
mod frames;
mod functions;
mod handlers;
pub(crate) mod hist;
mod live;
mod local;
mod output;
mod paths;
mod profiler;
pub(crate) mod range;
pub mod report;
mod sampler;
mod schedule;
mod settings;
mod signalcost;
mod slowing;
mod spread;
mod state;
mod store;
mod survival;
mod table;
mod thread;
mod uncharged;
mod window;

use crate::probe::{ProbeKind, ProbeMeta};
use crate::registry;
use crate::segmented::Segmented;
use crate::sitetable::{self, key};
use due::Due;
use functions::Func;
use handlers::{on_entry, on_exit};
use local::with_local;
pub(crate) use output::{snapshot_json, write_reports};
use parking_lot::Mutex;
pub use paths::MAX_PATH_NODES;
use profiler::{get, Profiler};
use sampler::{on_signal, rearm, start_sampler};
use schedule::Schedule;
pub use settings::{Sampler, Settings};
use state::State;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;
use store::Counters;
use thread::Agg;
use wordpatch::tsc;

/// The profiler's discovery: a function per entry address, both probes on
/// with the profiler's handlers (`crate::api::listen` hands it each probe
/// while the profiler runs). A stopped profiler switches nothing on.
fn discovered(m: &ProbeMeta) {
    let Some(p) = get().filter(|p| !p.stop.load(Ordering::Acquire)) else {
        return;
    };
    // Points are no function's: they stay off (as they start).
    if !crate::filter::admit(m) || m.kind == crate::probe::ProbeKind::Point {
        return;
    }
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
                // hand it to the sampler (see `Due::push`).
                p.due.reserve(fi);
                // Every thread's counter for it, so that a window can mark
                // it from the raw sampler (which must not allocate).
                for t in p.stores() {
                    t.calls.reserve(fi + 1);
                }
                if let Some(f) = p.funcs.get(fi) {
                    f.end.store(function_end(m.function), Ordering::Release);
                    if let Some((b, e)) = crate::sled::body_of(m.function) {
                        f.body.0.store(b, Ordering::Relaxed);
                        f.body.1.store(e, Ordering::Release);
                    }
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
    // Shown again to a later generation, which took over the function's
    // probe list.
    let mut listed = false;
    f.probes.for_each(|id, _| listed |= id == m.id);
    if !listed {
        f.probes.push(m.id, entry);
    }
    if !entry && m.provider == crate::probe::Provider::Finstrument && m.site != 0 {
        f.hint_exit(m.id, exit_slot(m));
    }
    if !entry && crate::toggle::follow_entry(m.id) {
        f.exits_follow_entry.store(true, Ordering::Relaxed);
    }
    if let Some(later) = ARM_LATER.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        later.push((m.id, entry));
        return;
    }
    arm(m.id, entry);
}

/// Switches probe `id` on with the profiler's entry or exit handler.
fn arm(id: crate::probe::ProbeId, entry: bool) {
    if let Err(e) = crate::activate(id, if entry { on_entry } else { on_exit }) {
        crate::log::warn(format_args!("profile: probe {id}: {e}"));
    }
}

/// The probes [`install`] found, to be switched on together once every
/// function is listed; `None` outside an install (a probe found later is
/// switched on at once).
///
/// Why: switched on as each function was listed, the probes of the first
/// ones ran in the program's threads while the rest were listed, and in a
/// running process (an attach) those threads' hooks and the listing shared
/// the CPUs, the allocator and the functions' records: the listing took
/// several times longer than with the threads idle.
static ARM_LATER: std::sync::Mutex<Option<Vec<(crate::probe::ProbeId, bool)>>> = std::sync::Mutex::new(None);

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

/// What [`install`] will wait for, done ahead on another thread (see
/// `crate::tools::prepare`).
pub(crate) fn prepare() {
    cpusample::prepare();
}

/// Starts the profiler: the discovery callback, the daemon, the signal. A
/// profiler that ran and stopped (an attached process that was detached)
/// is followed by a new one, with the settings as they are now; a running
/// one is left as it is.
pub fn install(out: PathBuf) -> crate::Result<()> {
    if profiler::running() {
        return Ok(());
    }
    let settings = Settings::from_env();
    let program = std::env::args().next().unwrap_or_default();
    let cpu_samples = settings.cpu_samples;
    let signal = settings.signal;
    // A profiler before this one (stopped: `install` refuses otherwise)
    // hands over its function table, reset; no probe is on meanwhile.
    let (funcs, by_addr) = match get() {
        Some(old) => {
            for i in 0..old.funcs.len() {
                if let Some(f) = old.funcs.get(i) {
                    f.reset();
                }
            }
            (old.funcs, old.by_addr)
        }
        None => (
            &*Box::leak(Box::new(Segmented::new())),
            &*Box::leak(Box::new(Mutex::new(thread::FxMap::default()))),
        ),
    };
    let fresh = profiler::install(|generation| Profiler {
        state: State {
            live: live::Live::new(&settings),
            settings,
            funcs,
            by_addr,
            due: Due::default(),
            stores: Segmented::new(),
            stores_lock: AtomicBool::new(false),
            epoch_start: AtomicU64::new(0),
            exposure_began: AtomicU64::new(0),
            tpn: AtomicU64::new(0),
            path_epoch: AtomicU32::new(0),
            threads: Mutex::new(Vec::new()),
            counters: Counters::default(),
            start: Mutex::new((tsc::now(), Instant::now())),
            stop: AtomicBool::new(false),
            nap: AtomicU32::new(0),
            dump: AtomicBool::new(false),
            rearm_skipped: AtomicU64::new(0),
            sampler_ns: AtomicU64::new(0),
            sampler_done: AtomicBool::new(false),
            out,
            program,
            hook_ticks_before: crate::clock::threads().map(|t| t.hook_ticks()).sum(),
            // None unless asked for (see `crate::timeline`).
            timeline: crate::timeline::Log::from_env(0),
        },
        schedule: Schedule::new(on_entry, on_exit),
        generation,
    });
    if !fresh {
        return Ok(());
    }
    if let Some(p) = get() {
        // The functions taken over: each is the sampler's to hand out
        // before any of its probes is on (see `Due::push`).
        for fi in 0..p.funcs.len() {
            p.due.reserve(fi);
        }
    }
    // The hooks time themselves (the program clock), and the first epoch
    // starts now.
    let t0 = tsc::now();
    crate::hookcost::start_clock();
    let calibrated = tsc::now();
    // A `-finstrument-functions` exit from below the innermost timed call
    // in flight on its thread has nothing to pair with: it returns from the
    // hook at once (but for one in `clock::CHEAP_EXIT_LOOK_EVERY`).
    crate::clock::set_cheap_exits(true);
    // Entry calls discovered from now on count in stubs of their own, as
    // sleds do.
    crate::callcount::enable();
    crate::clock::advance_period(tsc::now());
    if let Some(p) = get() {
        p.epoch_start.store(tsc::now(), Ordering::Relaxed);
    }
    // CPU samples before any probe goes on: a thread opens its sampling
    // event when its first hook makes its store, and in a process that
    // runs (an attach), threads hooked before the samples were on never
    // opened one (an attached run once had no CPU sample at all). A new
    // generation forgets the last one's samples.
    if cpu_samples {
        cpusample::reset();
        uncharged::begin();
        cpusample::start();
    }
    let sampling = tsc::now();
    *ARM_LATER.lock().unwrap_or_else(|e| e.into_inner()) = Some(Vec::new());
    let listened = crate::api::listen(discovered);
    let later = ARM_LATER.lock().unwrap_or_else(|e| e.into_inner()).take();
    let listed = tsc::now();
    let armed = later.as_ref().map_or(0, Vec::len);
    for (id, entry) in later.unwrap_or_default() {
        arm(id, entry);
    }
    listened?;
    let switched = tsc::now();
    start_sampler();
    crate::log::debug(format_args!(
        "profile: started in {} ticks: hooks calibrated {}, CPU samples {}, functions listed {}, {armed} probes on {}, sampler {}",
        tsc::now().wrapping_sub(t0),
        calibrated.wrapping_sub(t0),
        sampling.wrapping_sub(calibrated),
        listed.wrapping_sub(sampling),
        switched.wrapping_sub(listed),
        tsc::now().wrapping_sub(switched)
    ));
    if signal != 0 {
        // SAFETY: installs a handler that only stores to an atomic.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as usize;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigaction(signal, &sa, std::ptr::null_mut());
        }
    }
    Ok(())
}

/// Changes the running profiler's sampling settings from its next epoch
/// (`KEY=VALUE` words: see `live::Live::set`); the settings as they now
/// stand, or why nothing changed.
pub(crate) fn set_settings(words: &str) -> Result<String, String> {
    let p = get().ok_or_else(|| "the profiler has not started".to_string())?;
    p.live.set(words)
}

/// For a detach ([`crate::attach`]), before its reports are written:
/// stops the sampler, closes the threads' CPU sample events and waits up
/// to `wait` for the sampler thread to leave its loop; true at once
/// without a profiler.
pub(crate) fn end_for_detach(wait: std::time::Duration) -> bool {
    let Some(p) = get() else { return true };
    p.request_stop();
    crate::clock::set_cheap_exits(false);
    uncharged::freeze();
    cpusample::close_events();
    let until = Instant::now() + wait;
    while !p.sampler_done.load(Ordering::Acquire) {
        if Instant::now() > until {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    true
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
        let start = s.exposure.advance(p);
        (s.epoch_x, s.epoch_cpu) = (start.x(), start.cpu);
        s.slowing = slowing::Slowing::starting_at(cpusample::next_slot());
        s.budget = budget::Budget::default();
    }
    *p.start.lock() = (now, Instant::now());
    // Functions between windows, or past a whole count's overflow, in the
    // parent have their entry probes off: re-armed now, so the child's
    // first calls are counted too (the child is one thread until it
    // returns from fork).
    // Its epochs start afresh: every function counted whole from now.
    p.due.clear();
    p.timeline.clear();
    crate::clock::advance_period(now);
    let mut rearmed = 0;
    for i in 0..p.funcs.len() {
        if let Some(f) = p.funcs.get(i) {
            f.reset();
            rearmed += rearm(p, f, false, 0);
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
    p.paths_may_change();
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
        uncharged::begin();
        cpusample::start();
    }
}
