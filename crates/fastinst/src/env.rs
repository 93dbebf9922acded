//! The `FASTINST_*` variables read by more than one part of the runtime,
//! and how every part reads one: unset or empty is the default, an
//! invalid value is reported on stderr and the default used.

use crate::log;
use std::sync::RwLock;

/// Settings given to a runtime that was attached to a running process
/// (`process::attach_start`): they stand for the `FASTINST_*` variables
/// the process was not started with. The process's environment is never
/// written: `setenv` races every other thread's `getenv`.
static OVERLAY: RwLock<Option<Vec<(String, String)>>> = RwLock::new(None);

/// Sets the attached runtime's settings (each attach its own), in place of
/// the environment's.
pub(crate) fn set_overlay(vars: Vec<(String, String)>) {
    if let Ok(mut o) = OVERLAY.write() {
        *o = Some(vars);
    }
}

/// Whether an attach's settings were set: the runtime was started by an
/// attach.
pub(crate) fn has_overlay() -> bool {
    OVERLAY.read().is_ok_and(|o| o.is_some())
}

/// The variable as set: from the attached runtime's settings, if any were
/// given, else from the environment.
pub(crate) fn var(name: &str) -> Option<String> {
    match OVERLAY.read().as_deref() {
        Ok(Some(o)) => o.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()),
        _ => std::env::var(name).ok(),
    }
}

/// The variable's value, `None` when unset or empty.
pub(crate) fn env(name: &str) -> Option<String> {
    var(name).filter(|v| !v.is_empty())
}

/// The variable parsed, or `default` (unset, empty, or invalid: reported).
pub(crate) fn parse_or_warn<T: std::str::FromStr<Err = String>>(name: &str, default: T) -> T {
    match env(name) {
        None => default,
        Some(v) => v.parse().unwrap_or_else(|e| {
            log::error(format_args!("{name}: {e}; using the default"));
            default
        }),
    }
}

/// Whether tools measure the copies of functions that gcc's
/// `-finstrument-functions` left inlined in other functions
/// (`FASTINST_INLINED`, or its older name `FASTINST_PROFILE_INLINED`: `0`
/// or `1`; default 0). Off, an inlined copy's probes are switched off at
/// discovery and its time is its caller's, as in clang and sled builds of
/// the same program; every tool follows the same setting, so the exact
/// references count what the profiler estimates.
pub(crate) fn inlined_from_env() -> bool {
    for name in ["FASTINST_INLINED", "FASTINST_PROFILE_INLINED"] {
        if let Some(v) = var(name) {
            match v.trim() {
                "0" => return false,
                "1" => return true,
                _ => crate::log::error(format_args!("{name}: `{v}` is not 0 or 1; using 0")),
            }
        }
    }
    false
}
