//! Switching one probe's code on and off with the chosen strategy.

use crate::code::{strategy, word_store, ON};
use crate::error::{Error, Result};
use crate::probe::ProbeKind;
use crate::probe::{ProbeId, Strategy};
use crate::registry::{self, Probe, Site};
use crate::sled::site::Sled;
use callpatch::{CallSite, Mode};
use std::sync::atomic::Ordering;

/// The inactive bytes of the wordpatch strategies: the whole call becomes a
/// NOP of its length; a tail jump becomes `ret`.
fn word_off(site: &CallSite) -> [u8; 8] {
    let on = site.on();
    let mut b = [0u8; 8];
    b[..on.len()].copy_from_slice(on);
    if site.form().is_tail() {
        b[0] = 0xC3;
    } else {
        b[..on.len()].copy_from_slice(wordpatch::nop(on.len()));
    }
    b
}

fn word_patch(p: &Probe, site: &CallSite, new: &[u8], old: &[u8], async_: bool) -> Result<()> {
    // SAFETY: the site is a whole call/jmp instruction the runtime owns the
    // toggling of (the probe lock is held); `old` and `new` are both valid
    // instructions of the same length there (the call and its NOP or `ret`
    // form), and the hook call's callee follows the ABI.
    unsafe { word_store(p.meta.id, site.addr() as *mut u8, new, old, async_) }
}

/// Switches `p`'s code on or off. The caller holds the probe lock.
/// Whether switching `p` on would take a word patch: its code is off in a
/// form a word strategy wrote (or, for a sled, the sled's code is). The
/// profiler's raw sampler, which must not enter libc, leaves those alone
/// (a word patch may wait with a system call through libc).
pub(crate) fn activation_needs_word_patch(p: &Probe) -> bool {
    let code = match p.site {
        Site::Sled(sled) => sled.code.load(Ordering::Relaxed),
        Site::Unrecognised => return false,
        Site::Call(..) => p.state.load(Ordering::Relaxed),
    };
    code & ON == 0 && matches!(Strategy::from_u8(code & !ON), Strategy::WordSync | Strategy::WordAsync)
}

pub(crate) fn set_code(p: &Probe, on: bool) -> Result<()> {
    let site = match &p.site {
        Site::Sled(sled) => return set_sled_code(p, sled, on),
        Site::Call(site, _) => Some(site),
        Site::Unrecognised => None,
    };
    let id = p.meta.id;
    if p.unloaded.load(Ordering::Acquire) {
        return Err(Error::Unloaded(id));
    }
    let st = p.state.load(Ordering::Relaxed);
    if (st & ON != 0) == on {
        return Ok(());
    }
    let Some(site) = site else {
        // Unrecognised: never patched; the handler alone decides.
        p.state.store(if on { ON } else { 0 }, Ordering::Relaxed);
        return Ok(());
    };
    let cp = |r: std::result::Result<(), callpatch::Error>| r.map_err(|source| Error::Patch { id, source });
    let new_state = if on {
        match Strategy::from_u8(st & !ON) {
            Strategy::Flip | Strategy::Paper => cp(site.activate())?,
            s @ (Strategy::WordSync | Strategy::WordAsync) => word_toggle(p, site, true, s)?,
        }
        ON
    } else {
        let s = strategy();
        match s {
            Strategy::Flip => cp(site.deactivate(Mode::Flip))?,
            Strategy::Paper => cp(site.deactivate(Mode::Paper))?,
            Strategy::WordSync | Strategy::WordAsync => word_toggle(p, site, false, s)?,
        }
        s as u8
    };
    p.state.store(new_state, Ordering::Relaxed);
    Ok(())
}

/// The word strategies' toggle of call site `site`, kept out of
/// [`set_code`] so that the callpatch strategies' path carries none of its
/// frame.
#[inline(never)]
fn word_toggle(p: &Probe, site: &CallSite, on: bool, s: Strategy) -> Result<()> {
    let len = site.on().len();
    let off = word_off(site);
    let (new, old) = if on {
        (site.on(), &off[..len])
    } else {
        (&off[..len], site.on())
    };
    word_patch(p, site, new, old, s == Strategy::WordAsync)
}

/// For an attach after a detach, before any probe is switched: the detach
/// put every probed byte of code back to its file's, and the attach
/// normalised the sleds again, so each probe's recorded state is made its
/// code's again. A sled holds its starting NOP ([`Sled::restored`]); a
/// `-finstrument-functions` call site holds its call, on, as the compiler
/// emitted it. Returns the sites that hold neither (left as recorded;
/// switching them fails with the bytes found).
pub(crate) fn resync_after_restore() -> usize {
    let mut differing = 0;
    for p in registry::iter() {
        let _g = p.lock();
        let restored = match &p.site {
            Site::Sled(sled) if matches!(p.meta.kind, ProbeKind::Entry | ProbeKind::Point) => sled.restored(),
            Site::Sled(_) | Site::Unrecognised => true,
            Site::Call(site, counted) => {
                // The file's call reaches the hook: its stub again first.
                if let Some(c) = counted {
                    crate::callcount::reapply(site, c);
                }
                let on = site.current() == site.on();
                if on {
                    p.state.store(ON, Ordering::Relaxed);
                }
                on
            }
        };
        differing += usize::from(!restored);
    }
    differing
}

/// Switches sled probe `p` on or off; the sled's code follows "either probe
/// on". The caller holds `p`'s lock. Not inlined, like [`word_toggle`]:
/// its frame would be every call site's toggle's.
#[inline(never)]
fn set_sled_code(p: &Probe, sled: &Sled, on: bool) -> Result<()> {
    let id = p.meta.id;
    if p.unloaded.load(Ordering::Acquire) {
        return Err(Error::Unloaded(id));
    }
    let _g = sled.lock();
    let partner = match p.meta.kind {
        ProbeKind::Entry => Some(sled.entry.next()),
        ProbeKind::Exit => Some(sled.entry),
        // A point's sled is its own.
        ProbeKind::Point => None,
    };
    let partner_on = partner
        .and_then(registry::get)
        .is_some_and(|q| q.state.load(Ordering::Relaxed) & ON != 0);
    let want = match (sled.follows_entry.load(Ordering::Relaxed), p.meta.kind) {
        (false, _) | (true, ProbeKind::Point) => on || partner_on,
        (true, ProbeKind::Entry) => on,
        (true, ProbeKind::Exit) => partner_on,
    };
    let code = sled.code.load(Ordering::Relaxed);
    if (code & ON != 0) != want {
        if want {
            sled.switch_on(id, code)?;
        } else {
            sled.switch_off(id)?;
        }
    }
    p.state.store(if on { ON } else { 0 }, Ordering::Relaxed);
    Ok(())
}

/// Makes sled exit probe `exit` follow its entry probe (see the module
/// doc): from now on the sled's code is on only while the entry probe is,
/// so the exit probe, while on, sees the returns of exactly the calls that
/// entered while the entry probe was on. Returns whether `exit` is a sled
/// exit probe.
///
/// The latency profiler's exit probes are its consumers: once a function's
/// window closes its entry probe goes off, and until then the
/// exit probe had to keep the code on for its sampled calls still in
/// flight, so every further call of the function went through both
/// trampolines and the exit handler only to be dropped as unmatched
/// (QuickJS: ~12,000 a run, its recursive interpreter's sampled calls
/// outlasting whole windows).
pub(crate) fn follow_entry(exit: ProbeId) -> bool {
    let Some(p) = registry::get(exit) else { return false };
    let (Site::Sled(sled), ProbeKind::Exit) = (&p.site, p.meta.kind) else {
        return false;
    };
    let _p = p.lock();
    let _s = sled.lock();
    sled.follows_entry.store(true, Ordering::Relaxed);
    let entry_on = registry::get(sled.entry).is_some_and(|q| q.state.load(Ordering::Relaxed) & ON != 0);
    if !entry_on && sled.code.load(Ordering::Relaxed) & ON != 0 {
        // On for the exit alone until now.
        if let Err(e) = sled.switch_off(exit) {
            crate::log::warn(format_args!("sled of probe {exit}: {e}"));
        }
    }
    true
}
