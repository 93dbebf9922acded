//! The program clock: how much of each thread's time its hooks took, so a
//! tool can measure the program's own time (wall time minus hook time).
//!
//! While [`set_clocked`] is on, every hook stamps the TSC as its first act
//! (the `-finstrument-functions` stubs and the sled trampolines read it
//! before they do anything else) and adds what it took, up to the end of
//! its handler, to its thread's [`ThreadClock::hook_ticks`]. A duration
//! measured between two hooks of one thread, less the growth of that
//! counter between them, is then the program's own time: neither the two
//! hooks nor any hook that ran in between (a sampled callee, another
//! function's counting) is in it. What a stamp cannot see is the few
//! instructions before it and after the handler (the `call`, the stub's
//! jump, the return) and the TSC reads' own cost: `hookcost` measures
//! it once per process and every hook adds it to its time
//! ([`unseen_ticks`]).
//!
//! A sled's counting stub (`crate::sled::counter`) counts a call without
//! any hook: it cannot stamp, so it adds one to its thread's
//! [`ThreadClock::fast_calls`] instead, and each such call is charged the
//! calibrated cost of that path ([`fast_cost`]) in
//! [`ThreadClock::hook_ticks`].
//!
//! A `-finstrument-functions` exit hook has a cheap path too
//! ([`set_cheap_exits`]): while the profiler runs, an exit from deeper on
//! its thread's stack than the innermost timed call in flight
//! ([`ThreadClock::set_timed`]) has nothing to pair with, and returns at
//! once, adding one to
//! [`ThreadClock::fast_exits`], charged at that path's calibrated cost
//! ([`fast_exit_cost`]); one in [`CHEAP_EXIT_LOOK_EVERY`] runs the whole
//! hook, so that no exit call site stays undiscovered.
//!
//! Periods: a tool may cut time into periods ([`advance_period`]); each
//! thread notes its hook ticks at its first hook of a period, which are its
//! hook ticks at the period's start (no hook of the thread ran in between).
//! So the hook time a thread spent since the period began is known without
//! any thread stopping at the boundary.
//!
//! Records are never freed: another thread (the profiler's sampler, a
//! handler closing a window) may read any thread's counters at any time,
//! and a thread that exits leaves its final counts and its end.

use crate::segmented::Segmented;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use wordpatch::tsc;

/// Whether hooks time themselves. Read by the hook stubs and trampolines
/// (`sym`): a byte they compare with 0.
pub(crate) static FASTINST_CLOCKED: AtomicBool = AtomicBool::new(false);

/// Switches the hooks' self-timing on or off for every thread.
pub fn set_clocked(on: bool) {
    FASTINST_CLOCKED.store(on, Ordering::Release);
}

/// Whether hooks time themselves.
pub fn clocked() -> bool {
    FASTINST_CLOCKED.load(Ordering::Relaxed)
}

/// One thread's clock.
#[repr(C, align(64))]
pub struct ThreadClock {
    /// TSC ticks this thread has spent inside hooks (written by the thread
    /// itself only, with plain stores; others read).
    hook_ticks: AtomicU64,
    /// Calls counted by a sled's counting stub on this thread, which adds
    /// one with a plain `inc` at [`FAST_CALLS_OFFSET`] (the thread itself
    /// only; others read).
    fast_calls: AtomicU64,
    /// Exits that took the exit hook's cheap path on this thread, which
    /// adds one at [`FAST_EXITS_OFFSET`] (the thread itself only).
    fast_exits: AtomicU64,
    /// Where the innermost timed call in flight on this thread called its
    /// entry hook (its stack pointer before the call), as its profiler's
    /// handlers last left it (`u64::MAX`: none; the thread itself only):
    /// the exit hook, which reads it at [`TIMED_OFFSET`], takes its cheap
    /// path for a call from 16 bytes or more below it.
    timed_sp: AtomicU64,
    /// Hooks this thread has run with the clock on (for [`unseen_ticks`]).
    hooks: AtomicU64,
    /// The stamp of the hook in progress, as far as it has been charged
    /// ([`flush`]); 0 between hooks.
    open_since: AtomicU64,
    /// The period in which this thread last ran a hook.
    period: AtomicU32,
    /// Its hook ticks when that period began.
    period_base: AtomicU64,
    /// The period before that one in which it ran a hook, and its hook
    /// ticks when it began (so that a period just ended can be read while
    /// threads already run hooks in the next).
    prev_period: AtomicU32,
    prev_base: AtomicU64,
    /// When the thread's first hook ran (TSC).
    born: u64,
    /// When the thread exited (TSC; 0 while it runs).
    died: AtomicU64,
    /// Its kernel thread id.
    tid: i32,
    /// Ticks charged for the CPU-sampling signals that landed on this
    /// thread ([`charge_signal`]; its signal handler only). Apart from
    /// [`ThreadClock::hook_ticks`]'s own count, which the thread's hooks
    /// write with a plain load and store: a signal charged between the two
    /// would be lost, and the hooks' time alone could not be told from the
    /// signals' ([`ThreadClock::hooks_alone`]).
    signal_ticks: AtomicU64,
    /// Which lane of each sled counter it counts in, as the byte offset of
    /// that lane (`crate::sled::counter`): threads registered one after
    /// another count in different lanes, so two threads calling one
    /// function do not pass its counter's cache line back and forth.
    lane: u64,
}

/// Where a thread's [`ThreadClock::fast_calls`] lies in its record: the
/// counting stub's displacement, which must fit in a byte.
pub(crate) const FAST_CALLS_OFFSET: u8 = std::mem::offset_of!(ThreadClock, fast_calls) as u8;
const _: () = assert!(std::mem::offset_of!(ThreadClock, fast_calls) < 128);
/// Where a thread's counter lane offset lies (the counting stub's
/// displacement, which must fit in a byte).
pub(crate) const LANE_OFFSET: u8 = std::mem::offset_of!(ThreadClock, lane) as u8;
const _: () = assert!(std::mem::offset_of!(ThreadClock, lane) < 128);
/// Where a thread's [`ThreadClock::fast_exits`] lies (a byte displacement
/// of the exit hook's cheap path).
pub(crate) const FAST_EXITS_OFFSET: u8 = std::mem::offset_of!(ThreadClock, fast_exits) as u8;
const _: () = assert!(std::mem::offset_of!(ThreadClock, fast_exits) < 128);
/// Where a thread's timed calls in flight lie (likewise).
pub(crate) const TIMED_OFFSET: u8 = std::mem::offset_of!(ThreadClock, timed_sp) as u8;
const _: () = assert!(std::mem::offset_of!(ThreadClock, timed_sp) < 128);

impl ThreadClock {
    /// Ticks this thread has spent inside hooks so far: as stamped, the
    /// counting stub's calls and the cheap exits at their calibrated
    /// costs, and its sampling signals at theirs.
    #[inline(always)]
    pub fn hook_ticks(&self) -> u64 {
        self.hooks_alone() + self.signal_ticks.load(Ordering::Relaxed)
    }

    /// [`ThreadClock::hook_ticks`] without its sampling signals' charge:
    /// the time of the profiler's code that ran on the thread, as charged.
    #[inline(always)]
    pub fn hooks_alone(&self) -> u64 {
        self.stamped()
            + fast_charge(
                self.fast_calls(),
                self.fast_exits(),
                FAST_COST.load(Ordering::Relaxed),
                FAST_EXIT_COST.load(Ordering::Relaxed),
            )
    }

    /// Exits that took the exit hook's cheap path on this thread.
    #[inline(always)]
    pub fn fast_exits(&self) -> u64 {
        self.fast_exits.load(Ordering::Relaxed)
    }

    /// Publishes where the innermost timed call in flight on this thread
    /// called its entry hook (`None`: no timed call in flight; by the
    /// thread itself, whenever its profiler's handlers change its timed
    /// calls). A `-finstrument-functions` exit hook called from 16 bytes or
    /// more below it takes the cheap path: calls are made with the stack
    /// 16-byte aligned, so a callee's hook calls are at least that far
    /// below the caller's, while the timed call's own exit hook is called
    /// where its entry hook was, or above it after a tail jump. (One whose
    /// exit is called lower, after an `alloca`, loses its exit: it is
    /// dropped as left without exit, never misread.)
    #[inline(always)]
    pub fn set_timed(&self, sp: Option<u64>) {
        self.timed_sp.store(sp.unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Ticks of this thread's hooks as stamped (with what the stamps miss).
    #[inline(always)]
    pub(crate) fn stamped(&self) -> u64 {
        self.hook_ticks.load(Ordering::Relaxed)
    }

    /// Calls a sled's counting stub has counted on this thread.
    #[inline(always)]
    pub fn fast_calls(&self) -> u64 {
        self.fast_calls.load(Ordering::Relaxed)
    }

    /// The lane of each sled counter this thread counts in.
    #[inline(always)]
    pub(crate) fn lane(&self) -> usize {
        crate::sled::counter::lane_index(self.lane)
    }

    /// Clocked hooks this thread has run so far.
    #[inline(always)]
    pub fn hooks(&self) -> u64 {
        self.hooks.load(Ordering::Relaxed)
    }

    /// Its hook ticks at wall time `now`, counting the part of a hook in
    /// progress that has run so far (at most [`MAX_HOOK`], as its charge;
    /// read from another thread, a hook that ends meanwhile is counted
    /// whole, or from `now`: never twice).
    pub fn hook_ticks_at(&self, now: u64) -> u64 {
        let since = self.open_since.load(Ordering::Acquire);
        let t = self.hook_ticks();
        if since != 0 {
            t + hook_part(since, now)
        } else {
            t
        }
    }

    /// The thread's hook ticks at the start of period `period`, if it has
    /// run a hook in that period (else it has spent no hook time in it, and
    /// its current count is the base).
    pub fn period_base(&self, period: u32) -> u64 {
        if self.period.load(Ordering::Acquire) == period {
            self.period_base.load(Ordering::Relaxed)
        } else {
            self.hook_ticks()
        }
    }

    /// Whether the thread ran a hook in period `period`.
    pub fn active_in(&self, period: u32) -> bool {
        self.period.load(Ordering::Acquire) == period
    }

    /// The hook ticks this thread spent in period `period` up to now, if
    /// it ran a hook in it and has run hooks in at most one period since.
    pub fn hook_ticks_in(&self, period: u32) -> Option<u64> {
        let now = self.hook_ticks();
        if self.period.load(Ordering::Acquire) == period {
            return Some(now.saturating_sub(self.period_base.load(Ordering::Relaxed)));
        }
        if self.prev_period.load(Ordering::Acquire) == period {
            // Ended when the thread's next period began.
            let end = self.period_base.load(Ordering::Relaxed);
            return Some(end.saturating_sub(self.prev_base.load(Ordering::Relaxed)));
        }
        None
    }

    /// When its first hook ran (TSC).
    pub fn born(&self) -> u64 {
        self.born
    }

    /// When it exited (TSC), if it has.
    pub fn died(&self) -> Option<u64> {
        Some(self.died.load(Ordering::Acquire)).filter(|&t| t != 0)
    }

    /// Its kernel thread id.
    pub fn tid(&self) -> i32 {
        self.tid
    }

    /// Whether a hook stamped `now` starts inside another hook of this
    /// thread (a signal's): one began less than [`MAX_HOOK`] before and
    /// has not ended. (An older stamp is a hook that never ended, left by
    /// a signal handler that jumped out of it: the next hook replaces it.)
    fn in_hook(&self, now: u64) -> bool {
        let since = self.open_since.load(Ordering::Relaxed);
        since != 0 && now.wrapping_sub(since) < MAX_HOOK
    }
}

/// Up to 2^20 threads over the life of a process.
const SEGMENTS: usize = 256;
static THREADS: Segmented<ThreadClock, SEGMENTS> = Segmented::new();
static PUSH: AtomicBool = AtomicBool::new(false);

/// The current period and when it began.
static PERIOD: AtomicU32 = AtomicU32::new(0);
static PERIOD_START: AtomicU64 = AtomicU64::new(0);

/// Starts a new period at TSC `now`; returns its number.
pub fn advance_period(now: u64) -> u32 {
    PERIOD_START.store(now, Ordering::Relaxed);
    PERIOD.fetch_add(1, Ordering::AcqRel) + 1
}

/// The current period's number and start (TSC).
pub fn period() -> (u32, u64) {
    let p = PERIOD.load(Ordering::Acquire);
    (p, PERIOD_START.load(Ordering::Relaxed))
}

/// Every thread's clock, in the order the threads first ran a hook.
pub fn threads() -> impl Iterator<Item = &'static ThreadClock> {
    (0..THREADS.len()).filter_map(|i| THREADS.get(i))
}

/// The clock of the thread at `index` in the table (the order threads
/// first ran a clocked hook in; what a CPU sample notes of its thread).
pub fn thread(index: u32) -> Option<&'static ThreadClock> {
    THREADS.get(index)
}

/// This thread's clock, if it has run a clocked hook.
#[inline(always)]
pub fn current() -> Option<&'static ThreadClock> {
    let p = crate::arch::tls::clock() as *const ThreadClock;
    // SAFETY: a non-zero slot points at this thread's record, which is
    // never freed.
    (!p.is_null()).then(|| unsafe { &*p })
}

thread_local! {
    /// Marks the thread's record dead when the thread exits.
    static EXIT: ExitMark = const { ExitMark(std::cell::Cell::new(std::ptr::null())) };
}

struct ExitMark(std::cell::Cell<*const ThreadClock>);

impl Drop for ExitMark {
    fn drop(&mut self) {
        let p = self.0.get();
        if !p.is_null() {
            crate::arch::tls::set_clock(0);
            // SAFETY: records are never freed.
            unsafe { (*p).died.store(tsc::now().max(1), Ordering::Release) };
        }
    }
}

#[cold]
fn register(now: u64) -> Option<&'static ThreadClock> {
    crate::spin::acquire(&PUSH);
    let rec = THREADS.push_with(|i| ThreadClock {
        hook_ticks: AtomicU64::new(0),
        fast_calls: AtomicU64::new(0),
        fast_exits: AtomicU64::new(0),
        timed_sp: AtomicU64::new(u64::MAX),
        hooks: AtomicU64::new(0),
        open_since: AtomicU64::new(0),
        period: AtomicU32::new(u32::MAX),
        period_base: AtomicU64::new(0),
        prev_period: AtomicU32::new(u32::MAX),
        prev_base: AtomicU64::new(0),
        born: now,
        died: AtomicU64::new(0),
        // SAFETY: gettid has no preconditions.
        tid: unsafe { libc::gettid() },
        signal_ticks: AtomicU64::new(0),
        lane: crate::sled::counter::lane_offset(i),
    });
    crate::spin::release(&PUSH);
    let (i, rec) = rec?;
    crate::arch::tls::set_clock(rec as *const ThreadClock as u64);
    crate::arch::tls::set_sample_tag(u64::from(i) + 1);
    // A thread already exiting has no destructors left to run: its record
    // then stays alive-looking, which only its end time shows.
    let _ = EXIT.try_with(|m| m.0.set(rec));
    Some(rec)
}

/// A hook that stamped `start` begins: the thread's record (made on its
/// first clocked hook), with the period bookkeeping done. `None` when the
/// hook is not clocked (`start == 0`) or the thread table is full.
#[cfg(test)]
pub(crate) fn begin(start: u64) -> Option<&'static ThreadClock> {
    let rec = record(start)?;
    open(rec, start);
    Some(rec)
}

/// This thread's record (made on its first clocked hook), for a hook
/// stamped `start`; `None` when the hook is not clocked (`start == 0`)
/// or the thread table is full.
#[inline(always)]
fn record(start: u64) -> Option<&'static ThreadClock> {
    if start == 0 {
        return None;
    }
    current().or_else(|| register(start))
}

/// Opens the hook stamped `start` on `rec`, with the period bookkeeping
/// done.
#[inline(always)]
fn open(rec: &ThreadClock, start: u64) {
    let p = PERIOD.load(Ordering::Acquire);
    let last = rec.period.load(Ordering::Relaxed);
    if last != p {
        new_period(rec, last, p);
    }
    rec.open_since.store(start, Ordering::Release);
}

/// Longest time one hook is charged (ticks): a hook runs for a few
/// hundred, so a longer one was interrupted (preempted, or a signal ran on
/// top of it), or ran discovery, which is charged apart. The thread's CPU
/// clock, which exposure is measured in, did not run while it was
/// descheduled, so every tick charged past what the hook ran takes the
/// program's own time out of whatever window was open. With more threads
/// than CPUs, an uncapped charge of a time slice made windows read their
/// threads' own time as nearly none (a four-thread program on two CPUs
/// read 16 times its calls); at a cap of tens of microseconds, one
/// preempted hook still took most of the exposure out of a window that
/// hooks nearly filled (the jumps test's `catcher`, on a loaded machine,
/// read several times its calls). A hook that truly runs past the cap (a
/// page fault in a store) gives the rest to the program's time: rare, and
/// bounded by the hook's length.
pub const MAX_HOOK: u64 = 5_000;

/// The hook time in a hook's stretch from TSC `since` to `now`: its length,
/// at most [`MAX_HOOK`] (a longer one was descheduled in the middle, or
/// discovered a site, and the time its thread did not run is not the
/// hook's). A hook's charge at its end and every reading of a hook in
/// progress take it from here, so no reading runs ahead of a later one (a
/// `flush`, by the running thread itself, charges its whole stretch: later
/// readings only grow). (A reading that
/// counted a descheduled hook uncapped did: the next stretch's hook time
/// read as none, its hooks' time as the program's, and under load windows
/// read their functions' calls at a fraction of their rate.)
#[inline(always)]
fn hook_part(since: u64, now: u64) -> u64 {
    now.saturating_sub(since).min(MAX_HOOK)
}

/// Ticks a `-finstrument-functions` hook costs beyond its stamps, and a
/// sled hook (entry and exit averaged): see `hookcost`. Added to every
/// hook's stamped time.
static UNSEEN_FI: AtomicU32 = AtomicU32::new(0);
static UNSEEN_SLED: AtomicU32 = AtomicU32::new(0);

/// One exit in this many that would take the exit hook's cheap path
/// runs the whole hook instead (a power of two, at most 2^31: the stub
/// tests the low bits of [`ThreadClock::fast_exits`]). The cheap path
/// makes no look-up, so an exit call site that only ever took it was
/// never discovered, and stayed on for good: the exits of functions a
/// filter refused, and of inlined copies, none of which is ever timed.
/// Through the whole hook each such site is discovered within this many
/// of a thread's cheap exits, and its tool switches it off. What the whole
/// hooks cost is in the cheap path's calibrated cost, which runs them at
/// the same rate. Rare enough that an exit whose probe is on and known
/// (a windowed function's, whose whole hook finds nothing to pair with)
/// pays little for it (`crates/benches/results/accuracy.md`).
pub const CHEAP_EXIT_LOOK_EVERY: u64 = 4096;
const _: () = assert!(CHEAP_EXIT_LOOK_EVERY.is_power_of_two() && CHEAP_EXIT_LOOK_EVERY <= 1 << 31);

/// Fraction bits of [`FAST_COST`] and [`FAST_EXIT_COST`]: a few ticks
/// each, charged to millions of calls, so rounding them to whole ticks
/// moved every counted window's exposure by up to half a tick a call.
const COST_FRACTION_BITS: u32 = 8;

/// What a call through a counting stub costs (`hookcost` measures it once
/// per process; 0 before), in ticks times `2^COST_FRACTION_BITS`.
/// Changed only before any counting stub is armed: a thread's hook ticks
/// must only grow.
static FAST_COST: AtomicU32 = AtomicU32::new(0);

/// What an exit through the exit hook's cheap path costs (measured once
/// per process, as [`FAST_COST`]), in the same units.
static FAST_EXIT_COST: AtomicU32 = AtomicU32::new(0);

/// `ticks` in [`FAST_COST`]'s units.
fn to_fixed(ticks: f64) -> u32 {
    (ticks.max(0.0) * f64::from(1u32 << COST_FRACTION_BITS)).round() as u32
}

/// Whole ticks charged for `calls` counted calls and `exits` cheap exits
/// at costs `call_cost` and `exit_cost` ([`FAST_COST`]'s units): growing
/// with either count.
#[inline(always)]
fn fast_charge(calls: u64, exits: u64, call_cost: u32, exit_cost: u32) -> u64 {
    (calls * u64::from(call_cost) + exits * u64::from(exit_cost)) >> COST_FRACTION_BITS
}

/// [`FAST_COST`]'s units in ticks.
fn from_fixed(v: u32) -> f64 {
    f64::from(v) / f64::from(1u32 << COST_FRACTION_BITS)
}

/// Whether `-finstrument-functions` exits from below the innermost timed
/// call in flight on their thread take the cheap path. Read by the exit hook's stub (`sym`): a
/// byte it compares with 0.
pub(crate) static FASTINST_CHEAP_EXITS: AtomicBool = AtomicBool::new(false);

/// Always on: the flag of the calibration's copy of the exit hook, which
/// must take the cheap path whatever the profiler does.
pub(crate) static FASTINST_CHEAP_ALWAYS: AtomicBool = AtomicBool::new(true);

/// Lets `-finstrument-functions` exits from below the innermost timed
/// call in flight on their thread return at once (the profiler, while it
/// runs: no such exit pairs with a timed call), or makes every exit run
/// its hook again (every other tool needs each one).
pub fn set_cheap_exits(on: bool) {
    FASTINST_CHEAP_EXITS.store(on, Ordering::Release);
}

/// Whether exits take the cheap path ([`set_cheap_exits`]).
pub fn cheap_exits() -> bool {
    FASTINST_CHEAP_EXITS.load(Ordering::Relaxed)
}

/// Ticks an exit through the cheap path is charged.
pub fn fast_exit_cost() -> f64 {
    from_fixed(FAST_EXIT_COST.load(Ordering::Relaxed))
}

/// Sets [`fast_exit_cost`], as measured at start.
pub(crate) fn set_fast_exit_cost(ticks: f64) {
    FAST_EXIT_COST.store(to_fixed(ticks), Ordering::Relaxed);
}

/// Ticks a call through a counting stub is charged.
pub fn fast_cost() -> f64 {
    from_fixed(FAST_COST.load(Ordering::Relaxed))
}

/// Sets [`fast_cost`], as measured at start.
pub(crate) fn set_fast_cost(ticks: f64) {
    FAST_COST.store(to_fixed(ticks), Ordering::Relaxed);
}

/// What the stamps of one hook of each path miss, as `hookcost` last
/// measured it (`-finstrument-functions`, sled); 0 before.
pub fn unseen_ticks() -> (u32, u32) {
    (UNSEEN_FI.load(Ordering::Relaxed), UNSEEN_SLED.load(Ordering::Relaxed))
}

/// The thread's first hook in period `p`: the period it last ran a hook in
/// (`last`) moves to the second slot. Readers on other threads may see the
/// slots mid-change: the period numbers are written last (Release) and
/// compared on reading, and at worst a reader finds no figure for a period
/// (`None`), never another period's.
#[cold]
#[inline(never)]
fn new_period(rec: &ThreadClock, last: u32, p: u32) {
    let base = rec.period_base.load(Ordering::Relaxed);
    rec.prev_period.store(u32::MAX, Ordering::Release);
    rec.prev_base.store(base, Ordering::Relaxed);
    rec.prev_period.store(last, Ordering::Release);
    rec.period.store(u32::MAX, Ordering::Release);
    rec.period_base.store(rec.hook_ticks(), Ordering::Relaxed);
    rec.period.store(p, Ordering::Release);
}

/// A hook stamped `started` (0: unclocked) begins its handler: returns
/// the thread clock its stub charges when it ends (0: none) and the stamp
/// the handler sees. A hook inside a handler is part of that handler's
/// hook, which counts its whole time: it is not charged again.
#[inline(always)]
pub(crate) fn begin_hook(started: u64) -> (usize, u64) {
    let started = if started != 0 && crate::arch::tls::guard_get() {
        0
    } else {
        started
    };
    let Some(rec) = record(started) else { return (0, 0) };
    if rec.in_hook(started) {
        // A signal handler's hook on top of this thread's hook in progress,
        // outside its handler: the outer hook's stretch holds this one
        // whole. Charged itself, it would also clear the outer's stamp,
        // and the outer would be charged as if descheduled
        // ([`MAX_HOOK`]), taking that much of the program's time out of
        // whatever window was open.
        return (0, started);
    }
    open(rec, started);
    (rec as *const ThreadClock as usize, started)
}

/// The end of a clocked `-finstrument-functions` hook, called by its stub
/// with the thread clock [`begin_hook`] returned and the final stamp `t`.
pub(crate) extern "C" fn end_fi(rec: usize, t: u64) {
    end_at(rec, t, &UNSEEN_FI)
}

/// The end of a clocked sled hook, called by its trampoline.
pub(crate) extern "C" fn end_sled(rec: usize, t: u64) {
    end_at(rec, t, &UNSEEN_SLED)
}

#[inline(always)]
fn end_at(rec: usize, t: u64, unseen: &AtomicU32) {
    if rec == 0 {
        return;
    }
    // SAFETY: `begin_hook` returned a pointer to this thread's record,
    // which is never freed.
    let rec = unsafe { &*(rec as *const ThreadClock) };
    // From the stamp, or from where a `flush` left it.
    let start = rec.open_since.load(Ordering::Relaxed);
    // No stamp: a signal's hook before this one's `begin` already charged
    // and cleared it; what ran before is unknown, and taken as nothing
    // rather than as a descheduled hook's [`MAX_HOOK`].
    let ran = if start == 0 { 0 } else { hook_part(start, t) };
    let d = ran + u64::from(unseen.load(Ordering::Relaxed));
    // The count first: a reader adds the running part to it, and must not
    // see the running part gone before the count has it.
    rec.hook_ticks.store(rec.stamped() + d, Ordering::Release);
    rec.open_since.store(0, Ordering::Release);
    rec.hooks.store(rec.hooks() + 1, Ordering::Relaxed);
}

/// Charges the part of this thread's hook in progress that has run so far
/// (a handler about to take a reading of every thread's hook time, of
/// which its own must be part).
pub fn flush() {
    if let Some(rec) = current() {
        let since = rec.open_since.load(Ordering::Relaxed);
        if since != 0 {
            let now = tsc::now();
            rec.hook_ticks
                .store(rec.stamped() + now.saturating_sub(since), Ordering::Release);
            rec.open_since.store(now, Ordering::Release);
        }
    }
}

/// Sets what the stamps of one hook of each path miss
/// (`-finstrument-functions`, sled), as measured at start.
pub(crate) fn set_unseen(fi: u32, sled: u32) {
    UNSEEN_FI.store(fi, Ordering::Relaxed);
    UNSEEN_SLED.store(sled, Ordering::Relaxed);
}

/// Adds `ticks` of discovery, the runtime's work inside a hook, to this
/// thread's hook time, whole (a hook's stamped time is capped at
/// [`MAX_HOOK`]), registering the thread's record if it has none: the
/// program's own time, which the profiler's rates are measured against,
/// must not hold it.
pub(crate) fn charge_discovery(ticks: u64) {
    if let Some(rec) = current().or_else(|| register(tsc::now())) {
        rec.hook_ticks.store(rec.stamped() + ticks, Ordering::Relaxed);
    }
}

/// Adds `ticks` of work done on this thread's behalf outside a hook's own
/// stretch (the profiler's work at exit) to its hook time. Not from a
/// signal handler: a signal between a hook's end reading the count and
/// storing it would lose the charge; a sampling signal's goes through
/// `charge_signal`.
///
/// A hook in progress started before that work: its start moves on by
/// `ticks`, so that its own charge at its end (its stamps' stretch, at
/// most [`MAX_HOOK`]) does not hold the work too; readers on other
/// threads see the hook time only grow.
pub fn charge(ticks: u64) {
    let Some(rec) = current() else { return };
    let since = rec.open_since.load(Ordering::Relaxed);
    // The count first, as at a hook's end: a reader adds the running part
    // to it.
    rec.hook_ticks.store(rec.stamped() + ticks, Ordering::Release);
    if since != 0 {
        rec.open_since.store(since + ticks, Ordering::Release);
    }
}

/// Adds `ticks`, a CPU-sampling signal's measured cost, to this thread's
/// hook time ([`ThreadClock::signal_ticks`]), from the signal's handler, as
/// [`charge`] does for other work: a hook in progress moves its start on
/// by as much. Async-signal-safe; no hook's end can lose it. A signal
/// between a hook's stamp and its start being noted is charged twice, up
/// to [`MAX_HOOK`].
pub(crate) fn charge_signal(ticks: u64) {
    let Some(rec) = current() else { return };
    let since = rec.open_since.load(Ordering::Relaxed);
    rec.signal_ticks
        .store(rec.signal_ticks.load(Ordering::Relaxed) + ticks, Ordering::Release);
    if since != 0 {
        rec.open_since.store(since + ticks, Ordering::Release);
    }
}

/// The program time of thread `rec` between two instants at which its
/// hook counts were `ticks0` and `ticks1`.
#[inline(always)]
pub fn program_ticks(t0: u64, ticks0: u64, t1: u64, ticks1: u64) -> u64 {
    t1.saturating_sub(t0).saturating_sub(ticks1.saturating_sub(ticks0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A counted call's cost is kept to a fraction of a tick: charged to a
    /// million calls, 4.4 ticks is 4.4 million, where whole ticks made it
    /// 4 million.
    #[test]
    fn counted_calls_are_charged_their_cost_to_a_fraction_of_a_tick() {
        let (call, exit) = (to_fixed(4.4), to_fixed(3.3));
        assert!((from_fixed(call) - 4.4).abs() < 0.01);
        let charged = fast_charge(1_000_000, 1_000_000, call, exit) as f64;
        assert!((charged - 7_700_000.0).abs() < 2_000.0, "{charged}");
        assert_eq!(fast_charge(0, 0, call, exit), 0);
        // Monotonic in each count: a thread's hook ticks only grow.
        let mut last = 0;
        for n in 0..1000 {
            let c = fast_charge(n, n / 3, call, exit);
            assert!(c >= last);
            last = c;
        }
        assert_eq!(to_fixed(-1.0), 0, "a cost is never negative");
    }

    #[test]
    fn a_reading_inside_a_long_hook_never_runs_ahead_of_its_charge() {
        std::thread::spawn(|| {
            let t = tsc::now();
            let rec = begin(t).expect("record");
            // Read from elsewhere while the hook has been open long (its
            // thread waited for a CPU inside it): no more than the charge
            // it will get, so that later readings never fall behind.
            let long = t + 10 * MAX_HOOK;
            let read = rec.hook_ticks_at(long);
            assert!(read <= MAX_HOOK, "{read}");
            assert!(rec.hook_ticks_at(t + 100) >= 100, "a short hook in progress counts");
            end_fi(rec as *const ThreadClock as usize, long);
            assert!(
                rec.hook_ticks_at(long + 1) >= read,
                "{} < {read}",
                rec.hook_ticks_at(long + 1)
            );
        })
        .join()
        .unwrap();
    }

    /// A signal's hook on top of a hook in progress (outside its handler,
    /// where the guard is not yet or no longer set) is part of the outer
    /// hook's stretch: not charged itself, and the outer is charged what
    /// it ran. Charged itself, it cleared the outer's stamp, and the outer
    /// was charged as if descheduled, [`MAX_HOOK`] (it was, at 50,000
    /// ticks, about half the exposure of a busy window on the jumps test).
    #[test]
    fn a_signals_hook_inside_a_hook_leaves_the_outer_charge_alone() {
        std::thread::spawn(|| {
            let t = tsc::now();
            let (outer, started) = begin_hook(t);
            assert_ne!(outer, 0, "the outer hook is charged");
            assert_eq!(started, t);
            let (inner, inner_started) = begin_hook(t + 100);
            assert_eq!(inner, 0, "the nested hook is not charged itself");
            assert_eq!(inner_started, t + 100, "its handler still sees its stamp");
            end_fi(outer, t + 300);
            let rec = current().expect("record");
            // Its stretch and the calibrated unseen part (which another
            // test may be setting).
            let h = rec.hook_ticks();
            assert!(
                (300..300 + MAX_HOOK / 2).contains(&h),
                "the outer hook's own stretch: {h}"
            );
            // A stamp older than the cap is a hook that never ended (its
            // handler was jumped out of): the next hook replaces it.
            let t2 = t + 1_000_000;
            let (stale, _) = begin_hook(t2);
            assert_ne!(stale, 0, "a stale stamp does not make every later hook nested");
            let (left, _) = begin_hook(t2 + 10 * MAX_HOOK);
            assert_ne!(left, 0);
            end_fi(left, t2 + 10 * MAX_HOOK + 50);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_hook_charges_its_thread_and_periods_keep_the_base() {
        // No hook runs on a test thread: drive begin/end by hand, on a
        // thread of its own (the record and the TLS slot are per thread).
        std::thread::spawn(|| {
            assert!(begin(0).is_none(), "an unclocked hook has no record");
            let t = tsc::now();
            let rec = begin(t).expect("record");
            assert_eq!(rec.hook_ticks(), 0);
            tsc::spin_until(t, 1000);
            end_fi(rec as *const ThreadClock as usize, tsc::now());
            let after = rec.hook_ticks();
            assert!(after >= 1000, "{after}");
            let (p, _) = period();
            assert_eq!(
                rec.period_base(p),
                0,
                "the base is the count before the period's first hook"
            );
            let p2 = advance_period(tsc::now());
            assert_eq!(rec.period_base(p2), after, "no hook yet in the new period");
            assert!(!rec.active_in(p2));
            let t = tsc::now();
            begin(t);
            end_fi(rec as *const ThreadClock as usize, tsc::now());
            assert!(rec.active_in(p2));
            assert_eq!(rec.period_base(p2), after);
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::gettid() };
            assert_eq!(rec.tid(), tid);
            rec as *const ThreadClock as usize
        })
        .join()
        .map(|p| {
            // SAFETY: records are never freed.
            let rec = unsafe { &*(p as *const ThreadClock) };
            assert!(rec.died().is_some(), "the exit is recorded");
        })
        .unwrap();
    }

    /// A signal charged between hooks is hook time whole; one charged
    /// inside a hook moves the hook's start on, so the hook is charged
    /// its own stretch and the signal once (not the cap: a signal of
    /// several times [`MAX_HOOK`] inside a hook was charged at most the
    /// cap, and the rest stayed in the program's time). Sampling signals'
    /// charges stay apart from the hooks' own; other work's is the hooks'.
    #[test]
    fn a_signal_is_charged_once_inside_a_hook_or_out() {
        std::thread::spawn(|| {
            let t = tsc::now();
            let rec = begin(t).expect("record");
            end_fi(rec as *const ThreadClock as usize, t + 200);
            let base = rec.hook_ticks();
            let alone = rec.hooks_alone();
            charge_signal(40_000);
            assert_eq!(rec.hook_ticks(), base + 40_000, "between hooks: whole");
            assert_eq!(rec.hooks_alone(), alone, "not the hooks' own");
            let t = t + 1_000_000;
            begin(t);
            let mid = rec.hook_ticks_at(t + 100);
            charge_signal(40_000);
            let after = rec.hook_ticks_at(t + 40_200);
            assert!(after >= mid, "readings never go back: {after} < {mid}");
            // The hook ran 300 ticks besides the signal's 40,000.
            end_fi(rec as *const ThreadClock as usize, t + 40_300);
            let hook = rec.hook_ticks() - base - 80_000;
            let unseen = u64::from(UNSEEN_FI.load(Ordering::Relaxed));
            assert_eq!(hook - unseen, 300, "the hook's own 300 ticks, the signal's apart");
            assert_eq!(rec.hooks_alone() - alone - unseen, 300);
            // The profiler's own work, charged by the thread itself.
            charge(5_000);
            assert_eq!(rec.hooks_alone() - alone - unseen, 5_300);
            assert_eq!(rec.hook_ticks() - base - unseen, 85_300);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn program_time_excludes_hook_time() {
        assert_eq!(program_ticks(100, 5, 1100, 305), 700);
        assert_eq!(program_ticks(100, 5, 50, 5), 0, "never negative");
    }
}
