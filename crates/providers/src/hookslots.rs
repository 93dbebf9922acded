//! The GOT slots through which a module calls the `-finstrument-functions`
//! hooks, `__cyg_profile_func_enter` and `__cyg_profile_func_exit`: read
//! from its dynamic relocations, a `JUMP_SLOT` (a call through the PLT) or
//! a `GLOB_DAT` (a `-fno-plt` call through the GOT).
//!
//! In a process started without the runtime, the loader binds them to the
//! C library's functions of those names, which do nothing; an attached
//! runtime is reached only through slots pointed at its own hooks (by
//! `fastinst attach` for the modules mapped at the attach, by the runtime
//! for a library loaded while attached).

use crate::sections::ElfError;
use goblin::elf::program_header::PT_GNU_RELRO;
use goblin::elf::Elf;

/// The hook functions a `-finstrument-functions` build calls.
pub const HOOKS: [&str; 2] = ["__cyg_profile_func_enter", "__cyg_profile_func_exit"];

const R_X86_64_GLOB_DAT: u32 = 6;
const R_X86_64_JUMP_SLOT: u32 = 7;

/// One GOT slot that a module calls a hook through.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slot {
    /// Its address in the process.
    pub addr: u64,
    /// Which hook: an index into [`HOOKS`].
    pub hook: usize,
}

/// The hook slots of `elf` (its dynamic relocations, symbols and names
/// read), at run-time addresses: link-time ones plus `bias`.
pub fn of_elf(elf: &Elf, bias: u64) -> Vec<Slot> {
    let mut out = Vec::new();
    for r in elf.pltrelocs.iter().chain(elf.dynrelas.iter()) {
        if r.r_type != R_X86_64_JUMP_SLOT && r.r_type != R_X86_64_GLOB_DAT {
            continue;
        }
        let name = elf.dynsyms.get(r.r_sym).and_then(|s| elf.dynstrtab.get_at(s.st_name));
        if let Some(hook) = name.and_then(|n| HOOKS.iter().position(|h| *h == n)) {
            out.push(Slot {
                addr: bias.wrapping_add(r.r_offset),
                hook,
            });
        }
    }
    out
}

/// A module's hook slots and the range they may lie in read-only.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModuleSlots {
    /// Its hook slots, at run-time addresses.
    pub slots: Vec<Slot>,
    /// Its RELRO range at run-time addresses ([`relro`]).
    pub relro: Option<(u64, u64)>,
}

/// The hook slots of the ELF file `bytes` loaded with `bias`, and its
/// RELRO range: the whole file parsed (a library loaded while attached,
/// once).
pub fn of_file(bytes: &[u8], bias: u64) -> Result<ModuleSlots, ElfError> {
    let elf = Elf::parse(bytes)?;
    Ok(ModuleSlots {
        slots: of_elf(&elf, bias),
        relro: relro(&elf, bias),
    })
}

/// The run-time range `[start, end)` the loader makes read-only after
/// relocating (`PT_GNU_RELRO`), if `elf` has one: a slot inside it is
/// written only after its page is made writable again.
pub fn relro(elf: &Elf, bias: u64) -> Option<(u64, u64)> {
    elf.program_headers.iter().find(|p| p.p_type == PT_GNU_RELRO).map(|p| {
        let start = bias.wrapping_add(p.p_vaddr);
        (start, start.wrapping_add(p.p_memsz))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_test_binary_has_no_hook_slot() {
        let bytes = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let elf = Elf::parse(&bytes).unwrap();
        assert!(of_elf(&elf, 0x5555_0000_0000).is_empty());
        let (start, end) = relro(&elf, 0x1000).expect("a Rust test binary has a RELRO segment");
        assert!(start >= 0x1000 && end > start);
        assert_eq!(
            of_file(&bytes, 0x1000).unwrap(),
            ModuleSlots {
                slots: Vec::new(),
                relro: Some((start, end))
            }
        );
    }
}
