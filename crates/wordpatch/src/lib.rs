//! Patch 1..=8 bytes of live x86-64 code while every thread keeps running.
//!
//! The model (Chamith et al., PLDI 2016, §3): instruction fetch reads whole
//! 64-byte lines, may keep a stale copy for at most T_max, and never invents
//! bytes; a store of up to 8 bytes inside one line is seen whole or not at
//! all. So:
//!
//! - a patch inside one line ([`is_straddler`] is false) is one
//!   `lock cmpxchg` on the 8-byte window around it: atomic for every core,
//!   neighbouring bytes untouched, no wait;
//! - a patch that crosses a line (a *straddler*) is locked by exchanging its
//!   first byte for INT3, then the part after the boundary is written, then
//!   the part before it (which removes the INT3), with a wait between steps
//!   ([`Wait::Tmax`] ticks, or a [`Wait::SyncCore`] membarrier). A thread
//!   that runs into the INT3 waits in a SIGTRAP handler, helping the patch
//!   along, and re-executes the finished instruction.
//!
//! [`patch`] does all of it before returning; [`start_patch`] returns after
//! the lock and leaves the rest to [`finish_patch`], [`flush`] or a
//! [`Finisher`] thread, so one thread can keep thousands of straddlers in
//! flight and pay the waits once.
//!
//! Code pages are made writable on first use and stay so ([`make_writable`]);
//! code about to be unmapped must be forgotten first ([`forget_pages`]).
//! With [`WriteMode::Alias`] (W^X) they stay read+execute instead, and
//! every store goes through a writable alias of the same memory.
//! Intel's and AMD's manuals bless only "serialize before executing modified
//! code"; [`Wait::SyncCore`] is that protocol, and everything else rests on
//! the model, which this project tests by stress (`stress` crate).
#![warn(missing_docs)]

#[cfg(not(target_arch = "x86_64"))]
compile_error!("wordpatch patches x86-64 machine code: it builds for x86_64 only");

mod alias;
mod chain;
mod code_bytes;
mod config;
mod default_wait;
mod error;
mod evacuate;
mod finisher;
mod fork;
mod gate;
mod geometry;
mod illegal;
mod inflight;
mod line;
mod mode;
mod nop;
mod patch;
mod raw;
mod reprotect;
mod sites;
mod trap;
pub mod tsc;
mod wait;
mod wakeup;
mod writable;

pub use alias::{aliased_bytes, memfd_name, parse_memfd_name, MAX_REGIONS};
pub use code_bytes::CodeBytes;
pub use config::{config_path, ConfigError, MachineConfig};
pub use default_wait::{default_tmax, default_wait, set_default_wait, WaitSource};
pub use error::Error;
pub use evacuate::{evacuate, threads_moved, Evacuation};
pub use finisher::Finisher;
pub use fork::forks_with_late_child;
pub use geometry::{is_straddler, line_start, split, CACHE_LINE, MAX_PATCH_LEN, PAGE_SIZE};
pub use inflight::{diagnose, SlotDiagnosis, SLOTS as MAX_IN_FLIGHT_TABLE};
pub use line::Line;
pub use mode::{write_mode, WriteMode};
pub use nop::{nop, NOP5};
pub use patch::{finish_patch, flush, patch, patch_with, pending, start_patch, PatchOptions, Progress};
pub use raw::{read_code, read_code_u64, store_in_line, store_plain, store_unexecuted, Mismatch};
pub use reprotect::{install_fault_handler, reprotections_undone};
pub use sites::MAX_STRADDLER_SITES;
pub use trap::{install_trap_handler, trap_handler_is_current, traps_handled};
pub use wait::{ensure_sync_core, Wait, BUILTIN_TMAX};
pub use writable::{forget_pages, make_writable, pages_tracked};

/// Chooses how code pages not yet patched are made writable: in place
/// (read+write+execute, the default) or, with [`WriteMode::Alias`], never
/// writable and executable at once (W^X: written through a writable alias
/// of the same memory, with fork handlers that give a `fork` child code of
/// its own). Pages made writable before keep their way: call it before the
/// first patch.
pub fn set_write_mode(mode: WriteMode) {
    if mode == WriteMode::Alias {
        fork::install();
    }
    mode::set(mode);
}

/// Does the slow part of [`set_write_mode`]`(mode)` ahead of it, on any
/// thread, changing nothing else: for [`WriteMode::Alias`], the fork
/// gate's membarrier registration, which waits out an RCU grace period
/// once the process has a second thread (milliseconds). A
/// [`set_write_mode`] after it finds it done, or waits for the rest of it.
pub fn prepare_write_mode(mode: WriteMode) {
    if mode == WriteMode::Alias {
        gate::register();
    }
}
