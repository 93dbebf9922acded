//! The windows of an epoch, in which calls are counted and drawn for
//! timing.
//!
//! At the epoch's start every windowed function
//! ([`super::window::Kind::Windowed`]) is given
//! [`Settings::windows`](super::Settings::windows) windows, more if it is
//! bursty (its windows hold few calls on average: up to [`MORE_MAX`] times
//! as many), each at a time drawn uniformly over the epoch, so that every
//! part of the epoch is as likely to be counted as any other. A window is
//! long enough to hold about [`TARGET`] calls at the function's busiest
//! recent rate, between one wake-up of the sampler and [`MAX_WINDOW_US`].
//!
//! The sampler opens and closes every window itself, at its wake-ups
//! (at most about every [`WAKE_US`], each interval drawn from half to one
//! and a half times it, so that they keep no step with the program, and
//! no sooner than the next window's time or end, [`next_event`]): a window
//! opens at the first wake-up past its time, if the windows open leave
//! room for it under the density setting's counted calls per tick of
//! exposure ([`Settings::density`](super::Settings::density); a
//! function busier than that alone is open alone; one without room waits,
//! and the windows planned after it wait behind it, so none starves), and
//! closes at the first wake-up past its length. So a window is a stretch of time that nothing
//! in the program decides: not a call of its function (a window closed
//! after its K-th call reads a rate measured up to a call, biased high for
//! a function called in bursts), nor of another (one opened when the last
//! closed starts on the last one's call, tied to the program's phases:
//! SQLite's sort comparisons read 0.1 of their count so). Its probes go
//! on just before it opens (exits first) and its entry probe off just
//! after it closes; the entry handler counts a call while the window is
//! open, and times it if its draw says so (`super::choose`: the chance is
//! fixed when the window is planned, from the calls its recent windows
//! held).
//!
//! The exposure clock is read when windows open and when they close, by
//! the sampler (`super::exposure`). Every hook times itself, so a window's
//! exposure has its counting hooks' time taken off, to within the few
//! ticks a hook's stamps cannot see; that error weighs in proportion to
//! the counted calls per tick in the window: hence the density. (Counting
//! hooks that did not time themselves, at a third of the cost, had their
//! cost calibrated in a loop, which missed what they cost in a real
//! program: interpreters' busiest functions read well under their calls;
//! see `crates/benches/results/accuracy.md`.)

use super::choose;
use super::exposure::{Exposure, Reading};
use super::functions::Func;
use super::state::State;
use super::window::{self, Kind};
use crate::probe::Handler;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, Ordering};
use wordpatch::tsc;

/// The sampler's mean least interval between wake-ups
/// (microseconds): it sleeps longer where no window opens or closes
/// sooner ([`next_event`]).
pub const WAKE_US: u64 = 150;

/// Calls a window aims to hold.
pub const TARGET: f64 = 16.0;

/// Longest window (microseconds).
pub const MAX_WINDOW_US: f64 = 1_000.0;

/// Most windows planned in one epoch (the buffers are made once: the
/// sampler allocates nothing; each window costs it two toggles).
pub const MAX_PER_EPOCH: usize = 2048;
/// Most windows open at once.
pub const MAX_OPEN: usize = 4096;
/// Most windowed functions.
pub const MAX_WINDOWED: usize = 65_536;

/// How many times its share of windows a bursty function may get.
pub const MORE_MAX: f64 = 4.0;

/// A queue entry already opened.
const TAKEN: u32 = u32::MAX;

/// The schedule.
pub(crate) struct Schedule {
    lock: AtomicBool,
    inner: UnsafeCell<Inner>,
}

// SAFETY: `inner` is touched only by the holder of `lock`.
unsafe impl Sync for Schedule {}
// SAFETY: as above.
unsafe impl Send for Schedule {}

/// An open window.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Win {
    pub fi: u32,
    /// The hooks its function's calls run per tick of exposure, at its
    /// rate when planned (see [`hooks_per_call`]).
    pub rate: f64,
    /// When it may close (wall TSC).
    pub until: u64,
    /// The exposure clock when it opened.
    pub start: Reading,
    /// It closes at this wake-up.
    pub closing: bool,
}

pub(crate) struct Inner {
    /// The handlers an open window's entry and exit probes call.
    entry: Handler,
    exit: Handler,
    /// The epoch the windows are for, and whether they are planned.
    pub epoch: u32,
    pub planned: bool,
    /// The raw sampler planned it (word patches are not made from it).
    pub raw: bool,
    /// The exposure clock.
    pub exposure: Exposure,
    /// The exposure when the running epoch began.
    pub epoch_x: f64,
    /// The threads' CPU time when the running epoch began.
    pub epoch_cpu: f64,
    /// The CPU samples' tallies of the profiler's slowing.
    pub slowing: super::slowing::Slowing,
    /// The scale on the timed calls.
    pub budget: super::budget::Budget,
    /// Where in the windowed functions the next epoch's plan begins (see
    /// `plan`).
    cursor: usize,
    /// The windows to open, by time: (wall TSC, function, hooks per tick
    /// of exposure, length in ticks, the chance of timing a call in it as a
    /// shift, the calls it should time).
    queue: Vec<(u64, u32, f64, u64, u8, u32)>,
    next: usize,
    /// The windows open.
    open: Vec<Win>,
    /// Windowed functions.
    pub windowed: Vec<u32>,
    /// Scratch for `plan`: (function, sizing rate, share of windows,
    /// calls per recent window, hooks per counted call).
    order: Vec<(u32, f64, f64, f64, f64)>,
}

impl Schedule {
    /// An empty schedule whose windows switch entry probes on with `entry`
    /// and exit probes with `exit` (the profiler's handlers).
    pub(crate) fn new(entry: Handler, exit: Handler) -> Self {
        Schedule {
            lock: AtomicBool::new(false),
            inner: UnsafeCell::new(Inner {
                entry,
                exit,
                epoch: 0,
                planned: false,
                raw: false,
                exposure: Exposure::default(),
                epoch_x: 0.0,
                epoch_cpu: 0.0,
                slowing: super::slowing::Slowing::default(),
                budget: super::budget::Budget::default(),
                cursor: 0,
                queue: Vec::with_capacity(MAX_PER_EPOCH),
                next: 0,
                open: Vec::with_capacity(MAX_OPEN),
                windowed: Vec::with_capacity(MAX_WINDOWED),
                order: Vec::with_capacity(MAX_WINDOWED),
            }),
        }
    }
}

/// Holds the schedule's lock.
pub(crate) struct Held<'a>(&'a Schedule);

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.lock.store(false, Ordering::Release);
    }
}

impl std::ops::Deref for Held<'_> {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        // SAFETY: the lock is held (see `Schedule`).
        unsafe { &*self.0.inner.get() }
    }
}

impl std::ops::DerefMut for Held<'_> {
    fn deref_mut(&mut self) -> &mut Inner {
        // SAFETY: the lock is held, by this guard alone.
        unsafe { &mut *self.0.inner.get() }
    }
}

impl Schedule {
    /// The schedule (the sampler, or a report; no one holds it for more
    /// than a wake-up's work).
    pub(crate) fn hold(&self) -> Held<'_> {
        crate::spin::acquire(&self.lock);
        Held(self)
    }

    /// Releases a lock held by a thread that no longer exists (a forked
    /// child).
    ///
    /// # Safety
    /// No other thread of this process may hold or take the lock.
    pub(crate) unsafe fn force_unlock(&self) {
        self.lock.store(false, Ordering::Release);
    }
}

/// Epoch `epoch` has no windows (yet, or in a forked child, any more).
pub(crate) fn idle(s: &mut Inner, epoch: u32) {
    s.epoch = epoch;
    turn(s);
    s.open.clear();
}

/// The sampler's wake-up: arms the windows whose time has come and that
/// fit, then closes the windows whose time is up and opens the armed ones
/// back to back, with one reading of the clock between them.
///
/// Why in that order: arming a window switches its probes on, toggles of
/// a few microseconds each, and closing one switches them off. Closed
/// first and opened after those toggles, the windows left a gap at every
/// wake-up in which fewer of them were open: there the program ran with
/// fewer hooks, faster than in any window, and no window counted it.
/// With most windows lasting a wake-up or two, the gaps were a tenth of
/// the run, and 200 short functions called in turn read their calls
/// 10-40% low: their windows' rates, taken where the hooks crowded, stood
/// for the gaps too. Now the only time between one window's end and the
/// next one's start is the setting of their flags.
pub(crate) fn wake(p: &State, s: &mut Inner) {
    if !s.planned {
        return;
    }
    let now = tsc::now();
    let density = p.live.density();
    let (mut load, mut busy, mut staying) = (0.0, false, 0);
    for w in s.open.iter_mut() {
        w.closing = w.until <= now;
        if w.closing {
            continue;
        }
        staying += 1;
        if w.rate > density {
            busy = true;
        } else {
            load += w.rate;
        }
    }
    let first = s.open.len();
    let mut j = s.next;
    while j < s.queue.len() && s.open.len() < MAX_OPEN {
        let (at, fi, rate, len, chance, budget) = s.queue[j];
        if at > now {
            break;
        }
        j += 1;
        if fi == TAKEN {
            continue;
        }
        // Windows share the density; one busier than that alone is open
        // alone.
        let fits = if rate > density {
            staying == 0
        } else {
            !busy && load + rate <= density
        };
        // A busy window that does not fit waits, and so do all planned
        // after it, until the open ones close: letting later windows past
        // it starved the busiest functions, which need the others closed
        // (SQLite's aggregate and sorter functions went a whole run on
        // their first few windows, their rates extrapolated over it). A
        // smaller one that does not fit lets the rest try.
        if !fits {
            if rate > density {
                break;
            }
            continue;
        }
        // A function's next window waits for its last to close (one
        // closing now included: its probes are still on).
        if s.open.iter().any(|w| w.fi == fi) {
            continue;
        }
        s.queue[j - 1].1 = TAKEN;
        if arm(p, s, fi, chance, budget) {
            p.counters.windows_opened.fetch_add(1, Ordering::Relaxed);
            s.open.push(Win {
                fi,
                rate,
                until: len,
                start: Reading::default(),
                closing: false,
            });
            staying += 1;
            if rate > density {
                busy = true;
            } else {
                load += rate;
            }
        }
    }
    while s.queue.get(s.next).is_some_and(|q| q.1 == TAKEN) {
        s.next += 1;
    }
    swap(p, s, first);
}

/// When [`wake`] next has work (wall TSC): the first open window's end, or
/// the first queued window's time after `now`; `None` where it has none
/// before the epoch's end. A queued window that is due but did not fit
/// waits for an open one to close, which is the first of these.
///
/// The sampler sleeps until then rather than waking at its usual
/// interval regardless: a wake-up with nothing to do still cost the
/// program a context switch and, where its threads filled the CPUs, the
/// CPU time itself, which no hook's stamps see and so stayed in every
/// long call's duration (docs/profiler.md, "The sampler wakes only for
/// windows").
pub(crate) fn next_event(s: &Inner, now: u64) -> Option<u64> {
    if !s.planned {
        return None;
    }
    let close = s.open.iter().map(|w| w.until).min();
    let rest = &s.queue[s.next.min(s.queue.len())..];
    let due = rest.partition_point(|q| q.0 <= now);
    let open = rest[due..].iter().find(|q| q.1 != TAKEN).map(|q| q.0);
    match (close, open) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Ends the windows marked closing and starts those from `first` on:
/// their counting stops and starts together, one reading of the clock
/// ends the first and starts the second (a call counted on either side
/// of it is at most a few counted too many or too few, against windows
/// of hundreds of microseconds), and only then do the closed windows'
/// probes go off and their counts join their functions' estimates.
fn swap(p: &State, s: &mut Inner, first: usize) {
    let closing = s.open[..first].iter().any(|w| w.closing);
    if !closing && s.open.len() == first {
        return;
    }
    for w in s.open[..first].iter().filter(|w| w.closing) {
        if let Some(f) = p.funcs.get(w.fi) {
            f.window.set_open(false);
            f.closed.store(true, Ordering::SeqCst);
            // Its stubs stop counting with its handlers.
            f.disarm_counters();
        }
    }
    for w in &s.open[first..] {
        if let Some(f) = p.funcs.get(w.fi) {
            f.window.set_open(true);
            // Its stubs have counted since they were armed, which for
            // the first of many windows armed together is long before
            // this reading (SQLite's and a 20,000-function program's
            // windows read their calls at up to twice): the window
            // counts from here.
            f.mark_counters();
        }
    }
    let x = s.exposure.advance(p);
    for w in &mut s.open[first..] {
        w.until += x.at;
        w.start = x;
    }
    if closing {
        close_marked(p, s, x);
    }
}

/// Switches `f`'s exit probes off, if they are on and no timed call of
/// `f` is in flight ([`State::exit_probe_off`]); returns the toggles.
/// Its handlers switch them off too, on an exit after the window has
/// closed, but a `-finstrument-functions` exit from below the innermost
/// timed call on its thread takes the hook's cheap path and runs none
/// (`crate::clock::set_cheap_exits`): without this, an exit probe
/// stayed on after its window, each call of a hot function paying the
/// cheap path. (The sampler opens windows itself: none reopens under it.)
fn exits_off(p: &State, f: &Func) -> u64 {
    if f.outstanding.load(Ordering::SeqCst) > 0 {
        return 0;
    }
    let mut toggles = 0;
    f.probes.for_each(|id, is_entry| {
        if !is_entry && crate::is_active(id).unwrap_or(false) && p.exit_probe_off(f, id) {
            toggles += 1;
        }
    });
    toggles
}

/// Switches function `fi`'s probes on for a window, exits first so that
/// no timed entry misses its exit, marks its counters and arms its stubs'
/// (`crate::sled::counter`), and sets the chance
/// of timing a call in it (`2^-chance`); whether it is armed.
fn arm(p: &State, s: &Inner, fi: u32, chance: u8, budget: u32) -> bool {
    let Some(f) = p.funcs.get(fi) else { return false };
    if f.window.kind() != Kind::Windowed {
        return false;
    }
    p.open_counts(fi);
    f.arm_counters(Some(chance), tsc::now() ^ (u64::from(fi) << 32));
    let (toggles, skipped) = p.arm(f, chance, budget, s.raw, s.entry, s.exit);
    p.counters.toggles.fetch_add(toggles, Ordering::Relaxed);
    if skipped {
        p.rearm_skipped.fetch_add(1, Ordering::Relaxed);
    }
    true
}

/// The hooks a call counted in a window of `f` runs: its entry's, and its
/// exit's where the exit probe is on for every call in the window (a
/// `-finstrument-functions` build's exit hook call), not only for the
/// timed ones (a sled's exit, watched from its entry). The density is
/// shared in hooks, so that a build whose counted calls cost two hooks
/// counts no more hook time than one whose calls cost one. A call that
/// a stub counts (a sled's, or a `-finstrument-functions` entry call's)
/// runs no entry hook: it costs the counting path's share of one
/// (`crate::hookcost::counted_call_hooks`); an exit that takes the exit
/// hook's cheap path, likewise (`crate::hookcost::cheap_exit_hooks`).
fn hooks_per_call(f: &Func) -> f64 {
    let exit = if f.exits_follow_entry.load(Ordering::Relaxed) {
        0.0
    } else if crate::clock::cheap_exits() {
        crate::hookcost::cheap_exit_hooks()
    } else {
        1.0
    };
    let entry = if f.counts_in_stubs() {
        crate::hookcost::counted_call_hooks()
    } else {
        1.0
    };
    entry + exit
}

/// How many times its share of windows a function gets whose counted
/// calls cost `hooks` hooks each: a sled function whose stub counts costs
/// a fraction of a hook a call, and the same share of the density covers
/// more of its time with windows, which is what its estimate's spread
/// shrinks with. At most [`COUNTING_BOOST_MAX`].
fn counting_boost(hooks: f64) -> f64 {
    (1.0 / hooks.max(1e-3)).sqrt().clamp(1.0, COUNTING_BOOST_MAX)
}

/// The most [`counting_boost`] gives.
pub const COUNTING_BOOST_MAX: f64 = 4.0;

/// Closes every open window (the epoch's end): their counting and timing
/// stop, one reading of the clock ends them all ([`swap`]).
fn close_all(p: &State, s: &mut Inner) {
    for w in s.open.iter_mut() {
        w.closing = true;
    }
    let n = s.open.len();
    swap(p, s, n);
}

/// Takes the windows marked closing out, their counting stopped before
/// reading `end`: their entry probes go off (exit probes go off from
/// their handlers once no timed call is in flight), and each one's calls
/// over its exposure join its function's estimate.
fn close_marked(p: &State, s: &mut Inner, end: Reading) {
    let mut k = 0;
    while k < s.open.len() {
        let w = s.open[k];
        if !w.closing {
            k += 1;
            continue;
        }
        s.open.swap_remove(k);
        let Some(f) = p.funcs.get(w.fi) else { continue };
        let mut toggles = 0;
        f.probes.for_each(|id, is_entry| {
            if is_entry && crate::deactivate(id).is_ok() {
                toggles += 1;
            }
        });
        toggles += exits_off(p, f);
        p.counters.toggles.fetch_add(toggles, Ordering::Relaxed);
        if f.window.kind() != Kind::Windowed {
            continue;
        }
        let n = p.counted(w.fi) + f.counted_since_open();
        let x = end.x() - w.start.x();
        // Exposure is CPU time less the hooks' time, read at two moments:
        // in a window the hooks nearly filled, what is left can be noise
        // about zero, and one such window made a rate of calls per tick
        // without bound (Lua's `luaV_mod` once read orders of magnitude
        // over its calls). No call of a program's own takes under a few
        // ticks.
        if window::rate_of(n as f64, x).is_none() {
            p.counters.windows_void.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        // SAFETY: the schedule's lock is held.
        unsafe { f.window.estimate_mut() }.add_window(n, x, end.cpu - w.start.cpu, end.hooks - w.start.hooks);
    }
}

/// Plans epoch `epoch`, beginning at `now` and lasting about `len` ticks:
/// its windows' times, and the chance of timing a call in each, so that
/// about [`Settings::samples`](super::Settings::samples) calls of each
/// function are timed in the epoch. The windowed functions' probes go off
/// until their windows.
pub(crate) fn plan(p: &State, s: &mut Inner, epoch: u32, now: u64, len: u64, tpn: f64, rng: &mut u64) {
    s.epoch = epoch;
    turn(s);
    s.planned = true;
    let threads = p
        .stores()
        .filter(|t| t.died.load(Ordering::Relaxed) == 0)
        .count()
        .max(1) as f64;
    let (min, max) = (WAKE_US as f64 * 1e3 * tpn, MAX_WINDOW_US * 1e3 * tpn);
    s.order.clear();
    for &fi in &s.windowed {
        if let Some(f) = p.funcs.get(fi) {
            // SAFETY: the schedule's lock is held.
            let e = unsafe { f.window.estimate_mut() };
            // Windows sized for its busy stretches hold fewer calls on
            // average the burstier it is: it gets more of them (its count
            // varies more from window to window), at about the same
            // counting cost.
            let hooks = hooks_per_call(f);
            let more = (TARGET / e.mean_calls().max(1.0)).clamp(1.0, MORE_MAX) * counting_boost(hooks);
            s.order.push((fi, e.sizing_rate(), more, e.mean_calls(), hooks));
            if f.window.is_open() {
                // A window run on from the last epoch: on until it closes.
                continue;
            }
            // Off until its windows (one counted whole until now has them on).
            f.closed.store(true, Ordering::SeqCst);
            f.window.set_open(false);
            f.probes.for_each(|id, is_entry| {
                if is_entry && crate::deactivate(id).is_ok() {
                    p.counters.toggles.fetch_add(1, Ordering::Relaxed);
                }
            });
            p.counters.toggles.fetch_add(exits_off(p, f), Ordering::Relaxed);
        }
    }
    let want = f64::from(p.live.samples()) * s.budget.scale();
    // Shares that would plan more windows than the queue holds shrink
    // alike: cutting the queue at its end instead left the functions last
    // in the order with no window in any epoch, their calls estimated from
    // none (Lua's `lua_geti` read 65 of 2.7 million).
    let planned: f64 = s.order.iter().map(|o| p.live.windows() as f64 * o.2).sum();
    let fit = (MAX_PER_EPOCH as f64 / planned.max(1.0)).min(1.0);
    // Where even one window each overflows it, the next epoch begins
    // with the first function this one left without.
    let n = s.order.len();
    let first = s.cursor % n.max(1);
    let mut served = n;
    for i in 0..n {
        if s.queue.len() >= MAX_PER_EPOCH {
            served = i;
            break;
        }
        let (fi, r, more, per_window, hooks) = s.order[(i + first) % n];
        let k = (p.live.windows() as f64 * more * fit).round().max(1.0) as usize;
        let wlen = (if r > 0.0 { TARGET / (r * threads) } else { max }).clamp(min, max) as u64;
        let span = len.saturating_sub(wlen).max(1);
        // The weights undo whatever chance is chosen; this one aims at the
        // wanted timed calls over the epoch's windows, from the calls its
        // recent windows held (a window's calls are what the hooks let
        // run in it, which no rate of the program's own time predicts),
        // or, before its first, from its rate.
        let expected = if per_window > 0.0 {
            per_window
        } else {
            r * threads * wlen as f64
        };
        // More timed calls of a function whose durations spread more.
        let want = want * p.funcs.get(fi).map_or(1.0, |f| f.timed.spread.boost());
        let chance = choose::shift_for(expected, want / k as f64);
        let budget = (want / k as f64).ceil() as u32;
        for _ in 0..k {
            if s.queue.len() >= MAX_PER_EPOCH {
                break;
            }
            let at = now + next_random(rng) % span;
            s.queue.push((at, fi, r * hooks, wlen, chance, budget));
            p.counters.windows_planned.fetch_add(1, Ordering::Relaxed);
        }
    }
    s.cursor = first + served;
    s.queue.sort_unstable_by_key(|q| q.0);
}

/// Ends the epoch's plan at the sampler's turn of epochs: the rest of the
/// queue is dropped, and the open windows run on into the next epoch,
/// whose rates they join when they close.
///
/// Why not closed with the epoch: the next epoch's first windows open
/// only at its first wake-ups, and until then the program ran with no
/// window's hooks, faster than in any window, and uncounted. Where the
/// hooks of timed calls are most of a window's time, that stretch, a few
/// hundredths of the run, held a fifth of its calls (200 functions of a
/// few nanoseconds each read 20% low).
pub(crate) fn turn(s: &mut Inner) {
    s.queue.clear();
    s.next = 0;
    s.planned = false;
}

/// Stops function `fi`'s open window, if it has one, and forgets it: its
/// count is lost, its probes stay as they are (a function going back to
/// being counted whole, whose probes its rearming switches on).
pub(crate) fn drop_window(p: &State, s: &mut Inner, fi: u32) {
    let Some(f) = p.funcs.get(fi).filter(|f| f.window.is_open()) else {
        return;
    };
    if let Some(k) = s.open.iter().position(|w| w.fi == fi) {
        s.open.swap_remove(k);
    }
    f.window.set_open(false);
    f.disarm_counters();
}

/// Ends the run's windows: open windows close now and the rest of the
/// queue is dropped.
pub(crate) fn finish(p: &State, s: &mut Inner) {
    close_all(p, s);
    turn(s);
}

impl Inner {
    /// Every windowed function folds the epoch just finished,
    /// which spanned exposure `[self.epoch_x, x_now)`.
    pub(crate) fn fold(&mut self, p: &State, x_now: f64) {
        let from = self.epoch_x;
        for &fi in &self.windowed {
            if let Some(f) = p.funcs.get(fi) {
                // SAFETY: the schedule's lock is held (`self` is behind it).
                unsafe { f.window.estimate_mut() }.fold_epoch(from, x_now);
            }
        }
    }
}

/// The sampler's generator (xorshift64), seeded by the clock on first use.
pub(crate) fn next_random(rng: &mut u64) -> u64 {
    if *rng == 0 {
        *rng = tsc::now() | 1;
    }
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    *rng
}
