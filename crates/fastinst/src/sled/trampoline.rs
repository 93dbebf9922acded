//! The code an active sled runs: per-probe stubs near the module, the shared
//! entry trampoline, and the exit trampoline that substituted return
//! addresses lead to.
//!
//! An active sled is `call stub`. A stub, one per function, is 16 bytes in
//! a page within ±2 GiB of its module: `push <entry probe id>; jmp
//! [rip+slot]`, where `slot` (at the start of the stub area) holds the
//! address of the entry trampoline, which can be anywhere.
//!
//! What the trampolines preserve, and why that is enough. gcc turns its
//! inter-procedural register allocation (`-fipa-ra`) off for calls to a
//! function with a patchable entry (checked with gcc 12 at -O2: the caller of a
//! plain static function keeps values in caller-saved registers across the
//! call; with a sled on the callee it keeps them in callee-saved ones), and
//! clang does no such allocation, so a caller assumes only what the ABI
//! promises. That holds for the `-fpatchable-function-entry` option, not for
//! gcc's `patchable_function_entry` attribute on single functions, whose
//! callers' callers may keep values in caller-saved registers across the call
//! unless built with `-fno-ipa-ra` (README, "Known limits"). At the entry, the
//! trampoline therefore preserves what an entry may depend on: the argument
//! registers (`rdi rsi rdx rcx r8 r9`), `rax` (the vector-register count of a
//! varargs call), `r10` (the static chain), `r11`, the arithmetic flags, and
//! the argument vector registers 0–7 at their full width (`xmm`, `ymm` or
//! `zmm`, chosen once from the CPU), and calls the handler with the stack
//! aligned to 64. At the exit it preserves the return registers: `rax rdx`,
//! vector registers 0–1 at full width, and up to two `x87` values (`long
//! double` and its complex form), which it pops and pushes back around the
//! handler so the handler starts with the empty x87 stack the ABI requires.
//!
//! The exit trampoline reserves the slot just below the function's CFA (the
//! one that held its return address), has the runtime write the original
//! return address there, and jumps to it (not `ret`: see the comment at
//! its end).

use super::shadow;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Bytes per stub.
pub(crate) const STUB_LEN: usize = 16;
/// Bytes at the start of a stub area before the first stub (the slot).
pub(crate) const AREA_HEADER: usize = 16;

crate::arch::trampolines::sled_trampolines!(
    enter: shadow::sled_enter,
    ret: shadow::sled_return,
    flag: crate::clock::FASTINST_CLOCKED,
    end: crate::clock::end_sled
);

/// Vector register width the trampolines preserve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VectorWidth {
    /// `xmm` (SSE only).
    Xmm,
    /// `ymm` (AVX).
    Ymm,
    /// `zmm` (AVX-512).
    Zmm,
}

/// The widest vector registers this CPU and kernel let code use: what the
/// trampolines must preserve.
pub fn vector_width() -> VectorWidth {
    if std::arch::is_x86_feature_detected!("avx512f") {
        VectorWidth::Zmm
    } else if std::arch::is_x86_feature_detected!("avx") {
        VectorWidth::Ymm
    } else {
        VectorWidth::Xmm
    }
}

fn pick() -> (usize, usize) {
    match vector_width() {
        VectorWidth::Zmm => (
            fastinst_sled_enter_avx512 as *const () as usize,
            fastinst_sled_return_avx512 as *const () as usize,
        ),
        VectorWidth::Ymm => (
            fastinst_sled_enter_avx as *const () as usize,
            fastinst_sled_return_avx as *const () as usize,
        ),
        VectorWidth::Xmm => (
            fastinst_sled_enter_sse as *const () as usize,
            fastinst_sled_return_sse as *const () as usize,
        ),
    }
}

static ENTER: AtomicUsize = AtomicUsize::new(0);

/// The entry trampoline stubs jump to.
pub(crate) fn enter_addr() -> usize {
    init();
    ENTER.load(Ordering::Relaxed)
}

fn init() {
    if ENTER.load(Ordering::Acquire) == 0 {
        let (e, r) = pick();
        shadow::set_return_addr(r);
        ENTER.store(e, Ordering::Release);
    }
}

/// The bytes of the stub for entry probe `id` at `stub`, jumping through the
/// slot at `slot`.
pub(crate) fn stub_bytes(id: u32, stub: usize, slot: usize) -> [u8; STUB_LEN] {
    let mut b = [0xCC; STUB_LEN];
    b[0] = 0x68; // push imm32 (sign-extended; ids are < 2^31)
    b[1..5].copy_from_slice(&id.to_le_bytes());
    b[5] = 0xFF; // jmp [rip + disp32]
    b[6] = 0x25;
    let disp = slot as i64 - (stub + 11) as i64;
    b[7..11].copy_from_slice(&(disp as i32).to_le_bytes());
    b
}

/// A read+execute area of stubs for `ids` (entry probe ids, one per site),
/// within `call rel32` reach of every address in `[lo, hi]`. Returns the
/// address of each stub, in order, or `None` when no memory near enough
/// could be mapped.
pub(crate) fn make_stubs(lo: usize, hi: usize, ids: &[u32]) -> Option<Vec<usize>> {
    let size = AREA_HEADER + STUB_LEN * ids.len();
    let area = callpatch::map_near(lo, hi, 5, size)?;
    let slot = area;
    let stubs: Vec<usize> = (0..ids.len()).map(|i| area + AREA_HEADER + STUB_LEN * i).collect();
    // SAFETY: `area` is a fresh private read+write mapping of at least
    // `size` bytes that nothing else knows about yet.
    unsafe {
        *(slot as *mut u64) = enter_addr() as u64;
        for (&id, &at) in ids.iter().zip(&stubs) {
            std::ptr::copy_nonoverlapping(stub_bytes(id, at, slot).as_ptr(), at as *mut u8, STUB_LEN);
        }
    }
    let len = size.div_ceil(wordpatch::PAGE_SIZE) * wordpatch::PAGE_SIZE;
    // SAFETY: as above; after this the area is never written again.
    if unsafe { libc::mprotect(area as *mut libc::c_void, len, libc::PROT_READ | libc::PROT_EXEC) } != 0 {
        // SAFETY: our own mapping, not yet referenced by any code.
        unsafe { libc::munmap(area as *mut libc::c_void, len) };
        return None;
    }
    Some(stubs)
}

/// Two functions in a fresh page, for measuring what a sled probe costs
/// beyond its stamps (`crate::clock::calibrate`): the first is a sled
/// switched on (`call` to a stub for probe `id`, then `ret`), the second
/// the same sled off (its 5-byte NOP, then `ret`). Leaked; `None` when no
/// page near enough for a stub could be mapped.
pub(crate) fn calibration_functions(id: u32) -> Option<(usize, usize)> {
    // SAFETY: a fresh private mapping, ours alone until made executable.
    let page = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            wordpatch::PAGE_SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if page == libc::MAP_FAILED {
        return None;
    }
    let at = page as usize;
    let stub = make_stubs(at, at + 64, &[id])?[0];
    let mut code = [0xCCu8; 32];
    code[0] = 0xE8;
    code[1..5].copy_from_slice(&((stub as i64 - (at + 5) as i64) as i32).to_le_bytes());
    code[5] = 0xC3;
    code[16..21].copy_from_slice(&wordpatch::NOP5);
    code[21] = 0xC3;
    // SAFETY: the page is ours and writable; then it becomes read+execute
    // and is never written again.
    unsafe {
        std::ptr::copy_nonoverlapping(code.as_ptr(), at as *mut u8, code.len());
        if libc::mprotect(page, wordpatch::PAGE_SIZE, libc::PROT_READ | libc::PROT_EXEC) != 0 {
            return None;
        }
    }
    Some((at, at + 16))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stub_pushes_the_id_and_jumps_through_the_slot() {
        let b = stub_bytes(0x1234, 0x10010, 0x10000);
        assert_eq!(&b[..5], &[0x68, 0x34, 0x12, 0, 0]);
        assert_eq!(&b[5..7], &[0xFF, 0x25]);
        let disp = i32::from_le_bytes(b[7..11].try_into().unwrap());
        assert_eq!(0x10010 + 11 + disp as i64, 0x10000);
    }
}
