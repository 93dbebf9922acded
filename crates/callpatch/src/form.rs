//! The call-site forms, the toggle modes, and the bytes of each state.
//!
//! Pure logic: given a site's form, operand, address (for its straddle split)
//! and trampoline, compute the active bytes, the inactive bytes of each mode,
//! and the region the toggle rewrites. The invariant that makes every toggle a
//! single atomic store is that the region never crosses a cache line; the
//! tests below check it for every form, split and mode.

use wordpatch::{split, CACHE_LINE};

/// Longest form (call [rip+disp32]).
pub const MAX_FORM_LEN: usize = 6;

/// A call-site form found in real `-finstrument-functions` code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Form {
    /// `E8 rel32`: call rel32 (direct or to a PLT stub).
    CallRel32,
    /// `FF 15 disp32`: call [rip+disp32] (through the GOT, `-fno-plt`).
    CallRipIndirect,
    /// `E9 rel32`: jmp rel32, a tail call (gcc -O2 emits it for exit hooks).
    JmpRel32,
    /// `FF 25 disp32`: jmp [rip+disp32], a tail call through the GOT
    /// (`-fno-plt -O2`).
    JmpRipIndirect,
}

#[allow(clippy::len_without_is_empty, reason = "an instruction is never empty")]
impl Form {
    /// Every form, in declaration order.
    pub const ALL: [Form; 4] = [
        Form::CallRel32,
        Form::CallRipIndirect,
        Form::JmpRel32,
        Form::JmpRipIndirect,
    ];

    /// Instruction length in bytes.
    pub const fn len(self) -> usize {
        match self {
            Form::CallRel32 | Form::JmpRel32 => 5,
            Form::CallRipIndirect | Form::JmpRipIndirect => 6,
        }
    }

    /// True for the tail-call (`jmp`) forms, whose inactive form returns.
    pub const fn is_tail(self) -> bool {
        matches!(self, Form::JmpRel32 | Form::JmpRipIndirect)
    }

    /// True for the forms whose operand is a RIP-relative pointer slot.
    pub const fn is_rip_indirect(self) -> bool {
        matches!(self, Form::CallRipIndirect | Form::JmpRipIndirect)
    }

    fn prefix(self) -> &'static [u8] {
        match self {
            Form::CallRel32 => &[0xE8],
            Form::CallRipIndirect => &[0xFF, 0x15],
            Form::JmpRel32 => &[0xE9],
            Form::JmpRipIndirect => &[0xFF, 0x25],
        }
    }

    /// Recognises an active site: its form and operand (rel32 or disp32).
    pub fn decode(bytes: &[u8]) -> Option<(Form, i32)> {
        for f in Form::ALL {
            let p = f.prefix();
            if bytes.len() >= f.len() && bytes.starts_with(p) {
                let op = &bytes[p.len()..f.len()];
                return Some((f, i32::from_le_bytes([op[0], op[1], op[2], op[3]])));
            }
        }
        None
    }

    /// The active bytes for `operand` (first [`len`](Self::len) bytes valid).
    pub fn on_bytes(self, operand: i32) -> [u8; MAX_FORM_LEN] {
        let mut b = [0u8; MAX_FORM_LEN];
        let p = self.prefix();
        b[..p.len()].copy_from_slice(p);
        b[p.len()..self.len()].copy_from_slice(&operand.to_le_bytes());
        b
    }
}

/// How a site is switched off.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// The paper's callpatch (§6), valid at any call site: a non-straddler
    /// becomes a NOP of its length in one store; at a 1|4 split (1|5 for
    /// `FF 15`) the bytes after the boundary are redirected to a `ret`
    /// trampoline; at other splits the first two bytes become a short jump
    /// over the rest. A tail `jmp` becomes `ret` in its first byte (a jump
    /// over it would run into whatever follows), but for the 1|4 split (1|5
    /// for `FF 25`), which jumps to the `ret` trampoline as in the paper.
    Paper,
    /// Flip only the first byte: `E8`→`B8` (`mov eax, imm32`), `FF 15`→`8B 15`
    /// (`mov edx, [rip+disp32]`), `E9` and `FF 25`→`C3` (`ret`). Same length and
    /// instruction boundaries, one byte that never straddles: no trampoline,
    /// wait or INT3 at any split, and the inactive form costs what a NOP
    /// costs. Valid only where the call's callee follows the standard ABI, so
    /// eax/edx and the flags are dead at the call (the call clobbers them);
    /// never at an arbitrary instruction.
    Flip,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "paper" => Ok(Mode::Paper),
            "flip" => Ok(Mode::Flip),
            other => Err(format!("`{other}` is not a call toggle mode (paper, flip)")),
        }
    }
}

/// Where a `ret` trampoline is: `ret_at` holds `C3`, `ptr_at` holds the
/// 8-byte address of `ret_at` (for `call [rip+disp32]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Trampoline {
    /// Address of the `ret` byte.
    pub ret_at: usize,
    /// Address of the pointer to it.
    pub ptr_at: usize,
}

fn rel_from(site: usize, len: usize, target: usize) -> Option<i32> {
    i32::try_from(target as i64 - (site + len) as i64).ok()
}

/// Inactive bytes of `form` at `site` in `mode` (first `form.len()` valid), or
/// `None` when paper mode needs a trampoline that is not given or not in reach.
pub fn off_bytes(
    form: Form,
    operand: i32,
    site: usize,
    mode: Mode,
    tramp: Option<Trampoline>,
) -> Option<[u8; MAX_FORM_LEN]> {
    let on = form.on_bytes(operand);
    let mut off = on;
    let s = split(site, form.len());
    match (mode, form) {
        (Mode::Flip, Form::CallRel32) => off[0] = 0xB8,
        (Mode::Flip, Form::CallRipIndirect) => off[0] = 0x8B,
        (Mode::Flip, Form::JmpRel32 | Form::JmpRipIndirect) => off[0] = 0xC3,
        (Mode::Paper, Form::JmpRel32 | Form::JmpRipIndirect) if s != 1 => off[0] = 0xC3,
        (Mode::Paper, _) if s == 0 => {
            let nop = wordpatch::nop(form.len());
            off[..nop.len()].copy_from_slice(nop);
        }
        (Mode::Paper, Form::CallRel32 | Form::JmpRel32) if s == 1 => {
            let rel = rel_from(site, 5, tramp?.ret_at)?;
            off[1..5].copy_from_slice(&rel.to_le_bytes());
        }
        (Mode::Paper, Form::CallRipIndirect | Form::JmpRipIndirect) if s == 1 => {
            let disp = rel_from(site, 6, tramp?.ptr_at)?;
            off[2..6].copy_from_slice(&disp.to_le_bytes());
        }
        (Mode::Paper, _) => {
            // Split >= 2: a short jump over the rest of the instruction.
            off[0] = 0xEB;
            off[1] = (form.len() - 2) as u8;
        }
    }
    Some(off)
}

/// The bytes a toggle rewrites, as (offset, length) inside the instruction:
/// the smallest run that covers every byte that differs between `on` and
/// `off`. The mode and form tables guarantee it lies inside one cache line.
pub fn region(len: usize, on: &[u8], off: &[u8]) -> (usize, usize) {
    let first = (0..len).find(|&i| on[i] != off[i]).unwrap_or(0);
    let last = (0..len).rev().find(|&i| on[i] != off[i]).unwrap_or(0);
    (first, last + 1 - first)
}

/// True if the range lies inside one cache line.
pub fn in_one_line(addr: usize, len: usize) -> bool {
    len == 0 || addr / CACHE_LINE == (addr + len - 1) / CACHE_LINE
}

#[cfg(test)]
mod tests {
    use super::*;

    const FORMS: [Form; 4] = Form::ALL;

    #[test]
    fn decode_round_trip() {
        for f in FORMS {
            for op in [0, 1, -1, 0x0102_0304, i32::MIN, i32::MAX] {
                let b = f.on_bytes(op);
                assert_eq!(Form::decode(&b[..f.len()]), Some((f, op)));
            }
        }
        assert_eq!(Form::decode(&[0x0F, 0x1F, 0x44, 0, 0]), None);
        assert_eq!(Form::decode(&[0xE8, 1, 2]), None);
    }

    #[test]
    fn every_toggle_is_one_in_line_store() {
        let base = 0x5555_0000_0000usize;
        let tramp = Trampoline {
            ret_at: base - 0x1000,
            ptr_at: base - 0x1000 + 8,
        };
        for f in FORMS {
            for mode in [Mode::Paper, Mode::Flip] {
                for off_in_line in 0..64 {
                    let site = base + 64 * 10 + off_in_line;
                    let on = f.on_bytes(0x0A0B_0C0D);
                    let off = off_bytes(f, 0x0A0B_0C0D, site, mode, Some(tramp)).unwrap();
                    let (start, len) = region(f.len(), &on, &off);
                    assert!(len >= 1, "{f:?} {mode:?} at {off_in_line}: nothing changes");
                    assert!(
                        in_one_line(site + start, len),
                        "{f:?} {mode:?} split {}: region {start}+{len} straddles",
                        split(site, f.len())
                    );
                    // Bytes outside the region are the same in both states.
                    for i in 0..f.len() {
                        if i < start || i >= start + len {
                            assert_eq!(on[i], off[i]);
                        }
                    }
                    if mode == Mode::Flip {
                        assert_eq!(&on[1..f.len()], &off[1..f.len()], "flip changes one byte");
                    }
                }
            }
        }
    }

    #[test]
    fn paper_forms_match_the_paper() {
        let base = 0x4000_0000usize;
        let tramp = Trampoline {
            ret_at: base + 0x10_0000,
            ptr_at: base + 0x10_0008,
        };
        // Non-straddler: 5-byte NOP.
        let off = off_bytes(Form::CallRel32, 7, base, Mode::Paper, None).unwrap();
        assert_eq!(&off[..5], &[0x0F, 0x1F, 0x44, 0, 0]);
        // 1|4: rel32 of the ret trampoline.
        let site = base + 63;
        let off = off_bytes(Form::CallRel32, 7, site, Mode::Paper, Some(tramp)).unwrap();
        let rel = i32::from_le_bytes([off[1], off[2], off[3], off[4]]);
        assert_eq!(site as i64 + 5 + rel as i64, tramp.ret_at as i64);
        assert!(off_bytes(Form::CallRel32, 7, site, Mode::Paper, None).is_none());
        // 2|3 .. 4|1: EB 03.
        for s in 2..=4 {
            let off = off_bytes(Form::CallRel32, 7, base + 64 - s, Mode::Paper, None).unwrap();
            assert_eq!(&off[..2], &[0xEB, 0x03]);
        }
        // call [rip+disp32]: 1|5 to the pointer slot, 2..5 EB 04.
        let site = base + 63;
        let off = off_bytes(Form::CallRipIndirect, 7, site, Mode::Paper, Some(tramp)).unwrap();
        let disp = i32::from_le_bytes([off[2], off[3], off[4], off[5]]);
        assert_eq!(site as i64 + 6 + disp as i64, tramp.ptr_at as i64);
        let off = off_bytes(Form::CallRipIndirect, 7, base + 61, Mode::Paper, None).unwrap();
        assert_eq!(&off[..2], &[0xEB, 0x04]);
        // Tail jmp: ret.
        let off = off_bytes(Form::JmpRel32, 7, base + 62, Mode::Paper, None).unwrap();
        assert_eq!(off[0], 0xC3);
        let off = off_bytes(Form::JmpRipIndirect, 7, base + 62, Mode::Paper, None).unwrap();
        assert_eq!(off[0], 0xC3);
        // Tail jmp [rip+disp32] at 1|5: through the pointer slot.
        let site = base + 63;
        let off = off_bytes(Form::JmpRipIndirect, 7, site, Mode::Paper, Some(tramp)).unwrap();
        let disp = i32::from_le_bytes([off[2], off[3], off[4], off[5]]);
        assert_eq!(site as i64 + 6 + disp as i64, tramp.ptr_at as i64);
    }

    #[test]
    fn unreachable_trampoline_is_none() {
        let far = Trampoline {
            ret_at: 0x7000_0000_0000,
            ptr_at: 0x7000_0000_0008,
        };
        assert!(off_bytes(Form::CallRel32, 0, 0x1000 + 63, Mode::Paper, Some(far)).is_none());
    }

    #[test]
    fn mode_parse() {
        assert_eq!("Flip".parse::<Mode>(), Ok(Mode::Flip));
        assert_eq!("paper".parse::<Mode>(), Ok(Mode::Paper));
        assert!("fast".parse::<Mode>().is_err());
    }
}
