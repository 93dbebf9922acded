//! What an attach reads of a module's ELF file beyond its sections: the
//! program headers, the dynamic section, and the dynamic relocations with
//! the symbols they name. Never the symbol table.
//!
//! Why: goblin's `Elf::parse` reads everything, the full symbol table
//! among it with every one of its names made a string; on a program of
//! 20,000 functions that was a few milliseconds each of the three times an
//! attach looked at the file (its sleds, its hook slots, its code), while
//! the target's threads keep the CPUs busy and the attach waits.

use goblin::container::{Container, Ctx, Endian};
use goblin::elf::dynamic::{Dynamic, DT_RELA};
use goblin::elf::header::{EI_CLASS, EI_DATA, ELFCLASS64, ELFDATA2LSB};
use goblin::elf::program_header::ProgramHeader;
use goblin::elf::reloc::RelocSection;
use goblin::elf::sym::Symtab;
use goblin::elf::Elf;
use goblin::error::{Error, Result};
use goblin::strtab::Strtab;

/// `bytes` (a 64-bit little-endian ELF file) as an [`Elf`] with its
/// header, program headers, dynamic section, dynamic relocations
/// (`dynrelas`, `pltrelocs`), the dynamic symbols those name (`dynsyms`,
/// up to the highest one named) and their names (`dynstrtab`) filled in;
/// every other field empty.
pub fn parse(bytes: &[u8]) -> Result<Elf<'_>> {
    let header = Elf::parse_header(bytes)?;
    if header.e_ident[EI_CLASS] != ELFCLASS64 || header.e_ident[EI_DATA] != ELFDATA2LSB {
        return Err(Error::Malformed("not a 64-bit little-endian ELF file".into()));
    }
    let ctx = Ctx::new(Container::Big, Endian::Little);
    let mut elf = Elf::lazy_parse(header)?;
    elf.program_headers = ProgramHeader::parse(bytes, header.e_phoff as usize, header.e_phnum as usize, ctx)?;
    elf.dynamic = Dynamic::parse(bytes, &elf.program_headers, ctx)?;
    if let Some(d) = &elf.dynamic {
        let info = &d.info;
        elf.dynstrtab = Strtab::parse(bytes, info.strtab, info.strsz, 0)?;
        elf.dynrelas = RelocSection::parse(bytes, info.rela, info.relasz, true, ctx)?;
        let rela = info.pltrel == DT_RELA;
        elf.pltrelocs = RelocSection::parse(bytes, info.jmprel, info.pltrelsz, rela, ctx)?;
        let named = elf
            .dynrelas
            .iter()
            .chain(elf.pltrelocs.iter())
            .map(|r| r.r_sym + 1)
            .max()
            .unwrap_or(0);
        elf.dynsyms = Symtab::parse(bytes, info.symtab, named, ctx)?;
    }
    Ok(elf)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What every attach reads of a file is what goblin's full parse reads:
    /// this test binary's (PIE, dynamic) and the C library's.
    #[test]
    fn the_headers_and_dynamic_relocations_are_the_full_parse_s() {
        let exe = std::env::current_exe().unwrap();
        let libc = std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5).map(String::from))
            .find(|p| p.contains("/libc.so"))
            .expect("the C library mapped");
        for path in [exe, libc.into()] {
            let bytes = std::fs::read(&path).unwrap();
            let full = Elf::parse(&bytes).unwrap();
            let light = parse(&bytes).unwrap();
            let what = path.display();
            assert_eq!(light.program_headers, full.program_headers, "{what}");
            let flags = |e: &Elf| e.dynamic.as_ref().map(|d| (d.dyns.len(), d.info.flags, d.info.flags_1));
            assert_eq!(flags(&light), flags(&full), "{what}");
            let relocs = |e: &Elf| -> Vec<(u64, u32, Option<String>)> {
                e.pltrelocs
                    .iter()
                    .chain(e.dynrelas.iter())
                    .map(|r| {
                        let name = e.dynsyms.get(r.r_sym).and_then(|s| e.dynstrtab.get_at(s.st_name));
                        (r.r_offset, r.r_type, name.map(String::from))
                    })
                    .collect()
            };
            let (l, f) = (relocs(&light), relocs(&full));
            assert!(!l.is_empty(), "{what}: no dynamic relocation");
            assert_eq!(l, f, "{what}");
        }
    }
}
