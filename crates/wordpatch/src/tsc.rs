//! The time-stamp counter: the clock every wait is measured in.

/// Current TSC value. Not serializing: a wait only needs "at least this much
/// time has passed", and a later-than-real reading only lengthens it.
#[inline]
pub fn now() -> u64 {
    // SAFETY: rdtsc has no memory effects and every x86-64 CPU has it.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// Spins until at least `ticks` TSC ticks have passed since `from`.
#[inline]
pub fn spin_until(from: u64, ticks: u64) {
    while now().wrapping_sub(from) < ticks {
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
