//! The spin lock the runtime's short critical sections share: a flag taken
//! with an acquiring compare-exchange and given back with a releasing
//! store. Used where parking is not allowed (the raw sampler thread, the
//! allocator, fork handlers) or not worth it (a probe's toggle).

use std::sync::atomic::{AtomicBool, Ordering};

/// Spins until this thread holds `lock`.
#[inline]
pub fn acquire(lock: &AtomicBool) {
    while lock
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        std::hint::spin_loop();
    }
}

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
