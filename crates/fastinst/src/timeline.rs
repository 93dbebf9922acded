//! The calls a tool keeps for its timeline (`fastinst_report::timeline`):
//! an append-only log of fixed size, made when the tool starts, that any
//! thread's handler appends to without a lock and without allocating.
//!
//! A handler claims the next slot with one atomic add, writes it, and
//! marks it done last (`Release`); a reader takes only the slots marked
//! done (`Acquire`), so a slot still being written when the report is
//! made (another thread's call ending at that instant) is left out, never
//! read half written. Once the log is full, calls are counted instead.
//! Its size is `FASTINST_TIMELINE` calls (0: no timeline), the first calls
//! to end: ~40 bytes each in memory, ~120 in the file before it is
//! gzipped. The trace tool keeps [`DEFAULT_CALLS`] unless told otherwise;
//! the profiler none: writing 100,000 slices at exit added ~0.3 s to a
//! profiled SQLite run of 1.5 s.

use fastinst_report::timeline::{Slice, Track};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Calls the trace tool's timeline keeps unless `FASTINST_TIMELINE` says
/// otherwise.
pub const DEFAULT_CALLS: usize = 100_000;

/// The most calls `FASTINST_TIMELINE` may ask for (~400 MB of log).
pub const MAX_CALLS: usize = 10_000_000;

/// A slot's `meta` while it is written (or never was).
const EMPTY: u64 = 0;

#[derive(Default)]
struct Slot {
    /// Thread id + 1 in the low 32 bits and the function in the high 32,
    /// stored last: non-zero once the slot is whole.
    meta: AtomicU64,
    start: AtomicU64,
    end: AtomicU64,
    own: AtomicU64,
    weight: AtomicU32,
}

/// A tool's timeline log.
pub(crate) struct Log {
    slots: Box<[Slot]>,
    next: AtomicU64,
}

impl Log {
    /// A log of `FASTINST_TIMELINE` calls, else of `default` (an invalid
    /// value is reported and the default kept). Allocates it whole: call it
    /// when the tool starts, not from a hook.
    pub(crate) fn from_env(default: usize) -> Log {
        let calls = match crate::env::var("FASTINST_TIMELINE") {
            Some(v) => match v.trim().parse::<usize>() {
                Ok(n) if n <= MAX_CALLS => n,
                _ => {
                    crate::log::error(format_args!(
                        "FASTINST_TIMELINE: `{v}` is not a count of calls up to {MAX_CALLS}; using {default}"
                    ));
                    default
                }
            },
            None => default,
        };
        Log::with_capacity(calls)
    }

    /// A log of `calls` slots.
    pub(crate) fn with_capacity(calls: usize) -> Log {
        Log {
            slots: (0..calls).map(|_| Slot::default()).collect(),
            next: AtomicU64::new(0),
        }
    }

    /// Appends a call of function `func` on thread `tid` that ran from TSC
    /// `start` to `end`, `own` of it the program's own time, standing for
    /// `weight` calls. Lock-free, allocation-free; once the log is full the
    /// call is only counted.
    #[inline]
    pub(crate) fn push(&self, tid: i32, func: u32, start: u64, end: u64, own: u64, weight: u32) {
        let i = self.next.fetch_add(1, Ordering::Relaxed) as usize;
        let Some(slot) = self.slots.get(i) else { return };
        slot.start.store(start, Ordering::Relaxed);
        slot.end.store(end, Ordering::Relaxed);
        slot.own.store(own, Ordering::Relaxed);
        slot.weight.store(weight, Ordering::Relaxed);
        let meta = (u64::from(func) << 32) | u64::from((tid as u32).wrapping_add(1));
        slot.meta.store(meta, Ordering::Release);
    }

    /// Calls that ended once the log was full.
    pub(crate) fn dropped(&self) -> u64 {
        self.next
            .load(Ordering::Relaxed)
            .saturating_sub(self.slots.len() as u64)
    }

    /// The calls kept so far, by thread (in order of thread id).
    pub(crate) fn tracks(&self) -> Vec<Track> {
        let n = (self.next.load(Ordering::Relaxed) as usize).min(self.slots.len());
        let mut tracks: Vec<Track> = Vec::new();
        for slot in &self.slots[..n] {
            let meta = slot.meta.load(Ordering::Acquire);
            if meta == EMPTY {
                continue;
            }
            let tid = (meta as u32).wrapping_sub(1) as i32;
            let s = Slice {
                func: (meta >> 32) as u32,
                start: slot.start.load(Ordering::Relaxed),
                end: slot.end.load(Ordering::Relaxed),
                own: slot.own.load(Ordering::Relaxed),
                weight: slot.weight.load(Ordering::Relaxed),
            };
            match tracks.iter_mut().find(|t| t.tid == tid) {
                Some(t) => t.slices.push(s),
                None => tracks.push(Track { tid, slices: vec![s] }),
            }
        }
        tracks.sort_by_key(|t| t.tid);
        tracks
    }

    /// Forgets every call (a forked child keeps its own).
    pub(crate) fn clear(&self) {
        let n = (self.next.load(Ordering::Relaxed) as usize).min(self.slots.len());
        for slot in &self.slots[..n] {
            slot.meta.store(EMPTY, Ordering::Relaxed);
        }
        self.next.store(0, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Threads appending at once: every call below the size is kept whole
    /// and on its own thread's track, the rest are counted as dropped.
    #[test]
    fn threads_append_whole_calls_and_the_overflow_is_counted() {
        let log = Log::with_capacity(1_000);
        std::thread::scope(|s| {
            for t in 0..4 {
                let log = &log;
                s.spawn(move || {
                    for i in 0..400u64 {
                        log.push(t, 7, i * 10, i * 10 + 5 + t as u64, 3, 2);
                    }
                });
            }
        });
        let tracks = log.tracks();
        let kept: usize = tracks.iter().map(|t| t.slices.len()).sum();
        assert_eq!(kept, 1_000);
        assert_eq!(log.dropped(), 600);
        for t in &tracks {
            for s in &t.slices {
                assert_eq!((s.func, s.own, s.weight), (7, 3, 2));
                assert_eq!(
                    s.end - s.start,
                    5 + t.tid as u64,
                    "a slice of thread {} is whole",
                    t.tid
                );
            }
        }
        log.clear();
        assert!(log.tracks().is_empty());
        assert_eq!(log.dropped(), 0);
    }
}
