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
//! jump, the return): [`unseen_ticks`] measures them once.
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
    /// The period in which this thread last ran a hook.
    period: AtomicU32,
    /// Its hook ticks when that period began.
    period_base: AtomicU64,
    /// When the thread's first hook ran (TSC).
    born: u64,
    /// When the thread exited (TSC; 0 while it runs).
    died: AtomicU64,
    /// Its kernel thread id.
    tid: i32,
}

impl ThreadClock {
    /// Ticks this thread has spent inside hooks so far.
    #[inline(always)]
    pub fn hook_ticks(&self) -> u64 {
        self.hook_ticks.load(Ordering::Relaxed)
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

/// This thread's clock, if it has run a clocked hook.
#[inline(always)]
pub fn current() -> Option<&'static ThreadClock> {
    let p = crate::tls::clock() as *const ThreadClock;
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
            crate::tls::set_clock(0);
            // SAFETY: records are never freed.
            unsafe { (*p).died.store(tsc::now().max(1), Ordering::Release) };
        }
    }
}

#[cold]
fn register(now: u64) -> Option<&'static ThreadClock> {
    crate::spin::acquire(&PUSH);
    let rec = THREADS.push_with(|_| ThreadClock {
        hook_ticks: AtomicU64::new(0),
        period: AtomicU32::new(u32::MAX),
        period_base: AtomicU64::new(0),
        born: now,
        died: AtomicU64::new(0),
        // SAFETY: gettid has no preconditions.
        tid: unsafe { libc::gettid() },
    });
    crate::spin::release(&PUSH);
    let (_, rec) = rec?;
    crate::tls::set_clock(rec as *const ThreadClock as u64);
    // A thread already exiting has no destructors left to run: its record
    // then stays alive-looking, which only its end time shows.
    let _ = EXIT.try_with(|m| m.0.set(rec));
    Some(rec)
}

/// A hook that stamped `start` begins: the thread's record (made on its
/// first clocked hook), with the period bookkeeping done. `None` when the
/// hook is not clocked (`start == 0`) or the thread table is full.
#[inline(always)]
pub(crate) fn begin(start: u64) -> Option<&'static ThreadClock> {
    if start == 0 {
        return None;
    }
    let rec = match current() {
        Some(r) => r,
        None => register(start)?,
    };
    let p = PERIOD.load(Ordering::Acquire);
    if rec.period.load(Ordering::Relaxed) != p {
        rec.period_base.store(rec.hook_ticks(), Ordering::Relaxed);
        rec.period.store(p, Ordering::Release);
    }
    Some(rec)
}

/// The hook that [`begin`] returned `rec` for, stamped `start`, ends now.
#[inline(always)]
pub(crate) fn end(rec: Option<&'static ThreadClock>, start: u64) {
    if let Some(rec) = rec {
        let d = tsc::now().wrapping_sub(start) as i64;
        if d > 0 {
            rec.hook_ticks.store(rec.hook_ticks() + d as u64, Ordering::Relaxed);
        }
    }
}

/// Adds `ticks` of work done outside a hook on this thread's behalf (a
/// signal handler of a tool) to its hook time.
pub fn charge(ticks: u64) {
    if let Some(rec) = current() {
        rec.hook_ticks.store(rec.hook_ticks() + ticks, Ordering::Relaxed);
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
            end(Some(rec), t);
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
            end(Some(rec), t);
            assert!(rec.active_in(p2));
            assert_eq!(rec.period_base(p2), after);
            assert_eq!(rec.tid(), unsafe { libc::gettid() });
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

    #[test]
    fn program_time_excludes_hook_time() {
        assert_eq!(program_ticks(100, 5, 1100, 305), 700);
        assert_eq!(program_ticks(100, 5, 50, 5), 0, "never negative");
    }
}
