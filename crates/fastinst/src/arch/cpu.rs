//! The thread pointer, raw system calls and a raw `clone`: what
//! `crate::rawthread` needs below the C library.

/// The thread pointer of the calling thread (glibc stores it at `fs:0`).
#[inline]
pub(crate) fn thread_pointer() -> usize {
    let v: usize;
    // SAFETY: reads the first word of this thread's control block, which
    // glibc keeps pointing at itself.
    unsafe { core::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) v, options(nostack, readonly, preserves_flags)) };
    v
}

/// A system call of up to five arguments (unused ones 0), made directly
/// (no libc, no `errno`): the raw return value, negative for an error.
///
/// # Safety
/// The arguments must be valid for system call `nr`.
pub(crate) unsafe fn syscall(nr: libc::c_long, a: usize, b: usize, c: usize, d: usize, e: usize) -> isize {
    let ret: isize;
    // SAFETY: the caller's contract; the kernel clobbers rcx and r11 only.
    unsafe {
        core::arch::asm!(
            "syscall",
            inlateout("rax") nr as isize => ret,
            in("rdi") a,
            in("rsi") b,
            in("rdx") c,
            in("r10") d,
            in("r8") e,
            lateout("rcx") _, lateout("r11") _,
            options(nostack)
        )
    };
    ret
}

/// `clone(flags, stack_top, tid, 0, tp)`, the new thread calling
/// `entry(arg)` on its own stack and exiting when it returns. The caller
/// continues with the child's id, or -errno.
///
/// # Safety
/// `flags` make a thread (`CLONE_VM | CLONE_THREAD | ...`); `stack_top` is
/// the aligned top of a stack the new thread alone uses; `tid` is valid for
/// the kernel's write with `CLONE_PARENT_SETTID`; `tp` is a thread pointer
/// (`CLONE_SETTLS`) whose control block `entry` may rely on; `entry` and
/// everything it calls keep to what a thread without the C library may do.
pub(crate) unsafe fn clone_thread(
    flags: usize,
    stack_top: usize,
    tid: *mut i32,
    tp: usize,
    entry: extern "C" fn(usize),
    arg: usize,
) -> isize {
    let ret: isize;
    // SAFETY: the caller's contract. The child starts on its own stack
    // with every register as here, calls `entry(arg)` from r12/r13 (kept by
    // the system call) and exits the thread: it never returns into this
    // function's frame.
    unsafe {
        core::arch::asm!(
            "syscall",
            "test rax, rax",
            "jnz 2f",
            "xor ebp, ebp",
            "mov rdi, r13",
            "call r12",
            "xor edi, edi",
            "mov eax, 60",
            "syscall",
            "ud2",
            "2:",
            inlateout("rax") libc::SYS_clone as isize => ret,
            in("rdi") flags,
            in("rsi") stack_top,
            in("rdx") tid,
            in("r10") 0usize,
            in("r8") tp,
            in("r12") entry as usize,
            in("r13") arg,
            lateout("rcx") _, lateout("r11") _,
            options(nostack)
        )
    };
    ret
}
