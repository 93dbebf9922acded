//! The runtime's static (initial-exec) thread-local slots.
//!
//! Rust's `thread_local!` in a shared object uses the general-dynamic TLS
//! model: every access is a `__tls_get_addr` call, about half of what an
//! empty probe invocation costs. Initial-exec is what `LD_PRELOAD`
//! and libraries linked at start-up get from the static TLS block: one
//! `fs:`-relative move. These slots are plain words with no destructor, so
//! they work while a thread exits and in signal handlers; whatever needs a
//! destructor keeps a `thread_local!` and mirrors a pointer here.

// Each symbol is global but hidden: its accessors may be inlined into any
// codegen unit, whose object must resolve the name at link time.
core::arch::global_asm!(
    ".pushsection .tbss,\"awT\",@nobits",
    ".p2align 3",
    ".globl fastinst_in_handler",
    ".hidden fastinst_in_handler",
    ".type fastinst_in_handler,@object",
    ".size fastinst_in_handler,8",
    "fastinst_in_handler:",
    ".zero 8",
    ".globl fastinst_hook_ctx",
    ".hidden fastinst_hook_ctx",
    ".type fastinst_hook_ctx,@object",
    ".size fastinst_hook_ctx,32",
    "fastinst_hook_ctx:",
    ".zero 32",
    ".globl fastinst_profile_store",
    ".hidden fastinst_profile_store",
    ".type fastinst_profile_store,@object",
    ".size fastinst_profile_store,8",
    "fastinst_profile_store:",
    ".zero 8",
    ".globl fastinst_exit_declined",
    ".hidden fastinst_exit_declined",
    ".type fastinst_exit_declined,@object",
    ".size fastinst_exit_declined,8",
    "fastinst_exit_declined:",
    ".zero 8",
    ".globl fastinst_clock",
    ".hidden fastinst_clock",
    ".type fastinst_clock,@object",
    ".size fastinst_clock,8",
    "fastinst_clock:",
    ".zero 8",
    ".globl fastinst_sample_tag",
    ".hidden fastinst_sample_tag",
    ".type fastinst_sample_tag,@object",
    ".size fastinst_sample_tag,8",
    "fastinst_sample_tag:",
    ".zero 8",
    ".globl fastinst_sled_shadow",
    ".hidden fastinst_sled_shadow",
    ".type fastinst_sled_shadow,@object",
    ".size fastinst_sled_shadow,8",
    "fastinst_sled_shadow:",
    ".zero 8",
    ".popsection",
);

/// The hook's recursion guard: set while a handler runs on this thread.
#[inline(always)]
pub(crate) fn guard_get() -> bool {
    let v: u8;
    // SAFETY: reads this thread's copy of the TLS byte defined above.
    unsafe {
        core::arch::asm!(
            "mov {t}, qword ptr [rip + fastinst_in_handler@GOTTPOFF]",
            "mov {v}, byte ptr fs:[{t}]",
            t = out(reg) _, v = out(reg_byte) v, options(nostack, readonly, preserves_flags)
        )
    };
    v != 0
}

/// Sets or clears the recursion guard.
#[inline(always)]
pub(crate) fn guard_set(on: bool) {
    // SAFETY: writes this thread's copy of the TLS byte defined above.
    unsafe {
        core::arch::asm!(
            "mov {t}, qword ptr [rip + fastinst_in_handler@GOTTPOFF]",
            "mov byte ptr fs:[{t}], {v}",
            t = out(reg) _, v = in(reg_byte) on as u8, options(nostack, preserves_flags)
        )
    };
}

/// Publishes the running hook's context words.
#[inline(always)]
pub(crate) fn ctx_set(a: u64, b: u64, c: u64, d: u64) {
    // SAFETY: writes this thread's copy of the 32-byte TLS block above.
    unsafe {
        core::arch::asm!(
            "mov {t}, qword ptr [rip + fastinst_hook_ctx@GOTTPOFF]",
            "mov qword ptr fs:[{t}], {a}",
            "mov qword ptr fs:[{t} + 8], {b}",
            "mov qword ptr fs:[{t} + 16], {c}",
            "mov qword ptr fs:[{t} + 24], {d}",
            t = out(reg) _, a = in(reg) a, b = in(reg) b, c = in(reg) c, d = in(reg) d,
            options(nostack, preserves_flags)
        )
    };
}

/// The words [`ctx_set`] last published on this thread.
#[inline(always)]
pub(crate) fn ctx_get() -> (u64, u64, u64, u64) {
    let (a, b, c, d): (u64, u64, u64, u64);
    // SAFETY: reads this thread's copy of the 32-byte TLS block above.
    unsafe {
        core::arch::asm!(
            "mov {t}, qword ptr [rip + fastinst_hook_ctx@GOTTPOFF]",
            "mov {a}, qword ptr fs:[{t}]",
            "mov {b}, qword ptr fs:[{t} + 8]",
            "mov {c}, qword ptr fs:[{t} + 16]",
            "mov {d}, qword ptr fs:[{t} + 24]",
            t = out(reg) _, a = out(reg) a, b = out(reg) b, c = out(reg) c, d = out(reg) d,
            options(nostack, readonly, preserves_flags)
        )
    };
    (a, b, c, d)
}

/// A word slot of this thread's static TLS.
macro_rules! word_slot {
    ($sym:literal, $get:ident, $set:ident, $what:literal) => {
        #[doc = concat!("Reads ", $what, ".")]
        #[inline(always)]
        pub(crate) fn $get() -> u64 {
            let v: u64;
            // SAFETY: reads this thread's copy of an 8-byte TLS slot
            // defined above.
            unsafe {
                core::arch::asm!(
                    concat!("mov {t}, qword ptr [rip + ", $sym, "@GOTTPOFF]"),
                    "mov {v}, qword ptr fs:[{t}]",
                    t = out(reg) _, v = out(reg) v, options(nostack, readonly, preserves_flags)
                )
            };
            v
        }

        #[doc = concat!("Writes ", $what, ".")]
        #[inline(always)]
        pub(crate) fn $set(v: u64) {
            // SAFETY: writes this thread's copy of an 8-byte TLS slot
            // defined above.
            unsafe {
                core::arch::asm!(
                    concat!("mov {t}, qword ptr [rip + ", $sym, "@GOTTPOFF]"),
                    "mov qword ptr fs:[{t}], {v}",
                    t = out(reg) _, v = in(reg) v, options(nostack, preserves_flags)
                )
            };
        }
    };
}

word_slot!(
    "fastinst_profile_store",
    profile_store,
    set_profile_store,
    "the profiler's store of this thread (a pointer; 0 when it has none)"
);
word_slot!(
    "fastinst_exit_declined",
    exit_declined,
    set_exit_declined,
    "whether the running sled entry handler declined its call's exit (`hooks::decline_exit`)"
);

/// Whether the sled entry handler that just ran declined its call's exit;
/// clears the flag.
#[inline(always)]
pub(crate) fn take_exit_declined() -> bool {
    let v = exit_declined();
    if v != 0 {
        set_exit_declined(0);
    }
    v != 0
}

word_slot!(
    "fastinst_clock",
    clock,
    set_clock,
    "this thread's program clock (a pointer to its `clock::ThreadClock`; 0 before its first clocked hook)"
);
word_slot!(
    "fastinst_sample_tag",
    sample_tag,
    set_sample_tag,
    "one more than this thread's place in the clock's table (0 before its first clocked hook), for its CPU samples: unlike the clock's slot, never cleared as the thread exits, whose last samples are its own too"
);
word_slot!(
    "fastinst_sled_shadow",
    sled_shadow,
    set_sled_shadow,
    "this thread's sled shadow stack (a pointer; 0 before its first sled call)"
);

/// The offset of the clock slot ([`clock`]) from the thread pointer, the
/// same on every thread: generated code (a sled's counting stub) reads it
/// as `fs:[offset]`. `None` if it does not fit a 32-bit displacement
/// (static TLS lies within a few pages of the thread pointer).
pub(crate) fn clock_offset() -> Option<i32> {
    let off: i64;
    // SAFETY: reads the slot's link-time offset from the GOT; no TLS memory
    // is touched.
    unsafe {
        core::arch::asm!(
            "mov {o}, qword ptr [rip + fastinst_clock@GOTTPOFF]",
            o = out(reg) off, options(nostack, readonly, preserves_flags)
        )
    };
    i32::try_from(off).ok()
}

/// How far below the thread pointer these slots reach: what a thread
/// with a TLS block of its own ([`crate::rawthread`]) must map for them.
pub(crate) fn depth() -> usize {
    let (a, b): (isize, isize);
    // SAFETY: reads the link-time offsets of two slots from the GOT; no TLS
    // memory is touched.
    unsafe {
        core::arch::asm!(
            "mov {a}, qword ptr [rip + fastinst_in_handler@GOTTPOFF]",
            "mov {b}, qword ptr [rip + fastinst_sled_shadow@GOTTPOFF]",
            a = out(reg) a, b = out(reg) b, options(nostack, readonly, preserves_flags)
        )
    };
    // Variant II: offsets are negative; a slot spans [tp + off, tp + off + 32).
    (-a.min(b)).max(0) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_per_thread() {
        // No hook, handler or sled runs on a test thread, so the values
        // written here are never followed.
        set_profile_store(7);
        set_clock(5);
        set_sled_shadow(9);
        guard_set(true);
        ctx_set(1, 2, 3, 4);
        std::thread::spawn(|| {
            assert_eq!((profile_store(), sled_shadow(), guard_get()), (0, 0, false));
            assert_eq!(ctx_get(), (0, 0, 0, 0));
            set_profile_store(8);
        })
        .join()
        .unwrap();
        assert_eq!((profile_store(), sled_shadow(), guard_get()), (7, 9, true));
        assert_eq!(ctx_get(), (1, 2, 3, 4));
        set_profile_store(0);
        set_clock(0);
        set_sled_shadow(0);
        guard_set(false);
    }
}
