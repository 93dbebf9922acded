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
//! [`Counter`] lies in read-write memory beside the stubs. A counter is
//! [`LANES`] lanes, a cache line each, and a thread counts in the lane its
//! clock names (`crate::clock::ThreadClock::lane`; lane 0 for a thread
//! with no clock yet). One shared line was passed between the CPUs of the
//! threads calling a function at once, a cost no calibration on one thread
//! sees: it ran in the program's time, and a function called densely on
//! several threads read its calls low.
//!
//! While the counter is armed (lane 0's `next != 0`) a call
//! - adds one to its thread's fast-call count
//!   (`crate::clock::ThreadClock::fast_calls`, found through the clock's
//!   static TLS slot), which the clock charges at the path's calibrated
//!   cost;
//! - adds one to its lane's `calls` with `lock xadd`, reading its index
//!   `i`;
//! - if `i >= next` (its lane's), goes on to the trampoline: it is the
//!   call drawn for timing (or a thread raced it there; [`Counter::claim`]
//!   sorts them); else returns.
//!
//! A thread with no clock yet counts the call in lane 0 and goes on to
//! the trampoline, whose hook makes it one.
//!
//! Disarmed (lane 0's `next == 0`, as it starts) the stub goes straight to
//! the trampoline: every call runs the full hook, as every tool but the
//! profiler's windows wants.
//!
//! The path clobbers `rflags` (saving `rax` and `rcx`), which is sound at a
//! function's entry only: the ABI does not preserve flags across a call.
//! Point and `-pg` stubs never get one.
//!
//! The calls drawn for timing are a geometric renewal in each lane: after
//! each, the next is `G` calls on, `G` geometric with the chance `2^-j`
//! the sampler set ([`crate::profile`]'s `choose::gap`). That is the same
//! as drawing each call independently with that chance, which is what the
//! timed calls' weights assume, whichever lane the call came through.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

/// Lanes per counter. More lanes part more concurrent threads, at a cache
/// line each per function.
pub(crate) const LANES: usize = 4;

/// Bytes per lane: a cache line.
const LANE_LEN: usize = 64;

/// Bytes each counter takes.
pub(crate) const COUNTER_LEN: usize = LANE_LEN * LANES;

/// The byte offset of the lane the `i`-th thread to get a clock counts in
/// (what the stub adds to its counter's address).
pub(crate) fn lane_offset(i: u32) -> u64 {
    (i as usize % LANES * LANE_LEN) as u64
}

/// The lane a [`lane_offset`] names.
pub(crate) fn lane_index(offset: u64) -> usize {
    offset as usize / LANE_LEN % LANES
}

/// One lane of a counter. The stub reads `next` at offset 0 and `calls`
/// at offset 8 of its lane.
#[repr(C, align(64))]
struct Lane {
    /// The index of the next call to go on to the trampoline; 0 while
    /// disarmed.
    next: AtomicU64,
    /// Calls counted in this lane while armed (never 0 once armed, so
    /// that `next`, which is at least `calls`, is never 0 while armed).
    calls: AtomicU64,
    /// The shift `j` the pending gap was drawn with: a call it leads to
    /// stands for `2^j` calls.
    shift: AtomicU8,
}

/// One function's counter (for one entry stub): its lanes. Lane 0's
/// `next` is also the stub's armed flag, so it is armed last and
/// disarmed first.
#[repr(C, align(64))]
pub(crate) struct Counter {
    lanes: [Lane; LANES],
}

const _: () = assert!(std::mem::offset_of!(Lane, next) == 0);
const _: () = assert!(std::mem::offset_of!(Lane, calls) == 8);
const _: () = assert!(std::mem::size_of::<Lane>() == LANE_LEN);
const _: () = assert!(std::mem::size_of::<Counter>() == COUNTER_LEN);

impl Counter {
    /// Calls counted so far, over its lanes.
    #[inline(always)]
    pub(crate) fn calls(&self) -> u64 {
        self.lanes.iter().map(|l| l.calls.load(Ordering::Acquire)).sum()
    }

    /// Whether the stub counts calls now.
    #[cfg(test)]
    pub(crate) fn is_armed(&self) -> bool {
        self.lanes[0].next.load(Ordering::Acquire) != 0
    }

    /// Starts counting, each lane's first call to time `gap()` calls on
    /// (at least 1: the very next call) drawn at shift `shift`; returns
    /// [`Counter::calls`] from which this stretch counts. For one arming
    /// thread at a time (the profiler's schedule).
    pub(crate) fn arm(&self, shift: u8, mut gap: impl FnMut() -> u64) -> u64 {
        let mut from = 0;
        // Lane 0 last: a stub that sees it armed sees every lane armed.
        for l in self.lanes.iter().rev() {
            if l.calls.load(Ordering::Relaxed) == 0 {
                // Disarmed, the stub does not touch `calls`.
                l.calls.store(1, Ordering::Relaxed);
            }
            let c = l.calls.load(Ordering::Relaxed);
            l.shift.store(shift, Ordering::Relaxed);
            // Release: a stub that sees `next` sees the rest.
            l.next.store(c + gap().max(1) - 1, Ordering::Release);
            from += c;
        }
        from
    }

    /// Stops counting: every call goes to the trampoline.
    pub(crate) fn disarm(&self) {
        // Lane 0 first: the stub's flag.
        for l in &self.lanes {
            l.next.store(0, Ordering::Release);
        }
    }

    /// On the trampoline's path, for a call of an armed counter that its
    /// stub counted in lane `lane`: whether this call is the one drawn for
    /// timing, with the shift it was drawn at; if so, that lane's next is
    /// drawn `gap` calls on at shift `next_shift`. Of the threads that
    /// crossed `next` together, one wins; the others (and a call that came
    /// only to make its thread a clock) are counted and not timed.
    pub(crate) fn claim(&self, lane: usize, next_shift: u8, gap: u64) -> Option<u8> {
        let l = &self.lanes[lane % LANES];
        let n = l.next.load(Ordering::Acquire);
        // Disarmed meanwhile, or the drawn call has not come yet (its
        // index `n` is counted once `calls` passes it).
        if n == 0 || l.calls.load(Ordering::Acquire) <= n {
            return None;
        }
        let j = l.shift.load(Ordering::Relaxed);
        l.next
            .compare_exchange(n, n + gap.max(1), Ordering::AcqRel, Ordering::Relaxed)
            .ok()?;
        l.shift.store(next_shift, Ordering::Relaxed);
        Some(j)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh() -> Counter {
        // SAFETY: a counter is atomics only, and all zeroes is a valid,
        // disarmed one (the stubs' counters start as zeroed pages).
        unsafe { std::mem::zeroed() }
    }

    /// What the stub does to the counter for one call in lane `lane`:
    /// whether it goes on to the trampoline.
    fn stub_call(c: &Counter, lane: usize) -> bool {
        if c.lanes[0].next.load(Ordering::Acquire) == 0 {
            return true;
        }
        let l = &c.lanes[lane];
        l.calls.fetch_add(1, Ordering::AcqRel) >= l.next.load(Ordering::Acquire)
    }

    #[test]
    fn an_armed_counter_sends_on_exactly_the_drawn_calls() {
        let c = fresh();
        assert!(
            stub_call(&c, 1) && c.calls() == 0,
            "disarmed: every call goes on, none counted"
        );
        let from = c.arm(3, || 4);
        assert!(c.is_armed());
        let mut sent = vec![];
        for k in 0..20u64 {
            if stub_call(&c, 1) {
                sent.push(k);
                // The drawn call claims, and sets the next 5 calls on.
                assert_eq!(c.claim(1, 2, 5), Some(if k == 3 { 3 } else { 2 }), "call {k}");
                // A second thread's claim for the same crossing loses.
                assert_eq!(c.claim(1, 2, 5), None);
            }
        }
        assert_eq!(sent, vec![3, 8, 13, 18]);
        assert_eq!(c.calls() - from, 20);
        c.disarm();
        assert!(!c.is_armed() && stub_call(&c, 1));
        assert_eq!(c.claim(1, 0, 1), None, "disarmed: nothing to claim");
    }

    #[test]
    fn each_timed_call_carries_the_shift_its_gap_was_drawn_at() {
        let c = fresh();
        c.arm(5, || 1);
        assert!(stub_call(&c, 0));
        assert_eq!(c.claim(0, 7, 1), Some(5));
        assert!(stub_call(&c, 0));
        assert_eq!(c.claim(0, 1, 1), Some(7));
        assert!(stub_call(&c, 0));
        assert_eq!(c.claim(0, 1, 1), Some(1));
    }

    /// Each lane draws on its own: the calls through one lane do not move
    /// another's draw, a claim in one lane takes none of another's, and
    /// the count is the lanes' sum.
    #[test]
    fn lanes_count_and_draw_apart() {
        let c = fresh();
        let mut gaps = [3u64, 2, 6, 5].into_iter();
        // Armed from the last lane to the first.
        let from = c.arm(2, || gaps.next().unwrap());
        let sent = |lane: usize, calls: u64| (0..calls).filter(|_| stub_call(&c, lane)).count();
        // Lane 3 drew 3, lane 0 drew 5: lane 3's third call goes on,
        // lane 0's first four do not.
        assert_eq!(sent(0, 4), 0);
        assert_eq!(sent(3, 3), 1);
        assert_eq!(c.claim(0, 2, 100), None, "lane 0's draw is still ahead");
        assert_eq!(c.claim(3, 2, 100), Some(2));
        assert_eq!(sent(0, 1), 1, "lane 0's fifth call");
        assert_eq!(c.claim(0, 2, 100), Some(2));
        assert_eq!(c.calls() - from, 8);
        assert!(lane_offset(5) == 64 && lane_index(lane_offset(6)) == 2);
    }
}
