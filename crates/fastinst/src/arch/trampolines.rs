//! The sled trampolines: the shared entry trampoline a sled's stub jumps
//! to, and the exit trampoline that substituted return addresses lead to,
//! one pair per vector width. `crate::sled::trampoline` says what they
//! preserve and why, places the stubs and picks the pair; it instantiates
//! them here with [`sled_trampolines`], passing the runtime's handlers.

macro_rules! trampolines {
    ($enter:ident, $ret:ident, $vsz:literal, $ret_vsz:literal,
     syms: [$enter_fn:path, $ret_fn:path, $flag:path, $end:path],
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
            $crate::arch::stubs::tsc_stamp!(rdx),
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
            $crate::arch::stubs::tsc_stamp!(rax),
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
            $crate::arch::stubs::tsc_stamp!(rax),
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
            $crate::arch::stubs::tsc_stamp!(rax),
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
            enter = sym $enter_fn,
            ret = sym $ret_fn,
            clocked = sym $flag,
            end = sym $end,
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

pub(crate) use clean_entry_avx;
pub(crate) use clean_entry_xgetbv;
pub(crate) use clean_return_avx;
pub(crate) use clean_return_xgetbv;
pub(crate) use reclean_entry;
pub(crate) use reclean_return;
pub(crate) use trampolines;

/// Defines the three pairs of trampolines (`fastinst_sled_enter_sse` and
/// `fastinst_sled_return_sse`, then `_avx` and `_avx512`) and declares
/// them: `$enter_fn(id, frame)` and `$ret_fn(cfa, stamp)` are the
/// runtime's entry and return handlers, each returning the thread clock to
/// charge (or 0); `$flag` is the byte that says whether hooks are clocked;
/// `$end(clock, stamp)` ends a clocked hook.
macro_rules! sled_trampolines {
    (enter: $enter_fn:path, ret: $ret_fn:path, flag: $flag:path, end: $end:path) => {
        $crate::arch::trampolines::trampolines!(fastinst_sled_enter_sse, fastinst_sled_return_sse, "128", "32",
            syms: [$enter_fn, $ret_fn, $flag, $end],
            save: ["movups [rsp], xmm0", "movups [rsp + 16], xmm1", "movups [rsp + 32], xmm2", "movups [rsp + 48], xmm3",
                   "movups [rsp + 64], xmm4", "movups [rsp + 80], xmm5", "movups [rsp + 96], xmm6", "movups [rsp + 112], xmm7"],
            restore: ["movups xmm0, [rsp]", "movups xmm1, [rsp + 16]", "movups xmm2, [rsp + 32]", "movups xmm3, [rsp + 48]",
                      "movups xmm4, [rsp + 64]", "movups xmm5, [rsp + 80]", "movups xmm6, [rsp + 96]", "movups xmm7, [rsp + 112]"],
            save2: ["movups [rsp], xmm0", "movups [rsp + 16], xmm1"],
            restore2: ["movups xmm0, [rsp]", "movups xmm1, [rsp + 16]"],
            clean: [], reclean: [], clean2: [], reclean2: []);

        $crate::arch::trampolines::trampolines!(fastinst_sled_enter_avx, fastinst_sled_return_avx, "256", "64",
            syms: [$enter_fn, $ret_fn, $flag, $end],
            save: ["vmovdqu [rsp], ymm0", "vmovdqu [rsp + 32], ymm1", "vmovdqu [rsp + 64], ymm2", "vmovdqu [rsp + 96], ymm3",
                   "vmovdqu [rsp + 128], ymm4", "vmovdqu [rsp + 160], ymm5", "vmovdqu [rsp + 192], ymm6", "vmovdqu [rsp + 224], ymm7"],
            restore: ["vmovdqu ymm0, [rsp]", "vmovdqu ymm1, [rsp + 32]", "vmovdqu ymm2, [rsp + 64]", "vmovdqu ymm3, [rsp + 96]",
                      "vmovdqu ymm4, [rsp + 128]", "vmovdqu ymm5, [rsp + 160]", "vmovdqu ymm6, [rsp + 192]", "vmovdqu ymm7, [rsp + 224]"],
            save2: ["vmovdqu [rsp], ymm0", "vmovdqu [rsp + 32], ymm1"],
            restore2: ["vmovdqu ymm0, [rsp]", "vmovdqu ymm1, [rsp + 32]"],
            clean: [$crate::arch::trampolines::clean_entry_avx!()], reclean: [$crate::arch::trampolines::reclean_entry!()],
            clean2: [$crate::arch::trampolines::clean_return_avx!()], reclean2: [$crate::arch::trampolines::reclean_return!("64")]);

        $crate::arch::trampolines::trampolines!(fastinst_sled_enter_avx512, fastinst_sled_return_avx512, "512", "128",
            syms: [$enter_fn, $ret_fn, $flag, $end],
            save: ["vmovdqu64 [rsp], zmm0", "vmovdqu64 [rsp + 64], zmm1", "vmovdqu64 [rsp + 128], zmm2", "vmovdqu64 [rsp + 192], zmm3",
                   "vmovdqu64 [rsp + 256], zmm4", "vmovdqu64 [rsp + 320], zmm5", "vmovdqu64 [rsp + 384], zmm6", "vmovdqu64 [rsp + 448], zmm7"],
            restore: ["vmovdqu64 zmm0, [rsp]", "vmovdqu64 zmm1, [rsp + 64]", "vmovdqu64 zmm2, [rsp + 128]", "vmovdqu64 zmm3, [rsp + 192]",
                      "vmovdqu64 zmm4, [rsp + 256]", "vmovdqu64 zmm5, [rsp + 320]", "vmovdqu64 zmm6, [rsp + 384]", "vmovdqu64 zmm7, [rsp + 448]"],
            save2: ["vmovdqu64 [rsp], zmm0", "vmovdqu64 [rsp + 64], zmm1"],
            restore2: ["vmovdqu64 zmm0, [rsp]", "vmovdqu64 zmm1, [rsp + 64]"],
            clean: [$crate::arch::trampolines::clean_entry_xgetbv!()], reclean: [$crate::arch::trampolines::reclean_entry!()],
            clean2: [$crate::arch::trampolines::clean_return_xgetbv!("128")], reclean2: [$crate::arch::trampolines::reclean_return!("128")]);

        extern "C" {
            fn fastinst_sled_enter_sse();
            fn fastinst_sled_return_sse();
            fn fastinst_sled_enter_avx();
            fn fastinst_sled_return_avx();
            fn fastinst_sled_enter_avx512();
            fn fastinst_sled_return_avx512();
        }
    };
}
pub(crate) use sled_trampolines;
