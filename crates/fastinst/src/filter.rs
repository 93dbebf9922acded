//! Which functions the tools probe: a filter by function name and by
//! module, read once from the environment, applied at discovery. A probe
//! the filter refuses is switched off there and never handed to the tool,
//! so a function left out costs its callers a NOP, and nothing else.
//!
//! - `FASTINST_FUNCTIONS`: comma-separated globs; when set, only the
//!   functions whose name matches one are probed;
//! - `FASTINST_EXCLUDE`: globs of functions never probed (wins over the
//!   first);
//! - `FASTINST_MODULES`: globs of the modules (the executable or a shared
//!   library, by file name, e.g. `liblua*.so*`) whose functions are probed.
//!
//! A glob's `*` matches any run of characters and `?` any one; names are
//! the demangled names the reports show.

use crate::probe::ProbeMeta;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// The filter, as the environment set it.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Filter {
    functions: Vec<String>,
    exclude: Vec<String>,
    modules: Vec<String>,
}

static FILTER: OnceLock<Filter> = OnceLock::new();
static REFUSED: AtomicU64 = AtomicU64::new(0);

fn globs(var: &str) -> Vec<String> {
    crate::env::var(var)
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|g| !g.is_empty())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

impl Filter {
    fn from_env() -> Filter {
        Filter {
            functions: globs("FASTINST_FUNCTIONS"),
            exclude: globs("FASTINST_EXCLUDE"),
            modules: globs("FASTINST_MODULES"),
        }
    }

    /// Whether a function named `name` in the module file `module` is
    /// probed.
    fn admits(&self, name: &str, module: impl FnOnce() -> String) -> bool {
        if !self.functions.is_empty() && !self.functions.iter().any(|g| glob(g, name)) {
            return false;
        }
        if self.exclude.iter().any(|g| glob(g, name)) {
            return false;
        }
        if !self.modules.is_empty() {
            let m = module();
            return self.modules.iter().any(|g| glob(g, &m));
        }
        true
    }
}

/// Whether the tool may have probe `m`: if not, the probe is switched off
/// and counted ([`refused`]). Every tool's discovery callback asks first.
pub(crate) fn admit(m: &ProbeMeta) -> bool {
    let f = FILTER.get_or_init(Filter::from_env);
    if f.admits(&m.name(), || module_of(m.function)) {
        return true;
    }
    if let Err(e) = crate::deactivate(m.id) {
        crate::log::warn(format_args!("filter: probe {}: {e}", m.id));
    }
    REFUSED.fetch_add(1, Ordering::Relaxed);
    false
}

/// Probes the filter switched off so far.
pub(crate) fn refused() -> u64 {
    REFUSED.load(Ordering::Relaxed)
}

/// The file name of the module holding `addr` (empty if none is known).
fn module_of(addr: usize) -> String {
    // SAFETY: Dl_info is plain pointers, for which all zeroes is valid.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr reads the address and fills `info`; its strings live
    // as long as the module stays loaded, and are copied here at once.
    if unsafe { libc::dladdr(addr as *const libc::c_void, &mut info) } == 0 || info.dli_fname.is_null() {
        return String::new();
    }
    // SAFETY: a non-null dli_fname is a NUL-terminated string.
    let path = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }.to_string_lossy();
    path.rsplit('/').next().unwrap_or_default().to_string()
}

/// Whether `text` matches `pattern` (`*`: any run, `?`: any one character).
pub(crate) fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    // The classic two-pointer match with one backtrack point: the last `*`.
    let (mut i, mut j, mut star, mut mark) = (0, 0, None, 0);
    while j < t.len() {
        if i < p.len() && (p[i] == '?' || p[i] == t[j]) {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == '*' {
            star = Some(i);
            mark = j;
            i += 1;
        } else if let Some(s) = star {
            i = s + 1;
            mark += 1;
            j = mark;
        } else {
            return false;
        }
    }
    p[i..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_runs_and_single_characters() {
        for (p, t, want) in [
            ("fib", "fib", true),
            ("fib", "fibo", false),
            ("f*", "fib", true),
            ("*b", "fib", true),
            ("*", "", true),
            ("f?b", "fib", true),
            ("f?b", "fb", false),
            ("lua*_get*", "luaH_getshortstr", true),
            ("lua*_set*", "luaH_getshortstr", false),
            ("lua?_get*", "luaH_getshortstr", true),
            ("*get*str", "luaH_getshortstr", true),
            ("a*b*c", "aXbYbZc", true),
            ("a*b*c", "aXbYbZ", false),
            ("liblua*.so*", "liblua5.4.so.0", true),
        ] {
            assert_eq!(glob(p, t), want, "{p} ~ {t}");
        }
    }

    #[test]
    fn the_filter_includes_excludes_and_picks_modules() {
        let f = |functions: &[&str], exclude: &[&str], modules: &[&str]| Filter {
            functions: functions.iter().map(|s| s.to_string()).collect(),
            exclude: exclude.iter().map(|s| s.to_string()).collect(),
            modules: modules.iter().map(|s| s.to_string()).collect(),
        };
        let module = || "app".to_string();
        assert!(f(&[], &[], &[]).admits("fib", module), "no filter: everything");
        assert!(f(&["work", "sp*"], &[], &[]).admits("spin", module));
        assert!(!f(&["work", "sp*"], &[], &[]).admits("fib", module));
        assert!(!f(&["*"], &["fib"], &[]).admits("fib", module), "an exclusion wins");
        assert!(f(&[], &[], &["app"]).admits("fib", module));
        assert!(!f(&[], &[], &["lib*"]).admits("fib", module));
    }
}
