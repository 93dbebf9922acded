//! The probes' handlers: `on_entry` and `on_exit` time, count and switch
//! themselves off from inside the hook.

use super::choose;
use super::frames::{called_from, finish_frame, outermost};
use super::functions::Func;
use super::local::with_local;
use super::profiler::{get, Profiler};
use super::state::func_of;
use super::store::{Counters, ThreadStore};
use super::thread::{Frame, Shadow, MAX_DEPTH, NO_NODE};
use super::window::Kind;
use crate::probe::ProbeId;
use crate::registry;
use crate::sled::counter::Counter;
use std::sync::atomic::Ordering;
use wordpatch::tsc;

/// Pops the frames that cannot be live below an activation whose CFA is
/// `cfa` and whose return address is `caller`: a live caller's CFA is
/// higher, and the one activation at a given CFA has one return address
/// (an inlined function's hooks share both with the function they are
/// inlined into). What is popped was left by `longjmp`, an exception, or an
/// exit that was not seen; it is dropped and counted. Not on an alternate
/// signal stack, where a lower CFA says nothing about the interrupted
/// stack's frames ([`crate::altstack`]).
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
///
/// A dropped frame whose exit probe went off while it was in flight lost
/// its exit to that switch: it is recorded as censored, lasting at least
/// until the switch ([`super::survival`]), on `store`.
pub(super) fn pop_dead(
    p: &Profiler,
    store: &ThreadStore,
    sh: &mut Shadow,
    cfa: u64,
    caller: u64,
    exact: bool,
    entering: Option<u32>,
) {
    let tail_called_from = |f: &Frame| {
        exact && registry::get(f.entry).is_some_and(|e| (e.meta.site + providers::patchable::SLED_LEN) as u64 == caller)
    };
    let mut checked = false;
    while let Some(top) = sh.frames.last() {
        let live_here = top.cfa == cfa
            && (top.caller == caller || tail_called_from(top))
            && p.funcs.get(top.func).is_some_and(|f| top.watched(f))
            && !(entering == Some(top.func) && top.caller == caller);
        if top.cfa > cfa || live_here {
            break;
        }
        if !checked {
            // On an alternate signal stack, a lower CFA says nothing.
            if top.cfa != 0 && !crate::altstack::may_drop(top.cfa) {
                break;
            }
            checked = true;
        }
        if let Some(g) = p.funcs.get(top.func) {
            g.outstanding.fetch_sub(1, Ordering::Relaxed);
            if !top.watched(g) {
                if let Some(off) = g.timed.exit_log.off_after(top.exit_gen).filter(|&t| t > top.t0) {
                    // The hooks' time up to now, not only up to the switch,
                    // is taken off: still a time the call outlasted.
                    let h = crate::clock::current().map_or(top.h0, |c| c.hook_ticks());
                    let c = crate::clock::program_ticks(top.t0, top.h0, off, h);
                    let from = match top.from {
                        0 => called_from(g, top.entry, top.caller),
                        from => from,
                    };
                    let outer = outermost(&sh.frames[..sh.frames.len() - 1], top.func, g, from);
                    store.agg.lock().censor(top.func, c, top.weight, outer);
                    Counters::add_own(&store.counts.censored, 1);
                }
            }
        }
        p.counters.abandoned.fetch_add(1, Ordering::Relaxed);
        sh.frames.pop();
    }
}

/// Switches exit probe `id` of `f` off from a handler
/// ([`State::exit_probe_off`](super::state::State::exit_probe_off)), and
/// back on if the window reopened meanwhile ([`reopened`]). Whether it
/// switched (a toggle for the caller to count).
pub(super) fn exit_off(p: &Profiler, f: &Func, id: ProbeId) -> bool {
    let switched = p.exit_probe_off(f, id);
    if switched && reopened(f) && crate::activate(id, on_exit).is_ok() {
        p.exit_watch_changed(f, false);
    }
    switched
}

/// Whether `f`'s window has been reopened since a handler, which has
/// just switched one of `f`'s exit probes off, read it as closed; the
/// probe must then go back on at once.
///
/// A handler decides to switch an exit probe off from what it read (the
/// window closed, no timed call in flight), and the sampler may open the
/// next window between the read and the switch. The sampler switches exit
/// probes on before it marks the window open (so that no timed entry
/// misses its exit); the handler switches, fences, then reads `closed`.
/// So the check narrows the gap without closing it: an exit switched off
/// in it stays off for that window, which costs the window's timed calls
/// of the function (dropped as left without exit, never misattributed),
/// never the function.
pub(super) fn reopened(f: &Func) -> bool {
    std::sync::atomic::fence(Ordering::SeqCst);
    !f.closed.load(Ordering::Relaxed)
}

pub(super) extern "C" fn on_entry(id: ProbeId) {
    let Some(p) = get() else { return };
    let Some((f, fi, probe)) = func_of(p, id) else { return };
    let by_draw = |r: u64| {
        let j = f.chance.load(Ordering::Relaxed);
        choose::chosen(j, r).then_some(j)
    };
    // The stub counted the call, and sends on the one drawn for timing:
    // it claims the draw, and draws the next.
    let claim = |c: &Counter| {
        let j = f.chance.load(Ordering::Relaxed);
        // In the lane its stub counted it in: its thread's (which had a
        // clock unless this hook just made one; such a call claims nothing).
        let lane = crate::clock::current().map_or(0, |k| k.lane());
        next_draw().and_then(|r| c.claim(lane, j, choose::gap(j, r)))
    };
    let timed = match f.window.kind() {
        Kind::Whole => count_whole(p, f, fi, id).and_then(by_draw),
        // Between its windows the sampler keeps its probe off; one that
        // fires as a window closes is not counted.
        Kind::Windowed if f.window.is_open() => match crate::sled::counter_in(probe) {
            Some(c) => claim(c),
            None => count_call(fi).1.and_then(by_draw),
        },
        // Armed for a window not yet open: the drawn call is passed over
        // (the draws are memoryless), or every later call would come here
        // until the window opened.
        Kind::Windowed => crate::sled::counter_in(probe).and_then(claim).and(None),
    };
    // The shift the call was drawn at: it stands for `2^j` calls.
    let Some(j) = timed else {
        // Not timed: a light handler, no exit watched.
        crate::hooks::decline_exit();
        return;
    };
    f.took(j);
    // Every hook times itself while the profiler runs: this thread's clock
    // exists (the hook made it), unless the profiler started while this
    // hook was starting (then it is timed from its next call).
    let ctx = crate::hooks::context();
    let now = ctx.started;
    let Some(clock) = crate::clock::current() else { return };
    if now == 0 {
        return;
    }
    let Some(cfa) = crate::hooks::cfa(ctx) else {
        p.counters.no_cfa.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let h0 = clock.hook_ticks();
    let pushed = with_local(|store, sh| {
        pop_dead(p, store, sh, cfa, ctx.call_site as u64, ctx.cfa != 0, Some(fi));
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
            sp: ctx.stack as u64,
            t0: now,
            h0,
            child: 0,
            weight: choose::weight(j),
            node: NO_NODE,
            node_epoch: 0,
            open: false,
        });
        publish_timed(sh);
        f.prefetch_exit(ctx.call_site as u64);
    });
    if pushed.is_none() {
        p.counters.no_thread.fetch_add(1, Ordering::Relaxed);
    }
}

/// Publishes to this thread's clock where the innermost timed call in
/// flight called its entry hook, which the `-finstrument-functions` exit
/// hook compares its own call with: an exit from deeper on the stack (a
/// callee's) has nothing to pair with and takes the hook's cheap path
/// (`crate::clock::set_cheap_exits`). Called after every push, and after
/// the pops of an exit. A frame left by a `longjmp` is popped by the next
/// exit from above it, which runs its hook.
#[inline(always)]
fn publish_timed(sh: &Shadow) {
    if let Some(c) = crate::clock::current() {
        c.set_timed(sh.frames.last().map(|f| f.sp));
    }
}

/// This thread's next draw, for a call its stub counted (`None` on a
/// thread that is exiting).
#[inline(always)]
fn next_draw() -> Option<u64> {
    with_local(|store, _| linked_draw(store))
}

/// `store`'s next draw, its clock linked first if it is not yet.
#[inline(always)]
fn linked_draw(store: &ThreadStore) -> u64 {
    if store.clock.load(Ordering::Relaxed) == 0 {
        store.link_clock();
    }
    store.draw()
}

/// Counts a call of function `fi` on this thread; returns its calls on
/// the thread since its count was last marked, and the thread's next
/// draw for choosing whether to time it (`None` on a thread that is
/// exiting).
#[inline(always)]
pub(super) fn count_call(fi: u32) -> (u64, Option<u64>) {
    with_local(|store, _| (store.calls.bump(fi), Some(linked_draw(store)))).unwrap_or((0, None))
}

/// Counts a call of a function counted whole (through entry probe `id`);
/// its first of an epoch hands it to the sampler, which folds the epoch's
/// count. Past [`super::window::WHOLE_OVERFLOW`] calls on this thread in the
/// epoch its probe goes off, and the sampler makes it windowed. Returns
/// the draw for timing the call, as [`count_call`].
#[inline(always)]
pub(super) fn count_whole(p: &Profiler, f: &Func, fi: u32, id: ProbeId) -> Option<u64> {
    let (epoch, _) = crate::clock::period();
    let (k, draw) = count_call(fi);
    if f.window.counted_epoch.load(Ordering::Relaxed) != epoch {
        f.window.counted_epoch.store(epoch, Ordering::Relaxed);
        p.due.push(fi);
    }
    if k > p.live.whole_overflow() && f.counts_in_stubs() {
        // Its stubs count the rest of the epoch exactly, at a fraction of
        // a hook a call, and time none. (Going off lost the calls of a
        // burst that ended before the next epoch's windows: QuickJS's sort
        // comparator read 130 of a million.)
        if f.window.start_stub_count() {
            f.arm_counters(None, 0);
            f.window.stub_count_armed();
            p.due.push(fi);
        }
        return None;
    }
    if k > p.live.whole_overflow()
        && f.window
            .overflow_at
            .compare_exchange(0, tsc::now(), Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    {
        // Its exits go off once no timed call is in flight.
        f.closed.store(true, Ordering::SeqCst);
        if crate::deactivate(id).is_ok() {
            add_toggles(p, 1);
        }
        // Handed to the sampler after the switch: had the sampler folded
        // this epoch's count between the count above and the switch, it
        // re-armed the function just before the switch turned it off, and
        // with its probe off no later call would hand it over again: the
        // function was lost, counted whole at a few hundred calls (once in
        // CI, the demo's `hash` read 204 of 200,000).
        p.due.push(fi);
        return None;
    }
    draw
}

/// Adds `n` toggles to this thread's count (or the profiler's, on a
/// thread that is exiting).
pub(super) fn add_toggles(p: &Profiler, n: u64) {
    if with_local(|store, _| Counters::add_own(&store.counts.toggles, n)).is_none() {
        p.counters.toggles.fetch_add(n, Ordering::Relaxed);
    }
}

pub(super) extern "C" fn on_exit(id: ProbeId) {
    let Some(p) = get() else { return };
    let Some((f, fi, _)) = func_of(p, id) else { return };
    // The common case once the window has closed: nothing timed is in
    // flight, so this probe has no more work until the next window; it goes
    // off before the frame search.
    if f.closed.load(Ordering::Acquire) && f.outstanding.load(Ordering::Acquire) <= 0 {
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
        pop_dead(p, store, sh, cfa, ctx.call_site as u64, ctx.cfa != 0, None);
        match sh.frames.last() {
            Some(top) if top.cfa == cfa && top.func == fi => {}
            _ => {
                Counters::add_own(&store.counts.unmatched_exits, 1);
                // An exit of a call that was not timed (entered before the
                // window, not drawn, or through another copy): once the
                // window has closed and nothing timed is in flight, or the
                // window's budget of such exits is spent, this probe has no
                // more work until the next window.
                if f.closed.load(Ordering::Acquire)
                    && (f.outstanding.load(Ordering::Acquire) <= 0 || f.unmatched_over_budget())
                    && exit_off(p, f, id)
                {
                    Counters::add_own(&store.counts.toggles, 1);
                }
                publish_timed(sh);
                return;
            }
        }
        finish_frame(p, store, sh, t, h1);
        publish_timed(sh);
        let c = &store.counts;
        let left = f.outstanding.fetch_sub(1, Ordering::AcqRel) - 1;
        if left <= 0 && f.closed.load(Ordering::Acquire) && exit_off(p, f, id) {
            Counters::add_own(&c.toggles, 1);
        }
    });
    if r.is_none() {
        p.counters.no_thread.fetch_add(1, Ordering::Relaxed);
    }
}
