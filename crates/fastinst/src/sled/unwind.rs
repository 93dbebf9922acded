//! Unwinding with substituted return addresses: the unwinder must never see
//! the exit trampoline's address (it has no unwind information, so a C++
//! exception would end in `std::terminate`). These entry points interpose
//! the unwinder's (from `LD_PRELOAD`, or from the executable that links this
//! crate), put every substituted return address of the thread back
//! ([`shadow::restore_all`]), and continue in the real one.
//!
//! Covered: C++ `throw` and rethrow (`_Unwind_RaiseException`,
//! `_Unwind_Resume_or_Rethrow`), cleanup landing pads (`_Unwind_Resume`),
//! forced unwinding (`_Unwind_ForcedUnwind`) and `pthread_exit`, whose
//! unwinder glibc calls without going through the symbol table. Not
//! covered: `backtrace(3)` and debuggers, which stop at the exit trampoline
//! (no crash, a shorter trace).

use super::shadow;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Real {
    name: &'static std::ffi::CStr,
    addr: AtomicUsize,
}

impl Real {
    const fn new(name: &'static std::ffi::CStr) -> Real {
        Real {
            name,
            addr: AtomicUsize::new(0),
        }
    }

    fn get(&self) -> usize {
        let a = self.addr.load(Ordering::Relaxed);
        if a != 0 {
            return a;
        }
        // SAFETY: RTLD_NEXT lookup of a NUL-terminated name.
        let a = unsafe { libc::dlsym(libc::RTLD_NEXT, self.name.as_ptr()) } as usize;
        self.addr.store(a, Ordering::Relaxed);
        a
    }

    fn need(&self) -> usize {
        let a = self.get();
        if a == 0 {
            let msg = b"fastinst: the real unwinder entry point is missing; aborting\n";
            // SAFETY: write(2) of a static buffer, then abort.
            unsafe {
                libc::write(2, msg.as_ptr() as *const c_void, msg.len());
                libc::abort()
            }
        }
        a
    }
}

static RAISE: Real = Real::new(c"_Unwind_RaiseException");
static RETHROW: Real = Real::new(c"_Unwind_Resume_or_Rethrow");
static RESUME: Real = Real::new(c"_Unwind_Resume");
static FORCED: Real = Real::new(c"_Unwind_ForcedUnwind");
static PTHREAD_EXIT: Real = Real::new(c"pthread_exit");

/// Looks the real entry points up now, outside any unwinding.
pub(crate) fn init() {
    for r in [&RAISE, &RETHROW, &RESUME, &FORCED, &PTHREAD_EXIT] {
        r.get();
    }
}

// The entry points are naked stubs (`crate::arch::stubs::forward_stub`)
// that put the return addresses back, then *jump* to the real function: the unwinder starts from its caller's
// frame (`_Unwind_Resume` continues the unwinding of the function that
// called it), so no frame of ours may stand between them. When these
// were Rust functions that called the real one, `_Unwind_Resume` sat
// between a landing pad and the unwinder: the C++ tests passed, but a Rust
// panic unwinding through a `Drop` in a process with this library aborted
// in libgcc instead of reaching its `catch_unwind` (the test below). Each
// stub keeps the six integer argument registers across its Rust helper
// (the vector ones carry no argument of these functions), with the stack
// 16-byte aligned at the call.
macro_rules! forward {
    ($(#[$doc:meta])* $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty, $prepare:ident, $real:ident) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// As the function it forwards to.
        #[unsafe(naked)]
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            crate::arch::stubs::forward_stub!($prepare)
        }

        /// Puts the thread's return addresses back and returns where the
        /// real function is.
        extern "C" fn $prepare() -> usize {
            shadow::restore_all();
            $real.need()
        }
    };
}

forward!(
    /// Interposes the unwinder's `_Unwind_RaiseException` (C++ `throw`).
    _Unwind_RaiseException(exc: *mut c_void) -> c_int,
    prepare_raise,
    RAISE
);
forward!(
    /// Interposes `_Unwind_Resume_or_Rethrow` (C++ `throw;`).
    _Unwind_Resume_or_Rethrow(exc: *mut c_void) -> c_int,
    prepare_rethrow,
    RETHROW
);
forward!(
    /// Interposes `_Unwind_Resume` (the end of a cleanup landing pad).
    _Unwind_Resume(exc: *mut c_void) -> !,
    prepare_resume,
    RESUME
);
forward!(
    /// Interposes `_Unwind_ForcedUnwind` (thread cancellation).
    _Unwind_ForcedUnwind(exc: *mut c_void, stop: *mut c_void, arg: *mut c_void) -> c_int,
    prepare_forced,
    FORCED
);
forward!(
    /// Interposes `pthread_exit`, which unwinds the thread's stack.
    pthread_exit(ret: *mut c_void) -> !,
    prepare_pthread_exit,
    PTHREAD_EXIT
);

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    #[inline(never)]
    fn fails_holding_things(n: u64) {
        let mut owned: Vec<String> = Vec::new();
        let mut by_key: HashMap<u64, Vec<u64>> = HashMap::new();
        for i in 0..n {
            owned.push(format!("{i}"));
            by_key.entry(i % 7).or_default().push(i);
        }
        assert!(owned.len() as u64 > n, "expected by the test: {} items", owned.len());
    }

    #[test]
    fn a_panic_unwinds_through_drops_to_its_catch_unwind() {
        // The panic's cleanups end in the interposed `_Unwind_Resume`; as a
        // Rust function standing between a landing pad and the unwinder it
        // made this abort the process (SIGABRT in libgcc) instead.
        let r = std::thread::spawn(|| fails_holding_things(100)).join();
        assert!(r.is_err());
        let r = std::panic::catch_unwind(|| fails_holding_things(10));
        assert!(r.is_err());
    }
}
