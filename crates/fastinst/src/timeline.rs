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
//! the profiler none: writing 100,000 slices at exit takes a noticeable
//! share of a short run's exit.
//!
//! Two filters choose the calls it keeps, both counted when they refuse
//! one: `FASTINST_MIN_DURATION_US` keeps only calls that lasted at least
//! that long (wall time): the slow calls, each with the calls around it,
//! which lasted longer still, so the tail-latency question is answered
//! with a path. `FASTINST_MAX_DEPTH` keeps only calls at most that deep on
//! their thread, the outermost traced call being 1 (the trace tool; the
//! profiler's timed calls have no depth and are never refused by it).

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

/// One call, as a tool hands it to its log.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Call {
    /// Its thread.
    pub tid: i32,
    /// Its function's index.
    pub func: u32,
    /// When it began and ended (TSC).
    pub start: u64,
    pub end: u64,
    /// The program's own time in it (ticks).
    pub own: u64,
    /// The calls it stands for.
    pub weight: u32,
    /// How deep it was on its thread, the outermost traced call being 1
    /// (0: not known).
    pub depth: u32,
}

/// A tool's timeline log.
pub(crate) struct Log {
    slots: Box<[Slot]>,
    next: AtomicU64,
    /// The filters: the shortest call kept (TSC ticks of wall time) and
    /// the deepest; and the calls they refused.
    min_ticks: u64,
    max_depth: u32,
    filtered: AtomicU64,
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
        let mut log = Log::with_capacity(calls);
        if let Some(us) = crate::env::var("FASTINST_MIN_DURATION_US") {
            match us.trim().parse::<f64>() {
                Ok(us) if us >= 0.0 && us.is_finite() => log.min_ticks = (us * ticks_per_us()) as u64,
                _ => crate::log::error(format_args!(
                    "FASTINST_MIN_DURATION_US: `{us}` is not a number of microseconds; keeping calls of any length"
                )),
            }
        }
        if let Some(d) = crate::env::var("FASTINST_MAX_DEPTH") {
            match d.trim().parse::<u32>() {
                Ok(d) if d >= 1 => log.max_depth = d,
                _ => crate::log::error(format_args!(
                    "FASTINST_MAX_DEPTH: `{d}` is not a depth of 1 or more; keeping calls at any depth"
                )),
            }
        }
        log
    }

    /// A log of `calls` slots, with no filter.
    pub(crate) fn with_capacity(calls: usize) -> Log {
        Log {
            slots: (0..calls).map(|_| Slot::default()).collect(),
            next: AtomicU64::new(0),
            min_ticks: 0,
            max_depth: u32::MAX,
            filtered: AtomicU64::new(0),
        }
    }

    /// A log of `calls` slots that keeps calls of at least `min_ticks` and
    /// at most `max_depth` deep.
    #[cfg(test)]
    fn filtered_with(calls: usize, min_ticks: u64, max_depth: u32) -> Log {
        Log {
            min_ticks,
            max_depth,
            ..Log::with_capacity(calls)
        }
    }

    /// Appends call `c`. Lock-free, allocation-free; a call the filters
    /// refuse, or one that ends once the log is full, is only counted.
    #[inline]
    pub(crate) fn push(&self, c: Call) {
        let Call {
            tid,
            func,
            start,
            end,
            own,
            weight,
            depth,
        } = c;
        if end.saturating_sub(start) < self.min_ticks || depth > self.max_depth {
            self.filtered.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed) as usize;
        let Some(slot) = self.slots.get(i) else { return };
        slot.start.store(start, Ordering::Relaxed);
        slot.end.store(end, Ordering::Relaxed);
        slot.own.store(own, Ordering::Relaxed);
        slot.weight.store(weight, Ordering::Relaxed);
        let meta = (u64::from(func) << 32) | u64::from((tid as u32).wrapping_add(1));
        slot.meta.store(meta, Ordering::Release);
    }

    /// Calls the filters refused.
    pub(crate) fn filtered(&self) -> u64 {
        self.filtered.load(Ordering::Relaxed)
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
        self.filtered.store(0, Ordering::Relaxed);
    }
}

/// TSC ticks per microsecond, measured over 2 ms of wall time (once, when
/// a filter needs it).
fn ticks_per_us() -> f64 {
    let (t0, i0) = (wordpatch::tsc::now(), std::time::Instant::now());
    while i0.elapsed() < std::time::Duration::from_millis(2) {
        std::hint::spin_loop();
    }
    let us = i0.elapsed().as_secs_f64() * 1e6;
    wordpatch::tsc::now().saturating_sub(t0) as f64 / us
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
                        log.push(Call {
                            tid: t,
                            func: 7,
                            start: i * 10,
                            end: i * 10 + 5 + t as u64,
                            own: 3,
                            weight: 2,
                            depth: 1,
                        });
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

    /// The filters keep the calls at least as long and at most as deep as
    /// asked, count the others, and take no slot for them.
    #[test]
    fn the_filters_keep_long_shallow_calls_and_count_the_rest() {
        let log = Log::filtered_with(10, 100, 2);
        // (duration, depth): kept when >= 100 ticks and <= 2 deep.
        let calls = [(500, 1), (99, 1), (100, 2), (1_000, 3), (150, 2), (5, 0), (200, 0)];
        for (i, &(d, depth)) in calls.iter().enumerate() {
            log.push(Call {
                tid: 1,
                func: i as u32,
                start: 1_000,
                end: 1_000 + d,
                own: d,
                weight: 1,
                depth,
            });
        }
        let kept: Vec<u32> = log.tracks()[0].slices.iter().map(|s| s.func).collect();
        assert_eq!(kept, vec![0, 2, 4, 6]);
        assert_eq!(log.filtered(), 3);
        assert_eq!(log.dropped(), 0);
        log.clear();
        assert_eq!(log.filtered(), 0);
    }
}
