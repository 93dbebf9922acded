//! Switching one probe's code on and off with the chosen strategy.

use crate::error::{Error, Result};
use crate::probe::{ProbeId, Strategy};
use crate::registry::{Probe, ON};
use callpatch::{CallSite, Mode};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;
use wordpatch::{PatchOptions, Progress};

static STRATEGY: AtomicU8 = AtomicU8::new(Strategy::Flip as u8);

/// The strategy new deactivations use.
pub fn strategy() -> Strategy {
    Strategy::from_u8(STRATEGY.load(Ordering::Relaxed))
}

/// Sets the strategy new deactivations use. A probe that is off is switched
/// back on with the inverse of the strategy that switched it off, so the
/// strategy can change at any time.
pub fn set_strategy(s: Strategy) {
    if s == Strategy::WordAsync {
        finisher();
    }
    STRATEGY.store(s as u8, Ordering::Relaxed);
}

fn finisher() {
    static F: OnceLock<Option<wordpatch::Finisher>> = OnceLock::new();
    F.get_or_init(|| match wordpatch::Finisher::spawn() {
        Ok(f) => Some(f),
        Err(e) => {
            crate::log::warn(format_args!(
                "no finisher thread ({e}): async patches finish at the next toggle or when a thread reaches them"
            ));
            None
        }
    });
}

/// The inactive bytes of the wordpatch strategies: the whole call becomes a
/// NOP of its length; a tail jump becomes `ret`.
fn word_off(site: &CallSite) -> [u8; 8] {
    let on = site.on();
    let mut b = [0u8; 8];
    b[..on.len()].copy_from_slice(on);
    if site.form().is_tail() {
        b[0] = 0xC3;
    } else if on.len() == 5 {
        b[..5].copy_from_slice(&[0x0F, 0x1F, 0x44, 0x00, 0x00]);
    } else {
        b[..6].copy_from_slice(&[0x66, 0x0F, 0x1F, 0x44, 0x00, 0x00]);
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

/// Rewrites the instruction at `at` from `old` to `new` with wordpatch,
/// synchronously or (`async_`) leaving a straddler to finish later, after
/// any earlier async patch of the same site has finished.
///
/// # Safety
/// `old` and `new` are whole, valid instructions of the same length at
/// `at`, whose toggling the caller owns (it holds the lock that serialises
/// it).
pub(crate) unsafe fn word_store(id: ProbeId, at: *mut u8, new: &[u8], old: &[u8], async_: bool) -> Result<()> {
    let opts = PatchOptions {
        expected: Some(old),
        wait: None,
    };
    // A previous async patch of this site may still be in flight.
    while wordpatch::finish_patch(at) == Progress::InFlight {
        std::hint::spin_loop();
    }
    // SAFETY: forwarded contract.
    let r = unsafe {
        if async_ {
            wordpatch::start_patch(at, new, &opts).map(|_| ())
        } else {
            wordpatch::patch_with(at, new, &opts)
        }
    };
    r.map_err(|source| Error::WordPatch { id, source })
}

/// Switches `p`'s code on or off. The caller holds the probe lock.
/// Whether switching `p` on would take a word patch: its code is off in a
/// form a word strategy wrote (or, for a sled, the sled's code is). The
/// profiler's raw sampler, which must not enter libc, leaves those alone
/// (a word patch may wait with a system call through libc).
pub(crate) fn activation_needs_word_patch(p: &Probe) -> bool {
    let code = match p.sled {
        Some(sled) => sled.code.load(Ordering::Relaxed),
        None if p.site.is_none() => return false,
        None => p.state.load(Ordering::Relaxed),
    };
    code & ON == 0 && matches!(Strategy::from_u8(code & !ON), Strategy::WordSync | Strategy::WordAsync)
}

pub(crate) fn set_code(p: &Probe, on: bool) -> Result<()> {
    if let Some(sled) = p.sled {
        return crate::sled::set_code(p, sled, on);
    }
    let id = p.meta.id;
    if p.unloaded.load(Ordering::Acquire) {
        return Err(Error::Unloaded(id));
    }
    let st = p.state.load(Ordering::Relaxed);
    if (st & ON != 0) == on {
        return Ok(());
    }
    let Some(site) = &p.site else {
        // Unrecognised: never patched; the handler alone decides.
        p.state.store(if on { ON } else { 0 }, Ordering::Relaxed);
        return Ok(());
    };
    let len = site.on().len();
    let cp = |r: std::result::Result<(), callpatch::Error>| r.map_err(|source| Error::Patch { id, source });
    let new_state = if on {
        match Strategy::from_u8(st & !ON) {
            Strategy::Flip | Strategy::Paper => cp(site.activate())?,
            s @ (Strategy::WordSync | Strategy::WordAsync) => {
                word_patch(p, site, site.on(), &word_off(site)[..len], s == Strategy::WordAsync)?
            }
        }
        ON
    } else {
        let s = strategy();
        match s {
            Strategy::Flip => cp(site.deactivate(Mode::Flip))?,
            Strategy::Paper => cp(site.deactivate(Mode::Paper))?,
            Strategy::WordSync | Strategy::WordAsync => {
                word_patch(p, site, &word_off(site)[..len], site.on(), s == Strategy::WordAsync)?
            }
        }
        s as u8
    };
    p.state.store(new_state, Ordering::Relaxed);
    Ok(())
}
