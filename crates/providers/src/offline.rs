//! Probe sites of an ELF file on disk, found without running it.
//!
//! The run-time recognisers ([`call_site_at`], [`tail_sites`]) read code
//! through [`Memory`](crate::Memory); here they read an [`Image`] of the file's loadable
//! segments instead, so a listing shows exactly the sites the runtime would
//! recognise. What the dynamic linker would have done is stood in for: every
//! GOT slot that a relocation binds to `__cyg_profile_func_enter` or
//! `_exit` is filled with a stand-in hook address that no code can reach
//! otherwise, so PLT stubs and `-fno-plt` slots resolve to "the hook" just as
//! they do in a running process. A file that defines the hooks itself (a
//! static link) uses the symbols' own addresses.
//!
//! `-fpatchable-function-entry` sleds come from their ELF table and are
//! validated as the runtime validates them ([`patchable::sled_at`]); each
//! is listed once, as an entry site of form `sled` (its exit probe has no
//! site of its own). So are the `-pg` builds' profiling calls and NOPs
//! ([`crate::mcount`]) and XRay's entry sleds ([`crate::xray`]), which the
//! runtime turns into sleds, and Rust's point probes ([`crate::points`]),
//! listed as `point NAME`.
//!
//! Addresses are the file's virtual addresses. A PIE or shared object is
//! moved by a page-aligned load bias at run time, which keeps every offset
//! within a 64-byte line, so a site's straddle split is the same here as in
//! the process.

use crate::decode::{Step, Stream};
use crate::elf::{ElfError, SymbolTable};
use crate::finstrument::{call_site_at, tail_sites, HookKind, HookSite, Hooks, SiteForm};
use crate::memory::Image;
use crate::patchable;
use crate::sections::Sections;
use goblin::elf::Elf;
use iced_x86::FlowControl;

/// The hook symbols a `-finstrument-functions` build calls.
const ENTER: &str = "__cyg_profile_func_enter";
const EXIT: &str = "__cyg_profile_func_exit";

/// Stand-in addresses for hooks that live in another module: in the
/// non-canonical hole, so no rel32 target and no real GOT value equals them.
const STAND_IN_ENTER: u64 = 0x8000_0000_0000_1000;
const STAND_IN_EXIT: u64 = 0x8000_0000_0000_2000;

/// One recognised site and the function whose bytes hold it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileSite {
    /// The site (addresses are the file's virtual addresses).
    pub site: HookSite,
    /// The demangled name of the function symbol containing the site. For a
    /// site of an inlined function this is the function it was inlined into.
    pub function: String,
    /// That function's first byte.
    pub function_start: u64,
}

/// Everything [`sites_in_elf`] found.
#[derive(Clone, Debug, Default)]
pub struct FileSites {
    /// Recognised sites in address order.
    pub sites: Vec<FileSite>,
    /// Function symbols examined (those with a size).
    pub functions: usize,
    /// Whether the file calls or defines either hook at all.
    pub has_hooks: bool,
    /// Function symbols whose bodies stopped decoding before their end (data
    /// in code); sites after that point are not listed.
    pub undecodable: Vec<String>,
    /// `-fpatchable-function-entry` sleds the runtime would leave alone:
    /// the entry address and why.
    pub unusable_sleds: Vec<(u64, String)>,
}

/// The `-finstrument-functions` probe sites of the ELF file `bytes`.
pub fn sites_in_elf(bytes: &[u8]) -> Result<FileSites, ElfError> {
    let elf = Elf::parse(bytes)?;
    let mut image = crate::fileimage::file_image(&elf, bytes);
    let (hooks, has_hooks) = bind_hooks(&elf, &mut image);
    let sections = Sections::parse(bytes)?;
    let symbols = SymbolTable::from_sections(&sections, bytes, 0)?;
    let table = patchable::table(&sections);
    let mut out = FileSites {
        has_hooks: has_hooks || !table.is_empty(),
        ..FileSites::default()
    };
    let mut seen = std::collections::HashSet::new();
    for rec in table {
        let (entry, func) = patchable::entry_of(rec, &symbols);
        if !seen.insert(entry) {
            continue;
        }
        match patchable::sled_at(&image, rec, entry) {
            Ok(_) => {
                let f = func.and_then(|a| symbols.containing(a));
                let name = f.map(|f| f.name.clone()).unwrap_or_default();
                out.sites.push(sled_site(entry, name, f.map_or(entry, |f| f.start)))
            }
            Err(e) => out.unusable_sleds.push((entry, e.to_string())),
        }
    }
    if crate::mcount::wanted(&sections) {
        let m = crate::mcount::sites_in_elf(bytes)?;
        out.has_hooks |= !m.sites.is_empty();
        for site in m.sites {
            let name = symbols.containing(site.addr).map(|f| f.name.clone());
            out.sites
                .push(sled_site(site.addr, name.unwrap_or_default(), site.function));
        }
        out.unusable_sleds
            .extend(m.unusable.into_iter().map(|(a, e)| (a, e.to_string())));
    }
    if crate::points::has_points(&sections) {
        let (points, unusable) = crate::points::points_in_elf(bytes)?;
        out.has_hooks |= !points.is_empty();
        for p in points {
            let start = symbols.containing(p.addr).map_or(p.addr, |f| f.start);
            out.sites.push(sled_site(p.addr, format!("point {}", p.name), start));
        }
        out.unusable_sleds
            .extend(unusable.into_iter().map(|(a, e)| (a, e.to_string())));
    }
    let xray = crate::xray::entry_sleds(&sections);
    out.has_hooks |= !xray.is_empty();
    for sled in xray {
        match crate::xray::check(&image, sled.addr) {
            Ok(_) => {
                let name = symbols.containing(sled.addr).map(|f| f.name.clone());
                out.sites
                    .push(sled_site(sled.addr, name.unwrap_or_default(), sled.function));
            }
            Err(e) => out.unusable_sleds.push((sled.addr, e.to_string())),
        }
    }
    for f in symbols.iter().filter(|f| f.size > 0) {
        out.functions += 1;
        if !has_hooks {
            continue;
        }
        let mut found: Vec<HookSite> = Vec::new();
        let mut stream = Stream::new(&image, f.start, f.end());
        for step in stream.by_ref() {
            let Step::Insn(i) = step else { continue };
            if !matches!(i.flow_control(), FlowControl::Call | FlowControl::IndirectCall) {
                continue;
            }
            for kind in [HookKind::Enter, HookKind::Exit] {
                if let Ok(site) = call_site_at(&image, &hooks, kind, i.next_ip()) {
                    if site.addr == i.ip() {
                        found.push(site);
                    }
                }
            }
        }
        if stream.failed() {
            out.undecodable.push(f.name.clone());
        }
        found.extend(tail_sites(&image, &hooks, f.start, f.end()));
        found.sort_by_key(|s| s.addr);
        out.sites.extend(found.into_iter().map(|site| FileSite {
            site,
            function: f.name.clone(),
            function_start: f.start,
        }));
    }
    out.sites.sort_by_key(|s| s.site.addr);
    Ok(out)
}

/// A site the runtime toggles as a sled (one entry site per function: its
/// exit probe has no site of its own), in the function `function`
/// starting at `function_start`.
fn sled_site(addr: u64, function: String, function_start: u64) -> FileSite {
    FileSite {
        site: HookSite {
            addr,
            kind: HookKind::Enter,
            form: SiteForm::Sled,
            operand: 0,
        },
        function,
        function_start,
    }
}

/// The hooks' addresses as the file's code sees them: defined symbols, or
/// stand-ins written into every GOT slot a relocation binds to a hook.
/// What kind of probe build an ELF file is, read cheaply (its symbols,
/// relocations and section names, no code): whether it calls or defines
/// the `-finstrument-functions` hooks, whether it has a
/// `-fpatchable-function-entry` sled table, and whether it is a `-pg`
/// build.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProbeBuild {
    /// It calls or defines `__cyg_profile_func_enter`/`exit`.
    pub finstrument: bool,
    /// It has a `__patchable_function_entries` section.
    pub sleds: bool,
    /// It has a `__mcount_loc` section or imports `mcount` or `__fentry__`
    /// (a `-pg` build).
    pub mcount: bool,
    /// It has an `xray_instr_map` section (`-fxray-instrument`).
    pub xray: bool,
}

impl ProbeBuild {
    /// Whether the runtime would find any probe site in the file itself.
    pub fn any(self) -> bool {
        self.finstrument || self.sleds || self.mcount || self.xray
    }
}

/// [`ProbeBuild`] of the ELF file `bytes`.
pub fn probe_build(bytes: &[u8]) -> Result<ProbeBuild, ElfError> {
    let elf = Elf::parse(bytes)?;
    let mut image = Image::new();
    let (_, finstrument) = bind_hooks(&elf, &mut image);
    let sleds = elf
        .section_headers
        .iter()
        .any(|h| elf.shdr_strtab.get_at(h.sh_name) == Some(crate::patchable::SECTION));
    let sections = Sections::parse(bytes)?;
    let xray = sections.named(crate::xray::SECTION).next().is_some();
    Ok(ProbeBuild {
        finstrument,
        sleds,
        mcount: crate::mcount::wanted(&sections),
        xray,
    })
}

fn bind_hooks(elf: &Elf, image: &mut Image) -> (Hooks, bool) {
    let enter = crate::fileimage::bound(elf, image, &[ENTER], STAND_IN_ENTER);
    let exit = crate::fileimage::bound(elf, image, &[EXIT], STAND_IN_EXIT);
    let hooks = Hooks {
        enter: enter.0,
        exit: exit.0,
    };
    (hooks, enter.1 || exit.1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_that_is_not_elf_is_an_error() {
        assert!(sites_in_elf(b"#!/bin/sh\necho hi\n").is_err());
    }

    #[test]
    fn this_test_binary_has_no_hooks() {
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let s = sites_in_elf(&me).unwrap();
        assert!(!s.has_hooks);
        assert!(s.sites.is_empty());
        assert!(s.functions > 100);
    }
}
