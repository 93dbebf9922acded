//! What one CPU-sampling signal costs the thread it lands on, measured
//! once per process at start and charged to the thread's clock at every
//! sample.
//!
//! A sample (`super::cpusample`) is a signal: the kernel interrupts the
//! thread, writes a signal frame (the whole register state, vector
//! registers included), runs the handler and returns through
//! `sigreturn`. None of that is in a hook's stamps, and no sample can see
//! it (the next one comes a period later), so left uncharged it stays in
//! whatever the thread was running: every duration holds its share of it,
//! and `main`'s and a thread body's nearly all. In a virtual machine, where
//! the timer interrupt behind each sample leaves the guest, it is several
//! percent of the thread's time at the sampling period (measured figures:
//! `crates/benches/results/accuracy.md`).
//!
//! The measurement: this thread busy-reads the TSC while signals of the
//! kind the samples use land on it, and each signal shows as one gap in
//! the readings. A periodic event's signals ([`periodic`]) come at a
//! short period so that enough arrive in a millisecond or two; the
//! process timer's ([`sent`]), whose period is the scheduler tick, are
//! sent by the thread to itself instead, each timed beside a plain system
//! call. Samples are off meanwhile, and the handler only counts the
//! signal ([`count`]); what it does beyond that at a real sample is a few
//! stores, against the kernel's microseconds.
//!
//! The charge ([`charge`]) goes to the thread's hook time
//! (`crate::clock::charge_signal`), so durations and exposures leave it
//! out as they leave out the hooks' time. It is a mean, not this signal's
//! own cost, which nothing measures: a sample whose signal took longer
//! (the host was busy) leaves the rest in the program's time.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use wordpatch::tsc;

/// The measured cost of one signal (TSC ticks); 0 until measured, or where
/// it could not be.
static TICKS: AtomicU64 = AtomicU64::new(0);
/// Whether a measurement is under way, and the signals it has seen.
static COUNTING: AtomicBool = AtomicBool::new(false);
static SEEN: AtomicU64 = AtomicU64::new(0);

/// Signals a measurement times.
const WANT: usize = 48;
/// The event's period while measuring (ns of the thread's CPU time).
pub(super) const PERIOD_NS: u64 = 40_000;
/// The longest a measurement spins (ticks): a few milliseconds at any
/// TSC rate; fewer signals than wanted by then are used as they are.
const LIMIT: u64 = 40_000_000;
/// A TSC reading this much later than the one before is a gap (an
/// interrupt, a signal, a preemption); the loop itself takes tens.
const GAP: u64 = 1_000;

/// The cost charged per signal, in ticks (0: none).
pub(super) fn ticks() -> u64 {
    TICKS.load(Ordering::Relaxed)
}

/// Called by the sampling handler for a signal that came while samples
/// are off (as they are while measuring): counts it if a measurement is
/// under way. Async-signal-safe: two atomics.
#[inline(always)]
pub(super) fn count() {
    if COUNTING.load(Ordering::Relaxed) {
        SEEN.fetch_add(1, Ordering::Relaxed);
    }
}

/// Charges one signal's cost to the calling thread's clock (the sampling
/// handler, at each sample). Async-signal-safe.
#[inline(always)]
pub(super) fn charge() {
    let t = ticks();
    if t != 0 {
        crate::clock::charge_signal(t);
    }
}

/// The median of `gaps`: the typical signal's cost, whatever else
/// interrupted the loop (the machine's other interrupts, shorter; a
/// preemption, longer). Over whole runs, the mean cost of a sampling
/// signal matched it (both measured: the results file).
fn median(gaps: &mut [u64]) -> Option<u64> {
    gaps.sort_unstable();
    gaps.get(gaps.len() / 2).copied()
}

/// Runs a measurement with signal `sig`: the handler counts while `run`
/// does, with `sig` let through on this thread; `None` where it cannot be.
///
/// A thread may hold the signal blocked: an attach starts the runtime on
/// one of the program's threads with every signal held (the attaching
/// command's injected call), where the signals would wait unseen, and the
/// measurement read nothing. Where one of the program's own is already
/// waiting, the measurement is not made: let through, the sampling
/// handler would take it for none of its own and drop it.
fn measuring<T>(sig: libc::c_int, run: impl FnOnce() -> Option<T>) -> Option<T> {
    // SAFETY: sigset_t is plain data, for which all zeroes is valid, and
    // each call below fills or reads the sets it is given.
    let (mut only, mut before, mut pending): (libc::sigset_t, libc::sigset_t, libc::sigset_t) =
        unsafe { (std::mem::zeroed(), std::mem::zeroed(), std::mem::zeroed()) };
    // SAFETY: as above; `sig` is a valid signal number.
    unsafe {
        libc::sigemptyset(&mut only);
        libc::sigaddset(&mut only, sig);
        libc::sigpending(&mut pending);
        if libc::sigismember(&pending, sig) == 1 {
            return None;
        }
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &only, &mut before);
    }
    SEEN.store(0, Ordering::Relaxed);
    COUNTING.store(true, Ordering::Release);
    let r = run();
    COUNTING.store(false, Ordering::Release);
    // SAFETY: puts back the mask read above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &before, std::ptr::null_mut()) };
    r
}

/// Measures with the periodic signals of an event that `open` starts on
/// this thread (its descriptor, or negative), closing it after; sets the
/// charge and returns it, in ticks.
pub(super) fn periodic(sig: libc::c_int, open: impl FnOnce() -> isize) -> Option<u64> {
    let (mut gaps, n) = measuring(sig, || {
        let fd = open();
        if fd < 0 {
            return None;
        }
        let mut gaps = [0u64; 2 * WANT];
        let mut n = 0;
        let t0 = tsc::now();
        let mut t = t0;
        while (SEEN.load(Ordering::Relaxed) as usize) < WANT && t - t0 < LIMIT && n < gaps.len() {
            let u = tsc::now();
            if u - t > GAP {
                gaps[n] = u - t;
                n += 1;
            }
            t = u;
        }
        // SAFETY: the descriptor `open` just made, owned here alone.
        unsafe { libc::close(fd as i32) };
        let seen = SEEN.load(Ordering::Relaxed) as usize;
        // Every signal is a gap; far more gaps than signals is a machine
        // too busy to measure on.
        (seen > 0 && n <= 2 * seen).then_some((gaps, n))
    })?;
    set(median(&mut gaps[..n]))
}

/// Measures with signal `sig` sent by this thread to itself: each sent
/// signal's time beside a plain system call's; sets the charge and
/// returns it, in ticks. Every signal sent must have reached the handler.
pub(super) fn sent(sig: libc::c_int) -> Option<u64> {
    // SAFETY: getpid and gettid cannot fail.
    let (pid, tid) = unsafe { (libc::getpid(), libc::gettid()) };
    let (mut with, mut plain) = measuring(sig, || {
        let (mut with, mut plain) = ([0u64; WANT], [0u64; WANT]);
        for i in 0..WANT {
            let t0 = tsc::now();
            // SAFETY: a signal to this thread, whose handler is installed;
            // it runs before the call returns.
            unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, sig) };
            let t1 = tsc::now();
            // SAFETY: getppid cannot fail.
            unsafe { libc::syscall(libc::SYS_getppid) };
            let t2 = tsc::now();
            with[i] = t1 - t0;
            plain[i] = t2 - t1;
        }
        (SEEN.load(Ordering::Relaxed) as usize == WANT).then_some((with, plain))
    })?;
    let (w, p) = (median(&mut with)?, median(&mut plain)?);
    set(Some(w.saturating_sub(p)))
}

fn set(ticks: Option<u64>) -> Option<u64> {
    let t = ticks.filter(|&t| t > 0)?;
    TICKS.store(t, Ordering::Relaxed);
    Some(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_typical_gap_is_kept_and_strays_are_not() {
        // Signals of about 40,000 ticks, two small interrupts and one
        // preemption: a signal's.
        let mut g = [40_000, 41_000, 39_000, 2_000, 40_500, 3_000_000, 39_500, 1_500];
        assert_eq!(median(&mut g), Some(40_000));
        assert_eq!(median(&mut []), None);
    }
}
