//! The `-fpatchable-function-entry=N[,M]` provider (the paper's ELF-table
//! provider, §7, in the form gcc and clang emit today).
//!
//! The compiler puts an `N`-byte NOP sled in each function, `M` bytes of it
//! before the entry symbol, and records the sled's first byte in the
//! `__patchable_function_entries` section. The sites are therefore known from
//! the ELF file before any code runs, and the probes start off: no call is
//! paid for until one is switched on.
//!
//! A probe site is the first [`SLED_LEN`] bytes at the function entry, which
//! the runtime toggles between a NOP and a `call rel32` to a trampoline.
//! That needs an instruction boundary at entry + 5:
//! - clang fills `N = 5` with one 5-byte NOP (`0F 1F 44 00 08`): already one
//!   instruction, used as it is;
//! - gcc fills the sled with one-byte NOPs (`90`). Turning several
//!   instructions into one is unsafe while a thread may be stopped between
//!   them (it would resume inside the new instruction), so the sled is
//!   *normalised* once to [`NORMALISED`], `66 66 66 66 90`: one 5-byte NOP
//!   (`xchg ax,ax` with redundant operand-size prefixes). Every suffix of
//!   it, and every mix of it with the old bytes, is again a run of NOPs
//!   ending exactly at entry + 5: a thread stopped at entry + k resumes on
//!   `66…66 90`, and a fetch of a half-written sled sees `66`s and `90`s in
//!   the first four bytes and `90` in the last, whatever order the bytes are
//!   stored in. So normalisation is safe at *any* moment, with threads
//!   running and without an atomic store; it is done before the first
//!   toggle, which can then treat the sled as one instruction.
//! - Sleds without a boundary at entry + 5 (clang's single 8-byte NOP for
//!   `N = 8`, for instance) are reported as [`SledError::NoBoundary`] and left
//!   alone.
//!
//! The table holds link-time addresses: absolute in a non-PIE executable,
//! `R_X86_64_RELATIVE` addends (or the implicit addends of `DT_RELR`, which
//! stay in the section) in a PIE or shared object.

use crate::decode::{decode_one, MAX_INSN_LEN};
use crate::elf::SymbolTable;
use crate::memory::Memory;
use crate::sections::Sections;

/// The section gcc and clang record sleds in.
pub const SECTION: &str = "__patchable_function_entries";
/// Bytes of a sled the runtime toggles (a `call rel32`).
pub const SLED_LEN: usize = 5;
/// The 5-byte NOP one-byte-NOP sleds are normalised to (see the module doc).
pub const NORMALISED: [u8; SLED_LEN] = [0x66, 0x66, 0x66, 0x66, 0x90];
/// clang's sled for `N = 5`: one 5-byte NOP (`nopl 0x8(%rax,%rax,1)`).
const CLANG_NOP5: [u8; SLED_LEN] = [0x0f, 0x1f, 0x44, 0x00, 0x08];
/// Sleds whose decoding is fixed, NOPs that end at entry + 5 (each checked
/// by a test below), so [`sled_at`] takes them without the decoder, whose
/// tables are costly to build at a sled build's start-up and whose decoding
/// costs more per sled, where a `-fpatchable-function-entry` build
/// otherwise needs no decoder at all.
const KNOWN: [[u8; SLED_LEN]; 3] = [NORMALISED, [0x90; SLED_LEN], CLANG_NOP5];
/// Longest `M` (bytes before the entry) looked for.
const MAX_BEFORE: u64 = 64;

/// Why a recorded sled is not a probe site.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SledError {
    /// Its bytes could not be read.
    #[error("the sled's bytes cannot be read")]
    Unreadable,
    /// Fewer than [`SLED_LEN`] NOP bytes at the entry.
    #[error("only {0} NOP bytes at the entry (5 needed: build with -fpatchable-function-entry=5)")]
    TooShort(usize),
    /// The NOPs have no instruction boundary at entry + 5.
    #[error("no instruction boundary 5 bytes after the entry (use -fpatchable-function-entry=5)")]
    NoBoundary,
}

/// How a sled looked before normalisation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SledShape {
    /// One-byte NOPs (gcc): rewritten to [`NORMALISED`].
    OneByteNops,
    /// One or more multi-byte NOPs ending at entry + 5 (clang): used as is.
    Nops,
    /// Already [`NORMALISED`] (a second scan of the same module).
    Normalised,
}

impl SledShape {
    /// The shape of a sled's first [`SLED_LEN`] bytes (whether they are
    /// NOPs at all is [`sled_at`]'s to check).
    pub fn of(bytes: &[u8; SLED_LEN]) -> SledShape {
        if *bytes == NORMALISED {
            SledShape::Normalised
        } else if *bytes == [0x90; SLED_LEN] {
            SledShape::OneByteNops
        } else {
            SledShape::Nops
        }
    }
}

/// A usable sled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sled {
    /// The address the table records (first byte of the whole sled).
    pub recorded: u64,
    /// The function entry: the first byte of the toggled 5 bytes.
    pub entry: u64,
    /// The bytes found there.
    pub found: [u8; SLED_LEN],
    /// What it was.
    pub shape: SledShape,
}

impl Sled {
    /// The inactive bytes of this site: [`NORMALISED`] or its own 5-byte NOP.
    pub fn off(&self) -> [u8; SLED_LEN] {
        match self.shape {
            SledShape::OneByteNops | SledShape::Normalised => NORMALISED,
            SledShape::Nops => self.found,
        }
    }

    /// Whether the bytes must be rewritten to [`Sled::off`] before the first
    /// toggle.
    pub fn needs_normalising(&self) -> bool {
        self.shape == SledShape::OneByteNops
    }
}

/// The link-time addresses in the `__patchable_function_entries` sections
/// of an ELF file (empty when it has none), in table order.
pub fn table(sections: &Sections) -> Vec<u64> {
    crate::sections::address_table(sections, SECTION)
}

/// The function entry for a sled recorded at `recorded`: the start of a
/// function symbol at most `MAX_BEFORE` bytes on (the `M` NOPs before the
/// entry), else `recorded` itself (`M = 0`, or no symbols). Returns the
/// entry and the start of the function that contains it (`None` when no
/// symbol does).
pub fn entry_of(recorded: u64, symbols: &SymbolTable) -> (u64, Option<u64>) {
    if let Some(f) = symbols.containing(recorded) {
        if f.start == recorded || recorded < f.end() {
            // M = 0, or a sled placed after the entry (`endbr64` first).
            return (recorded, Some(f.start));
        }
    }
    match symbols
        .first_from(recorded)
        .filter(|f| f.start <= recorded + MAX_BEFORE)
    {
        Some(f) => (f.start, Some(f.start)),
        None => (recorded, None),
    }
}

/// Validates the sled at `entry` (recorded at `recorded`): NOP instructions
/// for at least [`SLED_LEN`] bytes with a boundary at entry + 5.
pub fn sled_at<M: Memory + ?Sized>(mem: &M, recorded: u64, entry: u64) -> Result<Sled, SledError> {
    let mut found = [0u8; SLED_LEN];
    if !mem.read(entry, &mut found) {
        return Err(SledError::Unreadable);
    }
    let shape = SledShape::of(&found);
    let mut ip = if KNOWN.contains(&found) {
        entry + SLED_LEN as u64
    } else {
        entry
    };
    while ip < entry + SLED_LEN as u64 {
        match decode_one(mem, ip, MAX_INSN_LEN) {
            Some(i) if is_nop(&i) => ip = i.next_ip(),
            _ => return Err(SledError::TooShort((ip - entry) as usize)),
        }
    }
    if ip != entry + SLED_LEN as u64 {
        return Err(SledError::NoBoundary);
    }
    Ok(Sled {
        recorded,
        entry,
        found,
        shape,
    })
}

fn is_nop(i: &iced_x86::Instruction) -> bool {
    i.mnemonic() == iced_x86::Mnemonic::Nop
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elf::Function;
    use crate::memory::Image;
    use iced_x86::{Decoder, DecoderOptions};

    fn decode_all(bytes: &[u8]) -> Vec<(usize, usize)> {
        let mut d = Decoder::with_ip(64, bytes, 0, DecoderOptions::NONE);
        let mut out = Vec::new();
        while d.can_decode() {
            let i = d.decode();
            out.push((i.ip() as usize, i.len()));
            assert!(is_nop(&i), "{bytes:02x?}: {i:?} is not a NOP");
        }
        out
    }

    #[test]
    fn normalised_is_one_nop_and_every_suffix_and_mix_ends_at_five() {
        assert_eq!(decode_all(&NORMALISED), vec![(0, 5)]);
        for k in 1..SLED_LEN {
            let ends: Vec<_> = decode_all(&NORMALISED[k..]).iter().map(|&(a, l)| a + l).collect();
            assert_eq!(*ends.last().unwrap(), SLED_LEN - k, "suffix at {k}");
        }
        // Any mix of old (90) and new (66) in the first four bytes.
        for m in 0..16u32 {
            let mut b = [0x90u8; SLED_LEN];
            for (j, x) in b.iter_mut().take(4).enumerate() {
                if m & (1 << j) != 0 {
                    *x = 0x66;
                }
            }
            for k in 0..SLED_LEN {
                let ends: Vec<_> = decode_all(&b[k..]).iter().map(|&(a, l)| a + l).collect();
                assert_eq!(*ends.last().unwrap(), SLED_LEN - k, "{b:02x?} from {k}");
            }
        }
    }

    #[test]
    fn the_sleds_taken_without_the_decoder_are_nops_ending_at_five() {
        for known in KNOWN {
            let ends: Vec<_> = decode_all(&known).iter().map(|&(a, l)| a + l).collect();
            assert_eq!(ends.last(), Some(&SLED_LEN), "{known:02x?}");
        }
        // An unknown run of NOPs still goes through the decoder.
        let mem = Image::new().with(0x1000, vec![0x66, 0x90, 0x0F, 0x1F, 0x00, 0xC3]);
        assert_eq!(sled_at(&mem, 0x1000, 0x1000).unwrap().shape, SledShape::Nops);
        let mem = Image::new().with(0x1000, vec![0x66, 0x90, 0x0F, 0x1F, 0x40, 0x00]);
        assert_eq!(sled_at(&mem, 0x1000, 0x1000), Err(SledError::NoBoundary));
    }

    #[test]
    fn classifies_gcc_clang_and_unusable_sleds() {
        let mem = Image::new()
            .with(0x1000, vec![0x90; 8])
            .with(0x2000, vec![0x0F, 0x1F, 0x44, 0x00, 0x08, 0xC3])
            .with(0x3000, vec![0x0F, 0x1F, 0x84, 0x00, 0x00, 0x02, 0x00, 0x00, 0xC3])
            .with(0x4000, vec![0x90, 0x90, 0xC3, 0x90, 0x90])
            .with(0x5000, NORMALISED.to_vec());
        let gcc = sled_at(&mem, 0x1000, 0x1000).unwrap();
        assert_eq!(gcc.shape, SledShape::OneByteNops);
        assert!(gcc.needs_normalising());
        assert_eq!(gcc.off(), NORMALISED);
        let clang = sled_at(&mem, 0x2000, 0x2000).unwrap();
        assert_eq!(clang.shape, SledShape::Nops);
        assert_eq!(clang.off(), [0x0F, 0x1F, 0x44, 0x00, 0x08]);
        assert!(!clang.needs_normalising());
        assert_eq!(sled_at(&mem, 0x3000, 0x3000), Err(SledError::NoBoundary));
        assert_eq!(sled_at(&mem, 0x4000, 0x4000), Err(SledError::TooShort(2)));
        assert_eq!(sled_at(&mem, 0x5000, 0x5000).unwrap().shape, SledShape::Normalised);
        assert_eq!(sled_at(&mem, 0x9000, 0x9000), Err(SledError::Unreadable));
    }

    #[test]
    fn entry_skips_the_bytes_before_the_symbol() {
        let f = |start, size| Function {
            start,
            size,
            name: format!("f{start:x}"),
        };
        let t = SymbolTable::from_functions(vec![f(0x1000, 0x20), f(0x1042, 0x20)]);
        assert_eq!(entry_of(0x1000, &t), (0x1000, Some(0x1000)));
        assert_eq!(entry_of(0x1040, &t), (0x1042, Some(0x1042)), "M = 2");
        assert_eq!(entry_of(0x1004, &t), (0x1004, Some(0x1000)), "after endbr64");
        assert_eq!(entry_of(0x9000, &t), (0x9000, None));
    }
}
