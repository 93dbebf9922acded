//! A lean view of an ELF file through its section headers: what the runtime
//! reads from every loaded module at start-up (symbols, the sled table and
//! its relocations), and nothing else.
//!
//! Why not `goblin::elf::Elf::parse`: it parses the whole file up front,
//! every string table into a vector of validated strings and every
//! relocation table, and the runtime parsed each module twice (symbols, then
//! sleds), a sizeable share of a sled build's start-up. Here the headers
//! are read once, symbols are read lazily by goblin,
//! and a name is read from its string table only for the function symbols
//! kept, with its bytes checked as UTF-8 one name at a time.

use goblin::container::Ctx;
use goblin::elf::reloc::RelocSection;
use goblin::elf::section_header::{SectionHeader, SHT_DYNSYM, SHT_RELA, SHT_SYMTAB};
use goblin::elf::sym::Symtab;
use goblin::elf::Elf;

/// Why an ELF image could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    /// goblin refused it.
    #[error("not a readable ELF file: {0}")]
    Parse(#[from] goblin::error::Error),
}

/// An ELF file's section headers, parsed once.
pub struct Sections<'a> {
    bytes: &'a [u8],
    ctx: Ctx,
    headers: Vec<SectionHeader>,
    names: &'a [u8],
}

/// One symbol table of a file: its symbols and the string table of their
/// names.
pub struct SymbolSection<'a> {
    /// The symbols (parsed one at a time as they are iterated).
    pub symbols: Symtab<'a>,
    /// The section type: `SHT_SYMTAB` or `SHT_DYNSYM`.
    pub kind: u32,
    strings: &'a [u8],
}

impl<'a> SymbolSection<'a> {
    /// The name at `offset` of this table's strings; `None` when it lies
    /// outside them. Bytes that are not UTF-8 are replaced (a name is
    /// for people; one odd name must not cost the whole table).
    pub fn name(&self, offset: usize) -> Option<std::borrow::Cow<'a, str>> {
        cstr(self.strings, offset).map(String::from_utf8_lossy)
    }
}

/// The bytes of the NUL-terminated string at `offset` of `table`.
fn cstr(table: &[u8], offset: usize) -> Option<&[u8]> {
    let rest = table.get(offset..)?;
    Some(&rest[..rest.iter().position(|&b| b == 0).unwrap_or(rest.len())])
}

impl<'a> Sections<'a> {
    /// Reads the ELF header and section headers of `bytes`. An ELF file
    /// without section headers (stripped with `sstrip`, say) gives an empty
    /// list: its callers fall back to goblin's full parse, which finds the
    /// dynamic symbols through the dynamic segment.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, ElfError> {
        let header = Elf::parse_header(bytes)?;
        let ctx = Ctx::new(header.container()?, header.endianness()?);
        let headers = SectionHeader::parse(bytes, header.e_shoff as usize, header.e_shnum as usize, ctx)?;
        let names = headers
            .get(header.e_shstrndx as usize)
            .and_then(|h| section_bytes(bytes, h))
            .unwrap_or(&[]);
        Ok(Sections {
            bytes,
            ctx,
            headers,
            names,
        })
    }

    /// Whether the file has no section headers.
    pub fn is_empty(&self) -> bool {
        self.headers.is_empty()
    }

    /// The sections named `name`.
    pub fn named<'s>(&'s self, name: &'s str) -> impl Iterator<Item = &'s SectionHeader> + 's {
        self.headers
            .iter()
            .filter(move |h| cstr(self.names, h.sh_name) == Some(name.as_bytes()))
    }

    /// The contents of `h` in the file (`None` when they lie outside it or
    /// the section occupies no file space).
    pub fn contents(&self, h: &SectionHeader) -> Option<&'a [u8]> {
        section_bytes(self.bytes, h)
    }

    /// Whether the file has a full symbol table (`.symtab`), not only the
    /// dynamic one: a stripped file has not.
    pub fn has_symtab(&self) -> bool {
        self.headers.iter().any(|h| h.sh_type == SHT_SYMTAB)
    }

    /// The symbol tables (`.symtab` and `.dynsym`), each with its strings.
    /// A table whose bounds lie outside the file is left out.
    pub fn symbol_tables(&self) -> Vec<SymbolSection<'a>> {
        let mut out = Vec::new();
        for h in self
            .headers
            .iter()
            .filter(|h| matches!(h.sh_type, SHT_SYMTAB | SHT_DYNSYM))
        {
            let Some(strings) = self.headers.get(h.sh_link as usize).and_then(|s| self.contents(s)) else {
                continue;
            };
            let count = (h.sh_size as usize).checked_div(h.sh_entsize as usize).unwrap_or(0);
            if let Ok(symbols) = Symtab::parse(self.bytes, h.sh_offset as usize, count, self.ctx) {
                out.push(SymbolSection {
                    symbols,
                    kind: h.sh_type,
                    strings,
                });
            }
        }
        out
    }

    /// Every `SHT_RELA` section's relocations (parsed lazily by goblin).
    pub fn rela_sections(&self) -> impl Iterator<Item = RelocSection<'a>> + '_ {
        self.headers.iter().filter(|h| h.sh_type == SHT_RELA).filter_map(|h| {
            RelocSection::parse(self.bytes, h.sh_offset as usize, h.sh_size as usize, true, self.ctx).ok()
        })
    }
}

/// The link-time addresses in the sections named `name` of an ELF file
/// (empty when it has none), in table order: tables of code addresses such
/// as `__patchable_function_entries` and `__mcount_loc`. They hold
/// absolute addresses in a non-PIE executable, `R_X86_64_RELATIVE` addends
/// (or the implicit addends of `DT_RELR`, which stay in the section) in a
/// PIE or shared object. A zero entry without a relocation belongs to a
/// function the linker discarded and is left out.
pub fn address_table(sections: &Sections, name: &str) -> Vec<u64> {
    words(sections, name).into_iter().filter(|&v| v != 0).collect()
}

/// The 8-byte words of the sections named `name`, in order, with their
/// `R_X86_64_RELATIVE` relocations applied (link-time values); a word
/// that pointed into a discarded section is 0.
pub fn words(sections: &Sections, name: &str) -> Vec<u64> {
    let mut out = Vec::new();
    for sh in sections.named(name) {
        let Some(body) = sections.contents(sh).filter(|b| !b.is_empty()) else {
            continue;
        };
        let (addr, size) = (sh.sh_addr, sh.sh_size);
        let mut relative: Vec<(u64, u64)> = Vec::new();
        for rela in sections.rela_sections() {
            relative.extend(
                rela.iter()
                    .filter(|r| {
                        r.r_type == goblin::elf::reloc::R_X86_64_RELATIVE
                            && r.r_offset >= addr
                            && r.r_offset < addr + size
                    })
                    .map(|r| (r.r_offset, r.r_addend.unwrap_or(0) as u64)),
            );
        }
        relative.sort_unstable();
        for (i, w) in body.chunks_exact(8).enumerate() {
            let at = addr + 8 * i as u64;
            let v = u64::from_le_bytes(w.try_into().expect("8 bytes"));
            match relative.binary_search_by_key(&at, |r| r.0) {
                Ok(k) => out.push(relative[k].1),
                Err(_) => out.push(v),
            }
        }
    }
    out
}

fn section_bytes<'a>(bytes: &'a [u8], h: &SectionHeader) -> Option<&'a [u8]> {
    if h.sh_type == goblin::elf::section_header::SHT_NOBITS {
        return None;
    }
    let start = h.sh_offset as usize;
    bytes.get(start..start.checked_add(h.sh_size as usize)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_read_to_their_nul_and_not_past_the_table() {
        let t = b"\0main\0f\xffg\0tail";
        assert_eq!(cstr(t, 1), Some(&b"main"[..]));
        assert_eq!(cstr(t, 0), Some(&b""[..]));
        // The last name has no NUL: it ends with the table.
        assert_eq!(cstr(t, 10), Some(&b"tail"[..]));
        assert_eq!(cstr(t, 14), Some(&b""[..]));
        assert_eq!(cstr(t, 15), None);
        let s = SymbolSection {
            symbols: Symtab::default(),
            kind: SHT_SYMTAB,
            strings: t,
        };
        assert_eq!(s.name(6).as_deref(), Some("f\u{fffd}g"));
    }

    #[test]
    fn the_test_binary_itself_has_symbols_and_no_sled_table() {
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let s = Sections::parse(&exe).unwrap();
        assert!(!s.is_empty());
        assert!(s.named(".text").count() == 1);
        assert_eq!(s.named(crate::patchable::SECTION).count(), 0);
        let tables = s.symbol_tables();
        assert!(tables.iter().any(|t| t.kind == SHT_SYMTAB && t.symbols.len() > 100));
    }
}
