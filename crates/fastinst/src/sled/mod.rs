//! The `-fpatchable-function-entry` provider at run time: probes that start
//! off (the paper's ELF-table provider, §7).
//!
//! [`load`] reads the `__patchable_function_entries` table of every loaded
//! module not seen before ([`crate::modules`] reads it with the symbols),
//! validates each sled ([`providers::patchable`]), normalises gcc's
//! one-byte-NOP sleds to one 5-byte NOP (safe at any moment: see that
//! module), makes a stub per function near the module
//! ([`trampoline`]), and registers two probes per function, entry then
//! exit, both off. Every callback hears of them at once: sites are known up
//! front, not on first call. The preload library calls [`load`] from its
//! constructor and, when the program has sleds, from a watcher thread that
//! looks at the loader's module counter every 10 ms, so a library
//! `dlopen`ed later has its probes within about 10 ms. The thread starts at
//! the program's first `dlopen` or `dlmopen` (interposed by a stub that
//! leaves the caller's return address for glibc, which resolves
//! `DT_RUNPATH` and `$ORIGIN` against it), so a program that loads no
//! library runs with no thread of ours: a second thread, even a sleeping
//! one, makes glibc lock its arena in `malloc` and `free` for the rest of
//! the run (QuickJS: 10-20% more CPU time in interleaved runs here).
//! Registering in the stub after the load would be sooner, but the stub
//! cannot regain control without replacing the return address glibc
//! reads. A program that links the crate calls [`load`] itself.
//!
//! An entry probe runs its handler from the entry trampoline; an exit probe
//! is a substituted return address (`shadow`). Everything else (the API,
//! strategies, tools, the profiler) is shared with the
//! `-finstrument-functions` provider.

pub(crate) mod shadow;
pub(crate) mod site;
pub(crate) mod trampoline;
mod unwind;

use crate::discovery::{with_state, DiscoveryGuard, State};
use crate::modules::{LiveMemory, Module};
use crate::probe::{ProbeId, ProbeKind, ProbeMeta, Provider};
use crate::registry::{self, Probe, Site};
use crate::sitetable::{self, key};
use callpatch::{CallSite, Form};
use providers::finstrument::SiteForm;
use providers::patchable::{self, SledError, SLED_LEN};
use site::Sled;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;

/// What one [`load`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// Modules whose tables were read.
    pub modules: usize,
    /// Functions registered (two probes each).
    pub functions: usize,
    /// Of those, sleds that were rewritten to one instruction.
    pub normalised: usize,
    /// Recorded sleds left alone, by reason.
    pub skipped: BTreeMap<String, usize>,
}

/// Counters of the provider (also in [`crate::Stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SledStats {
    /// Functions with sled probes.
    pub functions: u64,
    /// Exits delivered by return-address substitution.
    pub exits: u64,
    /// Calls whose exit was not watched: the thread's shadow stack was full.
    pub shadow_full: u64,
    /// Shadow entries dropped because their frames could not return
    /// normally any more (`longjmp`, exceptions).
    pub abandoned: u64,
    /// Substituted return addresses put back before an unwinder ran.
    pub restored: u64,
}

static FUNCTIONS: AtomicU64 = AtomicU64::new(0);

/// The provider's counters now.
pub fn stats() -> SledStats {
    let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
    SledStats {
        functions: l(&FUNCTIONS),
        exits: l(&shadow::EXITS),
        shadow_full: l(&shadow::FULL),
        abandoned: l(&shadow::ABANDONED),
        restored: l(&shadow::RESTORED),
    }
}

/// Registers the sleds of every loaded module whose table has not been
/// read yet: two probes per function (entry, then exit, with consecutive
/// ids), both off, reported to the discovery callbacks. Safe to call at any
/// time and from any thread, with other threads running the code: a sled
/// only changes from NOPs to one NOP before its probes exist.
pub fn load() -> LoadReport {
    let t0 = wordpatch::tsc::now();
    shadow::init();
    unwind::init();
    let report = with_state(|s| {
        s.rescan();
        let todo: Vec<Arc<Module>> = s
            .modules
            .loaded
            .iter()
            .filter(|m| s.sled_modules.insert(m.index))
            .cloned()
            .collect();
        let mut report = LoadReport::default();
        for m in todo {
            if m.sleds.is_empty() {
                continue;
            }
            report.modules += 1;
            register_module(s, &m, &mut report);
        }
        if !report.skipped.is_empty() {
            crate::log::warn(format_args!(
                "patchable entries left alone: {}",
                report
                    .skipped
                    .iter()
                    .map(|(k, v)| format!("{v} ({k})"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        report
    });
    crate::stats::SLED_LOAD_TICKS.fetch_add(wordpatch::tsc::now().wrapping_sub(t0), Ordering::Relaxed);
    report
}

/// Rewrites a one-byte-NOP sled to [`patchable::NORMALISED`]: every mix of
/// old and new bytes is valid (see [`providers::patchable`]), so the bytes
/// that change go in one locked store where they share a cache line, else
/// one byte at a time. One store, not four, per sled: the locked stores
/// into code were a fifth of a gcc sled build's registration (SQLite:
/// 1,549 sleds).
fn normalise(addr: u64) -> std::result::Result<(), String> {
    wordpatch::make_writable(addr as *const u8, SLED_LEN).map_err(|e| e.to_string())?;
    // The last byte is `90` before and after.
    const CHANGED: usize = SLED_LEN - 1;
    const _: () = assert!(patchable::NORMALISED[CHANGED] == 0x90);
    if !wordpatch::is_straddler(addr as usize, CHANGED) {
        // SAFETY: the first four bytes of the sled, inside one line, whose
        // page was just made writable; any mix of old and new sled bytes
        // decodes as NOPs that end where the sled ends, so threads may be
        // executing it.
        return unsafe {
            wordpatch::store_in_line(
                addr as *mut u8,
                &patchable::NORMALISED[..CHANGED],
                Some(&[0x90; CHANGED]),
            )
        }
        .map(drop)
        .map_err(|m| format!("bytes changed under us ({:02x?})", &m.found[..CHANGED]));
    }
    for k in 0..SLED_LEN {
        let (old, new) = (0x90u8, patchable::NORMALISED[k]);
        if old == new {
            continue;
        }
        // SAFETY: one byte inside the sled, whose page was just made
        // writable; any mix of old and new sled bytes decodes as NOPs that
        // end where the sled ends, so threads may be executing it.
        unsafe { wordpatch::store_in_line((addr + k as u64) as *mut u8, &[new], Some(&[old])) }
            .map_err(|m| format!("byte {k} changed under us ({:#04x})", m.found[0]))?;
    }
    Ok(())
}

fn register_module(s: &mut State, m: &Module, report: &mut LoadReport) {
    let mut skip = |why: String| *report.skipped.entry(why).or_default() += 1;
    let mut sleds = Vec::new();
    {
        let mem = LiveMemory { modules: &s.modules };
        let mut seen = std::collections::HashSet::new();
        for &rec in &m.sleds {
            let (entry, func) = patchable::entry_of(rec, m.symbols());
            sitetable::prepare_registration(entry);
            if !seen.insert(entry) || sitetable::get(key::site(entry)).is_some() {
                continue;
            }
            match patchable::sled_at(&mem, rec, entry) {
                Ok(sl) => sleds.push((sl, func.unwrap_or(entry))),
                Err(e @ (SledError::Unreadable | SledError::TooShort(_) | SledError::NoBoundary)) => {
                    skip(e.to_string())
                }
            }
        }
    }
    // The module's sled extent: made writable with one maps read and one
    // mprotect, not one per page (see `wordpatch::make_writable`; if it is
    // not one executable run, each sled's own call below says why), and
    // the range its stubs must reach.
    let lo = sleds.iter().map(|x| x.0.entry).min().unwrap_or(0) as usize;
    let hi = sleds.iter().map(|x| x.0.entry).max().unwrap_or(0) as usize;
    if !sleds.is_empty() {
        if let Err(e) = wordpatch::make_writable(lo as *const u8, hi - lo + SLED_LEN) {
            crate::log::debug(format_args!("sled extent of {} not writable at once: {e}", m.path));
        }
    }
    sleds.retain(|(sl, _)| {
        if !sl.needs_normalising() {
            return true;
        }
        match normalise(sl.entry) {
            Ok(()) => {
                report.normalised += 1;
                true
            }
            Err(e) => {
                crate::log::warn(format_args!("sled at {:#x} not normalised: {e}", sl.entry));
                skip("could not be normalised".into());
                false
            }
        }
    });
    if sleds.is_empty() {
        return;
    }
    let base = registry::count();
    if base as usize + 2 * sleds.len() > registry::MAX_PROBES
        || (base as usize + 2 * sleds.len()) * 5 > sitetable::CAPACITY
    {
        crate::log::warn(format_args!(
            "probe tables full; {} sleds of {} not registered",
            sleds.len(),
            m.path
        ));
        skip("probe tables full".into());
        return;
    }
    let ids: Vec<u32> = (0..sleds.len() as u32).map(|i| base + 2 * i).collect();
    s.reserve_names(sleds.len());
    let Some(stubs) = trampoline::make_stubs(lo, hi, &ids) else {
        crate::log::warn(format_args!(
            "no memory within reach of {}; its sleds are not registered",
            m.path
        ));
        *report.skipped.entry("no stub memory in reach".into()).or_default() += sleds.len();
        return;
    };
    for (((sl, func), &raw_id), &stub) in sleds.iter().zip(&ids).zip(&stubs) {
        let id = ProbeId::new(raw_id);
        let rel = stub as i64 - (sl.entry as i64 + SLED_LEN as i64);
        // SAFETY: the sled is one 5-byte NOP instruction at a function entry
        // (validated and normalised above) that this runtime owns from now
        // on; its active form calls the stub, which preserves what the entry
        // depends on (see `trampoline`).
        let call = match unsafe { CallSite::prepared(sl.entry as *mut u8, Form::CallRel32, rel as i32) } {
            Ok(c) => c,
            Err(e) => {
                crate::log::warn(format_args!("sled at {:#x} cannot be toggled: {e}", sl.entry));
                skip("cannot be toggled".into());
                // Its ids are taken by the stub area; keep numbering dense
                // by registering nothing after a gap: stop here.
                break;
            }
        };
        let sled: &'static Sled = Box::leak(Box::new(Sled::new(id, sl.off(), call)));
        let name = s.name_and_extent(*func);
        let split = wordpatch::split(sl.entry as usize, SLED_LEN) as u8;
        let mut pushed = [ProbeId::new(u32::MAX); 2];
        for (k, kind) in [ProbeKind::Entry, ProbeKind::Exit].into_iter().enumerate() {
            let p = registry::push(|pid| Probe {
                meta: ProbeMeta {
                    id: pid,
                    kind,
                    function: *func as usize,
                    function_name: name,
                    site: sl.entry as usize,
                    site_len: SLED_LEN as u8,
                    split,
                    form: Some(SiteForm::Sled),
                    provider: Provider::Patchable,
                    arg_rewritten: false,
                    inlined: false,
                },
                handler: AtomicUsize::new(0),
                state: AtomicU8::new(0),
                lock: AtomicBool::new(false),
                unloaded: AtomicBool::new(false),
                rewrite_at: AtomicU64::new(0),
                module: m.index,
                site: Site::Sled(sled),
                tool: AtomicU64::new(0),
                inactive_hits: AtomicU64::new(0),
            });
            pushed[k] = p.map_or(ProbeId::new(u32::MAX), |p| p.meta.id);
        }
        if pushed != [id, id.next()] {
            // Cannot happen while the discovery lock serialises pushes and
            // the capacity check above holds; never leave a stub pointing
            // at someone else's id.
            crate::log::error(format_args!(
                "sled probe ids {pushed:?} are not the stub's {id}; registration stops"
            ));
            break;
        }
        sitetable::insert(key::site(sl.entry), id.get());
        sitetable::insert(key::patched(sl.entry), SLED_LEN as u32);
        FUNCTIONS.fetch_add(1, Ordering::Relaxed);
        report.functions += 1;
        for pid in [id, id.next()] {
            announce(s, pid);
        }
    }
}

static WATCHING: AtomicBool = AtomicBool::new(false);
static WATCH_ON_DLOPEN: AtomicBool = AtomicBool::new(false);

/// Starts the thread that registers the sleds of libraries loaded later
/// (once; see the module doc).
pub fn watch() {
    if WATCHING.swap(true, Ordering::AcqRel) {
        return;
    }
    spawn_watcher();
}

/// Starts the watcher ([`watch`]) when the program first calls `dlopen`
/// or `dlmopen` (the preload library interposes both), not before: most
/// programs never load a library, and a thread, even one that only
/// sleeps, puts glibc in its multi-threaded mode for the rest of the run
/// (its `malloc` and `free` then take the arena lock).
pub fn watch_from_first_dlopen() {
    WATCH_ON_DLOPEN.store(true, Ordering::Release);
}

/// A library is about to be loaded (the interposed `dlopen`).
pub(crate) fn library_loading() {
    if WATCH_ON_DLOPEN.load(Ordering::Acquire) && !WATCHING.load(Ordering::Relaxed) {
        let _ = std::panic::catch_unwind(watch);
    }
}

fn spawn_watcher() {
    let r = std::thread::Builder::new().name("fastinst-sleds".into()).spawn(|| {
        let mut seen = crate::modules::load_count();
        loop {
            std::thread::sleep(std::time::Duration::from_millis(10));
            let n = crate::modules::load_count();
            if n != seen {
                seen = n;
                let _ = std::panic::catch_unwind(load);
            }
        }
    });
    if let Err(e) = r {
        crate::log::warn(format_args!(
            "no sled watcher thread ({e}): libraries loaded later get no probes"
        ));
    }
}

/// In a forked child: the watcher thread did not survive the fork.
pub(crate) fn watch_after_fork() {
    if WATCHING.load(Ordering::Acquire) {
        spawn_watcher();
    }
}

fn announce(s: &State, id: ProbeId) {
    let Some(p) = registry::get(id) else { return };
    let meta = p.meta();
    let _in_discovery = DiscoveryGuard::enter();
    for cb in &s.callbacks {
        cb.call(&meta);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A page of one-byte NOPs, executable as a code page is.
    fn nop_page() -> &'static mut [u8] {
        // SAFETY: a fresh private anonymous mapping, never unmapped (the
        // writable-page tracking keeps its address).
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_EXEC,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        wordpatch::make_writable(p as *const u8, 4096).unwrap();
        // SAFETY: the mapping above, now writable, 4096 bytes.
        let page = unsafe { std::slice::from_raw_parts_mut(p as *mut u8, 4096) };
        page.fill(0x90);
        page
    }

    /// Every offset in a line, so the four changed bytes lie in one line,
    /// or straddle two at each split.
    #[test]
    fn normalises_sleds_at_every_offset_in_a_line() {
        let page = nop_page();
        for off in 0..64usize {
            let at = 512 + off;
            let sled = &page[at..at + SLED_LEN];
            assert_eq!(sled, &[0x90; SLED_LEN]);
            normalise(sled.as_ptr() as u64).unwrap_or_else(|e| panic!("offset {off}: {e}"));
            assert_eq!(&page[at..at + SLED_LEN], &patchable::NORMALISED, "offset {off}");
            assert_eq!(page[at - 1], 0x90, "offset {off}: byte before");
            assert_eq!(page[at + SLED_LEN], 0x90, "offset {off}: byte after");
            page[at..at + SLED_LEN].fill(0x90);
        }
    }

    /// A byte that is not a one-byte NOP is never overwritten.
    #[test]
    fn leaves_a_sled_that_changed_alone() {
        let page = nop_page();
        for (off, k) in [(8usize, 0usize), (8, 3), (62, 1), (61, 3), (60, 3)] {
            page[off + k] = 0xcc;
            let before = page[off..off + SLED_LEN].to_vec();
            let e = normalise(page[off..].as_ptr() as u64).expect_err("a changed byte");
            assert!(e.contains("cc"), "offset {off}, byte {k}: {e}");
            assert_eq!(page[off + k], 0xcc, "offset {off}, byte {k}");
            if !wordpatch::is_straddler(page[off..].as_ptr() as usize, SLED_LEN - 1) {
                assert_eq!(page[off..off + SLED_LEN], before[..], "offset {off}, byte {k}");
            }
            page[off..off + SLED_LEN].fill(0x90);
        }
    }
}
