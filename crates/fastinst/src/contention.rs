//! How much of their runnable time the program's threads spent waiting
//! for a CPU, from the kernel's per-thread scheduler statistics
//! (`/proc/self/task/*/schedstat`: time on a CPU, time waiting on a run
//! queue, in nanoseconds).
//!
//! A timed call begins when a probe has just been switched on, right after
//! the sampler thread ran; on a machine with more runnable threads than
//! CPUs, whether the program's thread was preempted then (and resumes with
//! a fresh time slice) is not independent of the call, so timed calls can
//! be preempted less, or more, than calls at large. The report cannot
//! correct that; it says when the condition holds.

use std::fs;
use std::sync::atomic::{AtomicU64, Ordering};

/// On-CPU and run-queue nanoseconds of the threads that have exited (a
/// thread's statistics go with it).
static EXITED_RUN: AtomicU64 = AtomicU64::new(0);
static EXITED_WAIT: AtomicU64 = AtomicU64::new(0);

/// Keeps the calling thread's statistics, which its exit takes away: called
/// as it exits (the profiler's thread destructor).
pub(crate) fn thread_exiting() {
    if let Some((_, w)) = fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|t| parse(&t))
    {
        // The running thread's own on-CPU figure lags its current slice
        // (the kernel folds it in at a tick or a switch); its CPU clock
        // does not. No wait accrues while it runs, so that figure is whole.
        EXITED_RUN.fetch_add(crate::rawthread::thread_cpu_ns(), Ordering::Relaxed);
        EXITED_WAIT.fetch_add(w, Ordering::Relaxed);
    }
}

/// The share (percent) of their runnable time that the program's threads
/// waited on a run queue: those alive now, and those that exited through
/// [`thread_exiting`]; `None` if no thread's statistics could be read (a
/// kernel without `CONFIG_SCHEDSTATS`' per-task file, or no `/proc`).
pub(crate) fn wait_share() -> Option<f64> {
    let mut run = u128::from(EXITED_RUN.load(Ordering::Relaxed));
    let mut wait = u128::from(EXITED_WAIT.load(Ordering::Relaxed));
    for e in fs::read_dir("/proc/self/task").ok()?.flatten() {
        let Ok(text) = fs::read_to_string(e.path().join("schedstat")) else {
            continue;
        };
        if let Some((r, w)) = parse(&text) {
            run += u128::from(r);
            wait += u128::from(w);
        }
    }
    (run + wait > 0).then(|| 100.0 * wait as f64 / (run + wait) as f64)
}

/// `(on CPU, waiting)` nanoseconds from one `schedstat` line.
fn parse(line: &str) -> Option<(u64, u64)> {
    let mut w = line.split_whitespace();
    Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schedstat_line_reads_as_run_and_wait() {
        assert_eq!(parse("1067349 2500 1\n"), Some((1_067_349, 2_500)));
        assert_eq!(parse("12"), None);
        assert_eq!(parse("x y z"), None);
    }

    /// This process's threads have run, so a share is read, and it is a
    /// percentage; a thread that exits leaves its time counted.
    #[test]
    fn the_running_process_has_a_share_and_exited_threads_count() {
        let w = wait_share().expect("schedstat is readable here");
        assert!((0.0..=100.0).contains(&w), "{w}");
        let before = EXITED_RUN.load(Ordering::Relaxed);
        // Spins on its own CPU clock: a wall-clock spin on a loaded
        // machine gets less CPU than it lasts.
        std::thread::spawn(|| {
            while crate::rawthread::thread_cpu_ns() < 5_000_000 {}
            thread_exiting();
        })
        .join()
        .unwrap();
        assert!(
            EXITED_RUN.load(Ordering::Relaxed) >= before + 5_000_000,
            "5 ms of CPU kept"
        );
    }
}
