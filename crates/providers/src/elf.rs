//! Function symbols of an ELF image, demangled (goblin, cpp_demangle,
//! rustc-demangle).

pub use crate::sections::ElfError;
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

/// The function symbols of one module, sorted by address.
#[derive(Clone, Debug, Default)]
pub struct SymbolTable {
    funcs: Vec<Function>,
}

impl SymbolTable {
    /// The defined function symbols of `.symtab` and `.dynsym`, moved by
    /// `bias` (the module's load bias; 0 for a non-PIE executable). One name
    /// per address: `.symtab` first, then global before local, then the
    /// first in the file.
    pub fn from_elf(bytes: &[u8], bias: u64) -> Result<Self, ElfError> {
        Self::from_sections(&Sections::parse(bytes)?, bytes, bias)
    }

    /// [`SymbolTable::from_elf`] of a file whose section headers are read
    /// already. A file without section headers is parsed in full by goblin,
    /// which finds its dynamic symbols through the dynamic segment.
    pub fn from_sections(sections: &Sections, bytes: &[u8], bias: u64) -> Result<Self, ElfError> {
        Self::collect(sections, bytes, bias, true)
    }

    /// [`SymbolTable::from_sections`]'s functions, each with an empty name:
    /// for a caller after their extents alone (where a module's sleds
    /// enter their functions). Reading, copying and demangling every name
    /// was most of the time an attach spent on a module's sites.
    pub fn extents_from_sections(sections: &Sections, bytes: &[u8], bias: u64) -> Result<Self, ElfError> {
        Self::collect(sections, bytes, bias, false)
    }

    /// The named function symbols, one per start, each demangled if
    /// `names`, else nameless.
    fn collect(sections: &Sections, bytes: &[u8], bias: u64, names: bool) -> Result<Self, ElfError> {
        let mut funcs: Vec<(Function, u8)> = Vec::new();
        each_function(sections, bytes, bias, |start, size, name, rank| {
            if let Some(name) = name() {
                let name = if names { name.into_owned() } else { String::new() };
                funcs.push((Function { start, size, name }, rank))
            }
        })?;
        // Stable: of the names at one start and rank (code folded by the
        // linker), the first in the file is kept, as `function_at` keeps it.
        funcs.sort_by(|a, b| a.0.start.cmp(&b.0.start).then(a.1.cmp(&b.1)));
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

    /// The function containing `addr`, exactly as
    /// `from_sections(sections, bytes, bias)?.containing(addr)` finds it,
    /// by one pass over the symbols that copies only the name it returns:
    /// for a module asked about one or two addresses (the C library, which
    /// holds the caller of `main`), building its whole table (thousands
    /// of names, each a copy) cost more than everything else asked of it.
    pub fn function_at(sections: &Sections, bytes: &[u8], bias: u64, addr: u64) -> Result<Option<Function>, ElfError> {
        // (start, rank, size, name) of the best candidate so far: the
        // highest start at or below `addr`, and of those the lowest rank
        // (the one `from_sections` keeps), among the named; a name is read
        // only for a symbol that would be the best.
        let mut best: Option<(u64, u8, u64, std::borrow::Cow<str>)> = None;
        each_function(sections, bytes, bias, |start, size, name, rank| {
            if start > addr {
                return;
            }
            if best
                .as_ref()
                .is_none_or(|b| start > b.0 || (start == b.0 && rank < b.1))
            {
                if let Some(name) = name() {
                    best = Some((start, rank, size, name));
                }
            }
        })?;
        Ok(best.and_then(|(start, _, size, name)| {
            let f = Function {
                start,
                size,
                name: demangled(&name).unwrap_or_else(|| name.into_owned()),
            };
            (addr == f.start || addr < f.end()).then_some(f)
        }))
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

/// Calls `visit(start, size, name, rank)` for each defined function symbol
/// of `.symtab` and `.dynsym`, its start moved by `bias`. `rank` orders the
/// symbols that share a start, lowest first: `.symtab` before `.dynsym`,
/// global before local. `name` reads the symbol's name when called: most
/// symbols of a table are not functions, and a caller after one address
/// needs one name, not thousands (each a UTF-8 check, and a copy where it
/// is not valid).
fn each_function<'a>(
    sections: &Sections<'a>,
    bytes: &'a [u8],
    bias: u64,
    mut visit: impl FnMut(u64, u64, &dyn Fn() -> Option<std::borrow::Cow<'a, str>>, u8),
) -> Result<(), ElfError> {
    let mut add = |s: &sym::Sym, name: &dyn Fn() -> Option<std::borrow::Cow<'a, str>>, rank: u8| {
        if s.st_type() != sym::STT_FUNC && s.st_type() != sym::STT_GNU_IFUNC {
            return;
        }
        if s.st_shndx == 0 || s.st_value == 0 {
            return;
        }
        visit(
            s.st_value.wrapping_add(bias),
            s.st_size,
            name,
            rank + u8::from(s.st_bind() == sym::STB_LOCAL),
        );
    };
    if sections.is_empty() {
        let elf = Elf::parse(bytes)?;
        for (syms, strs, rank) in [(&elf.syms, &elf.strtab, 0u8), (&elf.dynsyms, &elf.dynstrtab, 2u8)] {
            for s in syms.iter() {
                add(&s, &|| strs.get_at(s.st_name).map(Into::into), rank);
            }
        }
    } else {
        for t in sections.symbol_tables() {
            let rank = if t.kind == SHT_SYMTAB { 0 } else { 2 };
            for s in t.symbols.iter() {
                add(&s, &|| t.name(s.st_name), rank);
            }
        }
    }
    Ok(())
}

/// The GNU build id of an ELF image (its `NT_GNU_BUILD_ID` note), which
/// names its separate debug file (`/usr/lib/debug/.build-id/xx/rest.debug`).
pub fn build_id(bytes: &[u8]) -> Option<Vec<u8>> {
    let elf = Elf::parse(bytes).ok()?;
    let notes = elf.iter_note_headers(bytes)?;
    for note in notes.flatten() {
        if note.n_type == goblin::elf::note::NT_GNU_BUILD_ID && note.name == "GNU" {
            return Some(note.desc.to_vec());
        }
    }
    None
}

/// The separate debug file of an image with build id `id`, under
/// `/usr/lib/debug/.build-id` (Debian's `-dbg` and `-dbgsym` packages).
pub fn debug_file(id: &[u8]) -> Option<std::path::PathBuf> {
    let (first, rest) = id.split_first()?;
    let hex: String = rest.iter().map(|b| format!("{b:02x}")).collect();
    let p = std::path::PathBuf::from(format!("/usr/lib/debug/.build-id/{first:02x}/{hex}.debug"));
    p.exists().then_some(p)
}

/// Demangles a C++ (Itanium) or Rust (legacy or v0) symbol; other names are
/// returned as they are.
pub fn demangle(name: &str) -> String {
    demangled(name).unwrap_or_else(|| name.to_string())
}

/// The prefix `#[fastinst::instrument]` gives a function's sled function
/// (`fastinst-macros`: keep the two in step).
pub const RUST_SLED_PREFIX: &str = "__fastinst_sled_";
/// The prefix of the function a `#[fastinst::instrument]` sled function
/// jumps to, which holds the body (`fastinst-macros`: keep in step).
pub const RUST_BODY_PREFIX: &str = "__fastinst_body_";

/// The name of the function a `#[fastinst::instrument]` sled function
/// stands for: `m::f::__fastinst_sled_f` (nested in `m::f`) is `m::f`,
/// `m::T::__fastinst_sled_g` (beside `g` in an impl) is `m::T::g`. Other
/// names are returned as they are.
pub fn rust_sled_name(name: String) -> String {
    let Some(at) = name.rfind(RUST_SLED_PREFIX) else {
        return name;
    };
    let f = &name[at + RUST_SLED_PREFIX.len()..];
    let parent = name[..at].strip_suffix("::").unwrap_or(&name[..at]);
    if parent.rsplit("::").next() == Some(f) {
        parent.to_string()
    } else if parent.is_empty() {
        f.to_string()
    } else {
        format!("{parent}::{f}")
    }
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
                return Some(rust_sled_name(s));
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
        // `#[fastinst::instrument]`'s sled functions, nested and beside.
        assert_eq!(rust_sled_name("nk::fib::__fastinst_sled_fib".into()), "nk::fib");
        assert_eq!(rust_sled_name("nk::S<T>::__fastinst_sled_m".into()), "nk::S<T>::m");
        assert_eq!(rust_sled_name("__fastinst_sled_x".into()), "x");
        assert_eq!(rust_sled_name("a::b".into()), "a::b");
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

    #[test]
    fn one_lookup_finds_what_the_table_finds() {
        // This test binary (thousands of Rust functions, demangled) and the
        // C library (IFUNCs, aliases at one address, `.dynsym` only).
        let libc = std::fs::read_to_string("/proc/self/maps")
            .ok()
            .and_then(|m| {
                m.lines()
                    .filter_map(|l| l.split_whitespace().nth(5))
                    .find(|p| p.contains("libc.so"))
                    .map(String::from)
            })
            .expect("the C library is mapped");
        for path in ["/proc/self/exe", libc.as_str()] {
            let bytes = std::fs::read(path).unwrap();
            let sections = Sections::parse(&bytes).unwrap();
            let bias = 0x5555_0000_0000;
            let t = SymbolTable::from_sections(&sections, &bytes, bias).unwrap();
            assert!(t.len() > 500, "{path}: {} functions", t.len());
            let mut probes = vec![0, bias, u64::MAX];
            for f in t.iter().step_by(t.len() / 300) {
                probes.extend([
                    f.start - 1,
                    f.start,
                    f.start + f.size / 2,
                    f.end().saturating_sub(1),
                    f.end(),
                ]);
            }
            for addr in probes {
                let one = SymbolTable::function_at(&sections, &bytes, bias, addr).unwrap();
                assert_eq!(one.as_ref(), t.containing(addr), "{path} at {addr:#x}");
            }
            // The extents alone: the same functions, unnamed.
            let e = SymbolTable::extents_from_sections(&sections, &bytes, bias).unwrap();
            let extents = |t: &SymbolTable| t.iter().map(|f| (f.start, f.size)).collect::<Vec<_>>();
            assert_eq!(extents(&e), extents(&t), "{path}");
            assert!(e.iter().all(|f| f.name.is_empty()));
        }
    }
}
