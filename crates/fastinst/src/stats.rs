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

/// A snapshot of the runtime's counters. `repr(C)`: it is also the C API's
/// `fastinst_stats`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
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
}

/// The counters now.
pub fn stats() -> Stats {
    let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
    Stats {
        probes: crate::registry::count() as u64,
        unrecognised: l(&UNRECOGNISED),
        arg_rewritten: l(&REWRITTEN),
        tail_ambiguous: l(&TAIL_AMBIGUOUS),
        dropped_nested: l(&DROPPED_NESTED),
        dropped_in_discovery: l(&DROPPED_IN_DISCOVERY),
        discoveries: l(&DISCOVERIES),
        discovery_ticks: l(&DISCOVERY_TICKS),
        refused_full: l(&FULL),
    }
}

pub(crate) fn bump(a: &AtomicU64) {
    a.fetch_add(1, Ordering::Relaxed);
}
