//! When a frame below the running one may be taken for dead.
//!
//! Both stacks of frames the runtime keeps per thread, the sled exits'
//! shadow stack (`crate::sled::shadow`) and the profiler's sampled calls
//! (`crate::profile`), drop an entry whose CFA lies below a new frame's:
//! the new frame could only be there if that one was left (`longjmp`, an
//! exception, `siglongjmp` out of a handler). The one exception is a signal
//! handler running on an alternate stack, whose addresses say nothing about
//! the interrupted stack: there only entries on the alternate stack may
//! go. Without it, a handler on an alternate stack placed above a thread's
//! stack dropped every live frame of the code it interrupted.

/// Whether an entry at `cfa` may be dropped as dead by the code running
/// now: always, unless this code runs on an alternate signal stack and
/// `cfa` is not on it. One `sigaltstack` query (async-signal-safe, no
/// allocation), so callers ask only once something looks dead.
pub(crate) fn may_drop(cfa: u64) -> bool {
    let mut ss = libc::stack_t {
        ss_sp: std::ptr::null_mut(),
        ss_flags: 0,
        ss_size: 0,
    };
    // SAFETY: querying only (NULL new stack); sigaltstack is async-signal-safe.
    if unsafe { libc::sigaltstack(std::ptr::null(), &mut ss) } != 0 || ss.ss_flags & libc::SS_ONSTACK == 0 {
        return true;
    }
    let lo = ss.ss_sp as u64;
    cfa > lo && cfa <= lo + ss.ss_size as u64
}

#[cfg(test)]
mod tests {
    use super::may_drop;
    use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

    static INSIDE: AtomicU64 = AtomicU64::new(0);
    static OUTSIDE: AtomicU64 = AtomicU64::new(0);
    /// Bit 0: the frame outside may go; bit 1: the one inside; bit 2: ran.
    static SEEN: AtomicU8 = AtomicU8::new(0);

    extern "C" fn on_signal(_: libc::c_int) {
        let mut bits = 4;
        if may_drop(OUTSIDE.load(Ordering::Relaxed)) {
            bits |= 1;
        }
        if may_drop(INSIDE.load(Ordering::Relaxed)) {
            bits |= 2;
        }
        SEEN.store(bits, Ordering::Relaxed);
    }

    #[test]
    fn on_an_alternate_stack_only_its_own_frames_may_go() {
        assert!(may_drop(1), "off any alternate stack, a frame below may go");
        std::thread::spawn(|| {
            let mut stack = vec![0u8; 64 * 1024];
            let lo = stack.as_mut_ptr() as u64;
            INSIDE.store(lo + 4096, Ordering::Relaxed);
            let here = 0u64;
            OUTSIDE.store(&here as *const u64 as u64, Ordering::Relaxed);
            let ss = libc::stack_t {
                ss_sp: stack.as_mut_ptr().cast(),
                ss_flags: 0,
                ss_size: stack.len(),
            };
            // A real-time signal no test of this crate uses, delivered to
            // this thread alone, on its alternate stack.
            let sig = libc::SIGRTMIN() + 7;
            // SAFETY: `stack` outlives the handler's one run (the signal is
            // raised and handled on this thread before it goes); the
            // handler only reads and writes atomics and queries sigaltstack.
            unsafe {
                assert_eq!(libc::sigaltstack(&ss, std::ptr::null_mut()), 0);
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
                sa.sa_flags = libc::SA_ONSTACK;
                assert_eq!(libc::sigaction(sig, &sa, std::ptr::null_mut()), 0);
                assert_eq!(libc::pthread_kill(libc::pthread_self(), sig), 0);
                let off = libc::stack_t {
                    ss_sp: std::ptr::null_mut(),
                    ss_flags: libc::SS_DISABLE,
                    ss_size: 0,
                };
                libc::sigaltstack(&off, std::ptr::null_mut());
            }
            drop(stack);
        })
        .join()
        .unwrap();
        let seen = SEEN.load(Ordering::Relaxed);
        assert_eq!(seen & 4, 4, "the handler ran");
        assert_eq!(seen & 1, 0, "a frame of the interrupted stack must stay");
        assert_eq!(seen & 2, 2, "a frame on the alternate stack may go");
    }
}
