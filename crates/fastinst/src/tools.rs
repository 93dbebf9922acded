//! Built-in tools, picked by `FASTINST_TOOL`: `none` (probes stay as the
//! compiler emitted them, on, with no handler), `off` (every probe is
//! deactivated at discovery: the floor of the instrumented build), `count`
//! (per-function call counts, written at exit), `profile` (the latency
//! profiler, [`crate::profile`]; the default).

use crate::probe::{ProbeId, ProbeKind};
use crate::registry;
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// A built-in tool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tool {
    /// Leave probes as they are.
    None,
    /// Deactivate every probe at discovery.
    Off,
    /// Count calls per function.
    Count,
    /// The latency profiler.
    Profile,
    /// Every call timed: the exact reference (`crate::trace`).
    Trace,
}

impl std::str::FromStr for Tool {
    type Err = String;
    fn from_str(s: &str) -> Result<Tool, String> {
        match s.trim() {
            "none" | "" => Ok(Tool::None),
            "off" => Ok(Tool::Off),
            "count" => Ok(Tool::Count),
            "profile" => Ok(Tool::Profile),
            "trace" => Ok(Tool::Trace),
            other => Err(format!("`{other}` is not a tool (profile, trace, count, off, none)")),
        }
    }
}

extern "C" fn count_handler(id: ProbeId) {
    if let Some(p) = registry::get(id) {
        p.tool.fetch_add(1, Ordering::Relaxed);
    }
}

/// Does what `tool`'s [`install`] will wait for and needs none of the
/// runtime's state, ahead of it, on another thread (the start's own
/// runs meanwhile).
pub(crate) fn prepare(tool: Tool) {
    if tool == Tool::Profile {
        crate::profile::prepare();
    }
}

/// Installs the tool; `out` is where reports go. In a process attached
/// again after a detach, the tool then chosen starts afresh: the profiler
/// as a new generation, the counts from zero.
pub fn install(tool: Tool, out: &Path) -> crate::Result<()> {
    match tool {
        Tool::Profile => crate::profile::install(out.to_path_buf()),
        Tool::Trace => crate::trace::install(out, crate::env::inlined_from_env()),
        Tool::None => {
            crate::api::unlisten();
            Ok(())
        }
        Tool::Off => crate::api::listen(off_discovered),
        Tool::Count => {
            COUNT_INLINED.store(crate::env::inlined_from_env(), Ordering::Relaxed);
            reset_counts();
            crate::api::listen(|m| count_discovered(m, COUNT_INLINED.load(Ordering::Relaxed)))
        }
    }
}

/// The count tool's `FASTINST_INLINED`.
static COUNT_INLINED: AtomicBool = AtomicBool::new(false);

/// The off tool's discovery: every probe off.
fn off_discovered(m: &crate::ProbeMeta) {
    if let Err(e) = crate::deactivate(m.id) {
        crate::log::warn(format_args!("off: probe {}: {e}", m.id));
    }
}

/// The count tool's discovery: entry probes and points count (an inlined
/// copy's only with `inlined`), every other probe goes off.
fn count_discovered(m: &crate::ProbeMeta, inlined: bool) {
    if !crate::filter::admit(m) {
        return;
    }
    let counted = matches!(m.kind, ProbeKind::Entry | ProbeKind::Point);
    let r = if counted && (inlined || !m.inlined) {
        crate::activate(m.id, count_handler)
    } else {
        crate::deactivate(m.id)
    };
    if let Err(e) = r {
        crate::log::warn(format_args!("count: probe {}: {e}", m.id));
    }
}

/// Zeroes the counters (a forked child counts its own calls).
pub(crate) fn reset_counts() {
    for p in registry::iter() {
        p.tool.store(0, Ordering::Relaxed);
    }
}

/// Writes `fastinst-count.<pid>.txt` under `dir`: calls per function,
/// most-called first. Returns the path, or `None` when there were no
/// probes (a process that is not instrumented writes nothing).
pub fn write_counts(dir: &Path) -> std::io::Result<Option<PathBuf>> {
    if registry::count() == 0 {
        return Ok(None);
    }
    let mut per_fn: HashMap<usize, (String, u64)> = HashMap::new();
    for p in registry::iter().filter(|p| matches!(p.meta.kind, ProbeKind::Entry | ProbeKind::Point)) {
        let e = per_fn
            .entry(p.meta.function)
            .or_insert_with(|| (p.meta.name().into_owned(), 0));
        e.1 += p.tool.load(Ordering::Relaxed);
    }
    let mut rows: Vec<(usize, String, u64)> = per_fn.into_iter().map(|(a, (n, c))| (a, n, c)).collect();
    rows.sort_by(|a, b| b.2.cmp(&a.2).then(a.1.cmp(&b.1)));
    let path = dir.join(format!("fastinst-count.{}.txt", std::process::id()));
    let mut out = String::from("# calls\tfunction\taddress\n");
    for (addr, name, calls) in rows {
        let name = if name.is_empty() { "?" } else { &name };
        out.push_str(&format!("{calls}\t{name}\t{addr:#x}\n"));
    }
    std::fs::File::create(&path)?.write_all(out.as_bytes())?;
    Ok(Some(path))
}
