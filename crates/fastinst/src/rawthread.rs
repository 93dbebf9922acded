//! A thread the C library does not know about, for the profiler's sampler.
//!
//! glibc switches to its multi-threaded mode at the first `pthread_create`
//! and never switches back: from then on every `malloc` and `free` that
//! misses the thread cache takes the arena lock, a locked instruction pair
//! (QuickJS: +1.4% instructions, all of them in `malloc` and `free`, and
//! 10-20% more CPU time in interleaved runs on this project's VM). A profiler whose sampler
//! is a pthread charges that to every single-threaded program it profiles.
//! A thread made with `clone(2)` directly leaves glibc in single-threaded
//! mode; Go's runtime makes all its threads so.
//!
//! The price is that such a thread must never enter the C library: no
//! `malloc`, stdio, `errno`, cancellation points, Rust `std` thread-locals,
//! panics, or a lock that may park. Its code is atomics, the toggling code
//! (which allocates nothing, not even for an error), and the system
//! calls made here ([`wait`], [`wake_all`] and the exit).
//!
//! Its thread pointer points at a block of its own laid out as glibc lays
//! out a thread's: the control block's self pointers, the stack-protector
//! canary and pointer guard copied from the creating thread, and below it a
//! zeroed static TLS area as deep as the runtime's own slots lie
//! ([`crate::arch::tls`]), so those slots are its own. The DTV pointer is null:
//! a dynamic TLS access faults at once instead of reading another thread's
//! data. Every signal is blocked in it (it inherits the mask set around
//! `clone`), so no handler of the application ever runs on it.

use crate::arch::cpu::syscall;
use std::io;

/// Stack of a raw thread; the sampler needs a few KiB.
const STACK: usize = 256 << 10;
/// Bytes above the thread pointer: glibc's control block is ~0x700 bytes.
const TCB: usize = 4096;

/// A word of the calling thread's control block.
fn tcb_word(offset: usize) -> usize {
    // SAFETY: glibc's x86-64 control block is at least 0x40 bytes and
    // mapped for every thread; `offset` is one of the fixed fields below.
    unsafe { *((crate::arch::cpu::thread_pointer() + offset) as *const usize) }
}

/// Sets this thread's signal mask with the system call itself (glibc's
/// wrappers keep its own two signals unblocked), returning the old one.
fn set_mask(mask: u64) -> u64 {
    let mut old: u64 = 0;
    // SAFETY: rt_sigprocmask(SIG_SETMASK, &mask, &old, 8) reads and writes
    // the two words given.
    unsafe {
        syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK as usize,
            &mask as *const u64 as usize,
            &mut old as *mut u64 as usize,
            8,
            0,
        )
    };
    old
}

/// Starts `entry(arg)` on a new raw thread; it exits when `entry` returns.
/// `tls_depth` is how far below the thread pointer the TLS it may touch
/// reaches (see [`crate::arch::tls::depth`]). Returns the thread's id.
///
/// # Safety
/// `entry` and everything it calls must keep to what the module doc
/// allows, and `arg` must stay valid for as long as the thread runs.
pub(crate) unsafe fn spawn(entry: extern "C" fn(usize), arg: usize, tls_depth: usize) -> io::Result<i32> {
    let page = 4096;
    let guard_and_stack = crate::mapping::map(page + STACK, libc::PROT_NONE)?;
    // SAFETY: the stack part of the mapping just made; the first page
    // stays PROT_NONE, a guard against overflow.
    if unsafe {
        libc::mprotect(
            (guard_and_stack + page) as *mut libc::c_void,
            STACK,
            libc::PROT_READ | libc::PROT_WRITE,
        )
    } != 0
    {
        let e = io::Error::last_os_error();
        // SAFETY: the mapping just made, which nothing else refers to.
        unsafe { libc::munmap(guard_and_stack as *mut libc::c_void, page + STACK) };
        return Err(e);
    }
    let stack_top = (guard_and_stack + page + STACK) & !15;
    // A margin past the runtime's own slots (untouched pages cost nothing):
    // a slip into a neighbouring module's TLS lands in this block, not in
    // another thread's memory or an unmapped page.
    let below = tls_depth.div_ceil(page) * page + (1 << 20);
    let block = crate::mapping::map(below + TCB, libc::PROT_READ | libc::PROT_WRITE)?;
    let tp = block + below;
    // SAFETY: `tp` is the start of the TCB page of the block just mapped;
    // the words written are glibc's x86-64 `tcbhead_t` fields: tcb (self),
    // dtv (null), self, stack_guard, pointer_guard.
    unsafe {
        let w = tp as *mut usize;
        *w = tp;
        *w.add(1) = 0;
        *w.add(2) = tp;
        *w.add(5) = tcb_word(0x28);
        *w.add(6) = tcb_word(0x30);
    }
    let flags = (libc::CLONE_VM
        | libc::CLONE_FS
        | libc::CLONE_FILES
        | libc::CLONE_SIGHAND
        | libc::CLONE_THREAD
        | libc::CLONE_SYSVSEM
        | libc::CLONE_SETTLS
        | libc::CLONE_PARENT_SETTID) as usize;
    let mut tid: i32 = 0;
    let old = set_mask(!0);
    // SAFETY: a thread's flags; the stack and the control block were just
    // mapped for it alone; `tid` outlives the call; `entry` keeps to what
    // the module doc allows (this function's contract).
    let ret = unsafe { crate::arch::cpu::clone_thread(flags, stack_top, &mut tid, tp, entry, arg) };
    set_mask(old);
    if ret < 0 {
        // SAFETY: no thread was made; both mappings are ours alone.
        unsafe {
            libc::munmap(guard_and_stack as *mut libc::c_void, page + STACK);
            libc::munmap(block as *mut libc::c_void, below + TCB);
        }
        return Err(io::Error::from_raw_os_error(-ret as i32));
    }
    Ok(ret as i32)
}

/// Sleeps for up to `d` on the monotonic clock, or until [`wake_all`] on
/// `word` once it no longer holds `seen`, with the futex system call itself
/// (no libc: `nanosleep` is a cancellation point that reads glibc's
/// thread state; callable from any thread; signals are blocked in a raw
/// thread, so it is cut short only by a wake). A wake that comes
/// between the caller's read of `seen` and the wait is not lost: the
/// kernel compares the word first.
pub(crate) fn wait(word: &std::sync::atomic::AtomicU32, seen: u32, d: std::time::Duration) {
    let ts = libc::timespec {
        tv_sec: d.as_secs() as libc::time_t,
        tv_nsec: d.subsec_nanos() as libc::c_long,
    };
    // SAFETY: futex(word, FUTEX_WAIT_PRIVATE, seen, &ts) reads the aligned
    // word, which outlives the call, and `ts`; its relative timeout runs
    // on the monotonic clock.
    unsafe {
        syscall(
            libc::SYS_futex,
            word.as_ptr() as usize,
            (libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG) as usize,
            seen as usize,
            &ts as *const libc::timespec as usize,
            0,
        )
    };
}

/// Moves `word` on and wakes every thread in [`wait`] on it.
pub(crate) fn wake_all(word: &std::sync::atomic::AtomicU32) {
    word.fetch_add(1, std::sync::atomic::Ordering::Release);
    // SAFETY: futex(word, FUTEX_WAKE_PRIVATE, i32::MAX) touches no memory
    // but the word's wait queue.
    unsafe {
        syscall(
            libc::SYS_futex,
            word.as_ptr() as usize,
            (libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG) as usize,
            i32::MAX as usize,
            0,
            0,
        )
    };
}

/// CPU time the calling thread has used, in nanoseconds, with the system
/// call itself (callable from a raw thread, and from any other).
pub(crate) fn thread_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID as i64).unwrap_or(0)
}

/// CPU time thread `tid` of this process has used, in nanoseconds, with
/// the system call itself; `None` once the thread has exited.
pub(crate) fn cpu_ns_of(tid: i32) -> Option<u64> {
    // The kernel's per-thread scheduler clock for `tid`
    // (`MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED)`).
    clock_ns(((!(tid as i64)) << 3) | 6)
}

/// Clock `clock` in nanoseconds (`clock_gettime`); `None` if the kernel
/// refuses it.
fn clock_ns(clock: i64) -> Option<u64> {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime(clock, &ts) writes `ts`.
    let ret = unsafe {
        syscall(
            libc::SYS_clock_gettime,
            clock as usize,
            &mut ts as *mut libc::timespec as usize,
            0,
            0,
            0,
        )
    };
    (ret == 0).then(|| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

/// The threads of this process now (`/proc/self/task`), at least 1.
pub(crate) fn threads_in_process() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(1, |d| d.count().max(1))
}

/// Sets the calling thread's timer slack to `ns` (how late the kernel may
/// end its sleeps to batch wake-ups; 50 us by default).
pub(crate) fn set_timer_slack(ns: u64) {
    // SAFETY: prctl(PR_SET_TIMERSLACK, ns) takes a plain number.
    unsafe { syscall(libc::SYS_prctl, libc::PR_SET_TIMERSLACK as usize, ns as usize, 0, 0, 0) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    static SEEN: AtomicU64 = AtomicU64::new(0);
    static NEVER_WOKEN: AtomicU32 = AtomicU32::new(0);

    extern "C" fn body(arg: usize) {
        wait(&NEVER_WOKEN, 0, std::time::Duration::from_millis(1));
        // Its own static TLS: the slot starts zeroed here, whatever the
        // creating thread holds (nothing follows the value: no sled runs
        // on either thread).
        let own = crate::arch::tls::sled_shadow();
        crate::arch::tls::set_sled_shadow(own + 1);
        SEEN.store(((arg as u64) << 8) | crate::arch::tls::sled_shadow(), Ordering::Release);
    }

    #[test]
    fn a_thread_cpu_clock_counts_this_threads_work_and_not_its_sleep() {
        // Work moves the clock: spinning, it passes 5 ms of CPU (the
        // escape only turns a clock that stands still into a failure).
        let c0 = thread_cpu_ns();
        let t0 = std::time::Instant::now();
        while thread_cpu_ns() - c0 < 5_000_000 && t0.elapsed().as_secs() < 30 {
            std::hint::spin_loop();
        }
        let c1 = thread_cpu_ns();
        assert!(c1 - c0 >= 5_000_000, "30 s of spinning used {} ns of CPU", c1 - c0);
        // Sleeping does not: the clock moves by the wake-up alone, far less
        // than the time slept.
        let s0 = std::time::Instant::now();
        let word = AtomicU32::new(0);
        wait(&word, 0, std::time::Duration::from_millis(50));
        let slept = s0.elapsed().as_nanos() as u64;
        let c2 = thread_cpu_ns();
        assert!(c2 - c1 < slept / 2, "a {slept} ns sleep used {} ns of CPU", c2 - c1);
    }

    #[test]
    fn a_wait_lasts_its_timeout_ends_at_a_wake_and_never_misses_one() {
        // Unwoken, it lasts its timeout (the kernel may end it a little
        // late, never early).
        let word = AtomicU32::new(0);
        let t0 = Instant::now();
        wait(&word, 0, Duration::from_millis(20));
        assert!(t0.elapsed() >= Duration::from_millis(20), "{:?}", t0.elapsed());
        // A wake ends it long before its timeout.
        let word = std::sync::Arc::new(AtomicU32::new(0));
        let w = word.clone();
        let waiter = std::thread::spawn(move || {
            let t0 = Instant::now();
            wait(&w, 0, Duration::from_secs(30));
            t0.elapsed()
        });
        std::thread::sleep(Duration::from_millis(20));
        wake_all(&word);
        let waited = waiter.join().unwrap();
        assert!(waited < Duration::from_secs(10), "woken after {waited:?}");
        // A wake made before the wait began (the word moved from what the
        // waiter read) ends it at once: none is lost.
        let t0 = Instant::now();
        wait(&word, 0, Duration::from_secs(30));
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    }

    #[test]
    fn a_raw_thread_runs_with_its_own_tls_and_exits() {
        crate::arch::tls::set_sled_shadow(41);
        // SAFETY: `body` uses atomics, a TLS slot and `wait` only.
        let tid = unsafe { spawn(body, 7, crate::arch::tls::depth()) }.expect("clone");
        assert!(tid > 0);
        let t0 = std::time::Instant::now();
        while SEEN.load(Ordering::Acquire) == 0 {
            assert!(t0.elapsed().as_secs() < 10, "the raw thread never ran");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(SEEN.load(Ordering::Acquire), (7 << 8) | 1);
        assert_eq!(
            crate::arch::tls::sled_shadow(),
            41,
            "the creating thread's slot is its own"
        );
        crate::arch::tls::set_sled_shadow(0);
        // The thread is gone once /proc no longer lists it.
        let task = format!("/proc/self/task/{tid}");
        while std::path::Path::new(&task).exists() {
            assert!(t0.elapsed().as_secs() < 10, "the raw thread never exited");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}
