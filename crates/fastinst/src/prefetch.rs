//! Cache-line prefetch hints, for work on many cold objects at once (a
//! batch of samples, an epoch's re-armed functions): their misses overlap
//! instead of being waited for one after another.

use std::arch::x86_64::{_mm_prefetch, _MM_HINT_ET0, _MM_HINT_T0};

/// Starts loading the cache line at `p`.
#[inline(always)]
pub(crate) fn line<T>(p: *const T) {
    // SAFETY: a prefetch is a hint: it never faults and changes no state
    // the program can see, whatever the address.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>()) };
}

/// Starts loading the cache line at `p` for writing (`prefetchw`).
#[inline(always)]
pub(crate) fn line_for_write<T>(p: *const T) {
    // SAFETY: as in `line`: a hint, never a fault.
    unsafe { _mm_prefetch::<_MM_HINT_ET0>(p.cast::<i8>()) };
}

/// Starts loading every cache line of `*r`.
#[inline(always)]
pub(crate) fn object<T>(r: &T) {
    each_line::<T, _MM_HINT_T0>(r);
}

/// Starts loading every cache line of the `T` at `p` for writing
/// (`prefetchw`): a locked update of a line that other threads read needs
/// it exclusive, which a plain prefetch does not get it.
#[inline(always)]
pub(crate) fn range_for_write<T>(p: *const T) {
    each_line::<T, _MM_HINT_ET0>(p);
}

#[inline(always)]
fn each_line<T, const HINT: i32>(p: *const T) {
    let start = p as usize;
    let end = start + std::mem::size_of::<T>();
    let mut at = start & !63;
    while at < end {
        // SAFETY: as in `line`: a hint, never a fault.
        unsafe { _mm_prefetch::<HINT>(at as *const i8) };
        at += 64;
    }
}
