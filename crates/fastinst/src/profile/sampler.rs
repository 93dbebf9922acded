//! The sampler thread: it runs the epochs (timing, then counting), re-arms
//! the probes, folds the threads' aggregates and wakes for on-demand
//! reports.

use super::functions::Func;
use super::handlers::{on_entry, on_exit};
use super::profiler::{get, Profiler};
use super::schedule::next_random;
use super::settings::Sampler;
use super::state::ticks_per_ns;
use super::window::Kind;
use super::{choose, schedule, window};
use crate::registry;
use crate::Strategy;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use wordpatch::tsc;

/// Switches the probes of `f`, a function counted whole, that are off
/// back on, exits first so that no timed entry misses its exit; its calls
/// are timed with chance `2^-chance` ([`choose`]). Returns how many it
/// switched. On the raw sampler (`raw`) a probe whose switch would take a
/// word patch is left off and counted ([`Profiler::rearm_skipped`]).
pub(super) fn rearm(p: &Profiler, f: &Func, raw: bool, chance: u8) -> u64 {
    let want = (f64::from(p.live.samples()) * f.timed.spread.boost()).round() as u32;
    let (toggles, skipped) = p.arm(f, chance, want, raw, on_entry, on_exit);
    if skipped {
        p.rearm_skipped.fetch_add(1, Ordering::Relaxed);
    }
    toggles
}

/// Starts loading what re-arming the functions `due` touches, in stages,
/// each reading only what the one before it loaded: each function's
/// record (and the first line of its longer probe lists), then its
/// probes' records, then the code (and sled) lines of those that are off.
/// A function is re-armed once per epoch, so all of it is cold; one by
/// one, each of ~100 functions per epoch waited for ~10 misses in turn.
pub(super) fn prefetch_epoch(p: &Profiler, due: &[u32]) {
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
pub(super) const BATCH: usize = 1024;

/// One tick of the sampler: the epoch that was running ends now, and the
/// next, of about `len` ticks, begins.
///
/// Every windowed function folds the windows that closed in the epoch
/// ([`window`]; those still open run on into the next,
/// [`schedule::turn`]); one whose rate now predicts few calls an epoch
/// goes back to being counted whole. Every function counted whole
/// that was called folds its count, and goes windowed if the epoch held
/// many calls; otherwise its probes stay on, and the chance that each of
/// its calls is timed is set from the epoch's count. Then the next epoch's
/// windows are planned ([`schedule::plan`]).
///
/// It allocates nothing and takes no lock that parks, so it can run on a
/// thread the C library does not know ([`crate::rawthread`]): `due` is
/// filled up to its capacity, never past it, and the schedule's buffers
/// were made with theirs.
pub(super) fn epoch(p: &'static Profiler, due: &mut Vec<u32>, raw: bool, rng: &mut u64, len: u64) {
    let tpn = ticks_per_ns(p);
    let mut s = p.schedule.hold();
    s.exposure.set_rate(tpn);
    schedule::turn(&mut s);
    let x = s.exposure.advance(p);
    let (now, x_now) = (x.at, x.x());
    let epoch_x = s.epoch_x;
    let t0 = p.epoch_start.load(Ordering::Relaxed);
    let p_epoch = (x_now - epoch_x).max(0.0);
    // The calls an epoch holds are judged in an epoch of the program's own
    // time: an epoch the hooks mostly filled held few calls because the
    // hooks slowed them, and judged by its wall count every function of a
    // program of many short ones stayed whole, every call hooked and
    // timed, which slowed it further (20,000 functions of a few ns each ran
    // at a fiftieth of their speed). The hooks' charges see part of the
    // slowing, the CPU samples all of it (`super::slowing`): the larger.
    let cpu_epoch = x.cpu - s.epoch_cpu;
    let (cursor, samples, profiler) = super::cpusample::tally_since(s.slowing.cursor());
    let sampled = s.slowing.fold(cursor, samples, profiler);
    let stretch = window::stretch(cpu_epoch, p_epoch).max(sampled.map_or(1.0, |t| t.stretch));
    // The timed calls' scale for the next epoch (`super::budget`): from
    // the samples' share of profiler time, else the hooks' charged share.
    let charged = (cpu_epoch > 0.0).then(|| ((cpu_epoch - p_epoch) / cpu_epoch).clamp(0.0, 1.0));
    let scale = s.budget.end_epoch(sampled.map(|t| t.share).or(charged), p.live.share());
    s.fold(p, x_now);
    let mut k = 0;
    while k < s.windowed.len() {
        let fi = s.windowed[k];
        let Some(f) = p.funcs.get(fi) else {
            k += 1;
            continue;
        };
        // SAFETY: the schedule's lock is held.
        let quiet = unsafe { f.window.estimate_mut() }.slow_rate() * p_epoch * stretch < window::WHOLE_BELOW;
        if quiet {
            schedule::drop_window(p, &mut s, fi);
            // SAFETY: the schedule's lock is held.
            unsafe { f.window.estimate_mut() }.go_whole(x_now);
            p.open_counts(fi);
            f.window.set_kind(Kind::Whole);
            s.windowed.swap_remove(k);
            p.due.push(fi);
        } else {
            k += 1;
        }
    }
    let next = crate::clock::advance_period(now);
    p.epoch_start.store(now, Ordering::Relaxed);
    (s.epoch_x, s.epoch_cpu) = (x_now, x.cpu);
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
                // Windowed: armed by its windows.
                continue;
            }
            let folded = p.fold_whole(f, i);
            if folded.handing_over {
                // Whole until its stubs' count can be read, at the next fold.
                p.due.push(i);
                continue;
            }
            let (n, overflow) = (folded.n, folded.overflow);
            let above = window::WINDOWED_ABOVE * p.live.epoch_scale();
            // SAFETY: the schedule's lock is held.
            let e = unsafe { f.window.estimate_mut() };
            let busy = window::stretched_past(n, stretch, above, e.counted);
            if (overflow != 0 || busy) && p_epoch > 0.0 && s.windowed.len() < schedule::MAX_WINDOWED {
                if overflow != 0 {
                    e.go_windowed_after_overflow(n as f64, overflow, p.exposed_from(t0), now, epoch_x, p_epoch);
                } else {
                    e.go_windowed_after_epoch(x_now, n as f64, p_epoch);
                }
                f.window.set_kind(Kind::Windowed);
                s.windowed.push(i);
                continue;
            }
            let chance = choose::shift_for(n as f64, f64::from(p.live.samples()) * f.timed.spread.boost() * scale);
            toggles += rearm(p, f, raw, chance);
        }
    }
    s.raw = raw;
    schedule::plan(p, &mut s, next, now, len, tpn, rng);
    schedule::wake(p, &mut s);
    drop(s);
    // Once per epoch: the handlers update this counter too.
    p.counters.toggles.fetch_add(toggles, Ordering::Relaxed);
}

/// The length of the next epoch: the setting times a factor uniform in
/// [0.5, 1.5), from a generator seeded by the clock, so that epochs do not
/// keep step with a periodic pattern of the program's calls.
pub(super) fn next_sleep(p: &Profiler, rng: &mut u64) -> Duration {
    let u = (next_random(rng) >> 11) as f64 / (1u64 << 53) as f64;
    p.live.epoch().mul_f64(0.5 + u)
}

/// The first epoch, where every function is counted whole, is short:
/// the busy ones are windowed from the second.
pub(super) fn first_sleep(p: &Profiler) -> Duration {
    p.live.epoch().min(Duration::from_millis(1))
}

/// Sleeps through an epoch of `d`, waking to open and close its windows:
/// no sooner than about [`schedule::WAKE_US`] after the last wake-up, and
/// otherwise at the next window's time or end ([`schedule::next_event`]),
/// so that a stretch with no window due costs the program no wake-up. A
/// stop ([`State::request_stop`](super::state::State::request_stop))
/// ends the sleep at once.
pub(super) fn sleep_epoch(p: &Profiler, d: Duration, rng: &mut u64) {
    let end = Instant::now() + d;
    let mut next = {
        let s = p.schedule.hold();
        schedule::next_event(&s, tsc::now())
    };
    loop {
        let seen = p.nap.load(Ordering::Acquire);
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() || p.stop.load(Ordering::Acquire) {
            return;
        }
        let u = (next_random(rng) >> 11) as f64 / (1u64 << 53) as f64;
        let least = Duration::from_micros(schedule::WAKE_US).mul_f64(0.5 + u);
        let until_next = next.map_or(left, |at| {
            Duration::from_nanos((at.saturating_sub(tsc::now()) as f64 / ticks_per_ns(p)) as u64)
        });
        let nap = least.max(until_next);
        if nap >= left {
            // To the epoch's end, whose turn opens what is due then.
            crate::rawthread::wait(&p.nap, seen, left);
            return;
        }
        crate::rawthread::wait(&p.nap, seen, nap);
        if p.stop.load(Ordering::Acquire) {
            return;
        }
        let mut s = p.schedule.hold();
        schedule::wake(p, &mut s);
        next = schedule::next_event(&s, tsc::now());
        p.counters.wakeups.fetch_add(1, Ordering::Relaxed);
    }
}

pub(super) fn sampler_pthread() {
    let Some(p) = get() else { return };
    crate::rawthread::set_timer_slack(1_000);
    let mut due = Vec::with_capacity(BATCH);
    let mut dumping = 0;
    let mut rng = 0;
    let mut cur = first_sleep(p);
    while !p.stop.load(Ordering::Relaxed) {
        sleep_epoch(p, cur, &mut rng);
        cur = next_sleep(p, &mut rng);
        epoch(p, &mut due, false, &mut rng, duration_ticks(p, cur));
        if p.dump.swap(false, Ordering::AcqRel) {
            let before = crate::rawthread::thread_cpu_ns();
            super::output::write_reports(true);
            dumping += crate::rawthread::thread_cpu_ns().saturating_sub(before);
        }
        let used = crate::rawthread::thread_cpu_ns().saturating_sub(dumping);
        p.sampler_ns.store(used, Ordering::Relaxed);
    }
    p.sampler_done.store(true, Ordering::Release);
}

/// `d` in TSC ticks.
pub(super) fn duration_ticks(p: &Profiler, d: Duration) -> u64 {
    (d.as_nanos() as f64 * ticks_per_ns(p)) as u64
}

/// The sampler on a raw thread ([`crate::rawthread`]). `arg` is its batch
/// buffer, a leaked `Vec<u32>` with capacity [`BATCH`].
pub(super) extern "C" fn sampler_raw(arg: usize) {
    // SAFETY: `start_sampler` leaked this Vec for this thread alone.
    let due = unsafe { &mut *(arg as *mut Vec<u32>) };
    let Some(p) = get() else { return };
    crate::rawthread::set_timer_slack(1_000);
    let mut rng = 0;
    let mut cur = first_sleep(p);
    while !p.stop.load(Ordering::Relaxed) {
        sleep_epoch(p, cur, &mut rng);
        if p.stop.load(Ordering::Relaxed) {
            break;
        }
        cur = next_sleep(p, &mut rng);
        epoch(p, due, true, &mut rng, duration_ticks(p, cur));
        p.sampler_ns.store(crate::rawthread::thread_cpu_ns(), Ordering::Relaxed);
    }
    p.sampler_done.store(true, Ordering::Release);
}

pub(super) extern "C" fn on_signal(_: libc::c_int) {
    // Async-signal-safe: one atomic store; the daemon writes the reports.
    if let Some(p) = get() {
        p.dump.store(true, Ordering::Release);
    }
}

/// Starts the sampler: on a raw thread ([`crate::rawthread`]) unless the
/// settings need a regular one (see [`Sampler`]) or `clone` fails.
pub(super) fn start_sampler() {
    let Some(p) = get() else { return };
    let word = matches!(crate::strategy(), Strategy::WordSync | Strategy::WordAsync);
    if p.settings.sampler == Sampler::Clone && p.settings.signal == 0 && !word {
        let due = Box::into_raw(Box::new(Vec::<u32>::with_capacity(BATCH))) as usize;
        // SAFETY: `sampler_raw` and `epoch` allocate nothing, park on no
        // lock and call no libc function (see `epoch`); the buffer is
        // leaked to the thread, which runs until the process exits.
        match unsafe { crate::rawthread::spawn(sampler_raw, due, crate::arch::tls::depth()) } {
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
            "profile: cannot start the sampling thread: {e}; every call is counted and timed, at a tracer's cost"
        ));
    }
}
