//! Toggle x86-64 call sites in live code without waits (paper §6).
//!
//! A probe that is a `call` can be switched off and on by changing bytes that
//! all lie in one cache line, whatever line boundary the instruction crosses,
//! so every toggle is one atomic store: no INT3, no wait, no T_max. Two modes:
//!
//! - [`Mode::Paper`], the paper's algorithm, valid at any call: NOP for a
//!   non-straddler, a `ret` trampoline at the 1|4 split, a short jump over the
//!   rest at the other splits;
//! - [`Mode::Flip`], this project's improvement, valid at calls to
//!   standard-ABI functions: change only the opcode byte to a `mov` of the
//!   same length into a register the call clobbers anyway.
//!
//! Sites of the three forms real `-finstrument-functions` code contains are
//! handled: `call rel32`, `call [rip+disp32]` (`-fno-plt`) and the tail call
//! `jmp rel32`. Every toggle checks the site holds an expected form and
//! refuses otherwise.
//!
//! ```no_run
//! # use callpatch::{CallSite, Mode};
//! # let site: *mut u8 = std::ptr::null_mut();
//! // SAFETY: `site` is a call to a standard-ABI function that we own.
//! let call = unsafe { CallSite::from_active(site) }?;
//! call.deactivate(Mode::Flip)?;
//! call.activate()?;
//! # Ok::<(), callpatch::Error>(())
//! ```
#![warn(missing_docs)]

mod error;
pub mod form;
mod site;
mod trampoline;

pub use error::Error;
pub use form::{Form, Mode, Trampoline};
pub use site::CallSite;
pub use trampoline::map_near;

use std::sync::atomic::{AtomicU8, Ordering};

static DEFAULT_MODE: AtomicU8 = AtomicU8::new(Mode::Paper as u8);

/// Sets the process-wide default mode (of the calls that take none, such
/// as [`deactivate_call`]).
pub fn set_default_mode(mode: Mode) {
    DEFAULT_MODE.store(mode as u8, Ordering::Relaxed);
}

/// The process-wide default mode: [`set_default_mode`]'s, else
/// [`Mode::Paper`], the one valid at any call.
pub fn default_mode() -> Mode {
    if DEFAULT_MODE.load(Ordering::Relaxed) == Mode::Flip as u8 {
        Mode::Flip
    } else {
        Mode::Paper
    }
}

/// Switches on the 5-byte `call rel32` at `site`, calling `site + 5 + rel32`.
///
/// # Safety
/// `site` is a `call rel32` site (on, or off as this crate writes it) whose
/// toggling the caller owns.
pub unsafe fn activate_call(site: *mut u8, rel32: i32) -> Result<(), Error> {
    // SAFETY: forwarded contract.
    unsafe { CallSite::new(site, Form::CallRel32, rel32)? }.activate()
}

/// Switches off the active `call rel32` at `site` in the [`default_mode`].
///
/// # Safety
/// As for [`activate_call`]; in [`Mode::Flip`] also that the callee follows
/// the standard ABI.
pub unsafe fn deactivate_call(site: *mut u8) -> Result<(), Error> {
    // SAFETY: forwarded contract.
    unsafe { deactivate_call_with(site, default_mode()) }
}

/// Switches off the active `call rel32` at `site` in `mode`.
///
/// # Safety
/// As for [`deactivate_call`].
pub unsafe fn deactivate_call_with(site: *mut u8, mode: Mode) -> Result<(), Error> {
    // SAFETY: forwarded contract.
    let call = unsafe { CallSite::from_active(site)? };
    if call.form() != Form::CallRel32 {
        return Err(Error::UnknownForm {
            site: site as usize,
            found: wordpatch::CodeBytes::new(&call.current()),
        });
    }
    call.deactivate(mode)
}
