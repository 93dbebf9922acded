//! One function's sled: the site its entry and exit probes share, and how
//! it is switched.
//!
//! The sled's code is on while either probe is on: the entry trampoline
//! runs the entry probe's handler if it has one and substitutes the return
//! address if the exit probe is on. A tool may instead make the exit probe
//! follow the entry ([`follow_entry`]): the code is then on only while the
//! entry probe is, and the exit probe, while on, sees the returns of the
//! calls that entered then (their return addresses were substituted on
//! entry), however long after, and of no others. Each probe's own state is
//! its `ON` bit;
//! the code's state lives here, under the sled's own lock (taken after the
//! probe's lock), so the two probes of a function can be toggled from
//! different threads.
//!
//! Forms: on is `call rel32` to the function's stub. Off is, by strategy:
//! - `flip` and `paper`: callpatch in paper mode (a NOP, a short jump over
//!   the rest at the 2|3, 3|2 and 4|1 splits, a call to a `ret` at the 1|4
//!   split). Flipping the opcode to a `mov eax` is never used here: at a
//!   function entry `eax` may carry the vector count of a varargs call.
//!   Where no `ret` trampoline can be placed, `word-sync` is used instead.
//! - `word-sync`, `word-async`: wordpatch back to the sled's NOP (the INT3
//!   protocol when the sled straddles a line), which is also the state
//!   every sled starts in.

use crate::error::{Error, Result};
use crate::probe::{ProbeId, ProbeKind, Strategy};
use crate::registry::{self, Probe, ON};
use callpatch::{CallSite, Mode};
use providers::patchable::SLED_LEN;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

/// A function's sled.
pub(crate) struct Sled {
    /// The entry probe's id; the exit probe's is the next.
    pub entry: ProbeId,
    /// The inactive bytes the sled started as.
    pub off: [u8; SLED_LEN],
    /// The callpatch view: `call rel32` to the stub.
    pub call: CallSite,
    /// `ON`, or the strategy that switched the code off.
    pub code: AtomicU8,
    /// The code follows the entry probe alone ([`follow_entry`]).
    follows_entry: AtomicBool,
    lock: AtomicBool,
}

struct Guard<'a>(&'a AtomicBool);

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl Sled {
    pub(crate) fn new(entry: ProbeId, off: [u8; SLED_LEN], call: CallSite) -> Sled {
        Sled {
            entry,
            off,
            call,
            code: AtomicU8::new(Strategy::WordSync as u8),
            follows_entry: AtomicBool::new(false),
            lock: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> Guard<'_> {
        crate::spin::acquire(&self.lock);
        Guard(&self.lock)
    }

    fn word(&self, id: ProbeId, new: &[u8], old: &[u8], async_: bool) -> Result<()> {
        // SAFETY: the sled is one 5-byte instruction this runtime owns
        // (normalised at registration; the sled lock is held); `old` and
        // `new` are its NOP and the call to its stub.
        unsafe { crate::toggle::word_store(id, self.call.addr() as *mut u8, new, old, async_) }
    }

    fn switch_on(&self, id: ProbeId, code: u8) -> Result<()> {
        match Strategy::from_u8(code) {
            Strategy::Flip | Strategy::Paper => {
                self.call.activate().map_err(|source| Error::Patch { id, source })?;
            }
            s @ (Strategy::WordSync | Strategy::WordAsync) => {
                self.word(id, self.call.on(), &self.off, s == Strategy::WordAsync)?;
            }
        }
        self.code.store(ON, Ordering::Relaxed);
        Ok(())
    }

    fn switch_off(&self, id: ProbeId) -> Result<()> {
        let s = match crate::strategy() {
            Strategy::Flip | Strategy::Paper => match self.call.deactivate(Mode::Paper) {
                Ok(()) => Strategy::Paper,
                Err(callpatch::Error::NoTrampoline { .. }) => {
                    self.word(id, &self.off, self.call.on(), false)?;
                    Strategy::WordSync
                }
                Err(source) => return Err(Error::Patch { id, source }),
            },
            s @ (Strategy::WordSync | Strategy::WordAsync) => {
                self.word(id, &self.off, self.call.on(), s == Strategy::WordAsync)?;
                s
            }
        };
        self.code.store(s as u8, Ordering::Relaxed);
        Ok(())
    }
}

/// Switches sled probe `p` on or off; the sled's code follows "either probe
/// on". The caller holds `p`'s lock.
pub(crate) fn set_code(p: &Probe, sled: &Sled, on: bool) -> Result<()> {
    let id = p.meta.id;
    if p.unloaded.load(Ordering::Acquire) {
        return Err(Error::Unloaded(id));
    }
    let _g = sled.lock();
    let partner = if p.meta.kind == ProbeKind::Entry {
        sled.entry + 1
    } else {
        sled.entry
    };
    let partner_on = registry::get(partner).is_some_and(|q| q.state.load(Ordering::Relaxed) & ON != 0);
    let want = match (sled.follows_entry.load(Ordering::Relaxed), p.meta.kind) {
        (false, _) => on || partner_on,
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
/// sample quota is filled its entry probe goes off, and until then the
/// exit probe had to keep the code on for its sampled calls still in
/// flight, so every further call of the function went through both
/// trampolines and the exit handler only to be dropped as unmatched
/// (QuickJS: ~12,000 a run, its recursive interpreter's sampled calls
/// outlasting whole windows).
pub(crate) fn follow_entry(exit: ProbeId) -> bool {
    let Some(p) = registry::get(exit) else { return false };
    let (Some(sled), ProbeKind::Exit) = (p.sled, p.meta.kind) else {
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
