//! Moving every other thread out of runs of code that have just become one
//! instruction ([`evacuate`]).
//!
//! Several instructions made into one (gcc's five one-byte NOPs made one
//! 5-byte NOP) are safe while threads run only if no thread is stopped
//! between two of the old ones: such a thread would later resume inside
//! the new instruction, or, once the site is armed as a `call`, inside its
//! operand. Under `ptrace` every thread can be stopped and its place
//! checked; from inside the process it cannot, so each other thread is
//! made to say where it is:
//!
//! - a thread blocked in the kernel is read from
//!   `/proc/self/task/TID/syscall`, which gives its user-mode instruction
//!   pointer (a thread in a system call is never inside a run of NOPs);
//!   such a thread is left alone, so no sleeping system call is
//!   interrupted;
//! - a thread that is running or runnable (its place is not published) is
//!   sent a real-time signal with `rt_tgsigqueueinfo`; the handler reads
//!   the instruction pointer it will resume at and, if it lies strictly
//!   inside a run, sets it to the run's end (the run's every suffix does
//!   nothing, so skipping it is what the thread would have done), then
//!   acknowledges.
//!
//! A thread seen once outside every run's interior after the runs were
//! rewritten is outside for good: it can enter a run only at its first
//! byte, where the new instruction starts. A thread that blocks the
//! signal, or does not answer within the caller's patience (stopped by a
//! debugger, say), is reported, and the caller must not arm the runs.
//!
//! The signal is the highest real-time signal found at its default
//! disposition when one is first needed; the handler stays installed (a
//! signal still pending in a thread that blocks it must not find the
//! default action, which kills) and hands any signal not sent by this
//! module to the disposition it replaced. The runs a handler reads are
//! never freed: a handler may run late, long after its evacuation ended.

use crate::chain::{chain, Prev};
use crate::Error;
use std::ops::Range;
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Threads signalled in one batch (one acknowledgement slot each); more
/// threads are signalled batch after batch.
const SLOTS: usize = 4096;
/// Marks a signal value as this module's (with the evacuation's number and
/// the thread's slot below it).
const MAGIC: u64 = 0xfa57 << 48;
const MAGIC_MASK: u64 = 0xffff << 48;

/// The signal in use; 0 until one is installed.
static SIGNAL: AtomicI32 = AtomicI32::new(0);
/// The disposition ours replaced, written under `INSTALL` before ours is
/// installed.
static PREV: Prev = Prev::new();
static INSTALL: Mutex<()> = Mutex::new(());
/// The process (pid) evacuating now, 0 when none: one evacuation at a
/// time. A pid, not a lock, so a child forked during one can start its own.
static BUSY: AtomicI32 = AtomicI32::new(0);
/// Numbers evacuations; a handler acts only for the one it was sent by.
static NEXT: AtomicU32 = AtomicU32::new(1);
/// The current evacuation's runs (leaked).
static RUNS: AtomicPtr<Runs> = AtomicPtr::new(std::ptr::null_mut());
/// Slot k holds the number of the last evacuation its thread answered.
static ACKS: [AtomicU32; SLOTS] = [const { AtomicU32::new(0) }; SLOTS];
/// Threads moved out of a run since the process began.
static MOVED: AtomicU64 = AtomicU64::new(0);

/// The runs of one evacuation, sorted, as handlers read them.
struct Runs {
    number: u32,
    runs: Box<[(u64, u64)]>,
}

/// What [`evacuate`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Evacuation {
    /// Other threads of the process when it began.
    pub threads: usize,
    /// Of those, threads sent the signal (the others were seen in the
    /// kernel, or had ended).
    pub signalled: usize,
    /// Threads moved to the end of a run.
    pub moved: u64,
    /// Threads whose place could not be checked (the signal blocked, or no
    /// answer within the patience): the runs must not be armed.
    pub unchecked: Vec<i32>,
}

impl Evacuation {
    /// Whether every other thread was seen outside every run's interior.
    pub fn is_complete(&self) -> bool {
        self.unchecked.is_empty()
    }
}

/// Makes sure no other thread of this process is stopped strictly inside
/// one of `runs` (see the module doc): each is seen in the kernel outside
/// them, or moved to a run's end by a signal handler. Returns what it
/// found; threads it could not check are listed in
/// [`Evacuation::unchecked`], and the caller must then not make the runs
/// anything but NOPs. Waits at most about `patience` for answers.
///
/// # Safety
/// Each run is code whose bytes, in every form they have had since a
/// thread could have started on them, do nothing from any instruction
/// boundary inside the run to its end but fall through to it (NOPs), so a
/// thread stopped inside one may resume at its end instead.
pub unsafe fn evacuate(runs: &[Range<u64>], patience: Duration) -> Result<Evacuation, Error> {
    // SAFETY: getpid and gettid cannot fail.
    let (pid, me) = unsafe { (libc::getpid(), libc::gettid()) };
    let _busy = Busy::take(pid);
    let mut sorted: Vec<(u64, u64)> = runs.iter().map(|r| (r.start, r.end)).collect();
    sorted.sort_unstable();
    let tids = threads().map_err(Error::ThreadList)?;
    let others: Vec<i32> = tids.into_iter().filter(|&t| t != me).collect();
    let mut out = Evacuation {
        threads: others.len(),
        ..Evacuation::default()
    };
    let moved_before = MOVED.load(Ordering::Relaxed);
    let unknown: Vec<i32> = others
        .into_iter()
        .filter(|&t| place(t, &sorted) == Place::Unknown)
        .collect();
    if !unknown.is_empty() {
        let signal = ensure_handler()?;
        for batch in unknown.chunks(SLOTS) {
            let number = NEXT.fetch_add(1, Ordering::Relaxed).max(1);
            let published = Box::leak(Box::new(Runs {
                number,
                runs: sorted.clone().into_boxed_slice(),
            }));
            RUNS.store(published, Ordering::Release);
            let mut asking = Asking {
                pid,
                signal,
                number,
                runs: &sorted,
                waiting: batch.iter().map(|&t| (t, None)).collect(),
                signalled: 0,
            };
            asking.until(Instant::now() + patience);
            out.signalled += asking.signalled;
            out.unchecked.extend(asking.waiting.iter().map(|&(t, _)| t));
        }
    }
    out.moved = MOVED.load(Ordering::Relaxed) - moved_before;
    Ok(out)
}

/// Threads moved out of a run by [`evacuate`] since the process began.
pub fn threads_moved() -> u64 {
    MOVED.load(Ordering::Relaxed)
}

/// Holds the one-evacuation-at-a-time claim.
struct Busy;

impl Busy {
    fn take(pid: i32) -> Busy {
        loop {
            match BUSY.compare_exchange(0, pid, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return Busy,
                // Left by the parent of a fork made during its evacuation.
                Err(owner) if owner != pid => {
                    if BUSY
                        .compare_exchange(owner, pid, Ordering::Acquire, Ordering::Relaxed)
                        .is_ok()
                    {
                        return Busy;
                    }
                }
                Err(_) => std::thread::sleep(Duration::from_micros(100)),
            }
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        BUSY.store(0, Ordering::Release);
    }
}

/// One batch of threads asked where they are, each with its slot once sent
/// the signal.
struct Asking<'a> {
    pid: i32,
    signal: i32,
    number: u32,
    runs: &'a [(u64, u64)],
    /// Threads not heard from yet, with their slot once signalled.
    waiting: Vec<(i32, Option<usize>)>,
    signalled: usize,
}

impl Asking<'_> {
    /// Signals every waiting thread that does not block the signal (a thread
    /// being created blocks every signal for a moment, so those are tried
    /// again), and waits until each answered, was seen in the kernel outside
    /// the runs, or ended, or `deadline`; leaves those not heard from in
    /// `waiting`.
    fn until(&mut self, deadline: Instant) {
        let mut nap = Duration::from_micros(20);
        loop {
            for (k, (ack, w)) in ACKS.iter().zip(self.waiting.iter_mut()).enumerate() {
                let (tid, slot) = *w;
                if tid == 0 || slot.is_some() || blocks(tid, self.signal) {
                    continue;
                }
                ack.store(0, Ordering::Relaxed);
                // A failure is an ended thread (`place` says so below) or a
                // full queue (EAGAIN): tried again next time.
                if send(self.pid, tid, self.signal, self.number, k).is_ok() {
                    self.signalled += 1;
                    w.1 = Some(k);
                }
            }
            // Answered, seen outside, or ended: marked, not removed, so
            // the slots stay the threads' indices.
            let mut left = 0;
            for w in &mut self.waiting {
                if w.0 == 0 {
                    continue;
                }
                let answered = w.1.is_some_and(|k| ACKS[k].load(Ordering::Acquire) == self.number);
                if answered || place(w.0, self.runs) != Place::Unknown {
                    w.0 = 0;
                } else {
                    left += 1;
                }
            }
            if left == 0 || Instant::now() >= deadline {
                self.waiting.retain(|w| w.0 != 0);
                return;
            }
            std::thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_millis(2));
        }
    }
}

/// Where a thread is, as far as the kernel says without stopping it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    /// Blocked in the kernel at an instruction pointer outside every run's
    /// interior.
    Outside,
    /// Running or runnable (its place is not published), or blocked
    /// inside a run.
    Unknown,
    /// It has ended.
    Gone,
}

fn place(tid: i32, runs: &[(u64, u64)]) -> Place {
    match std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall")) {
        Ok(s) => match syscall_pc(&s) {
            Some(pc) if interior_end(runs, pc).is_none() => Place::Outside,
            _ => Place::Unknown,
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH) => Place::Gone,
        Err(_) => Place::Unknown,
    }
}

/// The user-mode instruction pointer in a `/proc/.../syscall` line: its
/// last field, unless the thread is `running`.
fn syscall_pc(line: &str) -> Option<u64> {
    let mut f = line.split_whitespace();
    let first = f.next()?;
    if first == "running" {
        return None;
    }
    let last = f.last()?;
    u64::from_str_radix(last.trim_start_matches("0x"), 16).ok()
}

/// The end of the run whose interior (after its first byte, before its
/// end) holds `pc`, if one does. `runs` is sorted; no allocation (called
/// from the handler).
fn interior_end(runs: &[(u64, u64)], pc: u64) -> Option<u64> {
    let k = runs.partition_point(|r| r.0 < pc);
    let (_, end) = *runs.get(k.checked_sub(1)?)?;
    (pc < end).then_some(end)
}

/// Whether thread `tid` blocks `signal`: its `SigBlk` line in `/proc` (an
/// unreadable one is taken for no: the wait then tells).
fn blocks(tid: i32, signal: i32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")) else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigBlk:"))
        .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        .is_some_and(|mask| mask & (1u64 << (signal - 1)) != 0)
}

/// The highest real-time signal at its default disposition.
fn choose() -> Option<i32> {
    (libc::SIGRTMIN()..=libc::SIGRTMAX()).rev().find(|&s| {
        // SAFETY: a query of the disposition only.
        unsafe {
            let mut cur: libc::sigaction = std::mem::zeroed();
            libc::sigaction(s, std::ptr::null(), &mut cur) == 0 && cur.sa_sigaction == libc::SIG_DFL
        }
    })
}

/// The signal with our handler installed: the one in use while ours is
/// still its disposition, else a newly chosen one.
fn ensure_handler() -> Result<i32, Error> {
    let _g = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    let cur = SIGNAL.load(Ordering::Acquire);
    if cur != 0 && crate::chain::is_current(cur, on_signal) {
        return Ok(cur);
    }
    let sig = choose().ok_or(Error::NoFreeSignal)?;
    // SAFETY: PREV is written before our handler is installed for `sig`,
    // under INSTALL. A handler still installed for an earlier signal that
    // the program has since taken over no longer runs.
    unsafe { crate::chain::install(sig, on_signal, &PREV) }.map_err(Error::SignalHandler)?;
    SIGNAL.store(sig, Ordering::Release);
    Ok(sig)
}

/// The `siginfo` of `rt_tgsigqueueinfo`, as the kernel lays it out for a
/// queued signal on x86-64.
#[repr(C)]
struct Queued {
    signo: i32,
    errno: i32,
    code: i32,
    _pad: i32,
    pid: i32,
    uid: u32,
    value: u64,
    _rest: [u64; 12],
}

const _: () = assert!(std::mem::size_of::<Queued>() == std::mem::size_of::<libc::siginfo_t>());

fn send(pid: i32, tid: i32, sig: i32, number: u32, slot: usize) -> Result<(), i32> {
    let info = Queued {
        signo: sig,
        errno: 0,
        code: libc::SI_QUEUE,
        _pad: 0,
        pid,
        // SAFETY: getuid cannot fail.
        uid: unsafe { libc::getuid() },
        value: MAGIC | (u64::from(number) << 16) | slot as u64,
        _rest: [0; 12],
    };
    // SAFETY: a queued signal to a thread of this process, with a siginfo
    // of the kernel's size and layout.
    let r = unsafe { libc::syscall(libc::SYS_rt_tgsigqueueinfo, pid, tid, sig, &info as *const Queued) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }
}

/// Moves the interrupted thread out of the current evacuation's runs and
/// answers. Async-signal-safe: atomics, a binary search, `getpid`.
extern "C" fn on_signal(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel's siginfo for this handler, which has its size.
    let q = unsafe { &*(info as *const Queued) };
    // SAFETY: getpid is async-signal-safe.
    let ours = q.code == libc::SI_QUEUE && q.pid == unsafe { libc::getpid() } && q.value & MAGIC_MASK == MAGIC;
    if !ours || ctx.is_null() {
        // SAFETY: the kernel's arguments; PREV is not written while this
        // handler is installed.
        unsafe { chain(&PREV, sig, info, ctx, false) };
        return;
    }
    let number = (q.value >> 16) as u32;
    let slot = (q.value & 0xffff) as usize;
    let runs = RUNS.load(Ordering::Acquire);
    // SAFETY: published runs are leaked, never freed or written again.
    let Some(runs) = (unsafe { runs.as_ref() }).filter(|r| r.number == number) else {
        return;
    };
    // SAFETY: an SA_SIGINFO handler's third argument is the ucontext the
    // thread resumes from.
    let uc = unsafe { &mut *(ctx as *mut libc::ucontext_t) };
    let rip = &mut uc.uc_mcontext.gregs[libc::REG_RIP as usize];
    if let Some(end) = interior_end(&runs.runs, *rip as u64) {
        *rip = end as i64;
        MOVED.fetch_add(1, Ordering::Relaxed);
    }
    if let Some(a) = ACKS.get(slot) {
        a.store(number, Ordering::Release);
    }
}

/// This process's threads (`/proc/self/task`).
fn threads() -> Result<Vec<i32>, i32> {
    let dir = std::fs::read_dir("/proc/self/task").map_err(|e| e.raw_os_error().unwrap_or(0))?;
    Ok(dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pc_is_inside_a_run_only_after_its_first_byte_and_before_its_end() {
        let runs = [(0x100, 0x105), (0x200, 0x205)];
        assert_eq!(
            interior_end(&runs, 0x100),
            None,
            "the first byte starts the new instruction"
        );
        assert_eq!(interior_end(&runs, 0x101), Some(0x105));
        assert_eq!(interior_end(&runs, 0x104), Some(0x105));
        assert_eq!(interior_end(&runs, 0x105), None);
        assert_eq!(interior_end(&runs, 0x203), Some(0x205));
        assert_eq!(interior_end(&runs, 0xff), None);
        assert_eq!(interior_end(&runs, 0x300), None);
        assert_eq!(interior_end(&[], 0x101), None);
    }

    #[test]
    fn a_syscall_line_gives_the_user_pc_unless_running() {
        assert_eq!(syscall_pc("running\n"), None);
        assert_eq!(
            syscall_pc("202 0x7f 0x80 0x0 0x0 0x0 0x0 0x7ffd3 0x7f12ab\n"),
            Some(0x7f12ab)
        );
        assert_eq!(syscall_pc("-1 0x7ffd3 0x55aa10\n"), Some(0x55aa10));
        assert_eq!(syscall_pc(""), None);
    }

    #[test]
    fn a_thread_in_a_system_call_is_seen_outside_without_a_signal() {
        let (tx, rx) = std::sync::mpsc::channel::<i32>();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let h = std::thread::spawn(move || {
            // SAFETY: gettid cannot fail.
            tx.send(unsafe { libc::gettid() }).unwrap();
            done_rx.recv().unwrap();
        });
        let tid = rx.recv().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while place(tid, &[(1, 6)]) != Place::Outside {
            assert!(
                Instant::now() < deadline,
                "a thread blocked in recv was never seen in the kernel"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        done_tx.send(()).unwrap();
        h.join().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while place(tid, &[]) != Place::Gone {
            assert!(Instant::now() < deadline, "an ended thread still listed");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
