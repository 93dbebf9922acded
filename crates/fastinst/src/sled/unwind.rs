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

/// Interposes the unwinder's `_Unwind_RaiseException` (C++ `throw`).
///
/// # Safety
/// As the unwinder's.
#[no_mangle]
pub unsafe extern "C" fn _Unwind_RaiseException(exc: *mut c_void) -> c_int {
    shadow::restore_all();
    // SAFETY: the real function has this signature.
    let f: unsafe extern "C" fn(*mut c_void) -> c_int = unsafe { std::mem::transmute(RAISE.need()) };
    // SAFETY: forwarded.
    unsafe { f(exc) }
}

/// Interposes `_Unwind_Resume_or_Rethrow` (C++ `throw;`).
///
/// # Safety
/// As the unwinder's.
#[no_mangle]
pub unsafe extern "C" fn _Unwind_Resume_or_Rethrow(exc: *mut c_void) -> c_int {
    shadow::restore_all();
    // SAFETY: the real function has this signature.
    let f: unsafe extern "C" fn(*mut c_void) -> c_int = unsafe { std::mem::transmute(RETHROW.need()) };
    // SAFETY: forwarded.
    unsafe { f(exc) }
}

/// Interposes `_Unwind_Resume` (the end of a cleanup landing pad).
///
/// # Safety
/// As the unwinder's.
#[no_mangle]
pub unsafe extern "C" fn _Unwind_Resume(exc: *mut c_void) -> ! {
    shadow::restore_all();
    // SAFETY: the real function has this signature.
    let f: unsafe extern "C" fn(*mut c_void) -> ! = unsafe { std::mem::transmute(RESUME.need()) };
    // SAFETY: forwarded.
    unsafe { f(exc) }
}

/// Interposes `_Unwind_ForcedUnwind` (thread cancellation).
///
/// # Safety
/// As the unwinder's.
#[no_mangle]
pub unsafe extern "C" fn _Unwind_ForcedUnwind(exc: *mut c_void, stop: *mut c_void, arg: *mut c_void) -> c_int {
    shadow::restore_all();
    // SAFETY: the real function has this signature.
    let f: unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_void) -> c_int =
        unsafe { std::mem::transmute(FORCED.need()) };
    // SAFETY: forwarded.
    unsafe { f(exc, stop, arg) }
}

/// Interposes `pthread_exit`, which unwinds the thread's stack.
///
/// # Safety
/// As `pthread_exit(3)`.
#[no_mangle]
pub unsafe extern "C" fn pthread_exit(ret: *mut c_void) -> ! {
    shadow::restore_all();
    // SAFETY: the real function has this signature.
    let f: unsafe extern "C" fn(*mut c_void) -> ! = unsafe { std::mem::transmute(PTHREAD_EXIT.need()) };
    // SAFETY: forwarded.
    unsafe { f(ret) }
}
