//! Raw loads and locked stores on code bytes.
//!
//! Code bytes are shared with the instruction fetch of every core and with
//! other patchers, so every access here is a single machine instruction in
//! inline assembly: Rust's atomics cannot express an unaligned 8-byte
//! `lock cmpxchg`, which is atomic on x86 as long as it stays inside one cache
//! line (it is then not a split lock).

use crate::geometry::{is_straddler, window, MAX_PATCH_LEN};
use core::arch::asm;

/// Loads one byte of code.
///
/// # Safety
/// `addr` must be readable.
#[inline]
pub(crate) unsafe fn load_u8(addr: usize) -> u8 {
    let v: u8;
    // SAFETY: the caller guarantees `addr` is readable; a byte load is atomic.
    unsafe {
        asm!("mov {v}, byte ptr [{p}]", p = in(reg) addr, v = out(reg_byte) v, options(nostack, readonly, preserves_flags))
    };
    v
}

/// Loads 8 bytes that lie inside one cache line, atomically.
///
/// # Safety
/// The 8 bytes at `addr` must be readable and inside one cache line.
#[inline]
pub(crate) unsafe fn load_u64(addr: usize) -> u64 {
    let v: u64;
    // SAFETY: the caller guarantees the bytes are readable and in one line.
    unsafe {
        asm!("mov {v}, qword ptr [{p}]", p = in(reg) addr, v = out(reg) v, options(nostack, readonly, preserves_flags))
    };
    v
}

/// `lock cmpxchg` on 8 bytes inside one line; returns the value found.
///
/// # Safety
/// The 8 bytes at `addr` must be writable and inside one cache line.
#[inline]
pub(crate) unsafe fn cas_u64(addr: usize, old: u64, new: u64) -> u64 {
    let _pass = crate::gate::pass();
    let addr = crate::writable::target(addr);
    let prev: u64;
    // SAFETY: the caller guarantees the bytes are writable and in one line,
    // so the locked operation is atomic and not a split lock.
    unsafe {
        asm!("lock cmpxchg qword ptr [{p}], {n}", p = in(reg) addr, n = in(reg) new,
             inout("rax") old => prev, options(nostack))
    };
    prev
}

/// Atomically exchanges one byte of code; returns the old byte.
///
/// # Safety
/// `addr` must be writable.
#[inline]
pub(crate) unsafe fn xchg_u8(addr: usize, new: u8) -> u8 {
    let _pass = crate::gate::pass();
    let addr = crate::writable::target(addr);
    let mut v = new;
    // SAFETY: the caller guarantees `addr` is writable; xchg with memory is locked.
    unsafe {
        asm!("xchg byte ptr [{p}], {v}", p = in(reg) addr, v = inout(reg_byte) v, options(nostack, preserves_flags))
    };
    v
}

/// Reads `len` (at most 8) code bytes at `addr`, one byte load each, packed
/// little-endian into a `u64` (the rest zero): a snapshot to compare forms
/// with integer compares. Not atomic across bytes.
///
/// # Safety
/// The bytes must be readable.
#[inline]
pub unsafe fn read_code_u64(addr: *const u8, len: usize) -> u64 {
    let mut v = 0u64;
    for i in 0..len.min(8) {
        // SAFETY: the caller guarantees the range is readable.
        v |= (unsafe { load_u8(addr as usize + i) } as u64) << (8 * i);
    }
    v
}

/// Copies `out.len()` code bytes starting at `addr`, one byte load each.
/// The copy is not atomic across bytes: use it to inspect, not to decide races.
///
/// # Safety
/// The bytes must be readable.
pub unsafe fn read_code(addr: *const u8, out: &mut [u8]) {
    for (i, b) in out.iter_mut().enumerate() {
        // SAFETY: the caller guarantees the range is readable.
        *b = unsafe { load_u8(addr as usize + i) };
    }
}

/// Stores `bytes` at `addr` with one plain store instruction if the range
/// lies inside one naturally aligned quadword and is 1, 2, 4 or 8 bytes long;
/// returns false, writing nothing, otherwise. Both vendors guarantee such a
/// store is single-copy atomic (AMD only within an aligned quadword; Intel
/// within a cache line), and it touches no other byte, so it is the cheapest
/// way to change an in-line region that no one else writes concurrently.
///
/// # Safety
/// As for [`store_in_line`]; in addition no other thread may write the same
/// bytes concurrently (nothing checks them at the instant of the store).
#[inline]
pub unsafe fn store_plain(addr: *mut u8, bytes: &[u8]) -> bool {
    let a = addr as usize;
    let len = bytes.len();
    if len == 0 || a / 8 != (a + len - 1) / 8 {
        return false;
    }
    let _pass = crate::gate::pass();
    let a = crate::writable::target(a);
    // SAFETY: in each arm, the caller guarantees the bytes are writable; one
    // store instruction of the range's exact width.
    unsafe {
        match len {
            1 => {
                asm!("mov byte ptr [{p}], {v}", p = in(reg) a, v = in(reg_byte) bytes[0], options(nostack, preserves_flags))
            }
            2 => {
                asm!("mov word ptr [{p}], {v:x}", p = in(reg) a, v = in(reg) u16::from_le_bytes([bytes[0], bytes[1]]), options(nostack, preserves_flags))
            }
            4 => {
                asm!("mov dword ptr [{p}], {v:e}", p = in(reg) a, v = in(reg) u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]), options(nostack, preserves_flags))
            }
            8 => {
                asm!("mov qword ptr [{p}], {v}", p = in(reg) a, v = in(reg) pack(bytes), options(nostack, preserves_flags))
            }
            _ => return false,
        }
    }
    true
}

/// Writes `bytes` at `addr` a byte at a time: for code that no thread
/// runs (a part of a sled jumped over, code not yet reachable), through
/// its alias in [`WriteMode::Alias`](crate::WriteMode::Alias).
///
/// # Safety
/// The bytes' pages were made writable ([`make_writable`](crate::make_writable)),
/// and no thread executes them until the call returns.
pub unsafe fn store_unexecuted(addr: *mut u8, bytes: &[u8]) {
    let _pass = crate::gate::pass();
    for (i, &b) in bytes.iter().enumerate() {
        let a = crate::writable::target(addr as usize + i);
        // SAFETY: the caller guarantees the page is writable (its alias is
        // where `target` points) and that no thread runs the byte.
        unsafe {
            asm!("mov byte ptr [{p}], {v}", p = in(reg) a, v = in(reg_byte) b, options(nostack, preserves_flags))
        };
    }
}

fn mask(len: usize) -> u64 {
    if len >= 8 {
        u64::MAX
    } else {
        (1u64 << (8 * len)) - 1
    }
}

fn pack(bytes: &[u8]) -> u64 {
    let mut v = [0u8; 8];
    v[..bytes.len()].copy_from_slice(bytes);
    u64::from_le_bytes(v)
}

/// Result of [`store_in_line`] when the caller's expectation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mismatch {
    /// The bytes found (first `len` bytes valid).
    pub found: [u8; 8],
}

/// Replaces `new.len()` bytes at `addr` with one `lock cmpxchg` on the 8-byte
/// window around them, leaving the other window bytes as they are (a
/// concurrent change to them just retries). With `expected`, the store happens
/// only if the bytes at `addr` equal it at the instant of the store; returns
/// the bytes that were replaced.
///
/// This is the primitive every non-straddling patch uses: instruction fetch
/// sees the whole new range or none of it.
///
/// # Safety
/// `new` is 1..=8 bytes, the range does not cross a cache line, and its
/// window is writable (see [`make_writable`](crate::make_writable)). Other
/// threads may be executing the bytes: the caller answers for the new bytes
/// being valid code at every moment.
pub unsafe fn store_in_line(addr: *mut u8, new: &[u8], expected: Option<&[u8]>) -> Result<[u8; 8], Mismatch> {
    let addr = addr as usize;
    let len = new.len();
    debug_assert!((1..=MAX_PATCH_LEN).contains(&len) && !is_straddler(addr, len));
    let w = window(addr, len);
    let shift = 8 * w.offset as u32;
    let m = mask(len) << shift;
    let ins = pack(new) << shift;
    let want = expected.map(|e| pack(e) << shift);
    // SAFETY: the caller guarantees the window is readable and writable; it is
    // inside one line by construction of `window`.
    let mut cur = unsafe { load_u64(w.base) };
    loop {
        let old_part = cur & m;
        if let Some(want) = want {
            if old_part != want {
                return Err(Mismatch {
                    found: ((old_part >> shift) & mask(len)).to_le_bytes(),
                });
            }
        }
        let next = (cur & !m) | ins;
        // SAFETY: as above.
        let seen = unsafe { cas_u64(w.base, cur, next) };
        if seen == cur {
            return Ok((old_part >> shift).to_le_bytes());
        }
        cur = seen;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_store_only_inside_an_aligned_quadword() {
        let mut buf = [0u8; 32];
        let base = buf.as_mut_ptr();
        let off = (8 - base as usize % 8) % 8; // first aligned quadword
        let p = base.wrapping_add(off);
        // SAFETY: all stores land inside `buf`.
        unsafe {
            assert!(store_plain(p, &[1]));
            assert!(store_plain(p.wrapping_add(2), &[2, 3]));
            assert!(store_plain(p.wrapping_add(4), &[4, 5, 6, 7]));
            assert!(!store_plain(p.wrapping_add(7), &[9, 9]), "crosses a quadword");
            assert!(!store_plain(p.wrapping_add(5), &[9, 9, 9]), "3 bytes: no such store");
            assert!(!store_plain(p.wrapping_add(6), &[9, 9, 9, 9]), "crosses a quadword");
        }
        assert_eq!(&buf[off..off + 8], &[1, 0, 2, 3, 4, 5, 6, 7]);
    }
}
