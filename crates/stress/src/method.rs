//! The methods a stress trial toggles a site with: the patching layers'
//! protocols, each with its wait, and a negative control. The runtime's
//! `fastinst::Strategy` picks among the same protocols with the process's
//! default wait (`flip` is [`Method::CallFlip`], `paper`
//! [`Method::CallPaper`], `word-sync` and `word-async` are
//! [`Method::WordSync`] and [`Method::WordAsync`]); the stress harness
//! needs the wait spelled out and the control, so it has its own type.

use crate::fixture::{Fixture, NOP5, REL_A, REL_B};
use callpatch::{CallSite, Form, Mode};
use std::fmt;
use std::str::FromStr;
use wordpatch::{patch_with, start_patch, store_in_line, PatchOptions, Progress, Wait};

/// A toggle method under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// wordpatch synchronous `patch`, `call` <-> 5-byte NOP, with this wait.
    WordSync(Wait),
    /// wordpatch `start_patch` + `finish_patch` polling, with this wait.
    WordAsync(Wait),
    /// Negative control: a straddler written as two plain stores, back part
    /// then front part, with no INT3 lock and no wait. Must fail.
    WordNaive,
    /// Negative control for every callpatch form: the whole instruction
    /// rewritten between its active bytes and a short jump over INT3 filler
    /// (they differ in every byte; callpatch's own inactive bytes differ on
    /// one side of the line only, which is how it needs no wait) as two
    /// plain stores, back part then front part. Must fail at every straddle
    /// split.
    CallNaive,
    /// callpatch, paper mode.
    CallPaper,
    /// callpatch, flip mode.
    CallFlip,
    /// A `call rel32`'s operand swapped between two targets with one
    /// in-line store (the runtime's counting stubs, `fastinst`'s
    /// `callcount`): only where the operand lies in one line (splits 0 and
    /// 1).
    CallRetarget,
    /// Negative control for [`Method::CallRetarget`]: the call to the
    /// other target written as two plain stores, back part then front
    /// part, where the operand crosses a line. Must fail.
    CallRetargetNaive,
}

impl Method {
    /// Whether the strategy toggles call sites of `form` (wordpatch
    /// strategies toggle `call rel32` against a NOP).
    pub fn supports(self, form: Form) -> bool {
        matches!(self, Method::CallPaper | Method::CallFlip | Method::CallNaive) || form == Form::CallRel32
    }

    /// Whether the strategy toggles a site `split` bytes before a line's
    /// end: a retarget needs the operand inside one line.
    pub fn supports_split(self, split: usize) -> bool {
        self != Method::CallRetarget || split <= 1
    }

    /// Whether the strategy toggles through a callpatch call site (no waits
    /// at any split; the control writes its bytes its own way).
    pub fn is_callpatch(self) -> bool {
        matches!(self, Method::CallPaper | Method::CallFlip | Method::CallNaive)
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Method::WordSync(Wait::Tmax(t)) => write!(f, "word-tmax:{t}"),
            Method::WordSync(Wait::SyncCore) => write!(f, "word-synccore"),
            Method::WordAsync(Wait::Tmax(t)) => write!(f, "word-async:{t}"),
            Method::WordAsync(Wait::SyncCore) => write!(f, "word-async-synccore"),
            Method::WordNaive => write!(f, "word-naive"),
            Method::CallNaive => write!(f, "call-naive"),
            Method::CallPaper => write!(f, "call-paper"),
            Method::CallFlip => write!(f, "call-flip"),
            Method::CallRetarget => write!(f, "call-retarget"),
            Method::CallRetargetNaive => write!(f, "call-retarget-naive"),
        }
    }
}

impl FromStr for Method {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (name, arg) = match s.split_once(':') {
            Some((n, a)) => (n, Some(a.parse::<u64>().map_err(|_| format!("bad ticks in `{s}`"))?)),
            None => (s, None),
        };
        let tmax = || Wait::Tmax(arg.unwrap_or_else(wordpatch::default_tmax));
        Ok(match name {
            "word-tmax" => Method::WordSync(tmax()),
            "word-synccore" => Method::WordSync(Wait::SyncCore),
            "word-async" => Method::WordAsync(tmax()),
            "word-async-synccore" => Method::WordAsync(Wait::SyncCore),
            "word-naive" => Method::WordNaive,
            "call-naive" => Method::CallNaive,
            "call-paper" => Method::CallPaper,
            "call-flip" => Method::CallFlip,
            "call-retarget" => Method::CallRetarget,
            "call-retarget-naive" => Method::CallRetargetNaive,
            _ => {
                return Err(format!(
                    "unknown strategy `{s}` (word-tmax[:T], word-synccore, word-async[:T], word-async-synccore, \
                     word-naive, call-paper, call-flip, call-naive, call-retarget, call-retarget-naive)"
                ))
            }
        })
    }
}

/// Toggles one fixture's site with one strategy.
pub struct Toggler {
    strategy: Method,
    site: *mut u8,
    on: Vec<u8>,
    call: Option<CallSite>,
}

impl Toggler {
    /// Prepares `strategy` on the fixture's site (makes its page writable,
    /// places a trampoline if paper mode needs one).
    pub fn new(fx: &Fixture, strategy: Method) -> Result<Toggler, String> {
        if !strategy.supports(fx.form) {
            return Err(format!("{strategy} does not toggle {:?} sites", fx.form));
        }
        let call = match strategy {
            Method::CallPaper | Method::CallFlip | Method::CallNaive => {
                // SAFETY: the fixture's site is a call of this form to `A`,
                // which follows the C ABI, and this toggler owns its
                // toggling.
                Some(unsafe { CallSite::new(fx.site, fx.form, fx.operand) }.map_err(|e| e.to_string())?)
            }
            _ => {
                wordpatch::make_writable(fx.site, fx.form.len()).map_err(|e| e.to_string())?;
                None
            }
        };
        Ok(Toggler {
            strategy,
            site: fx.site,
            on: fx.on_bytes(),
            call,
        })
    }

    /// Leaves the site active, whichever state it is in now.
    pub fn ensure_on(&self) -> Result<(), String> {
        let mut cur = vec![0u8; self.on.len()];
        // SAFETY: the fixture's site is mapped (checked when preparing).
        unsafe { wordpatch::read_code(self.site, &mut cur) };
        if cur == self.on {
            Ok(())
        } else {
            self.set(true)
        }
    }

    /// Switches the site on or off; an error means the site was not in the
    /// state the previous toggle left it in.
    pub fn set(&self, on: bool) -> Result<(), String> {
        let (new, old): (&[u8], &[u8]) = if on { (&self.on, &NOP5) } else { (&NOP5, &self.on) };
        match self.strategy {
            Method::CallPaper | Method::CallFlip => {
                let call = self.call.as_ref().expect("call site prepared");
                let r = if on {
                    call.activate()
                } else {
                    call.deactivate(if self.strategy == Method::CallPaper {
                        Mode::Paper
                    } else {
                        Mode::Flip
                    })
                };
                r.map_err(|e| e.to_string())
            }
            Method::WordSync(wait) => {
                let o = PatchOptions {
                    expected: Some(old),
                    wait: Some(wait),
                };
                // SAFETY: the site holds `old` (checked atomically by the
                // expected bytes) and both states are valid code with the same
                // boundaries for the executors.
                unsafe { patch_with(self.site, new, &o) }.map_err(|e| e.to_string())
            }
            Method::WordAsync(wait) => {
                let o = PatchOptions {
                    expected: Some(old),
                    wait: Some(wait),
                };
                // SAFETY: as for the synchronous strategy.
                let started = unsafe { start_patch(self.site, new, &o) }.map_err(|e| e.to_string())?;
                if started == Progress::InFlight {
                    while wordpatch::finish_patch(self.site) == Progress::InFlight {
                        core::hint::spin_loop();
                    }
                }
                Ok(())
            }
            Method::WordNaive => naive_store(self.site, new),
            Method::CallRetarget | Method::CallRetargetNaive => self.retarget(on),
            Method::CallNaive => {
                let call = self.call.as_ref().expect("call site prepared");
                let active = call.on();
                if on {
                    naive_store(self.site, active)
                } else {
                    naive_store(self.site, &jump_over(active.len())[..active.len()])
                }
            }
        }
    }
}

impl Toggler {
    /// Calls `A` (on) or `B` (off) from the `call rel32` site: its
    /// operand alone in one in-line store, or (the control) the whole
    /// call in two plain stores.
    fn retarget(&self, on: bool) -> Result<(), String> {
        let (new, old) = if on { (REL_A, REL_B) } else { (REL_B, REL_A) };
        if self.strategy == Method::CallRetargetNaive {
            let mut call = [0xE8, 0, 0, 0, 0];
            call[1..].copy_from_slice(&new.to_le_bytes());
            return naive_store(self.site, &call);
        }
        // SAFETY: the operand lies in one line (`supports_split`), the
        // page was made writable, and both calls reach valid code.
        unsafe { store_in_line(self.site.wrapping_add(1), &new.to_le_bytes(), Some(&old.to_le_bytes())) }
            .map(|_| ())
            .map_err(|m| format!("operand was {:02x?}", &m.found[..4]))
    }
}

/// The control's inactive instruction of `len` bytes: a short jump over
/// the rest, which is INT3. It differs from every form's active bytes in
/// every byte, so on the way off each torn mixture (the active front with
/// the filler's back) is a call or jump whose operand's high bytes are
/// `CC`, far outside the fixture: a crash at every split.
fn jump_over(len: usize) -> [u8; 8] {
    let mut b = [0xCC; 8];
    b[0] = 0xEB;
    b[1] = (len - 2) as u8;
    b
}

/// Writes `new` at `site` as two plain stores where it straddles a line,
/// back part then front part: no lock and no wait, so an executor can run
/// the front of one instruction with the back of the other.
fn naive_store(site: *mut u8, new: &[u8]) -> Result<(), String> {
    let addr = site as usize;
    let s = wordpatch::split(addr, new.len());
    if s == 0 {
        // SAFETY: each store stays inside one line of the fixture's
        // writable page. Tearing the straddler is this control's point.
        unsafe { store_in_line(site, new, None) }.map_err(|_| "store".to_string())?;
    } else {
        // SAFETY: as above.
        unsafe {
            store_in_line((addr + s) as *mut u8, &new[s..], None).map_err(|_| "store".to_string())?;
            store_in_line(site, &new[..s], None).map_err(|_| "store".to_string())?;
        }
    }
    Ok(())
}
