//! The loaded modules (executable and shared libraries): their mapped
//! segments, for safe reads of live code, and their function symbols.
//!
//! Built from `dl_iterate_phdr` on first use and rebuilt when a hook comes
//! from an address no known module covers (a library `dlopen`ed since) and
//! after `dlclose`. Reading the ELF files allocates; it happens at start-up
//! and in discovery, never on the hook fast path. The runtime's own shared
//! library is listed (its segments) but its symbols are not read.
//!
//! A module's sled table is read when the module is first seen, and its
//! symbols too when it has sleds (registration names every sled's
//! function). The others (the C library, the loader, `libm`: usually no
//! probe sites at all) answer their first few look-ups by a pass over the
//! file's symbols each ([`SymbolTable::function_at`]), from the mapping
//! kept since (a file replaced on disk meanwhile cannot give the wrong
//! names), and build their table only when asked more often: a module with
//! probe sites is asked once per site. Reading every module's table at
//! start-up was a large share of a sled build's start-up (mostly the C
//! library's thousands of names, one allocation each), for a report that
//! names one function there, the caller of `main`.

use parking_lot::Mutex;
use providers::elf::{Function, SymbolTable};
use providers::Memory;
use std::ffi::CStr;
use std::sync::{Arc, OnceLock};

/// Look-ups a module answers by a pass over its symbols each before it
/// builds its table.
const SCANS: usize = 8;

/// One loaded module.
#[derive(Debug)]
pub struct Module {
    /// Path ("" for the main executable until resolved).
    pub path: String,
    /// Load bias.
    pub bias: u64,
    /// Readable PT_LOAD ranges `[start, end)` (page-rounded), with whether
    /// each is executable.
    pub segments: Vec<(u64, u64, bool)>,
    /// Function symbols at run-time addresses, read on first use
    /// ([`Module::symbols`]).
    symbols: OnceLock<SymbolTable>,
    /// The module file, mapped (`None`: no symbols to read).
    file: Option<memmap2::Mmap>,
    /// Its separate debug file, mapped, where the module file is stripped
    /// and one is installed: resolved on the first look-up, and then the
    /// source of every name (see [`Module::symbol_bytes`]).
    debug: OnceLock<Option<memmap2::Mmap>>,
    /// Look-ups answered before the table was built, by address; their
    /// functions are leaked (at most [`SCANS`] per module).
    scanned: Mutex<Vec<(u64, Option<&'static Function>)>>,
    /// Run-time addresses its `__patchable_function_entries` table records
    /// (the `-fpatchable-function-entry` sleds), in table order.
    pub sleds: Vec<u64>,
    /// Its `-pg` profiling sites ([`providers::mcount`]) at run-time
    /// addresses, as the file holds them.
    pub mcount: Vec<providers::mcount::McountSite>,
    /// Its point probes (`fastinst::probe!`, [`providers::points`]) at
    /// run-time addresses.
    pub points: Vec<providers::points::Point>,
    /// Its XRay entry sleds ([`providers::xray`]) at run-time addresses.
    pub xray: Vec<providers::xray::XraySled>,
    /// Its index in the runtime's module list (stable: modules are never
    /// removed from the list, only marked unloaded).
    pub index: u32,
}

impl Module {
    /// The GOT slots this module calls the `-finstrument-functions` hooks
    /// through, and its RELRO range, from its file; none without one.
    pub(crate) fn hook_slots(&self) -> providers::hookslots::ModuleSlots {
        match self
            .file
            .as_deref()
            .map(|b| providers::hookslots::of_file(b, self.bias))
        {
            Some(Ok(found)) => found,
            Some(Err(e)) => {
                crate::log::debug(format_args!("no hook slots read of {}: {e}", self.path));
                Default::default()
            }
            None => Default::default(),
        }
    }

    /// Whether it has sites registered up front: sleds, `-pg` sites,
    /// points or XRay sleds.
    pub fn has_sites(&self) -> bool {
        !(self.sleds.is_empty() && self.mcount.is_empty() && self.points.is_empty() && self.xray.is_empty())
    }

    /// True if `addr` lies in one of its segments.
    pub fn contains(&self, addr: u64) -> bool {
        self.segments.iter().any(|&(s, e, _)| addr >= s && addr < e)
    }

    /// The function containing `addr`.
    pub fn function(&self, addr: u64) -> Option<&Function> {
        if let Some(t) = self.symbols.get() {
            return t.containing(addr);
        }
        let bytes = self.symbol_bytes()?;
        let mut scanned = self.scanned.lock();
        if let Some(&(_, f)) = scanned.iter().find(|(a, _)| *a == addr) {
            return f;
        }
        if scanned.len() >= SCANS {
            drop(scanned);
            return self.symbols().containing(addr);
        }
        let found = providers::sections::Sections::parse(bytes)
            .and_then(|sections| SymbolTable::function_at(&sections, bytes, self.bias, addr))
            .unwrap_or_else(|e| {
                crate::log::warn(format_args!("no symbols for {}: {e}", self.path));
                None
            });
        let f = found.map(|f| &*Box::leak(Box::new(f)));
        scanned.push((addr, f));
        f
    }

    /// Its function symbols at run-time addresses (read now if not yet).
    pub fn symbols(&self) -> &SymbolTable {
        self.symbols.get_or_init(|| match self.symbol_bytes() {
            Some(bytes) => read_symbols(&self.path, bytes, self.bias),
            None => SymbolTable::default(),
        })
    }

    /// The file its names come from: its separate debug file where it is
    /// stripped and one is installed (as `perf report` names a stripped C
    /// library's `_int_malloc`, not the exported symbol below it), else
    /// its own. One source for every look-up, scanned or tabled.
    fn symbol_bytes(&self) -> Option<&[u8]> {
        let own = self.file.as_deref()?;
        Some(self.debug.get_or_init(|| debug_mapping(own)).as_deref().unwrap_or(own))
    }
}

/// A snapshot of the loaded modules.
#[derive(Clone, Debug, Default)]
pub struct Modules {
    /// Modules loaded now.
    pub loaded: Vec<Arc<Module>>,
}

impl Modules {
    /// The module containing `addr`.
    pub fn find(&self, addr: u64) -> Option<&Arc<Module>> {
        self.loaded.iter().find(|m| m.contains(addr))
    }
}

struct Seen {
    path: String,
    bias: u64,
    segments: Vec<(u64, u64, bool)>,
}

unsafe extern "C" fn collect(info: *mut libc::dl_phdr_info, _size: usize, data: *mut libc::c_void) -> libc::c_int {
    // SAFETY: dl_iterate_phdr passes a valid info for the duration of the
    // call, and `data` is the Vec<Seen> that `scan` passed.
    let (info, out) = unsafe { (&*info, &mut *(data as *mut Vec<Seen>)) };
    let path = if info.dlpi_name.is_null() {
        String::new()
    } else {
        // SAFETY: a non-null dlpi_name is a NUL-terminated string.
        unsafe { CStr::from_ptr(info.dlpi_name) }.to_string_lossy().into_owned()
    };
    let mut segments = Vec::new();
    for i in 0..info.dlpi_phnum as usize {
        // SAFETY: dlpi_phdr points to dlpi_phnum program headers.
        let ph = unsafe { &*info.dlpi_phdr.add(i) };
        if ph.p_type == libc::PT_LOAD && ph.p_flags & libc::PF_R != 0 {
            let start = (info.dlpi_addr + ph.p_vaddr) & !0xFFF;
            let end = (info.dlpi_addr + ph.p_vaddr + ph.p_memsz + 0xFFF) & !0xFFF;
            segments.push((start, end, ph.p_flags & libc::PF_X != 0));
        }
    }
    out.push(Seen {
        path,
        bias: info.dlpi_addr,
        segments,
    });
    0
}

unsafe extern "C" fn adds(info: *mut libc::dl_phdr_info, size: usize, data: *mut libc::c_void) -> libc::c_int {
    if size >= std::mem::size_of::<libc::dl_phdr_info>() {
        // SAFETY: the loader passes a valid info of `size` bytes and `data`
        // is the u64 `load_count` passed.
        unsafe { *(data as *mut u64) = (*info).dlpi_adds };
    }
    1
}

/// How many modules the loader has loaded so far (its `dlpi_adds`
/// counter): a cheap test for "has anything been `dlopen`ed since".
pub(crate) fn load_count() -> u64 {
    let mut n = 0u64;
    // SAFETY: `adds` matches the callback type and only writes `n`.
    unsafe { libc::dl_iterate_phdr(Some(adds), &mut n as *mut u64 as *mut libc::c_void) };
    n
}

fn scan() -> Vec<Seen> {
    let mut out: Vec<Seen> = Vec::new();
    // SAFETY: `collect` matches the callback type and only touches `out`.
    unsafe { libc::dl_iterate_phdr(Some(collect), &mut out as *mut Vec<Seen> as *mut libc::c_void) };
    out
}

/// The module file at `path`, mapped, and its sled table at run-time
/// addresses. The file is mapped, not read: only the pages holding the ELF
/// headers, the section headers and the sled table are touched now, and the
/// symbol and string tables when [`Module::symbols`] reads them.
fn read_module(path: &str, bias: u64) -> ModuleFile {
    let file = file_of(path);
    if path.starts_with("linux-vdso") || path.starts_with("linux-gate") {
        return Default::default();
    }
    let map = std::fs::File::open(file).and_then(|f| {
        // SAFETY: a read-only private mapping of a module file the loader
        // has mapped too. If the file were truncated while mapped, reading
        // past its end would fault — as the loaded code itself would.
        unsafe { memmap2::Mmap::map(&f) }
    });
    let bytes = match map {
        Ok(b) => b,
        Err(e) => {
            crate::log::debug(format_args!("no symbols for {file}: {e}"));
            return Default::default();
        }
    };
    let (sleds, mcount, points, xray) = match providers::sections::Sections::parse(&bytes) {
        Ok(sections) => {
            let sleds = providers::patchable::table(&sections)
                .into_iter()
                .map(|a| a.wrapping_add(bias))
                .collect();
            let points = points(file, &sections, &bytes, bias);
            let xray = providers::xray::entry_sleds(&sections)
                .into_iter()
                .map(|s| s.moved(bias))
                .collect();
            (sleds, mcount_sites(file, &sections, &bytes, bias), points, xray)
        }
        // Said again, with the file's name, if its symbols are ever read.
        Err(_) => Default::default(),
    };
    (Some(bytes), sleds, mcount, points, xray)
}

/// The point probes of module file `bytes` at run-time addresses.
fn points(
    file: &str,
    sections: &providers::sections::Sections,
    bytes: &[u8],
    bias: u64,
) -> Vec<providers::points::Point> {
    if !providers::points::has_points(sections) {
        return Vec::new();
    }
    match providers::points::points_in_elf(bytes) {
        Ok((found, unusable)) => {
            if let Some((at, why)) = unusable.first() {
                crate::log::warn(format_args!(
                    "{} point probes of {file} left alone, the first at {at:#x}: {why}",
                    unusable.len()
                ));
            }
            found
                .into_iter()
                .map(|p| providers::points::Point {
                    addr: p.addr.wrapping_add(bias),
                    ..p
                })
                .collect()
        }
        Err(e) => {
            crate::log::warn(format_args!("point probes of {file} not read: {e}"));
            Vec::new()
        }
    }
}

/// What [`read_module`] gives: the mapped file, its sled table, its `-pg`
/// sites, its point probes and its XRay sleds, at run-time addresses.
type ModuleFile = (
    Option<memmap2::Mmap>,
    Vec<u64>,
    Vec<providers::mcount::McountSite>,
    Vec<providers::points::Point>,
    Vec<providers::xray::XraySled>,
);

/// The `-pg` sites of module file `bytes`, where it may have any (the
/// check reads no code: see [`providers::mcount::wanted`]).
fn mcount_sites(
    file: &str,
    sections: &providers::sections::Sections,
    bytes: &[u8],
    bias: u64,
) -> Vec<providers::mcount::McountSite> {
    if !providers::mcount::wanted(sections) {
        return Vec::new();
    }
    match providers::mcount::sites_in_elf(bytes) {
        Ok(found) => {
            if !found.unusable.is_empty() {
                crate::log::warn(format_args!(
                    "{} -pg sites of {file} left alone, the first at {:#x}: {}",
                    found.unusable.len(),
                    found.unusable[0].0,
                    found.unusable[0].1
                ));
            }
            found.sites.into_iter().map(|s| s.moved(bias)).collect()
        }
        Err(e) => {
            crate::log::warn(format_args!("-pg sites of {file} not read: {e}"));
            Vec::new()
        }
    }
}

/// The function symbols of module file `bytes` (named `path` in warnings)
/// at run-time addresses.
fn read_symbols(path: &str, bytes: &[u8], bias: u64) -> SymbolTable {
    let file = file_of(path);
    let sections = match providers::sections::Sections::parse(bytes) {
        Ok(s) => s,
        Err(e) => {
            crate::log::warn(format_args!("no symbols for {file}: {e}"));
            return SymbolTable::default();
        }
    };
    SymbolTable::from_sections(&sections, bytes, bias).unwrap_or_else(|e| {
        crate::log::warn(format_args!("no symbols for {file}: {e}"));
        SymbolTable::default()
    })
}

/// The separate debug file of a stripped module file `own` (no `.symtab`:
/// Debian's C library), by build id under `/usr/lib/debug`, mapped; `None`
/// for a file with its own full table or without a debug file.
fn debug_mapping(own: &[u8]) -> Option<memmap2::Mmap> {
    if providers::sections::Sections::parse(own).ok()?.has_symtab() {
        return None;
    }
    let path = providers::elf::debug_file(&providers::elf::build_id(own)?)?;
    let f = std::fs::File::open(path).ok()?;
    // SAFETY: a read-only private mapping of a debug file, read as the
    // module file is (see `read_module`).
    unsafe { memmap2::Mmap::map(&f) }.ok()
}

/// The file of the module at `path` ("" is the executable).
fn file_of(path: &str) -> &str {
    if path.is_empty() {
        "/proc/self/exe"
    } else {
        path
    }
}

/// Whether `s` is the shared library this runtime is part of
/// (`libfastinst.so`). Its symbols are not read: it has no probe sites, no
/// probed function calls into it, and its symbol table (thousands of Rust
/// names, each demangled) was the largest part of start-up. The runtime
/// linked into an executable is not skipped: the executable has sites.
fn is_runtime_library(s: &Seen) -> bool {
    let here = read_module as fn(&str, u64) -> ModuleFile as usize as u64;
    !s.path.is_empty() && s.segments.iter().any(|&(a, b, _)| here >= a && here < b)
}

/// Rescans the loaded modules, keeping the records of those still loaded
/// (matched by path and bias) and reading symbols of new ones. `next_index`
/// numbers new modules. Returns the new snapshot and the modules that are
/// gone.
pub(crate) fn rescan(old: &Modules, next_index: &mut u32) -> (Modules, Vec<Arc<Module>>) {
    let seen = scan();
    let mut loaded = Vec::with_capacity(seen.len());
    for s in seen {
        if s.segments.is_empty() {
            continue;
        }
        // The executable has no name in dl_iterate_phdr; its record keeps
        // the resolved path, which is what a rescan must match.
        let path = if s.path.is_empty() {
            std::fs::read_link("/proc/self/exe")
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default()
        } else {
            s.path.clone()
        };
        if let Some(m) = old.loaded.iter().find(|m| m.path == path && m.bias == s.bias) {
            loaded.push(m.clone());
            continue;
        }
        let (file, sleds, mcount, points, xray) = if is_runtime_library(&s) {
            Default::default()
        } else {
            read_module(&s.path, s.bias)
        };
        let m = Module {
            path,
            bias: s.bias,
            segments: s.segments,
            symbols: OnceLock::new(),
            file,
            debug: OnceLock::new(),
            scanned: Mutex::new(Vec::new()),
            sleds,
            mcount,
            points,
            xray,
            index: *next_index,
        };
        if m.has_sites() {
            // Registration names every sled's function right away.
            m.symbols();
        }
        loaded.push(Arc::new(m));
        *next_index += 1;
    }
    let gone = old
        .loaded
        .iter()
        .filter(|m| !loaded.iter().any(|n| Arc::ptr_eq(m, n)))
        .cloned()
        .collect();
    (Modules { loaded }, gone)
}

/// Live process memory, readable only inside the loaded modules' segments,
/// with the runtime's patched instructions as the decode overlay.
pub(crate) struct LiveMemory<'a> {
    pub modules: &'a Modules,
}

impl Memory for LiveMemory<'_> {
    fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
        let Some(end) = addr.checked_add(buf.len() as u64) else {
            return false;
        };
        let ok = self
            .modules
            .loaded
            .iter()
            .any(|m| m.segments.iter().any(|&(s, e, _)| addr >= s && end <= e));
        if ok {
            // SAFETY: the range lies inside a readable PT_LOAD segment of a
            // module that is loaded (modules are unloaded only under the
            // discovery lock, which the caller holds).
            unsafe { wordpatch::read_code(addr as *const u8, buf) };
        }
        ok
    }

    fn patched_len(&self, addr: u64) -> Option<usize> {
        crate::sitetable::get(crate::sitetable::key::patched(addr)).map(|v| v as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_module_without_sleds_reads_its_symbols_only_when_asked_often() {
        let (mods, _) = rescan(&Modules::default(), &mut 0);
        // Not an IFUNC like `strlen`, whose address is an unnamed variant.
        let qsort = libc::qsort as *const () as u64;
        let libc = mods.find(qsort).expect("the C library is loaded");
        assert!(libc.sleds.is_empty());
        assert!(libc.symbols.get().is_none(), "read before use");
        let f = libc.function(qsort).expect("qsort has a symbol");
        assert!(f.name.contains("qsort"), "{}", f.name);
        assert_eq!(libc.function(qsort), Some(f), "asked again");
        // Other functions, from the table of the file its names come from
        // (its debug file where one is installed): the first SCANS distinct
        // look-ups scan, the next builds the table.
        let table = SymbolTable::from_elf(libc.symbol_bytes().unwrap(), libc.bias).unwrap();
        let others: Vec<&Function> = table
            .iter()
            .filter(|g| g.start != f.start)
            .step_by(97)
            .take(SCANS)
            .collect();
        for (k, g) in others.iter().enumerate() {
            assert!(libc.symbols.get().is_none(), "built after {} look-ups", k + 1);
            assert_eq!(libc.function(g.start + g.size / 2), Some(*g));
        }
        assert!(
            libc.symbols.get().is_some(),
            "still not built after {} look-ups",
            SCANS + 1
        );
        assert_eq!(libc.function(qsort), Some(f));
    }
}
