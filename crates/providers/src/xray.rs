//! The XRay provider: clang's `-fxray-instrument` entry sleds, toggled as
//! sleds.
//!
//! clang puts an 11-byte sled at each instrumented function's entry, `jmp
//! .+11` (`EB 09`) over a 9-byte NOP, and lists it in `xray_instr_map`
//! (32-byte entries: the sled's address, the function's, the kind, a
//! version; from version 2 both addresses are relative to the field that
//! holds them). XRay's own runtime patches the sled to `mov r10d, id; call
//! trampoline`, with an `mprotect` around each patch and no
//! synchronisation with the threads running it.
//!
//! Here the sled becomes a 5-byte site at the entry:
//! - its last 6 bytes are rewritten once to one 6-byte NOP, [`TAIL`]. While
//!   the `jmp` is there, no thread runs those bytes, so plain stores do;
//! - the first 5 bytes then toggle between the sled as it was (the `jmp`,
//!   and three bytes it jumps over) and a `call rel32` to a trampoline,
//!   which returns to entry + 5, the start of the NOP, which ends where the
//!   sled ends. Any strategy's off form that falls through (a NOP) reaches
//!   the same NOP.
//!
//! Exit and tail sleds are not used: an entry probe's trampoline watches
//! the function's return by return-address substitution, as for every
//! sled. The sites are the entry sleds (kinds `FUNCTION_ENTER` and
//! `LOG_ARGS_ENTER`).

use crate::memory::Memory;
use crate::sections::Sections;

/// The section clang lists the sleds in.
pub const SECTION: &str = "xray_instr_map";
/// Bytes of an x86-64 sled.
pub const SLED_BYTES: usize = 11;
/// Bytes of one `xray_instr_map` entry.
pub const ENTRY_BYTES: usize = 32;
/// The sled's first instruction: `jmp .+11`.
pub const JMP_OVER: [u8; 2] = [0xEB, 0x09];
/// What the sled's last 6 bytes become: one 6-byte NOP.
pub const TAIL: [u8; 6] = [0x66, 0x0F, 0x1F, 0x44, 0x00, 0x00];
/// Sled kinds that are entries (`FUNCTION_ENTER`, `LOG_ARGS_ENTER`).
const ENTRY_KINDS: [u8; 2] = [0, 3];

/// An entry sled, at the file's virtual addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XraySled {
    /// The sled's first byte (the `jmp`).
    pub addr: u64,
    /// The function's first byte.
    pub function: u64,
}

impl XraySled {
    /// The same sled moved by a load bias.
    pub fn moved(self, bias: u64) -> XraySled {
        XraySled {
            addr: self.addr.wrapping_add(bias),
            function: self.function.wrapping_add(bias),
        }
    }
}

/// Why a listed sled is not used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum XrayError {
    /// Its bytes cannot be read.
    #[error("the sled's bytes cannot be read")]
    Unreadable,
    /// It does not begin with `jmp .+11` (XRay's runtime patched it, or it
    /// is not a sled).
    #[error("the sled does not begin with jmp .+11 (is XRay's runtime patching it?)")]
    NotASled,
}

/// The entry sleds `xray_instr_map` lists in the file behind `sections`
/// (empty without one): link-time addresses.
pub fn entry_sleds(sections: &Sections) -> Vec<XraySled> {
    let mut out = Vec::new();
    for sh in sections.named(SECTION) {
        let Some(body) = sections.contents(sh) else { continue };
        for (i, e) in body.chunks_exact(ENTRY_BYTES).enumerate() {
            let (kind, version) = (e[16], e[18]);
            if !ENTRY_KINDS.contains(&kind) {
                continue;
            }
            let at = sh.sh_addr + (i * ENTRY_BYTES) as u64;
            let word = |k: usize| u64::from_le_bytes(e[k..k + 8].try_into().expect("8 bytes"));
            let (addr, function) = if version >= 2 {
                (at.wrapping_add(word(0)), (at + 8).wrapping_add(word(8)))
            } else {
                (word(0), word(8))
            };
            if addr != 0 {
                out.push(XraySled { addr, function });
            }
        }
    }
    out
}

/// Whether the sled at `addr` is usable as a site: its `jmp .+11`, and
/// whether its last 6 bytes must still be rewritten to [`TAIL`].
pub fn check<M: Memory + ?Sized>(mem: &M, addr: u64) -> Result<bool, XrayError> {
    let mut b = [0u8; SLED_BYTES];
    if !mem.read(addr, &mut b) {
        return Err(XrayError::Unreadable);
    }
    if b[..2] != JMP_OVER {
        return Err(XrayError::NotASled);
    }
    Ok(b[5..] != TAIL)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::Image;

    #[test]
    fn a_fresh_sled_needs_its_tail_and_a_patched_one_is_refused() {
        let fresh = [&JMP_OVER[..], &[0x66, 0x0F, 0x1F, 0x84, 0x00, 0x00, 0x02, 0x00, 0x00]].concat();
        let done = [&fresh[..5], &TAIL[..]].concat();
        let patched = [0x41, 0xBA, 1, 0, 0, 0, 0xE8, 0, 0, 0, 0];
        let mem = Image::new()
            .with(0x1000, fresh)
            .with(0x2000, done)
            .with(0x3000, patched.to_vec());
        assert_eq!(check(&mem, 0x1000), Ok(true));
        assert_eq!(check(&mem, 0x2000), Ok(false));
        assert_eq!(check(&mem, 0x3000), Err(XrayError::NotASled));
        assert_eq!(check(&mem, 0x9000), Err(XrayError::Unreadable));
    }

    #[test]
    fn the_tail_is_one_nop_ending_with_the_sled() {
        let mut d = iced_x86::Decoder::with_ip(64, &TAIL, 0, iced_x86::DecoderOptions::NONE);
        let i = d.decode();
        assert_eq!((i.mnemonic(), i.len()), (iced_x86::Mnemonic::Nop, TAIL.len()));
    }
}
