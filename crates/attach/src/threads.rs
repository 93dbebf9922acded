//! Stopping every thread of a process with ptrace (`PTRACE_SEIZE`, then
//! `PTRACE_INTERRUPT`), and letting them go again with what they were
//! about to receive.

use crate::error::{AttachError, Result};
use nix::errno::Errno;
use nix::sys::ptrace;
use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::time::{Duration, Instant};

/// A thread held stopped, and the signal it was stopped with (to be
/// delivered when it goes on).
#[derive(Clone, Copy, Debug)]
pub struct Held {
    /// The thread.
    pub tid: Pid,
    /// The signal it was about to receive, if it stopped for one.
    pub pending: Option<Signal>,
}

/// Every thread of a process, stopped.
#[derive(Debug)]
pub struct Stopped {
    /// The process.
    pub pid: i32,
    /// Its threads.
    pub threads: Vec<Held>,
}

/// Whether thread `tid` of process `pid` is ending or gone: its state in
/// `/proc` is zombie or dead, or it is not listed any more.
fn exiting(pid: i32, tid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")) {
        // The state follows the command name's closing parenthesis.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|c| matches!(c, 'Z' | 'X' | 'x')),
        Err(_) => true,
    }
}

/// The thread ids of process `pid`.
pub fn tids(pid: i32) -> Result<Vec<i32>> {
    let dir = format!("/proc/{pid}/task");
    let rd = std::fs::read_dir(&dir).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => AttachError::NoProcess(pid),
        _ => AttachError::io(dir.clone())(e),
    })?;
    let mut v: Vec<i32> = rd
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    v.sort_unstable();
    Ok(v)
}

/// What to do when ptrace is refused, from Yama's `ptrace_scope`.
pub fn ptrace_hint() -> String {
    match std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").map(|s| s.trim().to_string()) {
        Ok(s) if s == "1" => "; kernel.yama.ptrace_scope is 1 (only a parent may trace): allow it with `sudo sysctl kernel.yama.ptrace_scope=0`, or attach with CAP_SYS_PTRACE (as root)".into(),
        Ok(s) if s == "2" => "; kernel.yama.ptrace_scope is 2 (only CAP_SYS_PTRACE may trace): attach as root".into(),
        Ok(s) if s == "3" => "; kernel.yama.ptrace_scope is 3: no process may be traced until the next boot".into(),
        _ => String::new(),
    }
}

/// Waits for `tid`'s next stop within `limit`; `None` if it exited.
pub fn wait_stop(tid: Pid, limit: Duration) -> Result<Option<WaitStatus>> {
    let until = Instant::now() + limit;
    loop {
        match waitpid(tid, Some(WaitPidFlag::__WALL | WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => {
                let now = Instant::now();
                if now > until {
                    return Err(AttachError::Other(format!(
                        "thread {tid} did not stop within {limit:?}"
                    )));
                }
                // A thread stops once it gets a CPU: the first millisecond
                // gives it ours rather than a sleep's worth of timer slack.
                if until - now > limit.saturating_sub(Duration::from_millis(1)) {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
            Ok(WaitStatus::Exited(..)) | Ok(WaitStatus::Signaled(..)) | Err(Errno::ECHILD) => return Ok(None),
            Ok(s) => return Ok(Some(s)),
            Err(Errno::EINTR) => {}
            Err(e) => return Err(AttachError::Other(format!("waiting for thread {tid}: {e}"))),
        }
    }
}

/// The signal a stop holds for its thread (none for a ptrace-stop of our
/// own, such as an interrupt).
pub fn pending_of(s: &WaitStatus) -> Option<Signal> {
    match s {
        WaitStatus::Stopped(_, sig) => Some(*sig),
        _ => None,
    }
}

impl Stopped {
    /// Seizes and stops every thread of `pid`, threads started meanwhile
    /// included (the list is read again until it holds none unstopped).
    pub fn all(pid: i32) -> Result<Stopped> {
        let mut s = Stopped {
            pid,
            threads: Vec::new(),
        };
        // Every thread is asked to stop before any is waited for: they
        // stop side by side, and the stop lasts about as long as the
        // slowest thread's, not the sum of them all.
        loop {
            let mut asked = Vec::new();
            for tid in tids(pid)? {
                if s.threads.iter().any(|h| h.tid.as_raw() == tid) {
                    continue;
                }
                let t = Pid::from_raw(tid);
                match ptrace::seize(t, ptrace::Options::empty()) {
                    Ok(()) => {}
                    Err(Errno::ESRCH) => continue,
                    // The kernel refuses to trace a thread that is exiting
                    // (a runtime thread ending at the detach, say) with
                    // EPERM: it is gone, not forbidden.
                    Err(Errno::EPERM) if exiting(pid, tid) => continue,
                    Err(errno) => {
                        let e = AttachError::Ptrace {
                            pid,
                            errno,
                            hint: if errno == Errno::EPERM {
                                ptrace_hint()
                            } else {
                                String::new()
                            },
                        };
                        for &t in &asked {
                            let _ = wait_stop(t, Duration::from_secs(2));
                            let _ = ptrace::detach(t, None);
                        }
                        s.release();
                        return Err(e);
                    }
                }
                if ptrace::interrupt(t).is_err() {
                    let _ = ptrace::detach(t, None);
                    continue;
                }
                asked.push(t);
            }
            if asked.is_empty() {
                break;
            }
            let mut failed = None;
            for t in asked {
                match wait_stop(t, Duration::from_secs(2)) {
                    Ok(Some(st)) => s.threads.push(Held {
                        tid: t,
                        pending: pending_of(&st),
                    }),
                    Ok(None) => {}
                    Err(e) => {
                        let _ = ptrace::detach(t, None);
                        failed.get_or_insert(e);
                    }
                }
            }
            if let Some(e) = failed {
                s.release();
                return Err(e);
            }
        }
        if s.threads.is_empty() {
            return Err(AttachError::Exited(pid));
        }
        Ok(s)
    }

    /// Each thread's instruction pointer.
    pub fn pcs(&self) -> Vec<(Pid, u64)> {
        self.threads
            .iter()
            .filter_map(|h| Some((h.tid, ptrace::getregs(h.tid).ok()?.rip)))
            .collect()
    }

    /// Single-steps `tid` until its instruction pointer leaves
    /// `(lo, hi)` (at most 16 steps); returns where it is then.
    pub fn step_out(&mut self, tid: Pid, lo: u64, hi: u64) -> Result<u64> {
        for _ in 0..16 {
            let rip = ptrace::getregs(tid)
                .map_err(|e| AttachError::Other(format!("thread {tid}: {e}")))?
                .rip;
            if rip <= lo || rip >= hi {
                return Ok(rip);
            }
            ptrace::step(tid, None).map_err(|e| AttachError::Other(format!("single-step of {tid}: {e}")))?;
            if wait_stop(tid, Duration::from_secs(1))?.is_none() {
                return Err(AttachError::Exited(self.pid));
            }
        }
        Err(AttachError::Other(format!(
            "thread {tid} stayed inside {lo:#x}..{hi:#x}"
        )))
    }

    /// Lets every thread but `keep` go on, with its pending signal; `keep`
    /// stays stopped and traced.
    pub fn release_except(&mut self, keep: Pid) -> Held {
        let kept = self.threads.iter().copied().find(|h| h.tid == keep);
        self.threads.retain(|h| h.tid != keep);
        self.release();
        kept.expect("a held thread")
    }

    /// Lets every thread go on and stops tracing them.
    pub fn release(&mut self) {
        for h in self.threads.drain(..) {
            let _ = ptrace::detach(h.tid, h.pending);
        }
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        self.release();
    }
}
