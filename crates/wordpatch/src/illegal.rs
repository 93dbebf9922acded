//! A report of an illegal instruction in a process whose code this crate
//! writes.
//!
//! Code fetched torn, or a jump into the middle of an instruction, ends in
//! SIGILL, whose default action kills the process with nothing said: the
//! kernel logs no line for it, and the bytes that ran are gone with the
//! process. So once this crate first makes code writable, a SIGILL handler
//! is installed that, where the disposition it replaced is the default (or
//! ignored), writes one line to stderr (the instruction pointer and the
//! code around it) and lets the default action kill the process as before,
//! by SIGILL. A handler the program installed before is called instead,
//! with nothing written; one it installs later replaces this one (a
//! program that probes CPU features by SIGILL saves and restores the
//! disposition around its probe, so it keeps working).

use crate::chain::{chain, Prev};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

static INSTALLED: AtomicBool = AtomicBool::new(false);
static INSTALL: Mutex<()> = Mutex::new(());
/// The disposition found before ours, written only under `INSTALL` before
/// ours is installed.
static PREV: Prev = Prev::new();

/// Installs the handler once per process (the first page made writable,
/// in place or through an alias). A failure leaves SIGILL as it was: not
/// worth failing a patch for.
pub(crate) fn ensure_installed() {
    if INSTALLED.load(Ordering::Acquire) {
        return;
    }
    let _g = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    if INSTALLED.load(Ordering::Acquire) {
        return;
    }
    // SAFETY: PREV is written before our handler is installed (once, under
    // INSTALL), so no handler reads it meanwhile.
    if unsafe { crate::chain::install(libc::SIGILL, on_sigill, &PREV) }.is_err() {
        return;
    }
    INSTALLED.store(true, Ordering::Release);
}

extern "C" fn on_sigill(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel's arguments to an SA_SIGINFO handler; PREV is not
    // written while this handler is installed. A fault: reported where the
    // previous disposition is the default, never retried.
    unsafe { chain(&PREV, sig, info, ctx, true) }
}
