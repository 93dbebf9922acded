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

macro_rules! trampolines {
    ($enter:ident, $ret:ident, $vsz:literal, $ret_vsz:literal,
     save: [$($save:literal),*], restore: [$($restore:literal),*],
     save2: [$($save2:literal),*], restore2: [$($restore2:literal),*],
     clean: [$($clean:expr),*], reclean: [$($reclean:expr),*],
     clean2: [$($clean2:expr),*], reclean2: [$($reclean2:expr),*]) => {
        core::arch::global_asm!(
            ".pushsection .text",
            ".p2align 4",
            concat!(".globl ", stringify!($enter)),
            concat!(".hidden ", stringify!($enter)),
            concat!(".type ", stringify!($enter), ",@function"),
            concat!(stringify!($enter), ":"),
            // [rsp] = probe id (the stub's push), [rsp+8] = the sled's own
            // return address (entry + 5), [rsp+16] = the function's.
            "push rbp",
            "mov rbp, rsp",
            "push rax",
            "lahf",
            "seto al",
            "push rax",
            "push rdi",
            "push rsi",
            "push rdx",
            "push rcx",
            "push r8",
            "push r9",
            "push r10",
            "push r11",
            // The hook's stamp (`crate::clock`), the handler's third
            // argument: the flags are saved, so they may change.
            "xor edx, edx",
            "cmp byte ptr [rip + {clocked}], 0",
            "je 7f",
            crate::clock::tsc_stamp!(rdx),
            "7:",
            "and rsp, -64",
            concat!("sub rsp, ", $vsz),
            $($save,)*
            $($clean,)*
            "mov edi, dword ptr [rbp + 8]",
            "lea rsi, [rbp + 24]",
            "call {enter}",
            // The hook's end (`crate::clock`): every register but the
            // vector ones is restored from the frame below, and those are
            // restored right after.
            "test rax, rax",
            "jz 10f",
            "mov rdi, rax",
            crate::clock::tsc_stamp!(rax),
            "mov rsi, rax",
            "call {end}",
            "10:",
            $($restore,)*
            $($reclean,)*
            "lea rsp, [rbp - 80]",
            "pop r11",
            "pop r10",
            "pop r9",
            "pop r8",
            "pop rcx",
            "pop rdx",
            "pop rsi",
            "pop rdi",
            "pop rax",
            // OF from al (1 + 0x7f overflows), the others from ah.
            "add al, 0x7f",
            "sahf",
            "pop rax",
            "pop rbp",
            "lea rsp, [rsp + 8]",
            "ret",
            concat!(".size ", stringify!($enter), ", . - ", stringify!($enter)),

            ".p2align 4",
            concat!(".globl ", stringify!($ret)),
            concat!(".hidden ", stringify!($ret)),
            concat!(".type ", stringify!($ret), ",@function"),
            concat!(stringify!($ret), ":"),
            // rsp is the returning function's CFA. The slot below it gets
            // the original return address; the zero below that keeps a
            // stack scan from mistaking anything else for it.
            "push 0",
            "push 0",
            "push rbp",
            "mov rbp, rsp",
            "push rax",
            "push rdx",
            // The hook's stamp (`crate::clock`), kept in the frame for the
            // handler's second argument.
            "xor eax, eax",
            "cmp byte ptr [rip + {clocked}], 0",
            "je 8f",
            crate::clock::tsc_stamp!(rax),
            "8:",
            "and rsp, -64",
            // vector 0-1, then two x87 values (16 bytes each), a count and
            // the stamp.
            concat!("sub rsp, ", $ret_vsz, " + 64"),
            $($save2,)*
            concat!("mov qword ptr [rsp + ", $ret_vsz, " + 40], rax"),
            concat!("mov qword ptr [rsp + ", $ret_vsz, " + 32], 0"),
            "fnstsw ax",
            "and eax, 0x3800",
            "jz 4f",
            concat!("fstp tbyte ptr [rsp + ", $ret_vsz, "]"),
            concat!("mov qword ptr [rsp + ", $ret_vsz, " + 32], 1"),
            // TOP = 7: one value; TOP = 6: two.
            "cmp eax, 0x3800",
            "je 4f",
            concat!("fstp tbyte ptr [rsp + ", $ret_vsz, " + 16]"),
            concat!("mov qword ptr [rsp + ", $ret_vsz, " + 32], 2"),
            "4:",
            "lea rdi, [rbp + 24]",
            concat!("mov rsi, qword ptr [rsp + ", $ret_vsz, " + 40]"),
            $($clean2,)*
            "call {ret}",
            "test rax, rax",
            "jz 11f",
            "mov rdi, rax",
            crate::clock::tsc_stamp!(rax),
            "mov rsi, rax",
            "call {end}",
            "11:",
            concat!("mov rax, qword ptr [rsp + ", $ret_vsz, " + 32]"),
            "cmp rax, 1",
            "jb 6f",
            "je 5f",
            concat!("fld tbyte ptr [rsp + ", $ret_vsz, " + 16]"),
            "5:",
            concat!("fld tbyte ptr [rsp + ", $ret_vsz, "]"),
            "6:",
            $($restore2,)*
            $($reclean2,)*
            "lea rsp, [rbp - 16]",
            "pop rdx",
            "pop rax",
            "pop rbp",
            // Continue at the original return address by an indirect jump,
            // not `ret`: the function's own `ret` (to here) already took
            // its entry off the return-stack predictor, so a second `ret`
            // would take the caller's, and every return above this frame
            // would be predicted one frame off until the predictor
            // refilled. r11 is scratch at a return (not preserved, not a
            // return register), and the handler call above clobbers it
            // anyway.
            "mov r11, qword ptr [rsp + 8]",
            "lea rsp, [rsp + 16]",
            "jmp r11",
            concat!(".size ", stringify!($ret), ", . - ", stringify!($ret)),
            ".popsection",
            enter = sym shadow::sled_enter,
            ret = sym shadow::sled_return,
            clocked = sym crate::clock::FASTINST_CLOCKED,
            end = sym crate::clock::end_sled,
        );
    };
}

// The upper halves of the vector registers. The handlers are ordinary
// code, built for SSE: with the upper halves in use, every SSE instruction
// there waits to merge into the full register (measured on this project's
// Zen 4: an empty sled probe's handler ran about three times slower with
// the upper halves dirty). So once the argument (or return) registers are
// saved in full, `vzeroupper` cleans them for the handler, and afterwards,
// if they were clean when the probe fired (`xgetbv 1`: the AVX and
// AVX-512 upper states not in use), `vzeroupper` again, so the program is
// not left paying that merge in its own SSE code. Registers 8-15 hold
// nothing at an entry or a return (caller-saved, not arguments or results).
// With AVX, "clean" is tested on the values: the upper halves of the
// saved registers all zero (OR-ed together in the free registers 8-11: a
// few cycles, where `xgetbv 1` cost about twenty ticks a hook). Restoring
// those zeros and then `vzeroupper` gives the program back exactly its
// registers, upper halves clean. With AVX-512, `xgetbv 1` reports the AVX
// and AVX-512 upper states. Entry: the flag rides in the upper half of the
// stub's pushed probe id (ids are below 2^31, pushed sign-extended); `rdx`
// (the stamp) is kept in `r8` meanwhile (both saved above).
macro_rules! clean_entry_avx {
    () => {
        "vpor ymm8, ymm0, ymm1\n vpor ymm9, ymm2, ymm3\n vpor ymm10, ymm4, ymm5\n vpor ymm11, ymm6, ymm7
         vpor ymm8, ymm8, ymm9\n vpor ymm10, ymm10, ymm11\n vpor ymm8, ymm8, ymm10
         vextracti128 xmm8, ymm8, 1\n vptest xmm8, xmm8\n setnz byte ptr [rbp + 12]\n vzeroupper"
    };
}
macro_rules! clean_entry_xgetbv {
    () => {
        "mov r8, rdx\n mov ecx, 1\n xgetbv\n and eax, 0x44\n setnz byte ptr [rbp + 12]\n vzeroupper\n mov rdx, r8"
    };
}
macro_rules! reclean_entry {
    () => {
        "cmp byte ptr [rbp + 12], 0\n jne 9f\n vzeroupper\n 9:"
    };
}
// Return: only the result registers 0-1 matter; the flag goes in the
// frame's spare word; rax, rcx and rdx are free here (saved, or dead at a
// return).
macro_rules! clean_return_avx {
    () => {
        "vpor ymm8, ymm0, ymm1\n vextracti128 xmm8, ymm8, 1\n vptest xmm8, xmm8
         setnz byte ptr [rsp + 64 + 48]\n vzeroupper"
    };
}
macro_rules! clean_return_xgetbv {
    ($vsz:literal) => {
        concat!(
            "mov ecx, 1\n xgetbv\n and eax, 0x44\n setnz byte ptr [rsp + ",
            $vsz,
            " + 48]\n vzeroupper"
        )
    };
}
macro_rules! reclean_return {
    ($vsz:literal) => {
        concat!("cmp byte ptr [rsp + ", $vsz, " + 48], 0\n jne 9f\n vzeroupper\n 9:")
    };
}

trampolines!(fastinst_sled_enter_sse, fastinst_sled_return_sse, "128", "32",
    save: ["movups [rsp], xmm0", "movups [rsp + 16], xmm1", "movups [rsp + 32], xmm2", "movups [rsp + 48], xmm3",
           "movups [rsp + 64], xmm4", "movups [rsp + 80], xmm5", "movups [rsp + 96], xmm6", "movups [rsp + 112], xmm7"],
    restore: ["movups xmm0, [rsp]", "movups xmm1, [rsp + 16]", "movups xmm2, [rsp + 32]", "movups xmm3, [rsp + 48]",
              "movups xmm4, [rsp + 64]", "movups xmm5, [rsp + 80]", "movups xmm6, [rsp + 96]", "movups xmm7, [rsp + 112]"],
    save2: ["movups [rsp], xmm0", "movups [rsp + 16], xmm1"],
    restore2: ["movups xmm0, [rsp]", "movups xmm1, [rsp + 16]"],
    clean: [], reclean: [], clean2: [], reclean2: []);

trampolines!(fastinst_sled_enter_avx, fastinst_sled_return_avx, "256", "64",
    save: ["vmovdqu [rsp], ymm0", "vmovdqu [rsp + 32], ymm1", "vmovdqu [rsp + 64], ymm2", "vmovdqu [rsp + 96], ymm3",
           "vmovdqu [rsp + 128], ymm4", "vmovdqu [rsp + 160], ymm5", "vmovdqu [rsp + 192], ymm6", "vmovdqu [rsp + 224], ymm7"],
    restore: ["vmovdqu ymm0, [rsp]", "vmovdqu ymm1, [rsp + 32]", "vmovdqu ymm2, [rsp + 64]", "vmovdqu ymm3, [rsp + 96]",
              "vmovdqu ymm4, [rsp + 128]", "vmovdqu ymm5, [rsp + 160]", "vmovdqu ymm6, [rsp + 192]", "vmovdqu ymm7, [rsp + 224]"],
    save2: ["vmovdqu [rsp], ymm0", "vmovdqu [rsp + 32], ymm1"],
    restore2: ["vmovdqu ymm0, [rsp]", "vmovdqu ymm1, [rsp + 32]"],
    clean: [clean_entry_avx!()], reclean: [reclean_entry!()],
    clean2: [clean_return_avx!()], reclean2: [reclean_return!("64")]);

trampolines!(fastinst_sled_enter_avx512, fastinst_sled_return_avx512, "512", "128",
    save: ["vmovdqu64 [rsp], zmm0", "vmovdqu64 [rsp + 64], zmm1", "vmovdqu64 [rsp + 128], zmm2", "vmovdqu64 [rsp + 192], zmm3",
           "vmovdqu64 [rsp + 256], zmm4", "vmovdqu64 [rsp + 320], zmm5", "vmovdqu64 [rsp + 384], zmm6", "vmovdqu64 [rsp + 448], zmm7"],
    restore: ["vmovdqu64 zmm0, [rsp]", "vmovdqu64 zmm1, [rsp + 64]", "vmovdqu64 zmm2, [rsp + 128]", "vmovdqu64 zmm3, [rsp + 192]",
              "vmovdqu64 zmm4, [rsp + 256]", "vmovdqu64 zmm5, [rsp + 320]", "vmovdqu64 zmm6, [rsp + 384]", "vmovdqu64 zmm7, [rsp + 448]"],
    save2: ["vmovdqu64 [rsp], zmm0", "vmovdqu64 [rsp + 64], zmm1"],
    restore2: ["vmovdqu64 zmm0, [rsp]", "vmovdqu64 zmm1, [rsp + 64]"],
    clean: [clean_entry_xgetbv!()], reclean: [reclean_entry!()],
    clean2: [clean_return_xgetbv!("128")], reclean2: [reclean_return!("128")]);

extern "C" {
    fn fastinst_sled_enter_sse();
    fn fastinst_sled_return_sse();
    fn fastinst_sled_enter_avx();
    fn fastinst_sled_return_avx();
    fn fastinst_sled_enter_avx512();
    fn fastinst_sled_return_avx512();
}

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
