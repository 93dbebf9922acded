//! Cache-line prefetch hints, for work on many cold objects at once (a
//! batch of samples, an epoch's re-armed functions): their misses overlap
//! instead of being waited for one after another.

/// Starts loading the cache line at `p`.
#[inline(always)]
pub(crate) fn line<T>(p: *const T) {
    // SAFETY: a prefetch is a hint: it never faults and changes no state
    // the program can see, whatever the address.
    unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast::<i8>()) };
}

/// Starts loading every cache line of `*r`.
#[inline(always)]
pub(crate) fn object<T>(r: &T) {
    let start = r as *const T as usize;
    let end = start + std::mem::size_of::<T>();
    let mut at = start & !63;
    while at < end {
        line(at as *const u8);
        at += 64;
    }
}

/// Starts loading every cache line of the `T` at `p` for writing
/// (`prefetchw`): a locked update of a line that other threads read needs
/// it exclusive, which a plain prefetch does not get it.
#[inline(always)]
pub(crate) fn range_for_write<T>(p: *const T) {
    let start = p as usize;
    let end = start + std::mem::size_of::<T>();
    let mut at = start & !63;
    while at < end {
        // SAFETY: as `line`.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_ET0 }>(at as *const i8) };
        at += 64;
    }
}
