//! The SIGTRAP handler that makes the INT3 lock safe to run into.
//!
//! A thread that executes a site locked by a straddling patch traps. The
//! handler (installed once, on the first straddling patch) looks the site up
//! in the in-flight table, helps the patch to completion, rewinds RIP to the
//! site and returns, so the thread executes the finished instruction. Every
//! other SIGTRAP (the application's own `int3`, `raise`, `kill`, single-step)
//! goes to the disposition that was in place before: a handler is called with
//! the same arguments, `SIG_IGN` ignores, `SIG_DFL` is restored and the signal
//! raised again so the process dies as it would have.
//!
//! Async-signal-safe throughout: no allocation, no locks, no formatting.
//!
//! Limitation: a SIGTRAP handler installed by the application *after*
//! wordpatch replaces ours; straddling patches in flight then reach it.
//! [`install_trap_handler`] may be called again to re-chain.

use crate::chain::{chain, Prev};
use crate::error::Error;
use crate::inflight;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

/// `si_code` of the SIGTRAP the kernel sends for an `int3` instruction.
const SI_KERNEL: libc::c_int = 0x80;

static INSTALLED: AtomicBool = AtomicBool::new(false);
static TRAPS: AtomicU64 = AtomicU64::new(0);

/// How many INT3 traps on patch sites the handler has resolved in this
/// process: threads that ran into a straddling patch while it was in flight
/// (or a stale view of one just finished).
pub fn traps_handled() -> u64 {
    TRAPS.load(Ordering::Relaxed)
}
static INSTALL: Mutex<()> = Mutex::new(());

/// The disposition found before ours, written only under `INSTALL`.
static PREV: Prev = Prev::new();

/// Installs the SIGTRAP handler if it is not installed. Idempotent and cheap
/// after the first call. Calling it again after the application replaced the
/// handler re-installs ours, chaining to the application's.
pub fn install_trap_handler() -> Result<(), Error> {
    if INSTALLED.load(Ordering::Acquire) && current_is_ours() {
        return Ok(());
    }
    let _g = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    if INSTALLED.load(Ordering::Acquire) && current_is_ours() {
        return Ok(());
    }
    // SAFETY: PREV is written while our handler is not the installed one
    // (checked above, under INSTALL), so no handler reads it meanwhile.
    unsafe { crate::chain::install(libc::SIGTRAP, on_sigtrap, &PREV) }.map_err(Error::SignalHandler)?;
    INSTALLED.store(true, Ordering::Release);
    Ok(())
}

/// The patch path's check: installed once, no syscall afterwards (an
/// application that replaces the handler later must call
/// [`install_trap_handler`] again, which re-checks with `sigaction`).
pub(crate) fn ensure_installed() -> Result<(), Error> {
    if INSTALLED.load(Ordering::Acquire) {
        Ok(())
    } else {
        install_trap_handler()
    }
}

/// Whether the SIGTRAP disposition now is this crate's handler. Another
/// handler that wants SIGTRAP too (a sampler) may take its place and call
/// [`install_trap_handler`] again, which then chains to it.
pub fn trap_handler_is_current() -> bool {
    current_is_ours()
}

fn current_is_ours() -> bool {
    crate::chain::is_current(libc::SIGTRAP, on_sigtrap)
}

extern "C" fn on_sigtrap(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes valid siginfo and ucontext pointers to an
    // SA_SIGINFO handler; RIP is read and written through the ucontext the
    // kernel restores on return, which is how a handler redirects a thread.
    unsafe {
        if (*info).si_code == SI_KERNEL && !ctx.is_null() {
            let uc = ctx as *mut libc::ucontext_t;
            let rip = (*uc).uc_mcontext.gregs[libc::REG_RIP as usize] as usize;
            let site = rip.wrapping_sub(1);
            if inflight::wait_out(site) {
                TRAPS.fetch_add(1, Ordering::Relaxed);
                (*uc).uc_mcontext.gregs[libc::REG_RIP as usize] = site as i64;
                return;
            }
        }
        chain(&PREV, sig, info, ctx, false);
    }
}
