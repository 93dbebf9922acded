//! A module's dynamic symbols, read from its file without the rest of it:
//! the ELF header, the program and section headers, `.dynsym` and its
//! string table, each by one positioned read.
//!
//! The attach looks up a handful of symbols (`dlopen` and `dlerror` in
//! the C library, the runtime's start and hooks in `libfastinst.so`).
//! Read whole and parsed by goblin, each look-up took the whole file
//! (the runtime library's debug information included) and its full
//! symbol table: the largest part of the attaching command's own work.

use crate::error::{AttachError, Result};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

const PT_LOAD: u32 = 1;
const SHT_DYNSYM: u32 = 11;
const EHDR_LEN: usize = 64;
const PHDR_LEN: usize = 56;
const SHDR_LEN: usize = 64;
const SYM_LEN: usize = 24;

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// The addresses of `names` among the dynamic symbols of the ELF file at
/// `path`, mapped with its first loadable segment at `base` (`None` for
/// a name it does not define).
pub fn dynamic(path: &Path, base: u64, names: &[&str]) -> Result<Vec<Option<u64>>> {
    let what = path.display().to_string();
    let bad = |why: &str| AttachError::Other(format!("{what}: {why}"));
    let file = File::open(path).map_err(AttachError::io(what.clone()))?;
    let read = |at: u64, len: usize| -> Result<Vec<u8>> {
        // No table of a real file is near this; a corrupt header is.
        if len > 1 << 30 {
            return Err(bad("a table larger than 1 GiB"));
        }
        let mut b = vec![0u8; len];
        file.read_exact_at(&mut b, at).map_err(AttachError::io(what.clone()))?;
        Ok(b)
    };
    let eh = read(0, EHDR_LEN)?;
    if eh[..4] != *b"\x7fELF" || eh[4] != 2 || eh[5] != 1 {
        return Err(bad("not a 64-bit little-endian ELF file"));
    }
    let (phoff, shoff) = (u64_at(&eh, 32), u64_at(&eh, 40));
    let (phentsize, phnum) = (usize::from(u16_at(&eh, 54)), usize::from(u16_at(&eh, 56)));
    let (shentsize, shnum) = (usize::from(u16_at(&eh, 58)), usize::from(u16_at(&eh, 60)));
    if phentsize < PHDR_LEN || shentsize < SHDR_LEN {
        return Err(bad("headers shorter than ELF64's"));
    }
    let ph = read(phoff, phentsize * phnum)?;
    let first_load = (0..phnum)
        .map(|i| &ph[i * phentsize..])
        .filter(|p| u32_at(p, 0) == PT_LOAD)
        .map(|p| (u64_at(p, 8), u64_at(p, 16)))
        .min_by_key(|&(offset, _)| offset)
        .ok_or_else(|| bad("no PT_LOAD"))?;
    let bias = base.wrapping_sub(first_load.1.wrapping_sub(first_load.0));
    let sh = read(shoff, shentsize * shnum)?;
    let section = |i: usize| &sh[i * shentsize..(i + 1) * shentsize];
    let Some(dynsym) = (0..shnum).map(section).find(|s| u32_at(s, 4) == SHT_DYNSYM) else {
        return Ok(vec![None; names.len()]);
    };
    let link = u32_at(dynsym, 40) as usize;
    if link >= shnum {
        return Err(bad(".dynsym's string table is out of range"));
    }
    let strtab = section(link);
    let syms = read(u64_at(dynsym, 24), u64_at(dynsym, 32) as usize)?;
    let strs = read(u64_at(strtab, 24), u64_at(strtab, 32) as usize)?;
    let entsize = (u64_at(dynsym, 56) as usize).max(SYM_LEN);
    let name_at = |at: usize| -> Option<&[u8]> {
        let rest = strs.get(at..)?;
        Some(&rest[..rest.iter().position(|&c| c == 0)?])
    };
    let mut found = vec![None; names.len()];
    for sym in syms.chunks_exact(entsize) {
        let value = u64_at(sym, 8);
        if value == 0 {
            continue;
        }
        let Some(name) = name_at(u32_at(sym, 0) as usize) else {
            continue;
        };
        for (slot, want) in found.iter_mut().zip(names) {
            if slot.is_none() && name == want.as_bytes() {
                *slot = Some(value.wrapping_add(bias));
            }
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The C library's dynamic symbols, found as goblin finds them from
    /// the whole file, at any base.
    #[test]
    fn finds_what_a_whole_parse_finds() {
        let libc = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
        let bytes = std::fs::read(libc).expect("the C library (Debian package libc6)");
        let elf = goblin::elf::Elf::parse(&bytes).unwrap();
        let base = 0x7f00_0000_0000;
        let bias = crate::sleds::load_bias(&elf, base).unwrap();
        let whole = |name: &str| {
            elf.dynsyms
                .iter()
                .find(|s| s.st_value != 0 && elf.dynstrtab.get_at(s.st_name) == Some(name))
                .map(|s| s.st_value.wrapping_add(bias))
        };
        let names = [
            "dlopen",
            "dlerror",
            "__cyg_profile_func_enter",
            "malloc",
            "no_such_symbol_here",
        ];
        let got = dynamic(libc, base, &names).unwrap();
        for (name, got) in names.iter().zip(&got) {
            assert_eq!(*got, whole(name), "{name}");
        }
        assert!(got[0].is_some() && got[4].is_none());
    }

    #[test]
    fn a_file_that_is_not_elf_is_refused() {
        let dir = std::env::temp_dir().join(format!("fastinst-symbols-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("not-elf");
        std::fs::write(&f, [b'#'; 100]).unwrap();
        let e = dynamic(&f, 0, &["x"]).unwrap_err().to_string();
        assert!(e.contains("not a 64-bit"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
