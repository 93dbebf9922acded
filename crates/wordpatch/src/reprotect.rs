//! Code pages someone made read-only again.
//!
//! A page is made writable once and kept so ([`crate::make_writable`]). Other
//! code patchers in the same process (XRay's runtime, the `static-keys`
//! crate, a JIT) `mprotect` a page writable around their own write and then
//! back to read+execute, and this crate's next write there would fault. So
//! once the first page is made writable, a SIGSEGV handler is installed: a
//! write fault (`SEGV_ACCERR`) on a page this crate tracks makes the page
//! writable again and returns, and the store runs again, now allowed. Any
//! other SIGSEGV goes to the disposition found before (the program's
//! handler, Rust's stack-overflow handler, or the default action, raised
//! again: never a retry, which could hide a fault at code being patched).
//!
//! Async-signal-safe: a lock-free lookup and `mprotect`. What it changes:
//! a page another patcher protected again is writable again, as it was
//! while this crate patched it; a program's own stray write into such a
//! page succeeds, as it did before the other patcher ran. Limitation, as
//! for SIGTRAP: a SIGSEGV handler installed by the program afterwards
//! replaces this one ([`install_fault_handler`] re-installs it, chaining).

use crate::chain::{chain, Prev};
use crate::error::Error;
use crate::geometry::PAGE_SIZE;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// `si_code` of a fault on a mapped page whose protection forbids the access.
const SEGV_ACCERR: libc::c_int = 2;

static INSTALLED: AtomicBool = AtomicBool::new(false);
static INSTALL: Mutex<()> = Mutex::new(());
static UNDONE: AtomicU64 = AtomicU64::new(0);
/// The disposition found before ours, written only under `INSTALL`.
static PREV: Prev = Prev::new();
/// Whether a page is one the page tracker made writable (a
/// `fn(usize) -> bool`, lock-free), handed over by the tracker when it
/// installs the handler; 0 before.
static TRACKED: AtomicUsize = AtomicUsize::new(0);

/// How many write faults on tracked code pages the handler has resolved by
/// making the page writable again: each a page another patcher (or the
/// program) had made read-only since this crate made it writable.
pub fn reprotections_undone() -> u64 {
    UNDONE.load(Ordering::Relaxed)
}

/// Installs the SIGSEGV handler if it is not the current one; chains to
/// the disposition it replaces. Done by the first [`crate::make_writable`]
/// that makes a page writable; call it again after the program installed
/// a SIGSEGV handler of its own.
pub fn install_fault_handler() -> Result<(), Error> {
    let _g = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    if INSTALLED.load(Ordering::Acquire) && current_is_ours() {
        return Ok(());
    }
    // SAFETY: PREV is written while our handler is not the installed one
    // (checked above, under INSTALL), so no handler reads it meanwhile.
    unsafe { crate::chain::install(libc::SIGSEGV, on_sigsegv, &PREV) }.map_err(Error::SignalHandler)?;
    INSTALLED.store(true, Ordering::Release);
    Ok(())
}

/// Installs the handler once (the page-tracking path's check), with the
/// tracker's lock-free test of a page.
pub(crate) fn ensure_installed(tracked: fn(usize) -> bool) {
    TRACKED.store(tracked as usize, Ordering::Release);
    if !INSTALLED.load(Ordering::Acquire) {
        // Without it, a page protected again by someone else faults as it
        // would have before this crate existed: not worth failing a patch.
        let _ = install_fault_handler();
    }
}

fn current_is_ours() -> bool {
    crate::chain::is_current(libc::SIGSEGV, on_sigsegv)
}

extern "C" fn on_sigsegv(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler;
    // `si_addr` is the faulting address for SIGSEGV. `mprotect` on a page
    // this crate made writable before restores what it set, and is
    // async-signal-safe.
    unsafe {
        let tracked = TRACKED.load(Ordering::Acquire);
        if (*info).si_code == SEGV_ACCERR && tracked != 0 {
            // SAFETY: stored from a `fn(usize) -> bool` (ensure_installed).
            let is_tracked: fn(usize) -> bool = std::mem::transmute::<usize, fn(usize) -> bool>(tracked);
            let page = (*info).si_addr() as usize & !(PAGE_SIZE - 1);
            if is_tracked(page)
                && libc::mprotect(
                    page as *mut libc::c_void,
                    PAGE_SIZE,
                    libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC,
                ) == 0
            {
                UNDONE.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        chain(&PREV, sig, info, ctx, true);
    }
}
