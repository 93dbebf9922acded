//! The probe registry: dense ids, append-only, never moves (a `Segmented`
//! table).
//!
//! Probes live in segments of [`SEGMENT`] slots, allocated on demand and
//! never freed, indexed by a fixed table of segment pointers. A reader (the
//! hook fast path, any API call) does two loads and no locking; a probe,
//! once published, stays at its address for the life of the process.

use crate::callcount::Counted;
use crate::code::ON;
use crate::probe::{ProbeId, ProbeMeta};
use crate::segmented::Segmented;
use crate::sled::site::Sled;
use callpatch::CallSite;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};

const SEGMENTS: usize = 4096;
/// Probes per segment.
pub const SEGMENT: usize = crate::segmented::SEG;
/// Most probes one process can have.
pub const MAX_PROBES: usize = SEGMENT * SEGMENTS;

/// Where a probe's code is.
pub(crate) enum Site {
    /// Not recognised: never patched; while the probe is off its hook calls
    /// are dropped.
    Unrecognised,
    /// A hook call or tail jump (`-finstrument-functions`), switched with
    /// callpatch or wordpatch; an entry call given a counting stub
    /// (`crate::callcount`) calls the stub, and says so.
    Call(CallSite, Option<&'static Counted>),
    /// A function's sled (`-fpatchable-function-entry`), shared by its entry
    /// and exit probe.
    Sled(&'static Sled),
}

impl Site {
    /// The hook call's view, for a [`Site::Call`].
    pub(crate) fn call(&self) -> Option<&CallSite> {
        match self {
            Site::Call(c, _) => Some(c),
            _ => None,
        }
    }
}

/// One probe: immutable metadata plus the atomics the runtime toggles.
///
/// Laid out by hand (`repr(C)`, line-aligned) so that what a hook call and
/// a sampled call's handlers read, the metadata, the handler and the tool's
/// word, is the record's first cache line; the call site's view, the
/// state and the lock follow (a switch reads them, and a hook call only
/// when the probe has no handler, or for a sled's exit probe). Left to the
/// compiler, the handler and the site's address fell on two different
/// lines, each a miss on a probe the program last ran milliseconds ago.
#[repr(C, align(64))]
pub struct Probe {
    pub(crate) meta: ProbeMeta,
    /// The handler (`Handler` as usize), 0 when none.
    pub(crate) handler: AtomicUsize,
    /// A word for the built-in tools (the profiler's function index, the
    /// `count` tool's counter).
    pub(crate) tool: AtomicU64,
    /// Where its code is, and how it is switched.
    pub(crate) site: Site,
    /// Address of the `this_fn` load rewritten to pass the id (0 if none).
    pub(crate) rewrite_at: AtomicU64,
    /// Hook calls that reached this probe while it was inactive (the call
    /// that discovered it, calls in flight while it was switched off, and
    /// every call of an unrecognised site, which is never patched).
    pub(crate) inactive_hits: AtomicU64,
    /// Index of the module it lives in.
    pub(crate) module: u32,
    /// [`ON`] when the site's code calls the hook; otherwise the strategy
    /// that switched it off in the low bits.
    pub(crate) state: AtomicU8,
    /// Serialises toggles of this probe.
    pub(crate) lock: AtomicBool,
    /// Set once its library has been unloaded: never touched again.
    pub(crate) unloaded: AtomicBool,
}

// The hot part is the first line.
const _: () = assert!(std::mem::offset_of!(Probe, tool) + 8 <= 64);
const _: () = assert!(std::mem::size_of::<Probe>() == 192);

impl Probe {
    /// Its metadata.
    pub fn meta(&self) -> ProbeMeta {
        ProbeMeta {
            arg_rewritten: self.rewrite_at.load(Ordering::Acquire) != 0,
            ..self.meta
        }
    }

    pub(crate) fn lock(&self) -> ProbeGuard<'_> {
        crate::spin::acquire(&self.lock);
        ProbeGuard(self)
    }
}

/// Holds a probe's toggle lock.
pub(crate) struct ProbeGuard<'a>(&'a Probe);

impl Drop for ProbeGuard<'_> {
    fn drop(&mut self) {
        self.0.lock.store(false, Ordering::Release);
    }
}

static PROBES: Segmented<Probe, SEGMENTS> = Segmented::new();

/// The probe with id `id`, if it exists. Lock-free.
#[inline(always)]
pub fn get(id: ProbeId) -> Option<&'static Probe> {
    PROBES.get(id.get())
}

/// Starts loading probe `id`'s lines for a toggle (see
/// [`crate::prefetch`]).
pub(crate) fn prefetch_for_toggle(id: ProbeId) {
    PROBES.prefetch_for_write(id.get());
}

/// Starts loading the first line of probe `id`'s record, all that a hook
/// call reads of it before its handler (see [`Probe`]).
#[inline(always)]
pub(crate) fn prefetch_hot(id: ProbeId) {
    PROBES.prefetch(id.get());
}

/// Starts loading what switching probe `id` on writes besides its record
/// (see [`prefetch_for_toggle`], which should have been issued for it a
/// while before): its code line, for writing, if it is off, and a sled
/// probe's sled record. The profiler's sampler switches many functions'
/// probes on per epoch, and unprefetched each of those writes waits for a
/// line the program's CPU holds (the measured gain is in the benches'
/// results).
pub(crate) fn prefetch_code_for_activation(id: ProbeId) {
    let Some(p) = get(id) else { return };
    if p.state.load(Ordering::Relaxed) & ON != 0 {
        return;
    }
    if let Site::Sled(sled) = p.site {
        crate::prefetch::object(sled);
    }
    if p.meta.site != 0 {
        crate::prefetch::line_for_write(p.meta.site as *const u8);
    }
}

/// Number of probes published so far (ids `0..count()`).
pub fn count() -> u32 {
    PROBES.len()
}

/// Appends a probe built by `make` from its new id. Callers serialise
/// (discovery holds its lock), so ids are dense.
pub(crate) fn push(make: impl FnOnce(ProbeId) -> Probe) -> Option<&'static Probe> {
    PROBES.push_with(|n| make(ProbeId::new(n))).map(|(_, p)| p)
}

/// Every published probe.
pub fn iter() -> impl Iterator<Item = &'static Probe> {
    (0..count()).filter_map(|n| get(ProbeId::new(n)))
}
