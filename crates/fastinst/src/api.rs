//! The Rust API.

use crate::code::ON;
use crate::discovery::{with_state, Callback, DiscoveryGuard, MAX_CALLBACKS};
use crate::error::{Error, Result};
use crate::probe::{Handler, ProbeId, ProbeMeta};
use crate::registry::{self, Probe};
use crate::stats::{self, Stats};
use crate::toggle::set_code;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

fn probe(id: ProbeId) -> Result<&'static Probe> {
    registry::get(id).ok_or(Error::NoSuchProbe(id))
}

/// Registers `f` to be called with every probe's metadata: first, at once,
/// for every probe already discovered, then for each new probe when it is
/// discovered (from the thread whose hook call found it, with the
/// discovery lock held: `f` may activate and deactivate probes, but must not
/// register callbacks).
pub fn on_discovery(f: impl Fn(&ProbeMeta) + Send + Sync + 'static) -> Result<()> {
    register(Callback(Box::new(f)))
}

pub(crate) fn register(cb: Callback) -> Result<()> {
    if DiscoveryGuard::held() {
        return Err(Error::InvalidArgument(
            "callbacks cannot be registered from a discovery callback".into(),
        ));
    }
    with_state(|s| {
        if s.callbacks.len() >= MAX_CALLBACKS {
            return Err(Error::TooManyCallbacks(MAX_CALLBACKS));
        }
        let in_discovery = DiscoveryGuard::enter();
        for p in registry::iter() {
            cb.call(&p.meta());
        }
        drop(in_discovery);
        s.callbacks.push(cb);
        Ok(())
    })
}

/// The running tool's discovery (0: none), which [`listen`]'s one kept
/// callback hands each probe to.
static LISTENER: AtomicUsize = AtomicUsize::new(0);
/// Whether that callback is kept.
static LISTENING: AtomicBool = AtomicBool::new(false);

/// Shows the running tool, through `f`, every probe: those discovered so
/// far now, each later one at its discovery. The built-in tools share one
/// kept callback, which hands each probe to the tool listening then, so a
/// tool started again (an attach after a detach) is not registered twice
/// and one that stopped ([`unlisten`]) sees no probe.
pub(crate) fn listen(f: fn(&ProbeMeta)) -> Result<()> {
    LISTENER.store(f as usize, Ordering::Release);
    if LISTENING.load(Ordering::Acquire) {
        replay_discovery(f);
        return Ok(());
    }
    on_discovery(|m| {
        let f = LISTENER.load(Ordering::Acquire);
        if f != 0 {
            // SAFETY: non-zero words are stored from `fn(&ProbeMeta)`s only.
            let f = unsafe { std::mem::transmute::<usize, fn(&ProbeMeta)>(f) };
            f(m);
        }
    })?;
    LISTENING.store(true, Ordering::Release);
    Ok(())
}

/// No built-in tool sees probes from now (a detach).
pub(crate) fn unlisten() {
    LISTENER.store(0, Ordering::Release);
}

/// Calls `f` with every probe discovered so far, under the discovery lock,
/// as [`register`] does before it keeps a callback.
fn replay_discovery(f: fn(&ProbeMeta)) {
    with_state(|_| {
        let in_discovery = DiscoveryGuard::enter();
        for p in registry::iter() {
            f(&p.meta());
        }
        drop(in_discovery);
    });
}

/// Makes probe `id` call `handler`. If the probe's code is off it is
/// switched on with the inverse of the strategy that switched it off; if it
/// is on, this is one atomic store (switching between two handlers never
/// patches code).
pub fn activate(id: ProbeId, handler: Handler) -> Result<()> {
    let p = probe(id)?;
    let _g = p.lock();
    if p.unloaded.load(Ordering::Acquire) {
        return Err(Error::Unloaded(id));
    }
    p.handler.store(handler as usize, Ordering::Release);
    set_code(p, true)
}

/// Switches probe `id` off with the current [`strategy`](crate::strategy):
/// its site no longer calls the hook. An unrecognised site (see
/// [`ProbeMeta::form`]) is never patched; its calls are dropped instead.
///
/// After it returns the handler is not called for this probe again (a
/// thread that had already loaded the handler may still be running it).
pub fn deactivate(id: ProbeId) -> Result<()> {
    let p = probe(id)?;
    let _g = p.lock();
    set_code(p, false)?;
    p.handler.store(0, Ordering::Release);
    Ok(())
}

/// Whether probe `id`'s site calls the hook (and a handler, if set).
pub fn is_active(id: ProbeId) -> Result<bool> {
    Ok(probe(id)?.state.load(Ordering::Relaxed) & ON != 0)
}

/// The handler of probe `id`, if any.
pub fn handler(id: ProbeId) -> Result<Option<Handler>> {
    let h = probe(id)?.handler.load(Ordering::Acquire);
    // SAFETY: non-zero handler words are stored from `Handler`s only.
    Ok((h != 0).then(|| unsafe { std::mem::transmute::<usize, Handler>(h) }))
}

fn of_function(function: usize) -> impl Iterator<Item = &'static Probe> {
    registry::iter().filter(move |p| p.meta.function == function && !p.unloaded.load(Ordering::Relaxed))
}

/// Activates every discovered probe of the function at `function`; returns
/// how many. Probes of a function discovered later are not included.
pub fn activate_function(function: usize, handler: Handler) -> Result<usize> {
    let mut n = 0;
    for p in of_function(function) {
        activate(p.meta.id, handler)?;
        n += 1;
    }
    if n == 0 {
        return Err(Error::NoSuchFunction(function));
    }
    Ok(n)
}

/// Deactivates every discovered probe of the function at `function`;
/// returns how many.
pub fn deactivate_function(function: usize) -> Result<usize> {
    let mut n = 0;
    for p in of_function(function) {
        deactivate(p.meta.id)?;
        n += 1;
    }
    if n == 0 {
        return Err(Error::NoSuchFunction(function));
    }
    Ok(n)
}

/// The metadata of probe `id`.
pub fn probe_meta(id: ProbeId) -> Result<ProbeMeta> {
    Ok(probe(id)?.meta())
}

/// Number of probes discovered so far (ids are `0..probe_count()`).
pub fn probe_count() -> u32 {
    registry::count()
}

/// Metadata of every probe discovered so far.
pub fn probes() -> impl Iterator<Item = ProbeMeta> {
    registry::iter().map(|p| p.meta())
}

/// Hook calls that reached probe `id` while it was inactive: the call that
/// discovered it (if a discovery callback deactivated it), calls already
/// past the site when it was switched off, and every call of an
/// unrecognised site. For a patched site that stays off, this stops growing.
pub fn inactive_hits(id: ProbeId) -> Result<u64> {
    Ok(probe(id)?.inactive_hits.load(Ordering::Relaxed))
}

/// The runtime's counters now (C: `fastinst_get_stats`).
pub fn stats() -> Stats {
    let l = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let sled = crate::sled::stats();
    Stats {
        size: std::mem::size_of::<Stats>() as u64,
        probes: crate::registry::count() as u64,
        unrecognised: l(&stats::UNRECOGNISED),
        arg_rewritten: l(&stats::REWRITTEN),
        tail_ambiguous: l(&stats::TAIL_AMBIGUOUS),
        dropped_nested: l(&stats::DROPPED_NESTED),
        dropped_in_discovery: l(&stats::DROPPED_IN_DISCOVERY),
        discoveries: l(&stats::DISCOVERIES),
        discovery_ticks: l(&stats::DISCOVERY_TICKS),
        refused_full: l(&stats::FULL),
        modules_ticks: l(&stats::MODULES_TICKS),
        sled_load_ticks: l(&stats::SLED_LOAD_TICKS),
        sled_functions: sled.functions,
        sled_exits: sled.exits,
        sled_shadow_full: sled.shadow_full,
        sled_abandoned: sled.abandoned,
        sled_restored: sled.restored,
    }
}
