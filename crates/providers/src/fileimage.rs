//! An ELF file as the loader would map it, read from disk: its loadable
//! segments at their virtual addresses, and GOT slots bound to stand-ins
//! for the functions a recogniser looks for (what the dynamic linker would
//! have written there). The offline listing ([`crate::offline`]) and the
//! providers that read code from the file ([`crate::mcount`],
//! [`crate::points`]) share it.

use crate::memory::Image;
use goblin::elf::{program_header::PT_LOAD, reloc, Elf};

/// An image of the file's loadable segments at its virtual addresses, as
/// the loader maps them (the bytes past a segment's file size are zero).
pub(crate) fn file_image(elf: &Elf, bytes: &[u8]) -> Image {
    let mut image = Image::new();
    for ph in elf.program_headers.iter().filter(|p| p.p_type == PT_LOAD) {
        let start = ph.p_offset as usize;
        let file_end = start.saturating_add(ph.p_filesz as usize).min(bytes.len());
        let mut seg = bytes.get(start..file_end).unwrap_or(&[]).to_vec();
        seg.resize(ph.p_memsz.max(ph.p_filesz) as usize, 0);
        image = image.with(ph.p_vaddr, seg);
    }
    image
}

/// The address the file's code reaches a function named in `names` at, as
/// the dynamic linker would bind it: a symbol the file defines, else
/// `stand_in`, written into every GOT slot a relocation binds to one of the
/// names.
pub(crate) fn bind(elf: &Elf, image: &mut Image, names: &[&str], stand_in: u64) -> u64 {
    bound(elf, image, names, stand_in).0
}

/// [`bind`], and whether the file defines or imports any of `names`.
pub(crate) fn bound(elf: &Elf, image: &mut Image, names: &[&str], stand_in: u64) -> (u64, bool) {
    let mut addr = stand_in;
    let mut seen = false;
    for (syms, strs) in [(&elf.syms, &elf.strtab), (&elf.dynsyms, &elf.dynstrtab)] {
        for s in syms.iter().filter(|s| s.st_shndx != 0 && s.st_value != 0) {
            if strs.get_at(s.st_name).is_some_and(|n| names.contains(&n)) {
                (addr, seen) = (s.st_value, true);
            }
        }
    }
    let relocs = elf
        .pltrelocs
        .iter()
        .chain(elf.dynrelas.iter())
        .chain(elf.dynrels.iter());
    for r in relocs {
        if !matches!(
            r.r_type,
            reloc::R_X86_64_JUMP_SLOT | reloc::R_X86_64_GLOB_DAT | reloc::R_X86_64_64
        ) {
            continue;
        }
        let Some(sym) = elf.dynsyms.get(r.r_sym) else { continue };
        if !elf.dynstrtab.get_at(sym.st_name).is_some_and(|n| names.contains(&n)) {
            continue;
        }
        seen = true;
        if image.contains(r.r_offset, 8) {
            image.write(r.r_offset, &addr.to_le_bytes());
        }
    }
    (addr, seen)
}
