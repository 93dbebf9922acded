//! Where a patch lies relative to cache lines.
//!
//! Instruction fetch reads whole 64-byte lines, so the only question that
//! decides which protocol a patch needs is whether its bytes stay inside one
//! line ([`is_straddler`]) and, if not, how many fall in the front line
//! ([`split`]).

/// Size of an x86-64 cache line, the unit in which instruction fetch sees stores.
pub const CACHE_LINE: usize = 64;

/// Base page size on x86-64 Linux.
pub const PAGE_SIZE: usize = 4096;

/// Longest patch: one 8-byte store is the widest write the model calls atomic.
pub const MAX_PATCH_LEN: usize = 8;

/// Start of the cache line that holds `addr`.
#[inline]
pub const fn line_start(addr: usize) -> usize {
    addr & !(CACHE_LINE - 1)
}

/// True when `len` bytes at `addr` cross a cache-line boundary.
///
/// A zero-length range never straddles.
#[inline]
pub const fn is_straddler(addr: usize, len: usize) -> bool {
    len > 0 && line_start(addr) != line_start(addr + len - 1)
}

/// Number of the `len` bytes at `addr` that lie in the front line, or 0 when
/// the range does not straddle. For a 5-byte call this is the paper's `S`.
#[inline]
pub const fn split(addr: usize, len: usize) -> usize {
    if is_straddler(addr, len) {
        CACHE_LINE - (addr % CACHE_LINE)
    } else {
        0
    }
}

/// An 8-byte window, inside one cache line, that covers a non-straddling range.
///
/// Writing the window with one `lock cmpxchg` changes the range atomically as
/// seen by instruction fetch and leaves the neighbouring bytes as they were.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Window {
    /// First byte of the window.
    pub base: usize,
    /// Offset of the range inside the window, in bytes.
    pub offset: usize,
}

/// The window for `len` (1..=8) bytes at `addr`, which must not straddle.
///
/// Prefers the aligned window (a plain aligned access); otherwise slides the
/// window left until it ends at the line end at the latest, which keeps it
/// inside the line because the range itself is.
#[inline]
pub(crate) const fn window(addr: usize, len: usize) -> Window {
    debug_assert!(len >= 1 && len <= MAX_PATCH_LEN && !is_straddler(addr, len));
    let aligned = addr & !7;
    let base = if addr + len <= aligned + 8 {
        aligned
    } else {
        let last = line_start(addr) + CACHE_LINE - 8;
        if addr < last {
            addr
        } else {
            last
        }
    };
    Window {
        base,
        offset: addr - base,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_offset_and_length() {
        // Two lines' worth of start offsets so line-crossing shows up at both.
        for off in 0..2 * CACHE_LINE {
            let addr = 0x10_0000 + off;
            for len in 1..=MAX_PATCH_LEN {
                let end = addr + len;
                let crosses = (addr / CACHE_LINE) != ((end - 1) / CACHE_LINE);
                assert_eq!(is_straddler(addr, len), crosses, "off {off} len {len}");
                let s = split(addr, len);
                if crosses {
                    assert!(s >= 1 && s < len, "split {s} for off {off} len {len}");
                    assert_eq!((addr + s) % CACHE_LINE, 0);
                } else {
                    assert_eq!(s, 0);
                    let w = window(addr, len);
                    assert!(w.base <= addr && addr + len <= w.base + 8);
                    assert_eq!(line_start(w.base), line_start(w.base + 7), "window leaves line");
                    assert_eq!(w.offset, addr - w.base);
                    if (addr & !7) + 8 >= end {
                        assert_eq!(w.base % 8, 0, "aligned window preferred");
                    }
                }
            }
        }
    }

    #[test]
    fn empty_range_never_straddles() {
        assert!(!is_straddler(63, 0));
        assert_eq!(split(63, 0), 0);
    }

    #[test]
    fn call_splits_match_paper() {
        // A 5-byte call starting 1..4 bytes before a line boundary is split S|5-S.
        for s in 1..=4 {
            assert_eq!(split(128 - s, 5), s);
        }
        assert_eq!(split(128, 5), 0);
        assert_eq!(split(123, 5), 0);
    }
}
