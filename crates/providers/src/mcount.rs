//! The `-pg` provider: the profiling calls gcc and clang put in every
//! function for gprof and uftrace, turned into sleds.
//!
//! | build | at each function | where |
//! | --- | --- | --- |
//! | `-pg` | `call mcount` (5 bytes via the PLT, 6 through the GOT) | after `push rbp; mov rbp, rsp` (and, with clang, more of the prologue) |
//! | `-pg -mfentry` | `call __fentry__` | the entry (after `endbr64`) |
//! | gcc `-pg -mfentry -mrecord-mcount` | the same, listed in `__mcount_loc` | the entry |
//! | gcc `… -mnop-mcount` (non-PIE only) | a 5-byte NOP, listed in `__mcount_loc` | the entry |
//!
//! Sites come from `__mcount_loc` where the build has it, else from the
//! first call in each function symbol's prologue (at most
//! [`PROLOGUE_INSNS`] instructions before any branch), and are recognised
//! only when that instruction is exactly a call whose target resolves to
//! `mcount`, `_mcount` or `__fentry__` (directly, through a PLT stub or a
//! GOT slot: the file's relocations say which slot holds which function,
//! as `fastinst sites` does), or the 5-byte NOP of `-mnop-mcount`.
//!
//! A site becomes a sled: its first 5 bytes toggle between a NOP and a
//! `call rel32` to a trampoline, as `-fpatchable-function-entry` sleds do
//! ([`crate::patchable`]). A call site is first rewritten, once, to that
//! NOP (a 6-byte call to the NOP and a one-byte NOP after it, which no
//! toggle touches): the glibc function it called does gprof's bookkeeping,
//! which a program under fastinst does not need.
//!
//! Where a site sits decides where the function's return address is when
//! the trampoline runs ([`Frame`]): at a `-mfentry` site it is on top of
//! the stack, as at a sled; at an `mcount` site the prologue has already
//! run, and it is found through the frame pointer, which `-pg` requires:
//! the function must begin with `push rbp; mov rbp, rsp`, checked here.

use crate::decode::{decode_one, Stream};
use crate::elf::{ElfError, SymbolTable};
use crate::fileimage;
use crate::finstrument::{call_site_at, HookKind, Hooks};
use crate::memory::Memory;
use crate::patchable;
use crate::sections::Sections;
use goblin::elf::Elf;
use iced_x86::{Code, FlowControl, Mnemonic, OpKind, Register};

/// The section gcc's `-mrecord-mcount` lists the sites in.
pub const SECTION: &str = "__mcount_loc";
/// The functions a `-pg` build calls after its prologue.
pub const MCOUNT: [&str; 2] = ["mcount", "_mcount"];
/// The function a `-pg -mfentry` build calls at its entry.
pub const FENTRY: &str = "__fentry__";
/// Instructions of a prologue looked through for the profiling call when
/// the build has no `__mcount_loc` (clang saves registers and moves
/// arguments before its `call mcount`).
pub const PROLOGUE_INSNS: usize = 16;
/// The bytes a site is toggled in.
pub const SITE_LEN: usize = patchable::SLED_LEN;
/// The inactive form of every site: the 5-byte NOP `-mnop-mcount` emits.
pub const NOP: [u8; SITE_LEN] = [0x0F, 0x1F, 0x44, 0x00, 0x00];

/// Stand-ins the file's `mcount` and `__fentry__` GOT slots are bound to
/// (non-canonical, so no code address equals them).
const STAND_IN_MCOUNT: u64 = 0x8000_0000_0000_3000;
const STAND_IN_FENTRY: u64 = 0x8000_0000_0000_4000;

/// Where the function's return address is when the site runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Frame {
    /// At the entry (`-mfentry`): on top of the stack, as at a sled.
    Entry,
    /// After `push rbp; mov rbp, rsp` (`mcount`): just above the saved
    /// frame pointer, `[rbp + 8]`.
    FramePointer,
}

/// What the site holds in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    /// The 5-byte NOP of `-mnop-mcount`: a sled as it is.
    Nop,
    /// A call to `mcount` or `__fentry__`, `len` bytes (5 or 6), to be
    /// rewritten once to [`Found::rewritten`]'s NOP.
    Call {
        /// The call's bytes.
        bytes: [u8; 6],
        /// Its length: 5 (`call rel32`) or 6 (`call [rip+disp32]`).
        len: u8,
    },
}

impl Found {
    /// Bytes the site is rewritten with before its first toggle, as long
    /// as the call they replace: [`NOP`], then a one-byte NOP for a 6-byte
    /// call. Empty for [`Found::Nop`].
    pub fn rewritten(&self) -> &'static [u8] {
        const NOP6: [u8; 6] = [0x0F, 0x1F, 0x44, 0x00, 0x00, 0x90];
        match *self {
            Found::Nop => &[],
            Found::Call { len, .. } => &NOP6[..len as usize],
        }
    }

    /// The call's bytes (empty for a NOP).
    pub fn call_bytes(&self) -> &[u8] {
        match self {
            Found::Nop => &[],
            Found::Call { bytes, len } => &bytes[..*len as usize],
        }
    }
}

/// A usable site.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct McountSite {
    /// The site's first byte (the call or the NOP).
    pub addr: u64,
    /// The function's first byte.
    pub function: u64,
    /// What the site holds.
    pub found: Found,
    /// Where the return address is when it runs.
    pub frame: Frame,
}

impl McountSite {
    /// The same site moved by a load bias.
    pub fn moved(self, bias: u64) -> McountSite {
        McountSite {
            addr: self.addr.wrapping_add(bias),
            function: self.function.wrapping_add(bias),
            ..self
        }
    }
}

/// Why a recorded or found site is not used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum McountError {
    /// The bytes could not be read.
    #[error("the site's bytes cannot be read")]
    Unreadable,
    /// Neither the NOP nor a call that resolves to mcount or __fentry__.
    #[error("neither a 5-byte NOP nor a call to mcount or __fentry__")]
    NotASite,
    /// After the entry, but the function does not begin by setting up its
    /// frame pointer, so the return address cannot be found.
    #[error("after the entry, and the function does not begin with push rbp; mov rbp, rsp")]
    NoFramePointer,
    /// No function symbol contains it.
    #[error("in no function symbol")]
    NoFunction,
}

/// Everything [`sites_in_elf`] found, at the file's virtual addresses.
#[derive(Clone, Debug, Default)]
pub struct McountSites {
    /// Usable sites, in address order, one per function.
    pub sites: Vec<McountSite>,
    /// Sites left alone: address and why.
    pub unusable: Vec<(u64, McountError)>,
}

/// Whether the file may have sites, read cheaply (section names and its
/// undefined symbols, no code): a `__mcount_loc` section, or an import of
/// `mcount`, `_mcount` or `__fentry__`. The C library defines them and has
/// none.
pub fn wanted(sections: &Sections) -> bool {
    if sections.named(SECTION).next().is_some() {
        return true;
    }
    sections.symbol_tables().iter().any(|t| {
        t.symbols
            .iter()
            .filter(|s| s.st_shndx == 0 && s.st_name != 0)
            .any(|s| t.name(s.st_name).is_some_and(|n| is_hook(&n)))
    })
}

fn is_hook(name: &str) -> bool {
    name == FENTRY || MCOUNT.contains(&name)
}

/// The sites of the ELF file `bytes`.
pub fn sites_in_elf(bytes: &[u8]) -> Result<McountSites, ElfError> {
    let elf = Elf::parse(bytes)?;
    let mut image = fileimage::file_image(&elf, bytes);
    let hooks = Hooks {
        enter: fileimage::bind(&elf, &mut image, &MCOUNT, STAND_IN_MCOUNT),
        exit: fileimage::bind(&elf, &mut image, &[FENTRY], STAND_IN_FENTRY),
    };
    let sections = Sections::parse(bytes)?;
    let symbols = SymbolTable::from_sections(&sections, bytes, 0)?;
    let table = crate::sections::address_table(&sections, SECTION);
    // A prologue's first call that is not a profiling call is simply not a
    // site; an address the table lists is one, so a failure there is said.
    let listed = !table.is_empty();
    let candidates: Vec<u64> = if !listed {
        symbols
            .iter()
            .filter(|f| f.size > 0)
            .filter_map(|f| prologue_call(&image, f.start, f.end()))
            .collect()
    } else {
        table
    };
    let mut out = McountSites::default();
    let mut seen = std::collections::HashSet::new();
    for at in candidates {
        if !seen.insert(at) {
            continue;
        }
        match site_at(&image, &hooks, &symbols, at) {
            Ok(s) => out.sites.push(s),
            Err(McountError::NotASite) if !listed => {}
            Err(e) => out.unusable.push((at, e)),
        }
    }
    out.sites.sort_by_key(|s| s.addr);
    Ok(out)
}

/// The first call in the prologue of the function at `[start, end)`:
/// within [`PROLOGUE_INSNS`] instructions and before any other control
/// flow.
fn prologue_call<M: Memory + ?Sized>(mem: &M, start: u64, end: u64) -> Option<u64> {
    for step in Stream::new(mem, start, end).take(PROLOGUE_INSNS) {
        let crate::decode::Step::Insn(i) = step else {
            return None;
        };
        match i.flow_control() {
            FlowControl::Next => continue,
            FlowControl::Call | FlowControl::IndirectCall => return Some(i.ip()),
            _ => return None,
        }
    }
    None
}

/// The site at `at`: the `-mnop-mcount` NOP, or a call that resolves to
/// one of `hooks` (`enter`: mcount, `exit`: `__fentry__`), in a function
/// whose frame tells where its return address is.
pub fn site_at<M: Memory + ?Sized>(
    mem: &M,
    hooks: &Hooks,
    symbols: &SymbolTable,
    at: u64,
) -> Result<McountSite, McountError> {
    let mut b = [0u8; 6];
    let insn = decode_one(mem, at, 6).ok_or(McountError::Unreadable)?;
    let len = insn.len();
    if !mem.read(at, &mut b[..len.min(6)]) {
        return Err(McountError::Unreadable);
    }
    let found = if insn.mnemonic() == Mnemonic::Nop && b[..SITE_LEN] == NOP && len == SITE_LEN {
        Found::Nop
    } else {
        let ret = insn.next_ip();
        let ok = [HookKind::Enter, HookKind::Exit]
            .into_iter()
            .any(|k| call_site_at(mem, hooks, k, ret).is_ok_and(|s| s.addr == at));
        if !ok {
            return Err(McountError::NotASite);
        }
        Found::Call {
            bytes: b,
            len: len as u8,
        }
    };
    let f = symbols.containing(at).ok_or(McountError::NoFunction)?;
    let frame = if at == f.start || (at == f.start + 4 && starts_with_endbr64(mem, f.start)) {
        Frame::Entry
    } else if sets_frame_pointer(mem, f.start) {
        Frame::FramePointer
    } else {
        return Err(McountError::NoFramePointer);
    };
    Ok(McountSite {
        addr: at,
        function: f.start,
        found,
        frame,
    })
}

fn starts_with_endbr64<M: Memory + ?Sized>(mem: &M, at: u64) -> bool {
    decode_one(mem, at, 4).is_some_and(|i| i.code() == Code::Endbr64)
}

/// Whether the function at `start` begins (after `endbr64`) with `push
/// rbp; mov rbp, rsp`.
fn sets_frame_pointer<M: Memory + ?Sized>(mem: &M, start: u64) -> bool {
    let Some(mut i) = decode_one(mem, start, 16) else {
        return false;
    };
    if i.code() == Code::Endbr64 {
        let Some(n) = decode_one(mem, i.next_ip(), 16) else {
            return false;
        };
        i = n;
    }
    if !(i.code() == Code::Push_r64 && i.op0_register() == Register::RBP) {
        return false;
    }
    let Some(m) = decode_one(mem, i.next_ip(), 16) else {
        return false;
    };
    m.mnemonic() == Mnemonic::Mov
        && m.op0_kind() == OpKind::Register
        && m.op0_register() == Register::RBP
        && m.op1_kind() == OpKind::Register
        && m.op1_register() == Register::RSP
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elf::Function;
    use crate::memory::Image;

    fn symbols(fs: &[(u64, u64)]) -> SymbolTable {
        SymbolTable::from_functions(
            fs.iter()
                .map(|&(start, size)| Function {
                    start,
                    size,
                    name: format!("f{start:x}"),
                })
                .collect(),
        )
    }

    const HOOKS: Hooks = Hooks {
        enter: STAND_IN_MCOUNT,
        exit: STAND_IN_FENTRY,
    };

    /// `call rel32` from `at` to `target`.
    fn call(at: u64, target: u64) -> Vec<u8> {
        let mut v = vec![0xE8];
        v.extend_from_slice(&((target as i64 - (at as i64 + 5)) as i32).to_le_bytes());
        v
    }

    #[test]
    fn fentry_through_the_plt_and_the_got_and_the_nop_are_entry_sites() {
        // A PLT stub at 0x500 through the slot at 0x3000, which the
        // relocation binds to __fentry__; a GOT slot 0x3008 for mcount.
        let mut plt = vec![0xFF, 0x25];
        plt.extend_from_slice(&((0x3000i64 - 0x506) as i32).to_le_bytes());
        let mut got_call = vec![0xFF, 0x15];
        got_call.extend_from_slice(&((0x3000i64 - 0x2006) as i32).to_le_bytes());
        let mut slots = STAND_IN_FENTRY.to_le_bytes().to_vec();
        slots.extend_from_slice(&STAND_IN_MCOUNT.to_le_bytes());
        let mem = Image::new()
            .with(0x500, plt)
            .with(0x1000, [call(0x1000, 0x500), vec![0xC3]].concat())
            .with(0x2000, [got_call, vec![0xC3]].concat())
            .with(
                0x2800,
                [vec![0xF3, 0x0F, 0x1E, 0xFA], NOP.to_vec(), vec![0xC3]].concat(),
            )
            .with(0x3000, slots);
        let syms = symbols(&[(0x1000, 6), (0x2000, 7), (0x2800, 10)]);
        let s = site_at(&mem, &HOOKS, &syms, 0x1000).unwrap();
        assert_eq!((s.frame, s.function), (Frame::Entry, 0x1000));
        assert!(matches!(s.found, Found::Call { len: 5, .. }));
        assert_eq!(s.found.rewritten(), &NOP[..]);
        let s = site_at(&mem, &HOOKS, &syms, 0x2000).unwrap();
        assert!(matches!(s.found, Found::Call { len: 6, .. }));
        assert_eq!(s.found.rewritten(), &[0x0F, 0x1F, 0x44, 0x00, 0x00, 0x90]);
        assert_eq!(s.found.call_bytes()[..2], [0xFF, 0x15]);
        let s = site_at(&mem, &HOOKS, &syms, 0x2804).unwrap();
        assert_eq!((s.found, s.frame), (Found::Nop, Frame::Entry), "after endbr64");
        assert!(s.found.rewritten().is_empty());
    }

    #[test]
    fn an_mcount_call_after_the_frame_pointer_is_a_frame_pointer_site() {
        // push rbp; mov rbp, rsp; push rbx; call [rip -> slot]; pop ...
        let mut f = vec![0x55, 0x48, 0x89, 0xE5, 0x53, 0xFF, 0x15];
        f.extend_from_slice(&((0x3008i64 - 0x100B) as i32).to_le_bytes());
        f.extend_from_slice(&[0x5B, 0x5D, 0xC3]);
        // The same call without the frame pointer.
        let mut g = vec![0x53, 0xFF, 0x15];
        g.extend_from_slice(&((0x3008i64 - 0x2007) as i32).to_le_bytes());
        g.extend_from_slice(&[0x5B, 0xC3]);
        let mut slots = STAND_IN_FENTRY.to_le_bytes().to_vec();
        slots.extend_from_slice(&STAND_IN_MCOUNT.to_le_bytes());
        let mem = Image::new().with(0x1000, f).with(0x2000, g).with(0x3000, slots);
        let syms = symbols(&[(0x1000, 14), (0x2000, 9)]);
        assert_eq!(prologue_call(&mem, 0x1000, 0x100E), Some(0x1005));
        let s = site_at(&mem, &HOOKS, &syms, 0x1005).unwrap();
        assert_eq!(s.frame, Frame::FramePointer);
        assert_eq!(site_at(&mem, &HOOKS, &syms, 0x2001), Err(McountError::NoFramePointer));
    }

    #[test]
    fn other_calls_and_bytes_are_not_sites() {
        let mem = Image::new()
            .with(0x1000, [call(0x1000, 0x1800), vec![0xC3]].concat())
            .with(0x1800, vec![0xC3])
            .with(0x2000, vec![0x90, 0x90, 0x90, 0x90, 0x90, 0xC3]);
        let syms = symbols(&[(0x1000, 6), (0x1800, 1), (0x2000, 6)]);
        assert_eq!(site_at(&mem, &HOOKS, &syms, 0x1000), Err(McountError::NotASite));
        assert_eq!(site_at(&mem, &HOOKS, &syms, 0x2000), Err(McountError::NotASite));
        assert_eq!(site_at(&mem, &HOOKS, &syms, 0x9000), Err(McountError::Unreadable));
        // A branch before any call ends the prologue.
        let mem = Image::new().with(0x1000, [vec![0x74, 0x00], call(0x1002, 0x1800)].concat());
        assert_eq!(prologue_call(&mem, 0x1000, 0x1007), None);
    }
}
