//! The time-stamp counter: the clock every wait is measured in.

/// Current TSC value. Not serializing: a wait only needs "at least this much
/// time has passed", and a later-than-real reading only lengthens it.
#[inline]
pub fn now() -> u64 {
    // SAFETY: rdtsc has no memory effects and every x86-64 CPU has it.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// Ticks elapsed since `from`, read with [`now_ordered`] so the reading is
/// taken after every earlier load (of `from` in particular). A `from` still
/// ahead of the reading, as a stamp just written on another core may be,
/// counts as 0 elapsed, never as a wrapped-around huge value.
#[inline]
pub fn elapsed_since(from: u64) -> u64 {
    let d = now_ordered().wrapping_sub(from) as i64;
    d.max(0) as u64
}

/// Spins until at least `ticks` TSC ticks have passed since `from`.
#[inline]
pub fn spin_until(from: u64, ticks: u64) {
    while elapsed_since(from) < ticks {
        core::hint::spin_loop();
    }
}

/// TSC value read only after every earlier instruction has completed, so a
/// stamp taken right after a locked store is never earlier than the store.
#[inline]
pub fn now_ordered() -> u64 {
    // SAFETY: lfence and rdtsc have no memory effects; both exist on x86-64.
    unsafe {
        core::arch::x86_64::_mm_lfence();
        core::arch::x86_64::_rdtsc()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_ahead_of_now_is_not_elapsed() {
        let future = now_ordered() + 1_000_000_000;
        assert_eq!(elapsed_since(future), 0);
        let t = now_ordered();
        spin_until(t, 100);
        assert!(elapsed_since(t) >= 100);
    }
}
