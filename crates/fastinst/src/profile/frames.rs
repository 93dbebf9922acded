//! Closing a sampled call: its duration in the program's own time, its
//! caller, its call path; and the calls a thread or the process leaves
//! open when it ends.

use super::functions::Func;
use super::profiler::{get, Profiler};
use super::store::{Counters, ThreadStore};
use super::thread::{Frame, Shadow};
use crate::probe::ProbeId;
use crate::registry;
use std::sync::atomic::Ordering;
use wordpatch::tsc;

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
pub(super) fn called_from(f: &Func, id: ProbeId, ret: u64) -> u64 {
    let Some(probe) = registry::get(id) else { return 0 };
    match f.is_inlined_site(probe.meta.site) {
        None => 0,
        Some(true) if probe.meta.inlined => probe.meta.site as u64,
        Some(_) => ret,
    }
}

/// Whether a timed call of `f` (function `fi`) made from `from` (0:
/// unknown) is its function's outermost activation, with `below` the
/// thread's timed frames under it: none of them is an activation of `fi`,
/// and the call was not made from `f`'s own code.
pub(super) fn outermost(below: &[Frame], fi: u32, f: &Func, from: u64) -> bool {
    let enclosed = below.iter().any(|fr| fr.func == fi);
    let self_called = from != 0 && f.contains(from as usize);
    !enclosed && !self_called
}

/// Pops the thread's top sampled frame and records it as a call that
/// returned at `t`, when the thread's hook time was `h1`; returns its
/// function.
pub(super) fn finish_frame(p: &Profiler, store: &ThreadStore, sh: &mut Shadow, t: u64, h1: u64) -> Option<u32> {
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
    f.timed.spread.record(dur);
    let self_ticks = dur.saturating_sub(done.child);
    // Read before any frame's watch stamp (see `Shadow::path_end`).
    let epoch = p.path_epoch.load(Ordering::SeqCst);
    let mut agg = store.agg.lock();
    let end = sh.path_end(&done, &mut agg.paths, epoch, |i| get().and_then(|p| p.funcs.get(i)));
    // Outermost unless an activation of the same function encloses it
    // (counted once, in the outermost: recursion is not time twice): a
    // timed one below it on this thread, or its caller, for a call made
    // from the function's own code. (Seen through timed frames alone, a
    // nested call whose enclosing calls were not timed looked outermost:
    // nearly every one does when few calls are timed, and a recursion's
    // total counted each level's time again.)
    let outer = outermost(&sh.frames, fi, f, done.from);
    let hooks = t.saturating_sub(done.t0).saturating_sub(dur);
    if agg.log(fi, done.from, dur, self_ticks, hooks, end, outer, done.weight) {
        agg.fold();
    }
    drop(agg);
    p.timeline.push(crate::timeline::Call {
        tid: store.tid,
        func: fi,
        start: done.t0,
        end: t,
        own: dur,
        weight: done.weight,
        depth: 0,
    });
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
