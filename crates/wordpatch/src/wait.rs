//! Wait strategies: how a straddling patch makes sure every core has seen one
//! step before it takes the next.

use crate::config::{config_path, MachineConfig};
use crate::error::Error;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::OnceLock;

/// The paper's conservative wait in TSC ticks, used when nothing else is configured.
pub const BUILTIN_TMAX: u64 = 3000;

/// How long to wait between the steps of a straddling patch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Spin until this many TSC ticks have passed: safe when the ticks exceed
    /// the machine's T_max, the longest time instruction fetch may keep a
    /// stale line (paper §3). Measure it with `calibrate`.
    Tmax(u64),
    /// `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE)`: every running
    /// thread of the process executes a serializing instruction before the call
    /// returns; the protocol the Linux kernel uses for its own text patching.
    /// Needs no calibration; costs a round of IPIs. Concurrent patches share
    /// barriers: one barrier completes a step of every patch waiting on one.
    SyncCore,
}

impl FromStr for Wait {
    type Err = String;
    /// Parses `synccore`, `tmax` (the built-in default ticks) or `tmax:N` / `N` ticks.
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("synccore") {
            return Ok(Wait::SyncCore);
        }
        if s.eq_ignore_ascii_case("tmax") {
            return Ok(Wait::Tmax(BUILTIN_TMAX));
        }
        let n = s.strip_prefix("tmax:").unwrap_or(s);
        n.parse::<u64>()
            .map(Wait::Tmax)
            .map_err(|_| format!("`{s}` is not `synccore`, `tmax`, `tmax:TICKS` or TICKS"))
    }
}

/// Where the process-wide default wait came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WaitSource {
    /// [`set_default_wait`] was called.
    Explicit,
    /// Env `FASTINST_WAIT` (strategy) and/or `FASTINST_TMAX` (ticks).
    Env,
    /// The machine config file at this path.
    Config(std::path::PathBuf),
    /// [`BUILTIN_TMAX`].
    BuiltIn,
}

static DEFAULT: OnceLock<(Wait, WaitSource)> = OnceLock::new();
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
/// has it, [`Wait::Tmax`]`(`[`BUILTIN_TMAX`]`)` where it does not. An invalid
/// env value or config file is reported once on stderr and skipped.
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

/// [`default_wait`]'s strategy alone, without cloning its source: the patch path's version.
pub(crate) fn default_wait_copy() -> Wait {
    match OVERRIDE_KIND.load(Ordering::Acquire) {
        1 => Wait::Tmax(OVERRIDE_TICKS.load(Ordering::Relaxed)),
        2 => Wait::SyncCore,
        _ => DEFAULT.get_or_init(resolve).0,
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
        Err(_) => (Wait::Tmax(BUILTIN_TMAX), WaitSource::BuiltIn),
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

const MEMBARRIER_CMD_QUERY: libc::c_int = 0;
const MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE: libc::c_int = 1 << 5;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE: libc::c_int = 1 << 6;

/// Barriers started / completed, numbered from 1. A step stored before barrier
/// number `g` started is visible to all cores once `COMPLETED >= g`.
static STARTED: AtomicU64 = AtomicU64::new(0);
static COMPLETED: AtomicU64 = AtomicU64::new(0);
static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();

fn membarrier(cmd: libc::c_int) -> libc::c_long {
    // SAFETY: membarrier takes integer arguments only and touches no memory of ours.
    unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0 as libc::c_uint, 0 as libc::c_int) }
}

/// Registers the process for SYNC_CORE barriers (once); a clear error where the
/// kernel lacks them. Must be called (it is, by patch functions given
/// [`Wait::SyncCore`]) before any barrier.
///
/// Best called while the process has one thread (so does
/// [`default_wait`], which calls it when it picks SyncCore): Linux then
/// returns at once, but with a second thread the registration waits out an
/// RCU grace period, measured at 9-29 ms on this project's VM.
pub fn ensure_sync_core() -> Result<(), Error> {
    REGISTERED
        .get_or_init(|| {
            let q = membarrier(MEMBARRIER_CMD_QUERY);
            if q < 0 {
                return Err(format!("membarrier query failed: {}", std::io::Error::last_os_error()));
            }
            if q & MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE as libc::c_long == 0 {
                return Err("the kernel does not offer MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE".into());
            }
            if membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE) != 0 {
                return Err(format!(
                    "membarrier register failed: {}",
                    std::io::Error::last_os_error()
                ));
            }
            Ok(())
        })
        .clone()
        .map_err(Error::SyncCoreUnsupported)
}

/// The barrier generation to record after a store: the store is visible
/// everywhere once a barrier numbered above it has completed.
#[inline]
pub(crate) fn sync_stamp() -> u64 {
    STARTED.load(Ordering::SeqCst)
}

/// True when a barrier that started after `stamp` was taken has completed.
#[inline]
pub(crate) fn synced_since(stamp: u64) -> bool {
    COMPLETED.load(Ordering::Acquire) > stamp
}

/// Runs one SYNC_CORE barrier. Async-signal-safe (atomics and one syscall).
/// Registration must have succeeded before.
pub(crate) fn sync_core() {
    let g = STARTED.fetch_add(1, Ordering::SeqCst) + 1;
    // Registered before any patch with SyncCore could be started, so the
    // command cannot fail with EPERM; EINTR is not possible for membarrier.
    membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE);
    COMPLETED.fetch_max(g, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_waits() {
        assert_eq!("synccore".parse::<Wait>(), Ok(Wait::SyncCore));
        assert_eq!("SyncCore".parse::<Wait>(), Ok(Wait::SyncCore));
        assert_eq!("tmax".parse::<Wait>(), Ok(Wait::Tmax(BUILTIN_TMAX)));
        assert_eq!("tmax:800".parse::<Wait>(), Ok(Wait::Tmax(800)));
        assert_eq!("1200".parse::<Wait>(), Ok(Wait::Tmax(1200)));
        assert!("soon".parse::<Wait>().is_err());
    }

    #[test]
    fn barrier_generations() {
        if ensure_sync_core().is_err() {
            eprintln!("SYNC_CORE unavailable; skipping");
            return;
        }
        let s = sync_stamp();
        assert!(!synced_since(s) || COMPLETED.load(Ordering::SeqCst) > s);
        sync_core();
        assert!(synced_since(s));
    }
}
