//! The process-wide default wait: set explicitly, or resolved once from the
//! environment (`FASTINST_WAIT`, `FASTINST_TMAX`), the machine config file,
//! or the built-in T_max.

use crate::config::{config_path, MachineConfig};
use crate::wait::{ensure_sync_core, Wait, BUILTIN_TMAX};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::OnceLock;

/// Where the process-wide default wait came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WaitSource {
    /// [`set_default_wait`] was called.
    Explicit,
    /// Env `FASTINST_WAIT` (strategy) and/or `FASTINST_TMAX` (ticks).
    Env,
    /// The machine config file at this path.
    Config(std::path::PathBuf),
    /// SyncCore, which the kernel has: the built-in default.
    BuiltIn,
    /// Nothing: the kernel lacks SyncCore (or `FASTINST_SYNC_CORE=0` says
    /// to act as if it did) and neither the environment nor a machine
    /// config names a wait. The wait is [`BUILTIN_TMAX`] for explicit
    /// callers, and a straddler patch that leaves its wait to the default
    /// is refused ([`Error::NoProvenWait`](crate::Error::NoProvenWait)):
    /// INT3 + T_max at 3000 ticks has torn straddlers on this project's own
    /// VM, and a torn patch crashes the program.
    Unproven,
}

static DEFAULT: OnceLock<(Wait, WaitSource)> = OnceLock::new();
static UNPROVEN: AtomicBool = AtomicBool::new(false);
static OVERRIDE_KIND: AtomicU8 = AtomicU8::new(0); // 0 none, 1 tmax, 2 synccore
static OVERRIDE_TICKS: AtomicU64 = AtomicU64::new(0);

/// Sets the process-wide default wait, overriding env and config.
pub fn set_default_wait(w: Wait) {
    match w {
        Wait::Tmax(t) => {
            OVERRIDE_TICKS.store(t, Ordering::Relaxed);
            OVERRIDE_KIND.store(1, Ordering::Release);
        }
        Wait::SyncCore => OVERRIDE_KIND.store(2, Ordering::Release),
    }
}

/// The process-wide default wait and where it came from. Resolved once, in
/// order: [`set_default_wait`]; env `FASTINST_WAIT` / `FASTINST_TMAX`; the
/// machine config ([`config_path`]); else [`Wait::SyncCore`] where the kernel
/// has it, and where it does not, no proven wait ([`WaitSource::Unproven`]:
/// straddler patches that take the default are refused). An invalid env
/// value or config file is reported once on stderr and skipped.
///
/// Why SyncCore without a calibration: it is the only protocol the vendors
/// bless, and on this project's VM the stress harness saw rare torn
/// straddlers with asynchronous INT3+Tmax patching at waits up to 3000 ticks
/// under heavy co-running, never with SyncCore. A machine earns the cheaper
/// Tmax protocol through `calibrate`, whose config names it with evidence.
pub fn default_wait() -> (Wait, WaitSource) {
    match OVERRIDE_KIND.load(Ordering::Acquire) {
        1 => return (Wait::Tmax(OVERRIDE_TICKS.load(Ordering::Relaxed)), WaitSource::Explicit),
        2 => return (Wait::SyncCore, WaitSource::Explicit),
        _ => {}
    }
    DEFAULT.get_or_init(resolve).clone()
}

/// [`default_wait`]'s strategy alone, without cloning its source: the patch
/// path's version. `None` where the default is [`WaitSource::Unproven`].
pub(crate) fn default_wait_copy() -> Option<Wait> {
    match OVERRIDE_KIND.load(Ordering::Acquire) {
        1 => Some(Wait::Tmax(OVERRIDE_TICKS.load(Ordering::Relaxed))),
        2 => Some(Wait::SyncCore),
        _ => {
            let w = DEFAULT.get_or_init(resolve).0;
            (!UNPROVEN.load(Ordering::Relaxed)).then_some(w)
        }
    }
}

fn resolve() -> (Wait, WaitSource) {
    let mut env_wait = None;
    if let Ok(v) = std::env::var("FASTINST_WAIT") {
        match v.parse::<Wait>() {
            Ok(w) => env_wait = Some(w),
            Err(e) => eprintln!("wordpatch: ignoring FASTINST_WAIT: {e}"),
        }
    }
    if let Ok(v) = std::env::var("FASTINST_TMAX") {
        match v.trim().parse::<u64>() {
            Ok(t) if env_wait != Some(Wait::SyncCore) => return (Wait::Tmax(t), WaitSource::Env),
            Ok(_) => {}
            Err(_) => eprintln!("wordpatch: ignoring FASTINST_TMAX={v:?}: not a whole number of TSC ticks"),
        }
    }
    if let Some(w) = env_wait {
        return (w, WaitSource::Env);
    }
    let path = config_path();
    if path.exists() {
        match MachineConfig::load(&path) {
            Ok(cfg) => {
                if let Some(w) = cfg.recommended_wait() {
                    return (w, WaitSource::Config(path));
                }
            }
            Err(e) => eprintln!("wordpatch: ignoring machine config: {e}"),
        }
    }
    match ensure_sync_core() {
        Ok(()) => (Wait::SyncCore, WaitSource::BuiltIn),
        Err(_) => {
            UNPROVEN.store(true, Ordering::Relaxed);
            (Wait::Tmax(BUILTIN_TMAX), WaitSource::Unproven)
        }
    }
}

/// The T_max in ticks to use where a [`Wait::Tmax`] is asked for without a
/// value: env `FASTINST_TMAX`, else the machine config's `tmax_ticks`, else
/// [`BUILTIN_TMAX`].
pub fn default_tmax() -> u64 {
    if let Ok(v) = std::env::var("FASTINST_TMAX") {
        if let Ok(t) = v.trim().parse() {
            return t;
        }
    }
    let path = config_path();
    path.exists()
        .then(|| MachineConfig::load(&path).ok())
        .flatten()
        .and_then(|c| c.tmax_ticks)
        .unwrap_or(BUILTIN_TMAX)
}

// --- SyncCore -----------------------------------------------------------------
