//! The profiler's time as its CPU samples see it, beside what was charged,
//! thread by thread.
//!
//! The program clock (`crate::clock`) takes off each thread's durations
//! the time its hooks took as stamped, what the stamps miss, and its
//! counted calls and cheap exits at costs calibrated at start in a tight
//! loop. In a real program the same paths cost more: a counter's cache
//! line missed, a trampoline's stores waiting behind the program's. That
//! time stays in every duration the thread measures. The CPU samples
//! (`super::cpusample`) land in the profiler's code (a handler, its
//! library, a stub) in proportion to the time it really took, so a
//! thread's samples there, against its charge over the same stretch,
//! measure what the charge left in: the report states it beside the
//! totals and latencies it lengthens (`fastinst_report::CpuOut::threads`).
//!
//! The charge is read when the samples begin ([`begin`]) and when they
//! stop ([`freeze`]): the profiler's own work at exit is charged after
//! that, and no sample sees it.

use super::cpusample::Sample;
use fastinst_report::fx::FxMap;
use fastinst_report::CpuThread;
use std::sync::Mutex;

/// Each thread's charge (ticks, by its place in the clock's table) when
/// the samples began, and when they stopped (`None` while they run). A
/// thread's charge grows for the life of the process, through a detach and
/// the next attach, while the samples are a generation's: only the growth
/// between the two is beside them.
struct Marks {
    began: Vec<u64>,
    ended: Option<Vec<u64>>,
}

static MARKS: Mutex<Marks> = Mutex::new(Marks {
    began: Vec::new(),
    ended: None,
});

/// The hooks' charges alone: the sampling signals' are charged apart
/// (`crate::clock::charge_signal`), and no sample sees a signal's cost.
fn charges() -> Vec<u64> {
    crate::clock::threads().map(|t| t.hooks_alone()).collect()
}

fn marks() -> std::sync::MutexGuard<'static, Marks> {
    MARKS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Notes every thread's charge as the samples begin (a profiler's start,
/// a new generation's, a forked child's).
pub(crate) fn begin() {
    let began = charges();
    *marks() = Marks { began, ended: None };
}

/// Notes every thread's charge now, as the samples stop for the report.
pub(crate) fn freeze() {
    marks().ended = Some(charges());
}

/// The sampled threads' rows, from `samples` (each with whether it fell
/// in the profiler's code) and the clock's threads, with their charges
/// from [`begin`] to [`freeze`] or, while samples are taken, to now.
pub(super) fn rows(samples: &[(Sample, bool)], ticks_per_ms: f64) -> Vec<CpuThread> {
    let m = marks();
    tally(samples, ticks_per_ms, |i| {
        let t = crate::clock::thread(i)?;
        let at = |v: &Vec<u64>| v.get(i as usize).copied();
        // A thread first clocked after the end had no charge in it.
        let end = m.ended.as_ref().map_or_else(|| Some(t.hooks_alone()), at).unwrap_or(0);
        let start = at(&m.began).unwrap_or(0);
        Some((t.tid(), end.saturating_sub(start)))
    })
}

/// [`rows`] with the threads' ids and charges from `thread` (by place in
/// the table: its id and the ticks charged to it while the samples were
/// taken), ordered by samples, most first.
/// Samples of a thread the table does not name are in no row.
fn tally(samples: &[(Sample, bool)], ticks_per_ms: f64, thread: impl Fn(u32) -> Option<(i32, u64)>) -> Vec<CpuThread> {
    let mut by_thread: FxMap<u32, (u64, u64)> = FxMap::default();
    for (s, profiler) in samples {
        if let Some(i) = s.thread {
            let e = by_thread.entry(i).or_default();
            e.0 += 1;
            e.1 += u64::from(*profiler);
        }
    }
    let mut rows: Vec<CpuThread> = by_thread
        .into_iter()
        .filter_map(|(i, (samples, profiler_samples))| {
            let (tid, ticks) = thread(i)?;
            Some(CpuThread {
                tid,
                samples,
                profiler_samples,
                charged_ms: ticks as f64 / ticks_per_ms,
            })
        })
        .collect();
    rows.sort_by(|a, b| b.samples.cmp(&a.samples).then(a.tid.cmp(&b.tid)));
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(thread: Option<u32>) -> Sample {
        Sample {
            pc: 0x1000,
            in_hook: false,
            thread,
        }
    }

    #[test]
    fn each_thread_gets_its_own_samples_and_charge() {
        // Thread 0: 3 samples, 1 in the profiler; thread 2: 2, both; a
        // sample without a thread and one of a thread the table lacks
        // (place 9) are in no row.
        let samples = [
            (s(Some(0)), false),
            (s(Some(2)), true),
            (s(Some(0)), true),
            (s(None), true),
            (s(Some(0)), false),
            (s(Some(9)), true),
            (s(Some(2)), true),
        ];
        let thread = |i| match i {
            0 => Some((100, 2_500)),
            2 => Some((102, 500)),
            _ => None,
        };
        let rows = tally(&samples, 1000.0, thread);
        assert_eq!(
            rows,
            vec![
                CpuThread {
                    tid: 100,
                    samples: 3,
                    profiler_samples: 1,
                    charged_ms: 2.5
                },
                CpuThread {
                    tid: 102,
                    samples: 2,
                    profiler_samples: 2,
                    charged_ms: 0.5
                },
            ]
        );
        // Thread 0's profiler time at 500 us a sample: 0.5 ms seen, 2.5
        // charged; thread 2's: 1.0 seen, 0.5 charged.
        let cpu = fastinst_report::CpuOut {
            interval_us: 500.0,
            threads: rows,
            ..Default::default()
        };
        let (d, sd) = cpu.uncharged_ms(Some(&[102])).unwrap();
        assert!(
            (d - 0.5).abs() < 1e-9 && (sd - 2f64.sqrt() * 0.5).abs() < 1e-9,
            "{d} {sd}"
        );
        let (d, _) = cpu.uncharged_ms(None).unwrap();
        assert!((d - (1.5 - 3.0)).abs() < 1e-9, "{d}");
        assert_eq!(cpu.uncharged_ms(Some(&[7])), None);
    }
}
