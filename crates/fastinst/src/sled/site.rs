//! One function's sled: the site its entry and exit probes share, and how
//! it is switched.
//!
//! The sled's code is on while either probe is on: the entry trampoline
//! runs the entry probe's handler if it has one and substitutes the return
//! address if the exit probe is on. A tool may instead make the exit probe
//! follow the entry (`toggle::follow_entry`): the code is then on only while the
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

use super::counter::Counter;
use crate::code::ON;
use crate::error::{Error, Result};
use crate::probe::{ProbeId, Strategy};
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
    /// The code follows the entry probe alone (`toggle::follow_entry`).
    pub follows_entry: AtomicBool,
    /// Its stub's counter, if its stub counts (`super::counter`).
    pub counter: Option<&'static Counter>,
    lock: AtomicBool,
}

pub(crate) struct Guard<'a>(&'a AtomicBool);

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl Sled {
    pub(crate) fn new(entry: ProbeId, off: [u8; SLED_LEN], call: CallSite, counter: Option<&'static Counter>) -> Sled {
        Sled {
            entry,
            off,
            call,
            code: AtomicU8::new(Strategy::WordSync as u8),
            follows_entry: AtomicBool::new(false),
            counter,
            lock: AtomicBool::new(false),
        }
    }

    /// For an attach after a detach: the process's code was put back to
    /// its files' bytes at the detach, and the attach normalised it again,
    /// so a sled holds `off` again, the state it started in, whatever form
    /// switched it off last. Records that; false, and nothing changed, if
    /// it holds anything else.
    pub(crate) fn restored(&self) -> bool {
        let _g = self.lock();
        if self.call.current() != self.off {
            return false;
        }
        self.code.store(Strategy::WordSync as u8, Ordering::Relaxed);
        true
    }

    pub(crate) fn lock(&self) -> Guard<'_> {
        crate::spin::acquire(&self.lock);
        Guard(&self.lock)
    }

    fn word(&self, id: ProbeId, new: &[u8], old: &[u8], async_: bool) -> Result<()> {
        // SAFETY: the sled is one 5-byte instruction this runtime owns
        // (normalised at registration; the sled lock is held); `old` and
        // `new` are its NOP and the call to its stub.
        unsafe { crate::code::word_store(id, self.call.addr() as *mut u8, new, old, async_) }
    }

    pub(crate) fn switch_on(&self, id: ProbeId, code: u8) -> Result<()> {
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

    pub(crate) fn switch_off(&self, id: ProbeId) -> Result<()> {
        let s = match crate::code::strategy() {
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
