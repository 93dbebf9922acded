//! Wait strategies: how a straddling patch makes sure every core has seen one
//! step before it takes the next.

use crate::error::Error;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
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

const MEMBARRIER_CMD_QUERY: libc::c_int = 0;
const MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE: libc::c_int = 1 << 5;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE: libc::c_int = 1 << 6;

/// Barriers started / completed, numbered from 1. A step stored before barrier
/// number `g` started is visible to all cores once `COMPLETED >= g`.
static STARTED: AtomicU64 = AtomicU64::new(0);
static COMPLETED: AtomicU64 = AtomicU64::new(0);
static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();

pub(crate) fn membarrier(cmd: libc::c_int) -> libc::c_long {
    // SAFETY: membarrier takes integer arguments only and touches no memory of ours.
    unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0 as libc::c_uint, 0 as libc::c_int) }
}

/// Registers the process for SYNC_CORE barriers (once); a clear error where the
/// kernel lacks them. Must be called (it is, by patch functions given
/// [`Wait::SyncCore`]) before any barrier.
///
/// Best called while the process has one thread (so does
/// [`default_wait`](crate::default_wait), which calls it when it picks
/// SyncCore): Linux then returns at once, but with a second thread the
/// registration waits out an RCU grace period.
pub fn ensure_sync_core() -> Result<(), Error> {
    REGISTERED
        .get_or_init(|| {
            if std::env::var("FASTINST_SYNC_CORE").is_ok_and(|v| matches!(v.trim(), "0" | "off")) {
                return Err("turned off by FASTINST_SYNC_CORE".into());
            }
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
