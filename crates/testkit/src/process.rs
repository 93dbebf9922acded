//! A running test program seen from outside: its output once it ends,
//! and what it holds open, for the tests that attach to a program while
//! it runs and check it is left as it was.

use std::io::Read;
use std::process::Child;

/// Waits for `c` (started with its stdout and stderr piped): its stdout,
/// its stderr and its exit status.
pub fn finish(mut c: Child) -> (String, String, Option<i32>) {
    let (mut out, mut err) = (String::new(), String::new());
    if let Some(mut o) = c.stdout.take() {
        o.read_to_string(&mut out).unwrap();
    }
    if let Some(mut e) = c.stderr.take() {
        e.read_to_string(&mut err).unwrap();
    }
    (out, err, c.wait().unwrap().code())
}

/// How many perf events process `pid` holds open (its descriptors that
/// name `perf_event`): none once a profiler's detach closed its CPU
/// sample events, in a program that opens none of its own.
pub fn perf_events_open(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter(|e| std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().contains("perf_event")))
                .count()
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    #[test]
    fn a_finished_child_gives_both_outputs_and_its_status() {
        let c = Command::new("sh")
            .args(["-c", "echo out; echo err >&2; exit 3"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        assert_eq!(finish(c), ("out\n".into(), "err\n".into(), Some(3)));
    }

    #[test]
    fn this_process_holds_no_perf_event() {
        assert_eq!(perf_events_open(std::process::id()), 0);
    }
}
