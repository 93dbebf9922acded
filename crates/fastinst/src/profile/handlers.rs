//! The probes' handlers: `on_entry` and `on_exit` time, count and switch
//! themselves off from inside the hook.

use super::frames::{called_from, finish_frame};
use super::functions::{Func, Sample};
use super::local::with_local;
use super::profiler::{get, Profiler};
use super::state::{counting_epoch, func_of};
use super::store::Counters;
use super::thread::{Frame, Shadow, MAX_DEPTH, NO_NODE};
use super::window::Kind;
use crate::probe::ProbeId;
use crate::registry;
use std::sync::atomic::Ordering;
use wordpatch::tsc;

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
pub(super) fn pop_dead(p: &Profiler, sh: &mut Shadow, cfa: u64, caller: u64, exact: bool, entering: Option<u32>) {
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
pub(super) fn exit_off(p: &Profiler, f: &Func, id: ProbeId) -> bool {
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
/// very short epochs most of `tests/c/rearm.c`'s functions were lost in
/// every run, and some functions of one-threaded interpreters; at the
/// default epochs it is rarer, not impossible.
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
pub(super) fn reopened(f: &Func) -> bool {
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
pub(super) fn exit_watch_changed(p: &Profiler, f: &Func) {
    f.exit_gen.fetch_add(1, Ordering::SeqCst);
    if f.outstanding.load(Ordering::SeqCst) > 0 {
        paths_may_change(p);
    }
}

/// Invalidates every path node kept in a shadow-stack frame.
pub(super) fn paths_may_change(p: &Profiler) {
    p.path_epoch.fetch_add(1, Ordering::SeqCst);
}

pub(super) extern "C" fn on_entry(id: ProbeId) {
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

/// Counts a call of function `fi` on this thread; returns its calls on
/// the thread since its count was last marked.
#[inline(always)]
pub(super) fn count_call(fi: u32) -> u64 {
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
pub(super) fn count_whole(p: &Profiler, f: &Func, fi: u32, epoch: u32, id: ProbeId) {
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
pub(super) fn add_toggles(p: &Profiler, n: u64) {
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
pub(super) fn switch_off(p: &Profiler, f: &Func, fi: u32, id: ProbeId, gen: u64) {
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
pub(super) fn exits_on(p: &Profiler, f: &Func) -> u64 {
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

pub(super) extern "C" fn on_exit(id: ProbeId) {
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
