//! The C ABI's data, in one place: the structs `include/fastinst.h`
//! declares, as Rust sees them (their layouts are asserted here, at
//! compile time, and against a C compiler by the preload crate's
//! `c_abi` test), and the table of status codes, names and messages that
//! [`Error::code`](crate::Error::code), `fastinst_strerror` and the
//! header's `FASTINST_E*` all follow. The exported functions are the
//! preload library's (`fastinst-preload`).

use crate::probe::ProbeMeta;
use providers::finstrument::SiteForm;
use std::ffi::{c_char, c_void, CStr};

/// One C status code.
#[derive(Clone, Copy, Debug)]
pub struct Status {
    /// Its value: 0 success, negative an error.
    pub code: i32,
    /// Its name in the header (`FASTINST_OK`, `FASTINST_E*`).
    pub name: &'static str,
    /// What `fastinst_strerror` says.
    pub message: &'static CStr,
}

/// Every status code, success first.
pub const STATUSES: [Status; 8] = [
    Status {
        code: 0,
        name: "FASTINST_OK",
        message: c"success",
    },
    Status {
        code: -1,
        name: "FASTINST_ENOPROBE",
        message: c"no probe with this id",
    },
    Status {
        code: -2,
        name: "FASTINST_EUNLOADED",
        message: c"the probe's library has been unloaded",
    },
    Status {
        code: -3,
        name: "FASTINST_ENOFUNCTION",
        message: c"no probe of a function at this address",
    },
    Status {
        code: -4,
        name: "FASTINST_EINVAL",
        message: c"invalid argument",
    },
    Status {
        code: -5,
        name: "FASTINST_ECALLBACKS",
        message: c"too many discovery callbacks",
    },
    Status {
        code: -6,
        name: "FASTINST_EPATCH",
        message: c"patching the code failed",
    },
    Status {
        code: -7,
        name: "FASTINST_EINTERNAL",
        message: c"internal error",
    },
];

/// `fastinst_strerror`'s answer for `code`.
pub fn message(code: i32) -> &'static CStr {
    STATUSES
        .iter()
        .find(|s| s.code == code)
        .map_or(c"unknown status code", |s| s.message)
}

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

/// The `FASTINST_FORM_*` code of a site form.
pub fn form_code(f: Option<SiteForm>) -> u8 {
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

/// The C view of a probe's metadata.
pub fn c_meta(m: &ProbeMeta) -> CProbeMeta {
    CProbeMeta {
        id: m.id.get(),
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

// The header's sizes (x86-64): a field added or resized on this side only
// fails the build; the `c_abi` test checks every offset against a C
// compiler.
const _: () = assert!(std::mem::size_of::<CProbeMeta>() == 40);
const _: () = assert!(std::mem::size_of::<crate::Stats>() == 17 * 8);
