//! A toggleable call site.

use crate::error::Error;
use crate::form::{off_bytes, region, Form, Mode, Trampoline, MAX_FORM_LEN};
use crate::trampoline;
use wordpatch::{make_writable, read_code, split, store_in_line};

/// One call site: its form, active bytes, and the precomputed inactive bytes
/// and store region of each mode, so a toggle is one `lock cmpxchg` (plus, at
/// a straddler, a check of the bytes outside the region).
#[derive(Clone, Debug)]
pub struct CallSite {
    addr: usize,
    form: Form,
    on: [u8; MAX_FORM_LEN],
    flip: Variant,
    paper: Option<Variant>,
}

#[derive(Clone, Copy, Debug)]
struct Variant {
    off: [u8; MAX_FORM_LEN],
    start: usize,
    len: usize,
}

impl CallSite {
    /// A site at `site` of `form` whose active operand is `operand` (rel32 or
    /// disp32). The site must hold the active form or an inactive form this
    /// crate writes. Makes its page writable and finds the paper-mode
    /// trampoline (1|4 split) up front, so toggles do neither.
    ///
    /// # Safety
    /// `site` is the start of an instruction of `form` (active or as this
    /// crate deactivates it) that the caller owns the toggling of: the
    /// inactive forms change what the instruction does (see [`Mode`]).
    pub unsafe fn new(site: *mut u8, form: Form, operand: i32) -> Result<Self, Error> {
        let addr = site as usize;
        make_writable(site, form.len())?;
        let on = form.on_bytes(operand);
        let variant = |off: [u8; MAX_FORM_LEN]| {
            let (start, len) = region(addr, form.len(), &on, &off);
            Variant { off, start, len }
        };
        let tramp: Option<Trampoline> = if split(addr, form.len()) == 1 {
            trampoline::near(addr, form.len())
        } else {
            None
        };
        let flip = variant(off_bytes(form, operand, addr, Mode::Flip, None).expect("flip needs no trampoline"));
        let paper = off_bytes(form, operand, addr, Mode::Paper, tramp).map(variant);
        let s = CallSite {
            addr,
            form,
            on,
            flip,
            paper,
        };
        let cur = s.current();
        if cur != s.on() && s.inactive_mode(&cur).is_none() {
            return Err(s.unexpected(&cur));
        }
        Ok(s)
    }

    /// A site from the active bytes at `site`, decoded.
    ///
    /// # Safety
    /// As for [`new`](Self::new).
    pub unsafe fn from_active(site: *mut u8) -> Result<Self, Error> {
        let mut b = [0u8; MAX_FORM_LEN];
        make_writable(site, MAX_FORM_LEN)?;
        // SAFETY: the range was just checked to be mapped.
        unsafe { read_code(site, &mut b) };
        let (form, op) = Form::decode(&b).ok_or(Error::UnknownForm {
            site: site as usize,
            found: b.to_vec(),
        })?;
        // SAFETY: forwarded contract.
        unsafe { Self::new(site, form, op) }
    }

    /// Address of the instruction.
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// The instruction's form.
    pub fn form(&self) -> Form {
        self.form
    }

    /// Bytes of the instruction in the front cache line when it straddles, else 0.
    pub fn split(&self) -> usize {
        split(self.addr, self.form.len())
    }

    /// The active bytes.
    pub fn on(&self) -> &[u8] {
        &self.on[..self.form.len()]
    }

    /// The inactive bytes in `mode`; `None` for paper mode when no trampoline
    /// could be placed (1|4 split only).
    pub fn off(&self, mode: Mode) -> Option<&[u8]> {
        self.variant(mode).map(|v| &v.off[..self.form.len()])
    }

    fn variant(&self, mode: Mode) -> Option<&Variant> {
        match mode {
            Mode::Flip => Some(&self.flip),
            Mode::Paper => self.paper.as_ref(),
        }
    }

    /// The bytes at the site now (one load per byte: a snapshot for checks).
    pub fn current(&self) -> Vec<u8> {
        let mut b = vec![0u8; self.form.len()];
        // SAFETY: the site's pages were checked mapped in `new`.
        unsafe { read_code(self.addr as *const u8, &mut b) };
        b
    }

    /// True when the site holds its active form.
    pub fn is_active(&self) -> bool {
        self.current() == self.on()
    }

    fn inactive_mode(&self, cur: &[u8]) -> Option<Mode> {
        [Mode::Flip, Mode::Paper]
            .into_iter()
            .find(|&m| self.off(m) == Some(cur))
    }

    fn unexpected(&self, cur: &[u8]) -> Error {
        Error::Unexpected {
            site: self.addr,
            form: self.form,
            found: cur.to_vec(),
            on: self.on().to_vec(),
        }
    }

    /// Bytes outside `v`'s region, which no toggle changes, must hold the
    /// active form's bytes.
    fn rest_intact(&self, v: &Variant) -> bool {
        if v.len == self.form.len() {
            return true;
        }
        (0..self.form.len())
            .filter(|&i| i < v.start || i >= v.start + v.len)
            .all(|i| {
                let mut b = [0u8; 1];
                // SAFETY: mapped, see `current`.
                unsafe { read_code((self.addr + i) as *const u8, &mut b) };
                b[0] == self.on[i]
            })
    }

    /// One expected-value store of `v`'s region: `to_off` picks the direction.
    fn store(&self, v: &Variant, to_off: bool) -> bool {
        let r = v.start..v.start + v.len;
        let (new, old) = if to_off {
            (&v.off[r.clone()], &self.on[r])
        } else {
            (&self.on[r.clone()], &v.off[r])
        };
        // SAFETY: the region lies in one line (form::region, tested for every
        // split), the page is writable (`new`), and both states are valid
        // code with the same boundaries for the threads executing the site.
        unsafe { store_in_line((self.addr + v.start) as *mut u8, new, Some(old)).is_ok() }
    }

    /// Switches the site off in `mode`. A site already off in `mode` is left
    /// as it is; a site in any other state is refused.
    pub fn deactivate(&self, mode: Mode) -> Result<(), Error> {
        let v = self.variant(mode).ok_or(Error::NoTrampoline { site: self.addr })?;
        if self.rest_intact(v) && self.store(v, true) {
            return Ok(());
        }
        let cur = self.current();
        if cur == self.off(mode).unwrap_or_default() {
            Ok(())
        } else {
            Err(self.unexpected(&cur))
        }
    }

    /// Switches the site on, from whichever inactive form it holds (the mode
    /// it was switched off in is tried first). A site already on is left as it is.
    pub fn activate(&self) -> Result<(), Error> {
        let first = crate::default_mode();
        for mode in [first, first.other()] {
            if let Some(v) = self.variant(mode) {
                if self.rest_intact(v) && self.store(v, false) {
                    return Ok(());
                }
            }
        }
        let cur = self.current();
        if cur == self.on() {
            Ok(())
        } else {
            Err(self.unexpected(&cur))
        }
    }
}

impl Mode {
    fn other(self) -> Mode {
        match self {
            Mode::Paper => Mode::Flip,
            Mode::Flip => Mode::Paper,
        }
    }
}
