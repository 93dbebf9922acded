//! The `FASTINST_*` variables read by more than one part of the runtime,
//! and how every part reads one: unset or empty is the default, an
//! invalid value is reported on stderr and the default used.

use crate::log;

/// The variable's value, `None` when unset or empty.
pub(crate) fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
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
        if let Ok(v) = std::env::var(name) {
            match v.trim() {
                "0" => return false,
                "1" => return true,
                _ => crate::log::error(format_args!("{name}: `{v}` is not 0 or 1; using 0")),
            }
        }
    }
    false
}
