//! Test support shared by the workspace's tests (a dev-dependency only): a
//! child process run under a time limit, a seeded random generator
//! ([`Rng`]), a crate's module graph ([`modgraph`]), a counting
//! allocator ([`alloc`]), generated C programs ([`programs`]) and a
//! running program seen from outside ([`process`]).
//!
//! Every test that starts a program (a C test program, the `fastinst`
//! command, the calibration or stress binaries) runs it through
//! [`output_within`]. A child that hangs (a deadlock in the preload
//! library, a patch that loops) then fails its test within the limit and
//! shows where each of its threads was, where a plain `Command::output`
//! would hold the CI run until the CI's own limit, with nothing to read.

pub mod alloc;
pub mod modgraph;
pub mod process;
pub mod programs;
mod rng;
pub use rng::Rng;

use std::io::Read;
use std::os::unix::process::CommandExt as _;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// `LD_LIBRARY_PATH` with `dir` first, for a child linked against the
/// `libfastinst.so` in `dir`: the variable overrides the executable's
/// RUNPATH, and cargo's test and bench environments put the target
/// directory there, whose uplifted copy of the library only `cargo build`
/// refreshes. Stale, it was the library tested: a mutant that swallowed
/// `fastinst_deactivate`'s error passed the C API test.
pub fn library_path_first(dir: &std::path::Path) -> std::ffi::OsString {
    let mut path = std::ffi::OsString::from(dir.as_os_str());
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|v| !v.is_empty()) {
        path.push(":");
        path.push(old);
    }
    path
}

/// `c.output()`, but a child still running after `limit` has its threads'
/// stacks taken (gdb where it can attach, else each thread's state and
/// system call from /proc), is killed with every process it started, and
/// fails the test with them.
///
/// The child leads a process group of its own, so that what it started
/// (the program `fastinst run` runs, a stress trial's forked children) goes
/// with it: a grandchild left running would hold the output pipes open,
/// and reading them would never end.
pub fn output_within(mut c: Command, limit: Duration, what: &str) -> Output {
    // stdin is closed: a child that waits for input would only time out.
    c.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    c.process_group(0);
    let mut child = c.spawn().unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut v);
            }
            v
        })
    };
    let out = drain(child.stdout.take().map(|r| Box::new(r) as Box<dyn Read + Send>));
    let err = drain(child.stderr.take().map(|r| Box::new(r) as Box<dyn Read + Send>));
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t0.elapsed() > limit {
            let stacks = stacks_of(child.id());
            kill_group(child.id());
            let _ = child.kill();
            let _ = child.wait();
            let stdout = out.join().unwrap_or_default();
            let stderr = err.join().unwrap_or_default();
            panic!(
                "{what}: still running after {limit:?}; killed.\nstacks:\n{stacks}\nstdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&stdout),
                String::from_utf8_lossy(&stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }
}

/// Where each thread of process `pid` is: gdb's backtraces, and always
/// each thread's state, kernel wait channel and system call.
fn stacks_of(pid: u32) -> String {
    let mut s = String::new();
    let gdb = Command::new("timeout")
        .args([
            "60",
            "gdb",
            "-p",
            &pid.to_string(),
            "-batch",
            "-ex",
            "thread apply all bt",
        ])
        .stdin(Stdio::null())
        .output();
    match gdb {
        Ok(o) => s.push_str(&String::from_utf8_lossy(&o.stdout)),
        Err(e) => s.push_str(&format!("(no gdb: {e})\n")),
    }
    let tasks = format!("/proc/{pid}/task");
    for t in std::fs::read_dir(&tasks).into_iter().flatten().flatten() {
        let d = t.path();
        let read = |f: &str| std::fs::read_to_string(d.join(f)).unwrap_or_default();
        s.push_str(&format!(
            "task {}: {} | wchan {} | syscall {}\n",
            t.file_name().to_string_lossy(),
            read("stat").trim(),
            read("wchan").trim(),
            read("syscall").trim()
        ));
    }
    s
}

/// Sends SIGKILL to process group `pgid`.
fn kill_group(pgid: u32) {
    if let Ok(pgid) = libc::pid_t::try_from(pgid) {
        // SAFETY: kill(2) with a negative pid signals that process group;
        // it touches no memory of ours.
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_finished_child_gives_its_output_and_status() {
        let mut c = Command::new("sh");
        c.args(["-c", "echo out; echo err >&2; exit 3"]);
        let o = output_within(c, Duration::from_secs(60), "sh");
        assert_eq!(
            (o.status.code(), &o.stdout[..], &o.stderr[..]),
            (Some(3), &b"out\n"[..], &b"err\n"[..])
        );
    }

    #[test]
    fn a_hung_child_and_what_it_started_are_killed_and_fail_the_caller() {
        // The background `sleep` holds the output pipes: unless the whole
        // group goes, reading them would not end for 1,000 s.
        let mut c = Command::new("sh");
        c.args(["-c", "sleep 1000 & sleep 1000"]);
        let t0 = Instant::now();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            output_within(c, Duration::from_millis(300), "hung sh")
        }));
        let msg = r
            .err()
            .and_then(|e| e.downcast::<String>().ok())
            .expect("a panic with a message");
        assert!(msg.contains("hung sh: still running after"), "{msg}");
        assert!(t0.elapsed() < Duration::from_secs(120), "{:?}", t0.elapsed());
    }
}
