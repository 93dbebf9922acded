//! Function symbols of an ELF image, demangled (goblin, cpp_demangle,
//! rustc-demangle).

use crate::sections::Sections;
use goblin::elf::section_header::SHT_SYMTAB;
use goblin::elf::{sym, Elf};

/// A function symbol, at its run-time address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Function {
    /// First byte.
    pub start: u64,
    /// Size in bytes (0 when the symbol table does not say).
    pub size: u64,
    /// Demangled name.
    pub name: String,
}

impl Function {
    /// One past the last byte.
    pub fn end(&self) -> u64 {
        self.start + self.size
    }
}

/// Why an ELF image could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    /// goblin refused it.
    #[error("not a readable ELF file: {0}")]
    Parse(#[from] goblin::error::Error),
}

/// The function symbols of one module, sorted by address.
#[derive(Clone, Debug, Default)]
pub struct SymbolTable {
    funcs: Vec<Function>,
}

impl SymbolTable {
    /// The defined function symbols of `.symtab` and `.dynsym`, moved by
    /// `bias` (the module's load bias; 0 for a non-PIE executable). One name
    /// per address: `.symtab` first, then global before local.
    pub fn from_elf(bytes: &[u8], bias: u64) -> Result<Self, ElfError> {
        Self::from_sections(&Sections::parse(bytes)?, bytes, bias)
    }

    /// [`SymbolTable::from_elf`] of a file whose section headers are read
    /// already. A file without section headers is parsed in full by goblin,
    /// which finds its dynamic symbols through the dynamic segment.
    pub fn from_sections(sections: &Sections, bytes: &[u8], bias: u64) -> Result<Self, ElfError> {
        let mut funcs: Vec<(Function, u8)> = Vec::new();
        let mut add = |s: &sym::Sym, name: Option<std::borrow::Cow<str>>, rank: u8| {
            if s.st_type() != sym::STT_FUNC && s.st_type() != sym::STT_GNU_IFUNC {
                return;
            }
            if s.st_shndx == 0 || s.st_value == 0 {
                return;
            }
            let Some(name) = name else { return };
            funcs.push((
                Function {
                    start: s.st_value.wrapping_add(bias),
                    size: s.st_size,
                    name: name.into_owned(),
                },
                rank + u8::from(s.st_bind() == sym::STB_LOCAL),
            ));
        };
        if sections.is_empty() {
            let elf = Elf::parse(bytes)?;
            for (syms, strs, rank) in [(&elf.syms, &elf.strtab, 0u8), (&elf.dynsyms, &elf.dynstrtab, 2u8)] {
                for s in syms.iter() {
                    add(&s, strs.get_at(s.st_name).map(Into::into), rank);
                }
            }
        } else {
            for t in sections.symbol_tables() {
                let rank = if t.kind == SHT_SYMTAB { 0 } else { 2 };
                for s in t.symbols.iter() {
                    add(&s, t.name(s.st_name), rank);
                }
            }
        }
        funcs.sort_unstable_by(|a, b| a.0.start.cmp(&b.0.start).then(a.1.cmp(&b.1)));
        funcs.dedup_by(|later, first| later.0.start == first.0.start);
        Ok(SymbolTable {
            funcs: funcs
                .into_iter()
                .map(|(mut f, _)| {
                    if let Some(d) = demangled(&f.name) {
                        f.name = d;
                    }
                    f
                })
                .collect(),
        })
    }

    /// A table of the given functions (for tests and other providers).
    pub fn from_functions(mut funcs: Vec<Function>) -> Self {
        funcs.sort_by_key(|f| f.start);
        SymbolTable { funcs }
    }

    /// The function whose bytes contain `addr` (or that starts at it).
    pub fn containing(&self, addr: u64) -> Option<&Function> {
        let i = self.funcs.partition_point(|f| f.start <= addr);
        let f = self.funcs.get(i.checked_sub(1)?)?;
        (addr == f.start || addr < f.end()).then_some(f)
    }

    /// The first function that starts at or after `addr`.
    pub fn first_from(&self, addr: u64) -> Option<&Function> {
        self.funcs.get(self.funcs.partition_point(|f| f.start < addr))
    }

    /// Number of functions.
    pub fn len(&self) -> usize {
        self.funcs.len()
    }

    /// True if there are none.
    pub fn is_empty(&self) -> bool {
        self.funcs.is_empty()
    }

    /// All functions, sorted by address.
    pub fn iter(&self) -> impl Iterator<Item = &Function> {
        self.funcs.iter()
    }
}

/// Demangles a C++ (Itanium) or Rust (legacy or v0) symbol; other names are
/// returned as they are.
pub fn demangle(name: &str) -> String {
    demangled(name).unwrap_or_else(|| name.to_string())
}

/// The demangled form of `name`, or `None` when it is not a mangled C++ or
/// Rust name (most C symbols: the caller keeps the name it has, uncopied).
fn demangled(name: &str) -> Option<String> {
    if name.starts_with("_R") || name.starts_with("_ZN") {
        if let Ok(d) = rustc_demangle::try_demangle(name) {
            let s = format!("{d:#}");
            // rustc-demangle accepts many C++ names as legacy Rust paths;
            // only trust it when the result looks like a Rust path.
            if name.starts_with("_R") || name.contains("17h") {
                return Some(s);
            }
        }
    }
    if name.starts_with("_Z") {
        if let Ok(sym) = cpp_demangle::Symbol::new(name) {
            if let Ok(s) = sym.demangle(&cpp_demangle::DemangleOptions::default()) {
                return Some(s);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demangles_cpp_and_rust() {
        assert_eq!(demangle("_ZN3foo3barEv"), "foo::bar()");
        assert_eq!(demangle("_Z3addii"), "add(int, int)");
        assert_eq!(demangle("_ZN4core3fmt5write17h0123456789abcdefE"), "core::fmt::write");
        assert_eq!(demangle("_RNvCs1234_7mycrate4main"), "mycrate::main");
        assert_eq!(demangle("main"), "main");
    }

    #[test]
    fn containing_respects_bounds() {
        let t = SymbolTable::from_functions(vec![
            Function {
                start: 0x1000,
                size: 0x10,
                name: "a".into(),
            },
            Function {
                start: 0x1020,
                size: 0,
                name: "b".into(),
            },
        ]);
        assert_eq!(t.containing(0x1000).unwrap().name, "a");
        assert_eq!(t.containing(0x100f).unwrap().name, "a");
        assert!(t.containing(0x1010).is_none());
        assert_eq!(t.containing(0x1020).unwrap().name, "b");
        assert!(t.containing(0x0fff).is_none());
    }

    #[test]
    fn reads_this_test_binary() {
        let exe = std::fs::read("/proc/self/exe").unwrap();
        let t = SymbolTable::from_elf(&exe, 0).unwrap();
        assert!(
            t.iter().any(|f| f.name.contains("reads_this_test_binary")),
            "{} functions",
            t.len()
        );
    }
}
