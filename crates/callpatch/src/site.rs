//! A toggleable call site.

use crate::error::Error;
use crate::form::{off_bytes, region, Form, Mode, Trampoline, MAX_FORM_LEN};
use crate::trampoline;
use wordpatch::{make_writable, read_code, read_code_u64, split, store_in_line, store_plain};

/// One call site: its form, active bytes, and the precomputed inactive bytes
/// and store region of each mode. A toggle reads the instruction (the form
/// check), then writes its region with one store: a plain store where the
/// region lies inside an aligned quadword (flip's one byte always does), else
/// one `lock cmpxchg` that re-checks the region at the instant of the store.
#[derive(Clone, Debug)]
pub struct CallSite {
    addr: usize,
    form: Form,
    on: [u8; MAX_FORM_LEN],
    /// `on`, packed: toggles compare whole instructions as integers.
    on_word: u64,
    flip: Variant,
    paper: Option<Variant>,
}

#[derive(Clone, Copy, Debug)]
struct Variant {
    off: [u8; MAX_FORM_LEN],
    off_word: u64,
    start: usize,
    len: usize,
}

fn pack(b: &[u8; MAX_FORM_LEN]) -> u64 {
    let mut w = [0u8; 8];
    w[..MAX_FORM_LEN].copy_from_slice(b);
    u64::from_le_bytes(w)
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
        // SAFETY: forwarded contract.
        let s = unsafe { Self::prepared(site, form, operand)? };
        let cur = s.current();
        if cur != s.on() && s.inactive_mode(&cur).is_none() {
            return Err(s.unexpected_now());
        }
        Ok(s)
    }

    /// As [`new`](Self::new), for a site that holds neither form yet: its
    /// owner will write the active form (or one this crate writes) by other
    /// means before toggling it here. Until then every toggle is refused as
    /// [`Error::Unexpected`], since each one checks the whole instruction.
    ///
    /// # Safety
    /// As for [`new`](Self::new), once the site holds one of the forms.
    pub unsafe fn prepared(site: *mut u8, form: Form, operand: i32) -> Result<Self, Error> {
        let addr = site as usize;
        make_writable(site, form.len())?;
        let on = form.on_bytes(operand);
        let variant = |off: [u8; MAX_FORM_LEN]| {
            let (start, len) = region(form.len(), &on, &off);
            Variant {
                off,
                off_word: pack(&off),
                start,
                len,
            }
        };
        let tramp: Option<Trampoline> = if split(addr, form.len()) == 1 {
            trampoline::near(addr, form.len())
        } else {
            None
        };
        let flip = variant(off_bytes(form, operand, addr, Mode::Flip, None).expect("flip needs no trampoline"));
        let paper = off_bytes(form, operand, addr, Mode::Paper, tramp).map(variant);
        Ok(CallSite {
            addr,
            form,
            on,
            on_word: pack(&on),
            flip,
            paper,
        })
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
            found: wordpatch::CodeBytes::new(&b),
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
    #[inline]
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

    /// The refusal for the bytes the site holds now. Reads them into a
    /// stack buffer: a refused toggle must not allocate.
    fn unexpected_now(&self) -> Error {
        let mut b = [0u8; MAX_FORM_LEN];
        let cur = &mut b[..self.form.len()];
        // SAFETY: the site's pages were checked mapped in `new`.
        unsafe { read_code(self.addr as *const u8, cur) };
        Error::Unexpected {
            site: self.addr,
            form: self.form,
            found: wordpatch::CodeBytes::new(cur),
            on: wordpatch::CodeBytes::new(self.on()),
        }
    }

    /// The instruction now, packed (one byte load per byte: a snapshot).
    #[inline]
    fn snapshot(&self) -> u64 {
        // SAFETY: the site's pages were checked mapped in `new`.
        unsafe { read_code_u64(self.addr as *const u8, self.form.len()) }
    }

    /// Rewrites `v`'s region from `from` to `to` if the instruction holds
    /// `from` now. One store; false if the site held something else.
    ///
    /// The check reads the whole instruction, so bytes outside the region are
    /// checked too. A plain store makes check and store two steps: threads
    /// that all toggle through callpatch still leave a valid state in every
    /// interleaving (each state is a whole valid instruction), but a foreign
    /// writer racing a toggle is not detected; the `cmpxchg` path re-checks
    /// the region atomically.
    #[inline]
    fn rewrite(&self, v: &Variant, from: u64, to: u64) -> bool {
        if self.snapshot() != from {
            return false;
        }
        let (to, from) = (to.to_le_bytes(), from.to_le_bytes());
        let r = v.start..v.start + v.len;
        let at = (self.addr + v.start) as *mut u8;
        // SAFETY: the region lies in one line (form tables, tested for every
        // split), the page is writable (`new`), the site holds `from` (checked
        // above) and both states are valid code with the same boundaries for
        // the threads executing the site.
        unsafe { store_plain(at, &to[r.clone()]) || store_in_line(at, &to[r.clone()], Some(&from[r])).is_ok() }
    }

    /// Switches the site off in `mode`. A site already off in `mode` is left
    /// as it is; a site in any other state is refused.
    pub fn deactivate(&self, mode: Mode) -> Result<(), Error> {
        let Some(v) = self.variant(mode) else {
            return Err(Error::NoTrampoline { site: self.addr });
        };
        if self.rewrite(v, self.on_word, v.off_word) || self.snapshot() == v.off_word {
            return Ok(());
        }
        Err(self.unexpected_now())
    }

    /// Switches the site on from whichever inactive form it holds. A site
    /// already on is left as it is; a site in any other state is refused.
    pub fn activate(&self) -> Result<(), Error> {
        let cur = self.snapshot();
        if cur == self.on_word {
            return Ok(());
        }
        for v in [Some(&self.flip), self.paper.as_ref()].into_iter().flatten() {
            if cur == v.off_word && self.rewrite(v, v.off_word, self.on_word) {
                return Ok(());
            }
        }
        if self.snapshot() == self.on_word {
            return Ok(());
        }
        Err(self.unexpected_now())
    }
}
