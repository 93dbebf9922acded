//! One stress trial: executor threads run the site while one patcher toggles
//! it; and the same trial run in a forked child so that a crash is counted.

use crate::fetch::Fetch;
use crate::fixture::{Fixture, Place};
use crate::method::{Method, Toggler};
use callpatch::Form;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What one trial is asked to do.
#[derive(Clone, Copy, Debug)]
pub struct TrialSpec {
    /// Toggle strategy.
    pub strategy: Method,
    /// Site form.
    pub form: Form,
    /// Where the site lies in its line (or across two).
    pub place: Place,
    /// Executor threads.
    pub executors: usize,
    /// How they fetch the site.
    pub fetch: Fetch,
    /// Stop after this many toggles...
    pub max_toggles: u64,
    /// ...or after this long, whichever comes first.
    pub max_time: Duration,
    /// W^X: the site's code is read+execute only and patched through an
    /// alias ([`wordpatch::WriteMode::Alias`]); set in the trial's process.
    pub wx: bool,
}

/// What a trial that did not crash measured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrialStats {
    /// Toggles done.
    pub toggles: u64,
    /// Toggles during which the executors made progress or trapped on the
    /// site's INT3: the evidence that they really ran the site while it was
    /// being patched.
    pub corun_toggles: u64,
    /// Executor calls of the site while the patcher toggled.
    pub calls_during: u64,
    /// Calls that found the site active / inactive.
    pub seen_on: u64,
    /// See `seen_on`.
    pub seen_off: u64,
    /// Calls that returned a value no valid state produces (torn code).
    pub bad: u64,
    /// Toggle errors (the site was not in the state last written).
    pub toggle_errors: u64,
}

const FIELDS: usize = 7;

impl TrialStats {
    fn to_words(self) -> [u64; FIELDS] {
        [
            self.toggles,
            self.corun_toggles,
            self.calls_during,
            self.seen_on,
            self.seen_off,
            self.bad,
            self.toggle_errors,
        ]
    }
    fn from_words(w: [u64; FIELDS]) -> Self {
        TrialStats {
            toggles: w[0],
            corun_toggles: w[1],
            calls_during: w[2],
            seen_on: w[3],
            seen_off: w[4],
            bad: w[5],
            toggle_errors: w[6],
        }
    }
}

#[repr(align(128))]
#[derive(Default)]
struct Padded(AtomicU64);

/// Runs a trial in this process (a crash takes the process down: see
/// [`run_forked`]).
pub fn run_trial(spec: &TrialSpec) -> Result<TrialStats, String> {
    run_trial_reporting(spec, None)
}

/// [`run_trial`], publishing the toggle count every 64 toggles to `progress`
/// (memory shared with the parent, so a crashed trial's toggles are known).
fn run_trial_reporting(spec: &TrialSpec, progress: Option<&AtomicU64>) -> Result<TrialStats, String> {
    if spec.wx {
        wordpatch::set_write_mode(wordpatch::WriteMode::Alias);
    }
    let fx = Arc::new(Fixture::at(spec.form, spec.place).map_err(|e| format!("fixture: {e}"))?);
    let toggler = Toggler::new(&fx, spec.strategy)?;
    if spec.wx && wordpatch::aliased_bytes() == 0 {
        return Err("W^X asked for, and the site's code is not aliased".into());
    }
    crate::crash::set_site(fx.site as usize);
    let stop = Arc::new(AtomicBool::new(false));
    let go = Arc::new(AtomicBool::new(false));
    let counters: Arc<Vec<Padded>> = Arc::new((0..spec.executors).map(|_| Padded::default()).collect());
    let mut handles = Vec::new();
    for i in 0..spec.executors {
        let (fx, stop, go, counters) = (fx.clone(), stop.clone(), go.clone(), counters.clone());
        let (fetch, last_byte) = (spec.fetch, fx.site as usize + spec.form.len() - 1);
        handles.push(std::thread::spawn(move || {
            let (mut on, mut off, mut bad, mut n) = (0u64, 0u64, 0u64, 0u64);
            while !go.load(Ordering::Acquire) {
                core::hint::spin_loop();
            }
            while !stop.load(Ordering::Relaxed) {
                fetch.prepare(last_byte as *const u8);
                match fx.classify((fx.entry)()) {
                    Some(true) => on += 1,
                    Some(false) => off += 1,
                    None => bad += 1,
                }
                n += 1;
                counters[i].0.store(n, Ordering::Relaxed);
            }
            (on, off, bad)
        }));
    }
    let total = || counters.iter().map(|c| c.0.load(Ordering::Relaxed)).sum::<u64>();
    go.store(true, Ordering::Release);
    // Let the executors get going before the first toggle.
    let warm = Instant::now();
    while total() < 1000 && warm.elapsed() < Duration::from_millis(200) {
        std::thread::yield_now();
    }
    let start_calls = total();
    let mut st = TrialStats::default();
    let deadline = Instant::now() + spec.max_time;
    let mut on = true;
    while st.toggles < spec.max_toggles {
        if st.toggles % 64 == 0 {
            if let Some(p) = progress {
                p.store(st.toggles, Ordering::Relaxed);
            }
            if Instant::now() >= deadline {
                break;
            }
        }
        let before = (total(), wordpatch::traps_handled());
        on = !on;
        if toggler.set(on).is_err() {
            st.toggle_errors += 1;
        }
        if (total(), wordpatch::traps_handled()) != before {
            st.corun_toggles += 1;
        }
        st.toggles += 1;
    }
    st.calls_during = total() - start_calls;
    // Leave the site active, as found.
    if !on && toggler.set(true).is_err() {
        st.toggle_errors += 1;
    }
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        let (on, off, bad) = h.join().map_err(|_| "executor panicked".to_string())?;
        st.seen_on += on;
        st.seen_off += off;
        st.bad += bad;
    }
    Ok(st)
}

/// How a forked trial ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It ran to the end; `stats.bad` and `stats.toggle_errors` may still
    /// report wrong behaviour short of a crash.
    Completed(TrialStats),
    /// The child died of a signal (SIGSEGV, SIGILL, SIGTRAP, ...).
    Crashed {
        /// The signal.
        signal: i32,
        /// Toggles done before the crash (to within 64).
        toggles: u64,
    },
    /// The child did not finish in time and was killed.
    Hung {
        /// Toggles done before it stopped making progress (to within 64).
        toggles: u64,
    },
    /// The child exited with an error before reporting.
    Error(String),
}

impl Outcome {
    /// True for every outcome but a clean completion.
    pub fn is_failure(&self) -> bool {
        match self {
            Outcome::Completed(s) => s.bad > 0 || s.toggle_errors > 0,
            _ => true,
        }
    }
}

/// Runs the trial in a forked child and reports how it ended. Call from a
/// single-threaded process (the stress binary): the child starts its own
/// executor threads.
pub fn run_forked(spec: &TrialSpec) -> Outcome {
    match in_child(spec.max_time + Duration::from_secs(30), |progress| {
        run_trial_reporting(spec, Some(progress)).map(TrialStats::to_words)
    }) {
        Forked::Completed(w) => Outcome::Completed(TrialStats::from_words(w)),
        Forked::Crashed { signal, progress } => Outcome::Crashed {
            signal,
            toggles: progress,
        },
        Forked::Hung { progress } => Outcome::Hung { toggles: progress },
        Forked::Error(e) => Outcome::Error(e),
    }
}

/// How a child of [`in_child`] ended.
pub(crate) enum Forked<const N: usize> {
    /// It returned its words.
    Completed([u64; N]),
    /// It died of `signal` after reporting `progress`.
    Crashed { signal: i32, progress: u64 },
    /// It was killed at the limit after reporting `progress`.
    Hung { progress: u64 },
    /// It failed before reporting.
    Error(String),
}

/// Runs `child` in a forked child, which publishes its progress in memory
/// shared with this process (so a crash still says how far it got) and
/// returns N words through a pipe; kills it after `limit`. Call from a
/// single-threaded process: the child's copy of the heap and locks must be
/// consistent.
pub(crate) fn in_child<const N: usize>(
    limit: Duration,
    child: impl FnOnce(&AtomicU64) -> Result<[u64; N], String>,
) -> Forked<N> {
    let shared = match SharedCounter::new() {
        Ok(c) => c,
        Err(e) => return Forked::Error(format!("mmap: {e}")),
    };
    let mut fds = [0i32; 2];
    // SAFETY: pipe writes two fds into the array.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Forked::Error(format!("pipe: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: the caller is single-threaded, so the child's copy of the
    // heap and locks is consistent.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Forked::Error(format!("fork: {}", std::io::Error::last_os_error()));
    }
    if pid == 0 {
        // SAFETY: child: close the read end, report through the write end,
        // and leave with _exit so no parent state (atexit, buffers) runs twice.
        unsafe {
            libc::close(fds[0]);
            crate::crash::install();
            let code = match child(shared.get()) {
                Ok(w) => {
                    let bytes = std::slice::from_raw_parts(w.as_ptr() as *const u8, N * 8);
                    libc::write(fds[1], bytes.as_ptr() as *const libc::c_void, bytes.len());
                    0
                }
                Err(e) => {
                    eprintln!("trial error: {e}");
                    2
                }
            };
            libc::_exit(code);
        }
    }
    // SAFETY: parent closes its copy of the write end.
    unsafe { libc::close(fds[1]) };
    let t0 = Instant::now();
    let mut status = 0i32;
    let hung = loop {
        // SAFETY: waitpid on our own child with a valid status pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            break false;
        }
        if t0.elapsed() > limit {
            // SAFETY: killing and reaping our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            break true;
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let mut buf = vec![0u8; N * 8];
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: reading into our buffer from our pipe end.
        let n = unsafe { libc::read(fds[0], buf[got..].as_mut_ptr() as *mut libc::c_void, buf.len() - got) };
        if n <= 0 {
            break;
        }
        got += n as usize;
    }
    // SAFETY: closing our pipe end.
    unsafe { libc::close(fds[0]) };
    let progress = shared.get().load(Ordering::Relaxed);
    if hung {
        return Forked::Hung { progress };
    }
    if libc::WIFSIGNALED(status) {
        return Forked::Crashed {
            signal: libc::WTERMSIG(status),
            progress,
        };
    }
    if got != buf.len() || libc::WEXITSTATUS(status) != 0 {
        return Forked::Error(format!(
            "child exited with {} before reporting",
            libc::WEXITSTATUS(status)
        ));
    }
    let mut w = [0u64; N];
    for (i, c) in buf.chunks_exact(8).enumerate() {
        w[i] = u64::from_le_bytes(c.try_into().expect("8 bytes"));
    }
    Forked::Completed(w)
}

/// A counter in a shared anonymous page: written by the forked child, read by
/// the parent after the child is gone.
struct SharedCounter(*mut AtomicU64);

impl SharedCounter {
    fn new() -> std::io::Result<SharedCounter> {
        // SAFETY: a fresh shared anonymous page, zero-filled, owned by this value.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(SharedCounter(p as *mut AtomicU64))
    }

    fn get(&self) -> &AtomicU64 {
        // SAFETY: the page is mapped, aligned and zero-initialised (a valid
        // AtomicU64) for as long as `self` lives.
        unsafe { &*self.0 }
    }
}

impl Drop for SharedCounter {
    fn drop(&mut self) {
        // SAFETY: unmaps the page `new` mapped; no reference outlives `self`.
        unsafe { libc::munmap(self.0 as *mut libc::c_void, 4096) };
    }
}
