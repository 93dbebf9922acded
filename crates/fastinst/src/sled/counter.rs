//! A function's counting path: its stub counts a call and returns, and
//! only the calls drawn for timing go on to the entry trampoline.
//!
//! A full sled hook (the trampoline's saves, the handler, the clock's
//! stamps) costs several times what many hot functions take. A profiler
//! counting such a function in a window ran mostly hook time there, and
//! its rate stood on the difference of the window's time and the hooks'
//! charges: any error in those charges moved the rate by as much, times
//! the hooks' share (`profile::window::HOOK_COST_SPREAD`). The counting
//! path is a few instructions, so it leaves the window mostly the
//! program's own time.
//!
//! Each function's stub (`super::trampoline`) begins with the path; its
//! [`Counter`] lies in read-write memory beside the stubs. While the
//! counter is armed (`next != 0`) a call
//! - adds one to `calls` with `lock xadd`, reading its index `i`;
//! - if `i >= next`, goes on to the trampoline: it is the call drawn for
//!   timing (or a thread raced it there; [`Counter::claim`] sorts them);
//! - else adds one to its thread's fast-call count
//!   (`crate::clock::ThreadClock::fast_calls`, found through the clock's
//!   static TLS slot), which the clock charges at the path's calibrated
//!   cost, and returns. A thread with no clock yet goes on to the
//!   trampoline, whose hook makes it one.
//!
//! Disarmed (`next == 0`, as it starts) the stub goes straight to the
//! trampoline: every call runs the full hook, as every tool but the
//! profiler's windows wants.
//!
//! The path clobbers `rflags` (saving `rax`), which is sound at a
//! function's entry only: the ABI does not preserve flags across a call.
//! Point and `-pg` stubs never get one.
//!
//! The calls drawn for timing are a geometric renewal: after each, the
//! next is `G` calls on, `G` geometric with the chance `2^-j` the sampler
//! set ([`crate::profile`]'s `choose::gap`). That is the same as drawing
//! each call independently with that chance, which is what the timed
//! calls' weights assume.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

/// Bytes each counter takes: a cache line, so that two functions' counts
/// never share one between threads.
pub(crate) const COUNTER_LEN: usize = 64;

/// One function's counter (for one entry stub). The stub reads `next` at
/// offset 0 and `calls` at offset 8.
#[repr(C, align(64))]
pub(crate) struct Counter {
    /// The index of the next call to go on to the trampoline; 0 while
    /// disarmed.
    next: AtomicU64,
    /// Calls counted while armed (never 0 once armed, so that `next`,
    /// which is at least `calls`, is never 0 while armed).
    calls: AtomicU64,
    /// The shift `j` the pending gap was drawn with: a call it leads to
    /// stands for `2^j` calls.
    shift: AtomicU8,
}

const _: () = assert!(std::mem::offset_of!(Counter, next) == 0);
const _: () = assert!(std::mem::offset_of!(Counter, calls) == 8);
const _: () = assert!(std::mem::size_of::<Counter>() == COUNTER_LEN);

impl Counter {
    /// Calls counted so far.
    #[inline(always)]
    pub(crate) fn calls(&self) -> u64 {
        self.calls.load(Ordering::Acquire)
    }

    /// Whether the stub counts calls now.
    #[cfg(test)]
    pub(crate) fn is_armed(&self) -> bool {
        self.next.load(Ordering::Acquire) != 0
    }

    /// Starts counting, with the first call to time `gap` calls on (at
    /// least 1: the very next call) drawn at shift `shift`; returns
    /// [`Counter::calls`] from which this stretch counts. For one arming
    /// thread at a time (the profiler's schedule).
    pub(crate) fn arm(&self, shift: u8, gap: u64) -> u64 {
        if self.calls.load(Ordering::Relaxed) == 0 {
            // Disarmed, the stub does not touch `calls`.
            self.calls.store(1, Ordering::Relaxed);
        }
        let c = self.calls.load(Ordering::Relaxed);
        self.shift.store(shift, Ordering::Relaxed);
        // Release: a stub that sees `next` sees the rest.
        self.next.store(c + gap.max(1) - 1, Ordering::Release);
        c
    }

    /// Stops counting: every call goes to the trampoline.
    pub(crate) fn disarm(&self) {
        self.next.store(0, Ordering::Release);
    }

    /// On the trampoline's path, for a call of an armed counter: whether
    /// this call is the one drawn for timing, with the shift it was drawn
    /// at; if so, the next is drawn `gap` calls on at shift `next_shift`.
    /// Of the threads that crossed `next` together, one wins; the others
    /// (and a call that came only to make its thread a clock) are counted
    /// and not timed.
    pub(crate) fn claim(&self, next_shift: u8, gap: u64) -> Option<u8> {
        let n = self.next.load(Ordering::Acquire);
        // Disarmed meanwhile, or the drawn call has not come yet (its
        // index `n` is counted once `calls` passes it).
        if n == 0 || self.calls.load(Ordering::Acquire) <= n {
            return None;
        }
        let j = self.shift.load(Ordering::Relaxed);
        self.next
            .compare_exchange(n, n + gap.max(1), Ordering::AcqRel, Ordering::Relaxed)
            .ok()?;
        self.shift.store(next_shift, Ordering::Relaxed);
        Some(j)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh() -> Counter {
        Counter {
            next: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            shift: AtomicU8::new(0),
        }
    }

    /// What the stub does to the counter for one call: its index, and
    /// whether it goes on to the trampoline.
    fn stub_call(c: &Counter) -> bool {
        let next = c.next.load(Ordering::Acquire);
        next == 0 || c.calls.fetch_add(1, Ordering::AcqRel) >= next
    }

    #[test]
    fn an_armed_counter_sends_on_exactly_the_drawn_calls() {
        let c = fresh();
        assert!(
            stub_call(&c) && c.calls() == 0,
            "disarmed: every call goes on, none counted"
        );
        let from = c.arm(3, 4);
        assert!(c.is_armed());
        let mut sent = vec![];
        for k in 0..20u64 {
            if stub_call(&c) {
                sent.push(k);
                // The drawn call claims, and sets the next 5 calls on.
                assert_eq!(c.claim(2, 5), Some(if k == 3 { 3 } else { 2 }), "call {k}");
                // A second thread's claim for the same crossing loses.
                assert_eq!(c.claim(2, 5), None);
            }
        }
        assert_eq!(sent, vec![3, 8, 13, 18]);
        assert_eq!(c.calls() - from, 20);
        c.disarm();
        assert!(!c.is_armed() && stub_call(&c));
        assert_eq!(c.claim(0, 1), None, "disarmed: nothing to claim");
    }

    #[test]
    fn each_timed_call_carries_the_shift_its_gap_was_drawn_at() {
        let c = fresh();
        c.arm(5, 1);
        assert!(stub_call(&c));
        assert_eq!(c.claim(7, 1), Some(5));
        assert!(stub_call(&c));
        assert_eq!(c.claim(1, 1), Some(7));
        assert!(stub_call(&c));
        assert_eq!(c.claim(1, 1), Some(1));
    }
}
