//! The spin lock the runtime's short critical sections share: a flag taken
//! with an acquiring compare-exchange and given back with a releasing
//! store. Used where parking is not allowed (the raw sampler thread, the
//! allocator, fork handlers) or not worth it (a probe's toggle).

use std::sync::atomic::{AtomicBool, Ordering};

/// Spins until this thread holds `lock`, giving its CPU away between
/// tries once the lock has stayed taken for a short spin.
///
/// Why give the CPU away: with more threads than CPUs (an attach to a
/// program whose threads keep every CPU busy), a holder the scheduler
/// preempted inside its critical section runs again only when some CPU is
/// free, and waiters that only spin keep theirs busy for whole time
/// slices. A profile of the runtime's start inside such a process found the
/// program's threads spinning on the allocator's lock while the thread
/// starting the runtime, holding it, waited for a CPU. The yield is the
/// bare system call (no libc, no `errno`): it allocates nothing and may be
/// made from a signal handler or the raw sampler thread.
#[inline]
pub fn acquire(lock: &AtomicBool) {
    let mut tries = 0u32;
    while lock
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        if tries < SPINS {
            tries += 1;
            std::hint::spin_loop();
        } else {
            // SAFETY: `sched_yield` takes no arguments and touches no memory
            // of this process.
            unsafe { crate::arch::cpu::syscall(libc::SYS_sched_yield, 0, 0, 0, 0, 0) };
        }
    }
}

/// Tries spent spinning before [`acquire`] yields: several times a short
/// critical section's length, so an uncontended or briefly contended lock
/// never reaches the system call.
const SPINS: u32 = 128;

/// Gives `lock` back.
#[inline]
pub fn release(lock: &AtomicBool) {
    lock.store(false, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn the_lock_excludes_other_threads() {
        static LOCK: AtomicBool = AtomicBool::new(false);
        static N: AtomicU64 = AtomicU64::new(0);
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(|| {
                    for _ in 0..10_000 {
                        acquire(&LOCK);
                        // A read and a write apart: lost without the lock.
                        let v = N.load(Ordering::Relaxed);
                        N.store(v + 1, Ordering::Relaxed);
                        release(&LOCK);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(N.load(Ordering::Relaxed), 40_000);
    }
}
