//! gcc's sleds made one instruction while threads run them, then armed:
//! the stress for [`wordpatch::evacuate`].
//!
//! A page holds [`SledSpec::functions`] functions, each gcc's sled (five
//! one-byte NOPs) then `lea rax, [rdi+1]; ret`, placed 13 bytes apart so
//! that the sleds start at every offset of a cache line, the straddling
//! ones among them. Armed, a sled is `call` to a stub that adds 0x100 to
//! the argument: a call returns x+1 or x+0x101, and anything else (or a
//! crash) is a failure. More executor threads than CPUs call the functions
//! round-robin, so some are preempted inside a sled at any moment. Each
//! round: every sled is back to five NOPs; after a pause the sleds are
//! rewritten to `66 66 66 66 90` (byte by byte, any mix is NOPs), the
//! other threads are checked out of them ([`wordpatch::evacuate`]), every
//! sled is armed and disarmed by [`wordpatch::patch`] (INT3 protocol for
//! the straddlers), and put back to five NOPs. Without the check
//! (`evacuate: false`, the negative control) a preempted thread resumes
//! inside an armed `call`.

use crate::trial::{in_child, Forked};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const STRIDE: usize = 13;
const SLED: [u8; 5] = [0x90; 5];
const NORMALISED: [u8; 5] = [0x66, 0x66, 0x66, 0x66, 0x90];
/// `lea rax, [rdi+1]; ret`, after the sled.
const BODY: [u8; 5] = [0x48, 0x8d, 0x47, 0x01, 0xc3];
/// `add rdi, 0x100; ret`: what an armed sled calls.
const STUB: [u8; 8] = [0x48, 0x81, 0xc7, 0x00, 0x01, 0x00, 0x00, 0xc3];

/// What one run of rounds is asked to do.
#[derive(Clone, Copy, Debug)]
pub struct SledSpec {
    /// Functions (sleds) in the page.
    pub functions: usize,
    /// Executor threads.
    pub executors: usize,
    /// Rounds at most...
    pub max_rounds: u64,
    /// ...or this long, whichever comes first.
    pub max_time: Duration,
    /// Check the threads out of the sleds before arming them.
    pub evacuate: bool,
    /// W^X: the page stays read+execute and is written through an alias
    /// ([`wordpatch::WriteMode::Alias`], the attach's default).
    pub wx: bool,
}

/// What a run of rounds that did not crash measured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SledStats {
    /// Rounds done (each rewrites, arms and puts back every sled).
    pub rounds: u64,
    /// Calls the executors made.
    pub calls: u64,
    /// Calls that found a sled armed.
    pub armed: u64,
    /// Calls that returned an impossible value.
    pub bad: u64,
    /// Threads moved out of a sled by the check.
    pub moved: u64,
    /// Rounds where some thread could not be checked.
    pub unchecked: u64,
}

/// How a forked run of rounds ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SledOutcome {
    /// It ran to the end (`bad` may still be nonzero).
    Completed(SledStats),
    /// It died of `signal` after `rounds` rounds (to within one).
    Crashed {
        /// The signal.
        signal: i32,
        /// Rounds done.
        rounds: u64,
    },
    /// It was killed at its time limit.
    Hung {
        /// Rounds done.
        rounds: u64,
    },
    /// It failed before reporting.
    Error(String),
}

impl SledOutcome {
    /// True for every outcome but a clean completion.
    pub fn is_failure(&self) -> bool {
        !matches!(self, SledOutcome::Completed(s) if s.bad == 0 && s.unchecked == 0)
    }
}

/// Runs the rounds in a forked child (call from a single-threaded
/// process), so a crash is an outcome.
pub fn run_sleds_forked(spec: &SledSpec) -> SledOutcome {
    match in_child(spec.max_time + Duration::from_secs(30), |progress| {
        run_sleds(spec, progress).map(|s| [s.rounds, s.calls, s.armed, s.bad, s.moved, s.unchecked])
    }) {
        Forked::Completed(w) => SledOutcome::Completed(SledStats {
            rounds: w[0],
            calls: w[1],
            armed: w[2],
            bad: w[3],
            moved: w[4],
            unchecked: w[5],
        }),
        Forked::Crashed { signal, progress } => SledOutcome::Crashed {
            signal,
            rounds: progress,
        },
        Forked::Hung { progress } => SledOutcome::Hung { rounds: progress },
        Forked::Error(e) => SledOutcome::Error(e),
    }
}

/// The page of functions and the stub.
struct Page {
    base: *mut u8,
    functions: usize,
}

// SAFETY: the page is only executed by executors and written by the
// patcher through wordpatch, whose stores are what is under test.
unsafe impl Send for Page {}
// SAFETY: as above.
unsafe impl Sync for Page {}

impl Page {
    fn new(functions: usize) -> Result<Page, String> {
        let len = 4096;
        if functions == 0 || 64 + functions * STRIDE > len {
            return Err(format!("1 to {} functions fit a page", (len - 64) / STRIDE));
        }
        // SAFETY: a fresh private anonymous page, owned by the Page (leaked:
        // threads run it until the child exits).
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(format!("mmap: {}", std::io::Error::last_os_error()));
        }
        let base = base as *mut u8;
        // SAFETY: writes inside the page just mapped, before it is executable.
        unsafe {
            std::ptr::write_bytes(base, 0xcc, len);
            std::ptr::copy_nonoverlapping(STUB.as_ptr(), base, STUB.len());
            for k in 0..functions {
                let f = base.add(64 + k * STRIDE);
                std::ptr::copy_nonoverlapping(SLED.as_ptr(), f, 5);
                std::ptr::copy_nonoverlapping(BODY.as_ptr(), f.add(5), BODY.len());
            }
            if libc::mprotect(base.cast(), len, libc::PROT_READ | libc::PROT_EXEC) != 0 {
                return Err(format!("mprotect: {}", std::io::Error::last_os_error()));
            }
        }
        wordpatch::make_writable(base, len).map_err(|e| e.to_string())?;
        if wordpatch::write_mode() == wordpatch::WriteMode::Alias && wordpatch::aliased_bytes() == 0 {
            return Err("W^X asked for, and the page is not aliased".into());
        }
        Ok(Page { base, functions })
    }

    fn sled(&self, k: usize) -> *mut u8 {
        self.base.wrapping_add(64 + k * STRIDE)
    }

    /// The armed bytes of sled `k`: `call` the stub.
    fn call(&self, k: usize) -> [u8; 5] {
        let rel = (self.base as i64 - (self.sled(k) as i64 + 5)) as i32;
        let r = rel.to_le_bytes();
        [0xe8, r[0], r[1], r[2], r[3]]
    }

    /// Rewrites sled `k` from `from` to `to` one byte at a time, where the
    /// two differ (every mix of five NOPs and the 5-byte NOP is NOPs).
    fn bytewise(&self, k: usize, from: &[u8; 5], to: &[u8; 5]) -> Result<(), String> {
        for i in 0..5 {
            if from[i] != to[i] {
                // SAFETY: one byte of a sled in a page made writable, whose
                // every mix of old and new bytes is NOPs ending at the sled's
                // end.
                unsafe { wordpatch::store_in_line(self.sled(k).add(i), &to[i..=i], Some(&from[i..=i])) }
                    .map_err(|m| format!("sled {k} byte {i}: {:#04x}", m.found[0]))?;
            }
        }
        Ok(())
    }

    fn patch(&self, k: usize, from: &[u8; 5], to: &[u8; 5]) -> Result<(), String> {
        let opts = wordpatch::PatchOptions {
            expected: Some(from),
            wait: None,
        };
        // SAFETY: one 5-byte instruction (the normalised sled or the call)
        // replaced by the other, at a sled of this page.
        unsafe { wordpatch::patch_with(self.sled(k), to, &opts) }.map_err(|e| format!("sled {k}: {e}"))
    }
}

/// Runs the rounds in this process, publishing the round count to
/// `progress`.
fn run_sleds(spec: &SledSpec, progress: &AtomicU64) -> Result<SledStats, String> {
    if spec.wx {
        wordpatch::set_write_mode(wordpatch::WriteMode::Alias);
    }
    let page = Arc::new(Page::new(spec.functions)?);
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    for i in 0..spec.executors {
        let (page, stop) = (page.clone(), stop.clone());
        handles.push(std::thread::spawn(move || {
            let (mut armed, mut bad) = (0u64, 0u64);
            let mut x = i as u64 * 1_000_003;
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let k = (n as usize) % page.functions;
                // SAFETY: a complete function of the page (its sled in any
                // state under test, then its body): C ABI, one argument.
                let f: extern "C" fn(u64) -> u64 = unsafe { std::mem::transmute(page.sled(k)) };
                match f(x).wrapping_sub(x) {
                    1 => {}
                    0x101 => armed += 1,
                    _ => bad += 1,
                }
                x = x.wrapping_add(7);
                n += 1;
            }
            (n, armed, bad)
        }));
    }
    let runs: Vec<std::ops::Range<u64>> = (0..page.functions)
        .map(|k| page.sled(k) as u64..page.sled(k) as u64 + 5)
        .collect();
    let mut st = SledStats::default();
    let deadline = Instant::now() + spec.max_time;
    let mut result = Ok(());
    while st.rounds < spec.max_rounds && Instant::now() < deadline {
        // Threads run the five NOPs and some are preempted among them.
        std::thread::sleep(Duration::from_millis(1));
        let round = (|| -> Result<(), String> {
            for k in 0..page.functions {
                page.bytewise(k, &SLED, &NORMALISED)?;
            }
            if spec.evacuate {
                // SAFETY: each run is a sled that held five one-byte NOPs and
                // now holds NORMALISED (or a mix): NOPs to its end from any
                // boundary inside it.
                let e = unsafe { wordpatch::evacuate(&runs, Duration::from_secs(5)) }.map_err(|e| e.to_string())?;
                st.moved += e.moved;
                if !e.is_complete() {
                    st.unchecked += 1;
                    return Err(format!(
                        "threads {:?} not checked: {e:?} after {} rounds",
                        e.unchecked, st.rounds
                    ));
                }
            }
            for k in 0..page.functions {
                page.patch(k, &NORMALISED, &page.call(k))?;
            }
            for k in 0..page.functions {
                page.patch(k, &page.call(k), &NORMALISED)?;
            }
            for k in 0..page.functions {
                page.bytewise(k, &NORMALISED, &SLED)?;
            }
            Ok(())
        })();
        if round.is_err() {
            result = round;
            break;
        }
        st.rounds += 1;
        progress.store(st.rounds, Ordering::Relaxed);
    }
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        let (n, armed, bad) = h.join().map_err(|_| "executor panicked".to_string())?;
        st.calls += n;
        st.armed += armed;
        st.bad += bad;
    }
    result.map(|()| st)
}
