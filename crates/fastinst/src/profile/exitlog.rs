//! When a function's exit probes went off: the moment from which its timed
//! calls still in flight were no longer watched.
//!
//! A timed call whose exit probe goes off before it returns loses its exit
//! and is dropped. Which calls that happens to is not random: the probe goes
//! off once the window has closed and other threads' untimed exits have
//! spent the function's budget ([`super::functions::EXIT_BUDGET`]), so the
//! calls still in flight then are the long ones. Dropping them read a
//! function whose rare calls block (a cache miss that sleeps) at half its
//! inclusive time, below its own callee's. Each such call is known to have
//! lasted at least until its probe went off: a right-censored duration,
//! which [`super::survival`] weighs without bias. This log gives that
//! moment for a call by its watch stamp ([`super::thread::Frame::exit_gen`]).

use std::sync::atomic::{AtomicU64, Ordering};

/// Switches remembered per function: a call's censoring time is found if
/// fewer than this many switches of the function's exit probes happened
/// between its entry and its drop (otherwise it is censored at its entry,
/// which says only that it happened).
const SLOTS: usize = 8;

/// Marks a slot being written.
const WRITING: u64 = u64::MAX;

/// The last [`SLOTS`] switches of one function's exit probes.
pub(crate) struct ExitLog {
    /// `stamp << 1 | off` of the switch in each slot.
    key: [AtomicU64; SLOTS],
    /// Its wall TSC.
    at: [AtomicU64; SLOTS],
}

impl ExitLog {
    pub(crate) fn new() -> ExitLog {
        ExitLog {
            key: std::array::from_fn(|_| AtomicU64::new(WRITING)),
            at: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// Notes the switch that moved the function's watch stamp to `stamp`
    /// (`off`: an exit probe went off), at wall TSC `t`.
    pub(crate) fn note(&self, stamp: u32, off: bool, t: u64) {
        let i = stamp as usize % SLOTS;
        self.key[i].store(WRITING, Ordering::Relaxed);
        self.at[i].store(t, Ordering::Release);
        self.key[i].store(u64::from(stamp) << 1 | u64::from(off), Ordering::Release);
    }

    /// When an exit probe went off right after stamp `stamp`, if the next
    /// switch was that and is still remembered.
    pub(crate) fn off_after(&self, stamp: u32) -> Option<u64> {
        let next = stamp.wrapping_add(1);
        let i = next as usize % SLOTS;
        let want = u64::from(next) << 1 | 1;
        if self.key[i].load(Ordering::Acquire) != want {
            return None;
        }
        let t = self.at[i].load(Ordering::Acquire);
        // A writer that took the slot meanwhile changed its key first.
        (self.key[i].load(Ordering::Acquire) == want).then_some(t)
    }

    /// Forgets every switch (a forked child).
    pub(crate) fn reset(&self) {
        for k in &self.key {
            k.store(WRITING, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_switch_after_a_stamp_is_found_only_if_it_was_an_off() {
        let log = ExitLog::new();
        assert_eq!(log.off_after(0), None);
        log.note(1, true, 100);
        log.note(2, false, 200);
        assert_eq!(log.off_after(0), Some(100));
        // The switch after stamp 1 switched a probe on: no censoring time.
        assert_eq!(log.off_after(1), None);
        assert_eq!(log.off_after(2), None);
    }

    #[test]
    fn an_overwritten_switch_is_not_mistaken_for_another() {
        let log = ExitLog::new();
        for s in 1..=(SLOTS as u32 + 1) {
            log.note(s, true, u64::from(s) * 10);
        }
        // Stamp 1's slot now holds stamp SLOTS + 1.
        assert_eq!(log.off_after(0), None);
        assert_eq!(log.off_after(SLOTS as u32), Some((SLOTS as u64 + 1) * 10));
        log.reset();
        assert_eq!(log.off_after(SLOTS as u32), None);
    }
}
