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

/// The share (percent) of their runnable time that the threads alive now
/// waited on a run queue; `None` if no thread's statistics could be read
/// (a kernel without `CONFIG_SCHEDSTATS`' per-task file, or no `/proc`).
pub(crate) fn wait_share() -> Option<f64> {
    let (mut run, mut wait) = (0u128, 0u128);
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
    /// percentage.
    #[test]
    fn the_running_process_has_a_share() {
        let w = wait_share().expect("schedstat is readable here");
        assert!((0.0..=100.0).contains(&w), "{w}");
    }
}
