//! The sled sites of a process's modules, read from their ELF files: where
//! each is in memory and what its bytes are in the file.

use crate::error::{AttachError, Result};
use crate::files::Files;
use crate::maps::Module;
use crate::mem::Mem;
use goblin::elf::program_header::PT_LOAD;
use goblin::elf::Elf;
use providers::elf::SymbolTable;
use providers::patchable::{self, SledShape, SLED_LEN};
use providers::sections::Sections;

/// One sled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Site {
    /// Its first toggled byte, in the process.
    pub addr: u64,
    /// Its bytes in the file.
    pub original: [u8; SLED_LEN],
}

impl Site {
    /// Whether it must be rewritten to one instruction before a probe may
    /// be switched at it: gcc's five 1-byte NOPs, between which a thread
    /// may be stopped.
    pub fn needs_normalising(&self) -> bool {
        SledShape::of(&self.original) == SledShape::OneByteNops
    }
}

/// What to add to the link-time addresses of `elf`, mapped with its file
/// offset 0 at `base`, for their addresses in the process; `None` without
/// a loadable segment.
pub fn load_bias(elf: &Elf, base: u64) -> Option<u64> {
    let first = elf
        .program_headers
        .iter()
        .filter(|p| p.p_type == PT_LOAD)
        .min_by_key(|p| p.p_offset)?;
    Some(base.wrapping_sub(first.p_vaddr - first.p_offset))
}

/// The sites of the ELF file `bytes` mapped with its offset 0 at `base`.
pub fn of_file(bytes: &[u8], base: u64) -> Result<Vec<Site>> {
    let bad = |e: &dyn std::fmt::Display| AttachError::Other(format!("ELF: {e}"));
    let elf = crate::headers::parse(bytes).map_err(|e| bad(&e))?;
    let loads: Vec<_> = elf.program_headers.iter().filter(|p| p.p_type == PT_LOAD).collect();
    let Some(bias) = load_bias(&elf, base) else {
        return Ok(Vec::new());
    };
    let sections = Sections::parse(bytes).map_err(|e| bad(&e))?;
    let table = patchable::table(&sections);
    if table.is_empty() {
        return Ok(Vec::new());
    }
    let symbols = SymbolTable::extents_from_sections(&sections, bytes, 0).map_err(|e| bad(&e))?;
    let mut out = Vec::new();
    for recorded in table {
        let (entry, _) = patchable::entry_of(recorded, &symbols);
        let Some(ph) = loads
            .iter()
            .find(|p| entry >= p.p_vaddr && entry + SLED_LEN as u64 <= p.p_vaddr + p.p_filesz)
        else {
            continue;
        };
        let off = (ph.p_offset + entry - ph.p_vaddr) as usize;
        let Some(b) = bytes.get(off..off + SLED_LEN) else {
            continue;
        };
        out.push(Site {
            addr: entry.wrapping_add(bias),
            original: b.try_into().expect("5 bytes"),
        });
    }
    out.sort_by_key(|s| s.addr);
    out.dedup_by_key(|s| s.addr);
    Ok(out)
}

/// The sites of every module.
pub fn of_modules(modules: &[Module], files: &mut Files) -> Result<Vec<Site>> {
    let mut out = Vec::new();
    for m in modules {
        // The runtime of an earlier attach probes none of its own code,
        // and its file (with debug information) is the largest to read.
        if m.path.file_name().is_some_and(|n| n == crate::LIBRARY_NAME) {
            continue;
        }
        let Some(bytes) = files.get(&m.path) else { continue };
        match of_file(bytes, m.base) {
            Ok(s) => out.extend(s),
            // A file that is not ELF (or changed on disk) has no sites we can trust.
            Err(_) => continue,
        }
    }
    Ok(out)
}

/// The longest stretch of memory one read spans.
const READ_SPAN: u64 = 64 << 10;

/// The sites whose bytes in the process are not their file's (each with
/// its address and file bytes), with what was found.
pub fn differing<'s>(mem: &Mem, sites: &'s [Site]) -> Result<Vec<(&'s Site, [u8; SLED_LEN])>> {
    let mut sorted: Vec<&Site> = sites.iter().collect();
    sorted.sort_by_key(|s| s.addr);
    let mut out = Vec::new();
    let mut buf = Vec::new();
    // One read a stretch, not one a site: with every thread stopped, 20,000
    // reads of five bytes took most of a detach's stop.
    let ranges = sorted.iter().map(|s| (s.addr, SLED_LEN as u64));
    for (start, end, i, j) in crate::mem::stretches(ranges, READ_SPAN) {
        buf.resize((end - start) as usize, 0);
        mem.read(start, &mut buf)?;
        for s in &sorted[i..j] {
            let o = (s.addr - start) as usize;
            let b: [u8; SLED_LEN] = buf[o..o + SLED_LEN].try_into().expect("SLED_LEN bytes");
            if b != s.original {
                out.push((*s, b));
            }
        }
    }
    Ok(out)
}

/// Writes each `(address, bytes)` (sites' bytes, not overlapping), a
/// stretch of them at a time: read, changed and written back whole. Every
/// thread of the process must be stopped, so that no byte between the sites
/// changes meanwhile.
pub fn write_all(mem: &Mem, writes: &[(u64, [u8; SLED_LEN])]) -> Result<()> {
    let mut sorted: Vec<(u64, &[u8])> = writes.iter().map(|(a, b)| (*a, &b[..])).collect();
    sorted.sort_by_key(|w| w.0);
    mem.write_each(&sorted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_one_byte_nops_need_normalising() {
        let gcc = Site {
            addr: 0,
            original: [0x90; 5],
        };
        let clang = Site {
            addr: 0,
            original: [0x0f, 0x1f, 0x44, 0x00, 0x08],
        };
        assert!(gcc.needs_normalising() && !clang.needs_normalising());
    }

    #[test]
    fn a_file_without_the_table_has_no_sites() {
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert!(of_file(&exe, 0).unwrap().is_empty());
    }
}
