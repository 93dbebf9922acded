//! The C API (`include/fastinst.h`). Every entry point catches panics and
//! returns a status code: 0 or a count on success, a negative
//! `FASTINST_E*` code on failure (see [`Error::code`]).

use crate::discovery::Callback;
use crate::error::Error;
use crate::probe::{Handler, ProbeId, ProbeMeta, Strategy};
use providers::finstrument::SiteForm;
use std::ffi::{c_char, c_int, c_void, CStr};

/// C view of [`ProbeMeta`] (`fastinst_probe_meta`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CProbeMeta {
    /// Probe id.
    pub id: u32,
    /// 0 entry, 1 exit.
    pub kind: u8,
    /// `FASTINST_FORM_*`: 0 unrecognised, 1 call, 2 plt, 3 got, 4 tail,
    /// 5 tail-plt, 6 tail-got, 7 sled.
    pub form: u8,
    /// Bytes before the line boundary the site crosses, 0 if none.
    pub split: u8,
    /// Site instruction length (0 if unrecognised).
    pub site_len: u8,
    /// 0: `-finstrument-functions`, 1: `-fpatchable-function-entry`.
    pub provider: u8,
    /// 1 if the `this_fn` load passes the id.
    pub arg_rewritten: u8,
    /// 1 if the site lies in a copy of the function inlined into another
    /// function ([`ProbeMeta::inlined`]).
    pub inlined: u8,
    /// Zero.
    pub reserved: [u8; 1],
    /// The instrumented function.
    pub function: *const c_void,
    /// Its demangled name, NUL-terminated, never freed ("" if unknown).
    pub function_name: *const c_char,
    /// The site instruction (NULL if unrecognised).
    pub site: *const c_void,
}

/// `fastinst_discovery_fn`.
pub type DiscoveryFn = extern "C" fn(*const CProbeMeta, *mut c_void);

pub(crate) fn form_code(f: Option<SiteForm>) -> u8 {
    match f {
        None => 0,
        Some(SiteForm::Call) => 1,
        Some(SiteForm::CallPlt) => 2,
        Some(SiteForm::CallGot) => 3,
        Some(SiteForm::TailJmp) => 4,
        Some(SiteForm::TailJmpPlt) => 5,
        Some(SiteForm::TailJmpGot) => 6,
        Some(SiteForm::Sled) => 7,
    }
}

pub(crate) fn c_meta(m: &ProbeMeta) -> CProbeMeta {
    CProbeMeta {
        id: m.id,
        kind: m.kind as u8,
        form: form_code(m.form),
        split: m.split,
        site_len: m.site_len,
        provider: m.provider as u8,
        arg_rewritten: m.arg_rewritten as u8,
        inlined: m.inlined as u8,
        reserved: [0; 1],
        function: m.function as *const c_void,
        function_name: m.function_name.as_ptr(),
        site: m.site as *const c_void,
    }
}

fn guard(f: impl FnOnce() -> Result<c_int, Error>) -> c_int {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            crate::log::debug(format_args!("{e}"));
            e.code()
        }
        Err(_) => Error::Internal("panic").code(),
    }
}

/// Registers a discovery callback (see [`crate::on_discovery`]).
#[no_mangle]
pub extern "C" fn fastinst_on_discovery(cb: Option<DiscoveryFn>, user: *mut c_void) -> c_int {
    guard(|| {
        let cb = cb.ok_or_else(|| Error::InvalidArgument("null callback".into()))?;
        crate::api::register(Callback::C(cb, user as usize)).map(|_| 0)
    })
}

/// Activates a probe with a handler (see [`crate::activate`]).
#[no_mangle]
pub extern "C" fn fastinst_activate(id: ProbeId, handler: Option<Handler>) -> c_int {
    guard(|| {
        let h = handler.ok_or_else(|| Error::InvalidArgument("null handler".into()))?;
        crate::activate(id, h).map(|_| 0)
    })
}

/// Deactivates a probe (see [`crate::deactivate`]).
#[no_mangle]
pub extern "C" fn fastinst_deactivate(id: ProbeId) -> c_int {
    guard(|| crate::deactivate(id).map(|_| 0))
}

/// 1 if the probe is active, 0 if not, or an error code.
#[no_mangle]
pub extern "C" fn fastinst_is_active(id: ProbeId) -> c_int {
    guard(|| crate::is_active(id).map(c_int::from))
}

/// Activates every probe of a function; returns how many.
#[no_mangle]
pub extern "C" fn fastinst_activate_function(function: *const c_void, handler: Option<Handler>) -> c_int {
    guard(|| {
        let h = handler.ok_or_else(|| Error::InvalidArgument("null handler".into()))?;
        crate::activate_function(function as usize, h).map(|n| n as c_int)
    })
}

/// Deactivates every probe of a function; returns how many.
#[no_mangle]
pub extern "C" fn fastinst_deactivate_function(function: *const c_void) -> c_int {
    guard(|| crate::deactivate_function(function as usize).map(|n| n as c_int))
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
        crate::set_strategy(st);
        Ok(0)
    })
}

/// The current strategy's name (static string).
#[no_mangle]
pub extern "C" fn fastinst_strategy() -> *const c_char {
    match crate::strategy() {
        Strategy::Flip => c"flip".as_ptr(),
        Strategy::Paper => c"paper".as_ptr(),
        Strategy::WordSync => c"word-sync".as_ptr(),
        Strategy::WordAsync => c"word-async".as_ptr(),
    }
}

/// Number of probes discovered so far.
#[no_mangle]
pub extern "C" fn fastinst_probe_count() -> u32 {
    crate::probe_count()
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
        let m = crate::probe_meta(id)?;
        // SAFETY: checked non-null; the caller guarantees it is writable.
        unsafe { out.write(c_meta(&m)) };
        Ok(0)
    })
}

/// Hook calls that reached the probe while it was inactive (see
/// [`crate::inactive_hits`]), or an error code.
#[no_mangle]
pub extern "C" fn fastinst_inactive_hits(id: ProbeId) -> i64 {
    match crate::inactive_hits(id) {
        Ok(n) => n as i64,
        Err(e) => e.code() as i64,
    }
}

/// Copies the runtime counters ([`crate::Stats`]) to `*out`.
///
/// # Safety
/// `out` is NULL or points to writable memory for one `fastinst_stats`.
#[no_mangle]
pub unsafe extern "C" fn fastinst_get_stats(out: *mut crate::Stats) -> c_int {
    if out.is_null() {
        return Error::InvalidArgument("null output".into()).code();
    }
    // SAFETY: non-null, and the caller guarantees at least its `size`
    // field (the first 8 bytes) is readable.
    let want = unsafe { std::ptr::addr_of!((*out).size).read_unaligned() };
    let own = std::mem::size_of::<crate::Stats>();
    if want < 8 {
        return Error::InvalidArgument("fastinst_stats.size not set (sizeof(fastinst_stats))".into()).code();
    }
    let n = (want as usize).min(own);
    let mut s = crate::stats();
    s.size = n as u64;
    // SAFETY: the caller's struct holds `want >= n` bytes (its `size`), and
    // ours `own >= n`; the two do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(&s as *const crate::Stats as *const u8, out as *mut u8, n) };
    0
}

/// A static description of a status code.
#[no_mangle]
pub extern "C" fn fastinst_strerror(code: c_int) -> *const c_char {
    match code {
        0 => c"success",
        -1 => c"no probe with this id",
        -2 => c"the probe's library has been unloaded",
        -3 => c"no probe of a function at this address",
        -4 => c"invalid argument",
        -5 => c"too many discovery callbacks",
        -6 => c"patching the code failed",
        -7 => c"internal error",
        _ => c"unknown status code",
    }
    .as_ptr()
}
