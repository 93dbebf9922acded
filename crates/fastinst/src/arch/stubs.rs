//! Hook-path assembly: the TSC stamp, the `-finstrument-functions` hook
//! stubs, the unwinder's forwarding stubs, and the calls the hook-cost
//! calibration times (`crate::hookcost`). The runtime's symbols come in as
//! macro arguments.

/// A hook's stamp, for the naked stubs and trampolines: the TSC into
/// `rax` (or `rdx`) behind an `lfence`, clobbering both. Every clocked hook
/// path stamps with this one sequence, so that what the calibration
/// measures of one path's unseen ticks holds for the others.
macro_rules! tsc_stamp {
    (rax) => {
        "lfence\nrdtsc\nshl rdx, 32\nor rax, rdx"
    };
    (rdx) => {
        "lfence\nrdtsc\nshl rdx, 32\nor rdx, rax"
    };
}
pub(crate) use tsc_stamp;

/// The body of a `-finstrument-functions` hook (a naked function).
/// Unclocked: hand the return address and the stack to Rust and jump there
/// (`mov rdx,[rsp]; jmp`), as always. Clocked (`crate::clock`): the TSC
/// first of all, the fast path called (it returns the thread clock to
/// charge, or 0), and the TSC again last of all, both behind `lfence` so
/// that each stamp sits at a fixed instruction. What the stamps miss (the
/// `call` into the stub and the return, the stamps' own cost, the charge)
/// is then the same whatever the handler did, and the calibration measures
/// it once (`crate::hookcost`). `rax`, `rcx`, `rdx`, `rsi`, `rdi`,
/// `r8`-`r11` are free: the hooks are called as ordinary functions of two
/// arguments.
///
/// `$unclocked` and `$clocked` are the two paths, `$flag` the byte that
/// says which to take, `$end` the clock's end of a hook.
macro_rules! hook_stub {
    ($unclocked:path, $clocked:path, flag: $flag:path, end: $end:path, own: $own:literal) => {
        core::arch::naked_asm!(
            // A hidden name for the stub's own address: the exported one is
            // resolved through the global scope, where in a process the
            // library was `dlopen`ed into (an attach) the C library's
            // function of the same name comes first.
            concat!(".globl ", $own),
            concat!(".hidden ", $own),
            concat!($own, ":"),
            $crate::arch::stubs::hook_body!(),
            clocked = sym $flag,
            unclocked = sym $unclocked,
            clocked_fast = sym $clocked,
            end = sym $end,
        )
    };
    // An exit hook: first its cheap path (`crate::clock`'s cheap exits),
    // taken while the byte `$cheap` is set, by a call from 16 bytes or more
    // below where the thread's innermost timed call in flight called its
    // entry hook (`crate::clock::ThreadClock::set_timed`; the caller's
    // stack pointer before this call is `rsp + 8`): it counts the exit
    // and returns, but for one exit in `crate::clock::CHEAP_EXIT_LOOK_EVERY`
    // (its count's low bits all clear), which runs the whole hook: the
    // cheap path makes no look-up, so an exit call site that only ever
    // took it was never discovered and never switched off (a function the
    // filter refused, or an inlined copy, is never timed). `rax`, `rcx` and
    // the flags are free, as in the rest of the stub.
    ($unclocked:path, $clocked:path, flag: $flag:path, end: $end:path, own: $own:literal, cheap: $cheap:path) => {
        core::arch::naked_asm!(
            concat!(".globl ", $own),
            concat!(".hidden ", $own),
            concat!($own, ":"),
            "cmp byte ptr [rip + {cheap}], 0",
            "je 4f",
            "mov rax, qword ptr [rip + fastinst_clock@GOTTPOFF]",
            "mov rax, qword ptr fs:[rax]",
            "test rax, rax",
            "jz 4f",
            "lea rcx, [rsp + 24]",
            "cmp rcx, qword ptr [rax + {timed}]",
            "ja 4f",
            "mov rcx, qword ptr [rax + {fast_exits}]",
            "inc rcx",
            "mov qword ptr [rax + {fast_exits}], rcx",
            "test ecx, {look}",
            "jz 4f",
            "ret",
            "4:",
            $crate::arch::stubs::hook_body!(),
            cheap = sym $cheap,
            timed = const $crate::clock::TIMED_OFFSET,
            fast_exits = const $crate::clock::FAST_EXITS_OFFSET,
            look = const $crate::clock::CHEAP_EXIT_LOOK_EVERY - 1,
            clocked = sym $flag,
            unclocked = sym $unclocked,
            clocked_fast = sym $clocked,
            end = sym $end,
        )
    };
}
pub(crate) use hook_stub;

/// The body of [`hook_stub`]: the clocked or unclocked path, as one
/// template string.
macro_rules! hook_body {
    () => {
        concat!(
            "cmp byte ptr [rip + {clocked}], 0\n",
            "jne 2f\n",
            "mov rdx, [rsp]\n",
            "lea rcx, [rsp + 8]\n",
            "xor r8d, r8d\n",
            "jmp {unclocked}\n",
            "2:\n",
            $crate::arch::stubs::tsc_stamp!(rax),
            "\nmov r8, rax\n",
            // Aligns the stack for the call.
            "push r8\n",
            "mov rdx, [rsp + 8]\n",
            "lea rcx, [rsp + 16]\n",
            "call {clocked_fast}\n",
            "pop r8\n",
            "test rax, rax\n",
            "jz 3f\n",
            "mov rdi, rax\n",
            $crate::arch::stubs::tsc_stamp!(rax),
            "\nmov rsi, rax\n",
            "jmp {end}\n",
            "3:\n",
            "ret"
        )
    };
}
pub(crate) use hook_body;

/// The body of a naked stub that calls `$prepare` (no arguments; it
/// returns an address), keeping the six integer argument registers across
/// it with the stack 16-byte aligned at the call, then *jumps* to the
/// address it returned: no frame of the stub's stands between its caller
/// and the function jumped to (the unwinder's entry points, see
/// `crate::sled::unwind`). The vector registers carry no argument of the
/// functions forwarded.
macro_rules! forward_stub {
    ($prepare:path) => {
        core::arch::naked_asm!(
            "push rdi",
            "push rsi",
            "push rdx",
            "push rcx",
            "push r8",
            "push r9",
            "sub rsp, 8",
            "call {prepare}",
            "add rsp, 8",
            "pop r9",
            "pop r8",
            "pop rcx",
            "pop rdx",
            "pop rsi",
            "pop rdi",
            "jmp rax",
            prepare = sym $prepare,
        )
    };
}
pub(crate) use forward_stub;

/// Calls hook `$f` (a C function of two pointer-sized arguments) with `$a`
/// and `$b` by a direct `call`, as compiled code calls a hook.
///
/// # Safety
/// Expands to an `unsafe` block's content: `$f` must be such a function.
macro_rules! call_hook {
    ($f:path, $a:expr, $b:expr) => {
        core::arch::asm!(
            "call {f}",
            f = sym $f,
            in("rdi") $a, in("rsi") $b,
            clobber_abi("C"),
        )
    };
}
pub(crate) use call_hook;

/// Keeps `v` in a register at this point without any instruction: the
/// argument set-up of a hook call, without the call.
#[inline(always)]
pub(crate) fn keep(v: u64) {
    // SAFETY: an empty template; it only names the register.
    unsafe { core::arch::asm!("/* {t} */", t = in(reg) v, options(nostack, nomem)) };
}

/// Calls the code at `f` with no arguments, as a C function.
///
/// # Safety
/// `f` is a function that may clobber only what a C function may.
#[inline(always)]
pub(crate) unsafe fn call_address(f: usize) {
    // SAFETY: the caller's contract.
    unsafe { core::arch::asm!("call {f}", f = in(reg) f, clobber_abi("C")) };
}
