//! Counters the runtime keeps about itself, for reports and tests.

use std::sync::atomic::{AtomicU64, Ordering};

pub(crate) static UNRECOGNISED: AtomicU64 = AtomicU64::new(0);
pub(crate) static REWRITTEN: AtomicU64 = AtomicU64::new(0);
pub(crate) static TAIL_AMBIGUOUS: AtomicU64 = AtomicU64::new(0);
pub(crate) static DROPPED_NESTED: AtomicU64 = AtomicU64::new(0);
pub(crate) static DROPPED_IN_DISCOVERY: AtomicU64 = AtomicU64::new(0);
pub(crate) static DISCOVERY_TICKS: AtomicU64 = AtomicU64::new(0);
pub(crate) static DISCOVERIES: AtomicU64 = AtomicU64::new(0);
pub(crate) static FULL: AtomicU64 = AtomicU64::new(0);
pub(crate) static MODULES_TICKS: AtomicU64 = AtomicU64::new(0);
pub(crate) static SLED_LOAD_TICKS: AtomicU64 = AtomicU64::new(0);

/// A snapshot of the runtime's counters. `repr(C)`: it is also the C API's
/// `fastinst_stats`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Its size in bytes: the C caller sets it to `sizeof(fastinst_stats)`
    /// before `fastinst_get_stats`, which fills that many bytes at most
    /// and sets it to how many it filled, so the struct can grow at its
    /// end without breaking programs built against an older header.
    pub size: u64,
    /// Probes discovered.
    pub probes: u64,
    /// Sites that were not recognised (never patched; their probes are
    /// "soft": deactivation only drops the calls).
    pub unrecognised: u64,
    /// Probes whose `this_fn` load was rewritten to pass the id.
    pub arg_rewritten: u64,
    /// Tail-jump exits that could not be told apart (a function with
    /// several tail jumps to the exit hook and no rewritten load): they are
    /// reported as the first one.
    pub tail_ambiguous: u64,
    /// Hook calls not delivered because the thread was already inside a
    /// handler (the recursion guard).
    pub dropped_nested: u64,
    /// Hook calls not delivered because they arrived while their thread was
    /// discovering (a signal handler, a discovery callback).
    pub dropped_in_discovery: u64,
    /// Discovery runs (slow-path hook calls that registered probes).
    pub discoveries: u64,
    /// TSC ticks spent in those discovery runs.
    pub discovery_ticks: u64,
    /// Probes refused because a table was full.
    pub refused_full: u64,
    /// TSC ticks spent reading the loaded modules' symbols at start-up.
    pub modules_ticks: u64,
    /// TSC ticks spent registering `-fpatchable-function-entry` sleds
    /// (reading tables, normalising, making stubs), at start-up and for
    /// libraries loaded later.
    pub sled_load_ticks: u64,
    /// Functions with sled probes (two probes each).
    pub sled_functions: u64,
    /// Sled exits delivered by return-address substitution.
    pub sled_exits: u64,
    /// Sled calls whose exit was not watched: the thread's shadow stack
    /// was full.
    pub sled_shadow_full: u64,
    /// Shadow-stack entries dropped because their frames could not return
    /// normally any more (`longjmp`, exceptions).
    pub sled_abandoned: u64,
    /// Substituted return addresses put back before an unwinder ran.
    pub sled_restored: u64,
}

impl Stats {
    /// Everything the runtime spent setting probes up: module symbols,
    /// sled registration and discovery runs, in TSC ticks.
    pub fn init_ticks(&self) -> u64 {
        self.modules_ticks + self.sled_load_ticks + self.discovery_ticks
    }
}

pub(crate) fn bump(a: &AtomicU64) {
    a.fetch_add(1, Ordering::Relaxed);
}
