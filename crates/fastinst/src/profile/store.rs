//! What each thread keeps: its shadow stack of sampled calls, its
//! aggregates, its counters and call counts.

use super::counts;
use super::thread::{Agg, Shadow};
use parking_lot::Mutex;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

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
    /// Abandoned frames recorded as censored (their exit probe went off).
    pub censored: AtomicU64,
    pub too_deep: AtomicU64,
    pub no_cfa: AtomicU64,
    pub no_thread: AtomicU64,
    pub inlined_off: AtomicU64,
    pub open_at_exit: AtomicU64,
    pub windows_planned: AtomicU64,
    pub windows_opened: AtomicU64,
    pub windows_void: AtomicU64,
    /// The sampler's wake-ups to open and close windows.
    pub wakeups: AtomicU64,
}

impl Counters {
    /// Adds `v` to counter `c` of the calling thread's own set: a plain
    /// load and store, where a shared counter took a locked add (and, with
    /// threads, its cache line moving between them) four times a sample.
    #[inline(always)]
    pub(crate) fn add_own(c: &AtomicU64, v: u64) {
        c.store(c.load(Ordering::Relaxed).wrapping_add(v), Ordering::Relaxed);
    }

    pub(crate) fn all(&self) -> [&AtomicU64; 14] {
        [
            &self.wakeups,
            &self.windows_void,
            &self.windows_planned,
            &self.windows_opened,
            &self.open_at_exit,
            &self.samples,
            &self.toggles,
            &self.unmatched_exits,
            &self.abandoned,
            &self.censored,
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
    pub(crate) tid: i32,
    /// The generation of the profiler it was made for and registered with
    /// (`super::profiler`): a thread makes itself a new store when the
    /// generation moves on.
    pub(crate) generation: std::sync::atomic::AtomicU32,
    pub(crate) shadow: UnsafeCell<Shadow>,
    pub(crate) agg: Mutex<Agg>,
    pub(crate) exited: AtomicBool,
    /// What this thread's handlers counted; only this thread writes them
    /// ([`Counters::add_own`]).
    pub(crate) counts: Counters,
    /// Its call counters ([`counts`]).
    pub(crate) calls: counts::Counts,
    /// When it exited (TSC; 0 while it runs).
    pub(crate) died: AtomicU64,
    /// Where the exposure clock last counted it to: CPU time (ns), wall
    /// TSC and hook ticks; and its CPU clock's last reading and when
    /// ([`exposure`]; the schedule's lock holder only).
    pub(crate) x_cpu: AtomicU64,
    pub(crate) x_wall: AtomicU64,
    pub(crate) x_hooks: AtomicU64,
    pub(crate) x_cpu_read: AtomicU64,
    pub(crate) x_cpu_at: AtomicU64,
    /// Its CPU time when it exited (ns; 0 while it runs).
    pub(crate) cpu_final: AtomicU64,
    /// Its program clock ([`crate::clock::ThreadClock`], as an address; 0
    /// until its first clocked hook).
    pub(crate) clock: std::sync::atomic::AtomicUsize,
    /// Its generator's state for choosing which counted calls to time
    /// ([`super::choose`]); only this thread touches it.
    pub(crate) draws: AtomicU64,
}

impl ThreadStore {
    /// This thread's next draw (on the owning thread, in a hook).
    #[inline(always)]
    pub(crate) fn draw(&self) -> u64 {
        let mut state = self.draws.load(Ordering::Relaxed);
        let r = super::choose::draw(&mut state);
        self.draws.store(state, Ordering::Relaxed);
        r
    }

    /// Notes this thread's program clock (on the owning thread, in a hook).
    #[cold]
    pub(crate) fn link_clock(&self) {
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
