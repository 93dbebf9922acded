//! The C API (`include/fastinst.h`). Every entry point catches panics and
//! returns a status code: 0 or a count on success, a negative
//! `FASTINST_E*` code on failure (see [`Error::code`]).

use fastinst::c_abi::{c_meta, message, CProbeMeta, DiscoveryFn};
use fastinst::{Error, Handler, ProbeId, Strategy};
use std::ffi::{c_char, c_int, c_void, CStr};

fn guard(f: impl FnOnce() -> Result<c_int, Error>) -> c_int {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            fastinst::log::debug(format_args!("{e}"));
            e.code()
        }
        Err(_) => Error::Internal("panic").code(),
    }
}

/// Registers a discovery callback (see [`fastinst::on_discovery`]).
#[no_mangle]
pub extern "C" fn fastinst_on_discovery(cb: Option<DiscoveryFn>, user: *mut c_void) -> c_int {
    guard(|| {
        let cb = cb.ok_or_else(|| Error::InvalidArgument("null callback".into()))?;
        let user = user as usize;
        fastinst::on_discovery(move |m| cb(&c_meta(m), user as *mut c_void)).map(|_| 0)
    })
}

/// Activates a probe with a handler (see [`fastinst::activate`]).
#[no_mangle]
pub extern "C" fn fastinst_activate(id: ProbeId, handler: Option<Handler>) -> c_int {
    guard(|| {
        let h = handler.ok_or_else(|| Error::InvalidArgument("null handler".into()))?;
        fastinst::activate(id, h).map(|_| 0)
    })
}

/// Deactivates a probe (see [`fastinst::deactivate`]).
#[no_mangle]
pub extern "C" fn fastinst_deactivate(id: ProbeId) -> c_int {
    guard(|| fastinst::deactivate(id).map(|_| 0))
}

/// 1 if the probe is active, 0 if not, or an error code.
#[no_mangle]
pub extern "C" fn fastinst_is_active(id: ProbeId) -> c_int {
    guard(|| fastinst::is_active(id).map(c_int::from))
}

/// Activates every probe of a function; returns how many.
#[no_mangle]
pub extern "C" fn fastinst_activate_function(function: *const c_void, handler: Option<Handler>) -> c_int {
    guard(|| {
        let h = handler.ok_or_else(|| Error::InvalidArgument("null handler".into()))?;
        fastinst::activate_function(function as usize, h).map(|n| n as c_int)
    })
}

/// Deactivates every probe of a function; returns how many.
#[no_mangle]
pub extern "C" fn fastinst_deactivate_function(function: *const c_void) -> c_int {
    guard(|| fastinst::deactivate_function(function as usize).map(|n| n as c_int))
}

/// Sets the toggle strategy by name (`flip`, `paper`, `word-sync`,
/// `word-async`).
///
/// # Safety
/// `name` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn fastinst_set_strategy(name: *const c_char) -> c_int {
    guard(|| {
        if name.is_null() {
            return Err(Error::InvalidArgument("null strategy name".into()));
        }
        // SAFETY: the caller passes a NUL-terminated string.
        let s = unsafe { CStr::from_ptr(name) }.to_string_lossy();
        let st: Strategy = s.parse().map_err(Error::InvalidArgument)?;
        fastinst::set_strategy(st);
        Ok(0)
    })
}

/// The current strategy's name (static string).
#[no_mangle]
pub extern "C" fn fastinst_strategy() -> *const c_char {
    fastinst::strategy().c_name().as_ptr()
}

/// Number of probes discovered so far.
#[no_mangle]
pub extern "C" fn fastinst_probe_count() -> u32 {
    fastinst::probe_count()
}

/// Copies probe `id`'s metadata to `*out`.
///
/// # Safety
/// `out` is NULL or points to writable memory for one `fastinst_probe_meta`.
#[no_mangle]
pub unsafe extern "C" fn fastinst_probe_info(id: ProbeId, out: *mut CProbeMeta) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(Error::InvalidArgument("null output".into()));
        }
        let m = fastinst::probe_meta(id)?;
        // SAFETY: checked non-null; the caller guarantees it is writable.
        unsafe { out.write(c_meta(&m)) };
        Ok(0)
    })
}

/// Hook calls that reached the probe while it was inactive (see
/// [`fastinst::inactive_hits`]), or an error code.
#[no_mangle]
pub extern "C" fn fastinst_inactive_hits(id: ProbeId) -> i64 {
    match fastinst::inactive_hits(id) {
        Ok(n) => n as i64,
        Err(e) => e.code() as i64,
    }
}

/// Copies the runtime counters ([`fastinst::Stats`]) to `*out`.
///
/// # Safety
/// `out` is NULL or points to writable memory for one `fastinst_stats`.
#[no_mangle]
pub unsafe extern "C" fn fastinst_get_stats(out: *mut fastinst::Stats) -> c_int {
    if out.is_null() {
        return Error::InvalidArgument("null output".into()).code();
    }
    // SAFETY: non-null, and the caller guarantees at least its `size`
    // field (the first 8 bytes) is readable.
    let want = unsafe { std::ptr::addr_of!((*out).size).read_unaligned() };
    let own = std::mem::size_of::<fastinst::Stats>();
    if want < 8 {
        return Error::InvalidArgument("fastinst_stats.size not set (sizeof(fastinst_stats))".into()).code();
    }
    let n = (want as usize).min(own);
    let mut s = fastinst::stats();
    s.size = n as u64;
    // SAFETY: the caller's struct holds `want >= n` bytes (its `size`), and
    // ours `own >= n`; the two do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(&s as *const fastinst::Stats as *const u8, out as *mut u8, n) };
    0
}

/// A static description of a status code.
#[no_mangle]
pub extern "C" fn fastinst_strerror(code: c_int) -> *const c_char {
    message(code).as_ptr()
}

/// Starts the runtime in a process it was attached to, from the settings
/// file `config` (`fastinst attach` calls it in the target, after
/// `dlopen`; see `fastinst::attach`). Returns 0, or the
/// [`fastinst::attach::AttachError::code`] of why it did not start; -1 for
/// a NULL or non-UTF-8 path or a panic.
///
/// # Safety
/// `config` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn fastinst_attach_start(config: *const std::ffi::c_char) -> i32 {
    if config.is_null() {
        return -1;
    }
    // SAFETY: the caller passes a NUL-terminated string.
    let Ok(path) = unsafe { std::ffi::CStr::from_ptr(config) }.to_str() else {
        return -1;
    };
    std::panic::catch_unwind(|| match fastinst::attach::start(std::path::Path::new(path)) {
        Ok(()) => {
            crate::at_exit_while_attached();
            0
        }
        Err(e) => e.code(),
    })
    .unwrap_or(-1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `FASTINST_EINTERNAL` in `include/fastinst.h`.
    const EINTERNAL: c_int = -7;

    #[test]
    fn a_panic_inside_an_entry_point_is_einternal_and_goes_no_further() {
        // The runtime has no way to panic on purpose; the guard every
        // entry point runs through is given one.
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let rc = guard(|| panic!("a bug inside the runtime"));
        std::panic::set_hook(prev);
        assert_eq!(rc, EINTERNAL);
        assert_eq!(Error::Internal("panic").code(), EINTERNAL);
        // Errors and values pass through unchanged.
        assert_eq!(guard(|| Ok(5)), 5);
        assert_eq!(guard(|| Err(Error::InvalidArgument("x".into()))), -4);
    }
}
