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
//! The `-pg` builds' profiling calls ([`providers::mcount`], read with the
//! module) become sleds here too: each call is first rewritten to a NOP
//! with the toggles' own protocol, and a site after the prologue (`call
//! mcount`) gets a stub that marks it, so the entry handler finds the
//! return address through the frame pointer.
//!
//! An entry probe runs its handler from the entry trampoline; an exit probe
//! is a substituted return address (`shadow`). Everything else (the API,
//! strategies, tools, the profiler) is shared with the
//! `-finstrument-functions` provider.

pub(crate) mod counter;
pub(crate) mod shadow;
pub(crate) mod site;
pub(crate) mod stubarea;
pub(crate) mod trampoline;
mod unwind;
mod watcher;

pub(crate) use watcher::stop_watching;
pub use watcher::watch_from_first_dlopen;

/// Starts the thread that looks for libraries loaded later (once until a
/// detach ends it; see [`watcher`]) and calls `found` when there are: an
/// attached runtime's, which registers their sleds with [`load`] and
/// binds their hook slots.
pub(crate) fn watch_with(found: fn()) {
    watcher::watch(found);
}

/// A library is about to be loaded (the interposed `dlopen`).
pub(crate) fn library_loading() {
    watcher::library_loading(load_found);
}

/// In a forked child: the watcher thread did not survive the fork.
pub(crate) fn watch_after_fork() {
    watcher::watch_after_fork(load_found);
}

/// [`load`], for the watcher.
fn load_found() {
    load();
}

use crate::discovery::{with_state, DiscoveryGuard, State};
use crate::modules::{LiveMemory, Module};
use crate::probe::{ProbeId, ProbeKind, ProbeMeta, Provider};
use crate::registry::{self, Probe, Site};
use crate::sitetable::{self, key};
use callpatch::{CallSite, Form};
use providers::finstrument::SiteForm;
use providers::mcount::{self, Frame};
use providers::patchable::{self, SledError, SLED_LEN};
use providers::Memory;
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
    /// Of those, `-pg` profiling calls rewritten to NOPs.
    pub rewritten: usize,
    /// Point probes registered (`fastinst::probe!`).
    pub points: usize,
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
/// ids), both off, reported to the discovery callbacks; likewise each
/// `-pg` site, and one probe per point (`fastinst::probe!`). Safe to call
/// at any time and from any thread, with other threads running the code: a
/// sled only changes from NOPs to one NOP, or from a profiling call to a
/// NOP by the toggles' protocol, before its probes exist. Exported as
/// `fastinst::register_sleds`: a program that links this crate (rather
/// than running under the preload library) calls it, then drives the
/// probes with the API.
///
/// ```no_run
/// #[fastinst::instrument]
/// fn work(x: u64) -> u64 {
///     x * 3
/// }
///
/// extern "C" fn on_entry(_: fastinst::ProbeId) {}
///
/// let report = fastinst::register_sleds();
/// assert!(report.functions >= 1);
/// for m in fastinst::probes().filter(|m| m.name() == "rust_out::work") {
///     if m.kind == fastinst::ProbeKind::Entry {
///         fastinst::activate(m.id, on_entry).unwrap();
///     }
/// }
/// work(7);
/// ```
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
            if !m.has_sites() {
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

/// How long threads get to say where they are after sleds were normalised.
const PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);

/// Makes sure no thread is stopped between two of the old one-byte NOPs of
/// the sleds just normalised at `entries`, before any of them can be armed
/// as a `call`: a thread found there (preempted mid-sled before the
/// rewrite) is moved to the sled's end, which is what its NOPs would have
/// done ([`wordpatch::evacuate`]). Under `LD_PRELOAD` at the start there is
/// no other thread and nothing is signalled; a library `dlopen`ed while the
/// program's threads run it needed this (seen: SIGILL with the thread's
/// instruction pointer inside the armed sled). Why the sleds must not be
/// armed otherwise.
fn evacuate(entries: &[u64]) -> std::result::Result<(), String> {
    let runs: Vec<std::ops::Range<u64>> = entries.iter().map(|&e| e..e + SLED_LEN as u64).collect();
    // SAFETY: each run is a sled that held five one-byte NOPs and now holds
    // NORMALISED (or a mix while it was written): from any boundary inside
    // it, NOPs that end at its end, so a thread may resume there instead.
    match unsafe { wordpatch::evacuate(&runs, PATIENCE) } {
        Ok(e) if e.is_complete() => {
            if e.signalled > 0 {
                crate::log::info(format_args!(
                    "{} sleds made one NOP while {} threads ran: {} asked where they were, {} moved to a sled's end",
                    entries.len(),
                    e.threads,
                    e.signalled,
                    e.moved
                ));
            }
            Ok(())
        }
        Ok(e) => Err(format!(
            "threads {:?} could not be checked (they block the signal, or did not answer within {PATIENCE:?})",
            e.unchecked
        )),
        Err(e) => Err(e.to_string()),
    }
}

/// A site about to become a sled: a `-fpatchable-function-entry` sled
/// as validated, a `-pg` site as it will be once rewritten, or a point.
struct Candidate {
    sled: patchable::Sled,
    function: u64,
    provider: Provider,
    shape: Shape,
    /// What must be written before the first toggle, if anything.
    prep: Prep,
    /// The body a `#[fastinst::instrument]` sled function jumps to.
    body: Option<u64>,
}

/// What a site needs written once, before its first toggle.
#[derive(Clone, Copy)]
enum Prep {
    /// Nothing, or gcc's one-byte NOPs made one (`Sled::needs_normalising`).
    Sled,
    /// A `-pg` profiling call rewritten to the NOP.
    Call(mcount::Found),
    /// An XRay sled's last bytes made one NOP ([`providers::xray::TAIL`]).
    XrayTail,
}

/// What a site is to the trampoline.
enum Shape {
    /// A function's sled (entry and exit probes), with where its return
    /// address is when the sled runs.
    Function(Frame),
    /// A point probe, with its name.
    Point(String),
}

impl Candidate {
    /// Probes it registers: entry and exit, or the point.
    fn probes(&self) -> u32 {
        match self.shape {
            Shape::Function(_) => 2,
            Shape::Point(_) => 1,
        }
    }

    /// The id its stub pushes: the first probe's, with what the entry
    /// trampoline's handler must know of the site.
    fn stub_id(&self, id: u32) -> u32 {
        match self.shape {
            Shape::Function(Frame::Entry) => id,
            Shape::Function(Frame::FramePointer) => id | shadow::FRAME_POINTER_SITE,
            Shape::Point(_) => id | shadow::POINT_SITE,
        }
    }
}

fn register_module(s: &mut State, m: &Module, report: &mut LoadReport) {
    let mut skip = |why: String| *report.skipped.entry(why).or_default() += 1;
    let mut sleds: Vec<Candidate> = Vec::new();
    {
        let mem = LiveMemory { modules: &s.modules };
        let mut seen: std::collections::HashSet<u64, std::hash::BuildHasherDefault<fastinst_report::fx::FxHasher>> =
            Default::default();
        for &rec in &m.sleds {
            let (entry, func) = patchable::entry_of(rec, m.symbols());
            sitetable::prepare_registration(entry);
            if !seen.insert(entry) || sitetable::get(key::site(entry)).is_some() {
                continue;
            }
            match patchable::sled_at(&mem, rec, entry) {
                Ok(sl) => sleds.push(Candidate {
                    sled: sl,
                    function: func.unwrap_or(entry),
                    provider: Provider::Patchable,
                    shape: Shape::Function(Frame::Entry),
                    prep: Prep::Sled,
                    body: rust_body(&mem, m, entry),
                }),
                Err(e @ (SledError::Unreadable | SledError::TooShort(_) | SledError::NoBoundary)) => {
                    skip(e.to_string())
                }
            }
        }
        for site in &m.mcount {
            sitetable::prepare_registration(site.addr);
            if !seen.insert(site.addr) || sitetable::get(key::site(site.addr)).is_some() {
                continue;
            }
            match mcount_candidate(&mem, site) {
                Ok(c) => sleds.push(c),
                Err(why) => skip(why.into()),
            }
        }
        for sled in &m.xray {
            sitetable::prepare_registration(sled.addr);
            if !seen.insert(sled.addr) || sitetable::get(key::site(sled.addr)).is_some() {
                continue;
            }
            match providers::xray::check(&mem, sled.addr) {
                Ok(tail) => {
                    let mut found = [0u8; SLED_LEN];
                    mem.read(sled.addr, &mut found);
                    sleds.push(Candidate {
                        sled: patchable::Sled {
                            recorded: sled.addr,
                            entry: sled.addr,
                            found,
                            shape: patchable::SledShape::Nops,
                        },
                        function: sled.function,
                        provider: Provider::Xray,
                        shape: Shape::Function(Frame::Entry),
                        prep: if tail { Prep::XrayTail } else { Prep::Sled },
                        body: None,
                    });
                }
                Err(e) => skip(e.to_string()),
            }
        }
        for point in &m.points {
            sitetable::prepare_registration(point.addr);
            if !seen.insert(point.addr) || sitetable::get(key::site(point.addr)).is_some() {
                continue;
            }
            // The file had the NOP there; so must the live code.
            let mut live = [0u8; SLED_LEN];
            match mem.read(point.addr, &mut live) && live == providers::points::NOP {
                false => skip("a point is not the NOP".into()),
                true => sleds.push(Candidate {
                    sled: patchable::Sled {
                        recorded: point.addr,
                        entry: point.addr,
                        found: providers::points::NOP,
                        shape: patchable::SledShape::Nops,
                    },
                    function: point.addr,
                    provider: Provider::Point,
                    shape: Shape::Point(point.name.clone()),
                    prep: Prep::Sled,
                    body: None,
                }),
            }
        }
    }
    // The module's sled extent: made writable with one maps read and one
    // mprotect, not one per page (see `wordpatch::make_writable`; if it is
    // not one executable run, each sled's own call below says why), and
    // the range its stubs must reach.
    let lo = sleds.iter().map(|x| x.sled.entry).min().unwrap_or(0) as usize;
    let hi = sleds.iter().map(|x| x.sled.entry).max().unwrap_or(0) as usize;
    if !sleds.is_empty() {
        if let Err(e) = wordpatch::make_writable(lo as *const u8, hi - lo + SLED_LEN) {
            crate::log::debug(format_args!("sled extent of {} not writable at once: {e}", m.path));
        }
    }
    let mut normalised: Vec<u64> = Vec::new();
    sleds.retain(|c| {
        let sl = &c.sled;
        if let Prep::XrayTail = c.prep {
            return match xray_tail(sl.entry) {
                Ok(()) => {
                    report.normalised += 1;
                    true
                }
                Err(e) => {
                    crate::log::warn(format_args!("XRay sled at {:#x} not prepared: {e}", sl.entry));
                    skip("could not be prepared".into());
                    false
                }
            };
        }
        if let Prep::Call(found) = c.prep {
            return match rewrite_call(sl.entry, &found) {
                Ok(()) => {
                    report.rewritten += 1;
                    true
                }
                Err(e) => {
                    crate::log::warn(format_args!("-pg call at {:#x} not rewritten: {e}", sl.entry));
                    skip("could not be rewritten".into());
                    false
                }
            };
        }
        if !sl.needs_normalising() {
            return true;
        }
        match normalise(sl.entry) {
            Ok(()) => {
                report.normalised += 1;
                normalised.push(sl.entry);
                true
            }
            Err(e) => {
                crate::log::warn(format_args!("sled at {:#x} not normalised: {e}", sl.entry));
                skip("could not be normalised".into());
                false
            }
        }
    });
    if !normalised.is_empty() {
        if let Err(why) = evacuate(&normalised) {
            crate::log::warn(format_args!(
                "{} sleds of {} made one NOP but not probed: {why}",
                normalised.len(),
                m.path
            ));
            let left: std::collections::HashSet<u64> = normalised.into_iter().collect();
            sleds.retain(|c| !left.contains(&c.sled.entry));
            for _ in 0..left.len() {
                skip("a thread could not be checked out of it".into());
            }
        }
    }
    if sleds.is_empty() {
        return;
    }
    let base = registry::count();
    let total: u32 = sleds.iter().map(Candidate::probes).sum();
    if (base + total) as usize > registry::MAX_PROBES || (base + total) as usize * 5 > sitetable::CAPACITY {
        crate::log::warn(format_args!(
            "probe tables full; {} sleds of {} not registered",
            sleds.len(),
            m.path
        ));
        skip("probe tables full".into());
        return;
    }
    let ids: Vec<u32> = sleds
        .iter()
        .scan(base, |next, c| {
            let id = *next;
            *next += c.probes();
            Some(id)
        })
        .collect();
    // A function's entry counts in its stub; a point or a `-pg` site (after
    // the prologue, where flags may be live) does not.
    let stub_ids: Vec<(u32, bool)> = ids
        .iter()
        .zip(&sleds)
        .map(|(&id, c)| (c.stub_id(id), matches!(c.shape, Shape::Function(Frame::Entry))))
        .collect();
    // Points of one name share a key (`ProbeMeta::function`): the first's
    // address.
    let mut point_keys: std::collections::HashMap<&str, u64> = std::collections::HashMap::new();
    s.reserve_names(sleds.len());
    let Some(stubs) = trampoline::make_stubs(lo, hi, &stub_ids) else {
        crate::log::warn(format_args!(
            "no memory within reach of {}; its sleds are not registered",
            m.path
        ));
        *report.skipped.entry("no stub memory in reach".into()).or_default() += sleds.len();
        return;
    };
    for ((c, &raw_id), &(stub, counter)) in sleds.iter().zip(&ids).zip(&stubs) {
        let (sl, func) = (&c.sled, &c.function);
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
        let sled: &'static Sled = Box::leak(Box::new(Sled::new(id, sl.off(), call, counter)));
        let (name, kinds, function): (_, &[ProbeKind], u64) = match &c.shape {
            Shape::Function(_) => (s.name_and_extent(*func), &[ProbeKind::Entry, ProbeKind::Exit], *func),
            Shape::Point(n) => (
                s.keep_name(n),
                &[ProbeKind::Point],
                *point_keys.entry(n.as_str()).or_insert(sl.entry),
            ),
        };
        let split = wordpatch::split(sl.entry as usize, SLED_LEN) as u8;
        let mut pushed = [ProbeId::new(u32::MAX); 2];
        for (k, &kind) in kinds.iter().enumerate() {
            let p = registry::push(|pid| Probe {
                meta: ProbeMeta {
                    id: pid,
                    kind,
                    function: function as usize,
                    function_name: name,
                    site: sl.entry as usize,
                    site_len: SLED_LEN as u8,
                    split,
                    form: Some(SiteForm::Sled),
                    provider: c.provider,
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
        let want = [id, id.next()];
        if pushed[..kinds.len()] != want[..kinds.len()] {
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
        if let Some(body) = c.body {
            // Before the callbacks hear of the probes (the profiler reads
            // it when it first sees the function).
            let func = m.function(body);
            if let Some(size) = func.and_then(|f| u32::try_from(f.size).ok()) {
                sitetable::insert(key::extent(body), size);
                sitetable::insert(key::body(function), body.wrapping_sub(function) as u32);
                BODIES.store(true, Ordering::Release);
            }
        }
        if kinds.len() == 2 {
            FUNCTIONS.fetch_add(1, Ordering::Relaxed);
            report.functions += 1;
        } else {
            report.points += 1;
        }
        for &pid in &want[..kinds.len()] {
            announce(s, pid);
        }
    }
}

/// The counter of entry probe `id`'s stub, if it is a sled function's
/// entry with a counting stub (`counter`), or a `-finstrument-functions`
/// entry call given one (`crate::callcount`).
pub(crate) fn counter_of(id: ProbeId) -> Option<&'static counter::Counter> {
    counter_in(registry::get(id)?)
}

/// [`counter_of`] for a probe record already at hand.
#[inline(always)]
pub(crate) fn counter_in(probe: &Probe) -> Option<&'static counter::Counter> {
    match &probe.site {
        Site::Sled(s) if s.entry == probe.meta.id => s.counter,
        Site::Call(_, Some(c)) => Some(c.counter),
        _ => None,
    }
}

/// The body of a `#[fastinst::instrument]` sled function at `entry`: the
/// target of the `jmp rel32` right after the sled, when a symbol of the
/// macro's body functions starts there.
fn rust_body(mem: &LiveMemory, m: &Module, entry: u64) -> Option<u64> {
    let mut b = [0u8; 5];
    if !mem.read(entry + SLED_LEN as u64, &mut b) || b[0] != 0xE9 {
        return None;
    }
    let rel = i32::from_le_bytes([b[1], b[2], b[3], b[4]]) as i64;
    let target = (entry as i64 + 2 * SLED_LEN as i64 + rel) as u64;
    m.function(target)
        .filter(|f| f.start == target && f.name.contains(providers::elf::RUST_BODY_PREFIX))
        .map(|_| target)
}

/// Where the body of function `f` lies, `[start, end]`, when `f` is a
/// `#[fastinst::instrument]` sled function that jumps to it: the code the
/// function's time is spent in, for attributing return addresses and CPU
/// samples to it.
pub(crate) fn body_of(f: usize) -> Option<(usize, usize)> {
    if !BODIES.load(Ordering::Acquire) {
        return None;
    }
    let off = sitetable::get(key::body(f as u64))? as i32;
    let start = (f as i64 + off as i64) as usize;
    let size = sitetable::get(key::extent(start as u64))?;
    Some((start, start + size as usize))
}

/// Whether any sled function has a body of its own ([`body_of`]): a C
/// program's have none, and its start-up looked each of them up in vain.
static BODIES: AtomicBool = AtomicBool::new(false);

/// The sled a `-pg` site will be: the live bytes are the call the file
/// has (rewritten before the first toggle) or already the NOP (a site an
/// earlier attach left off).
fn mcount_candidate(mem: &LiveMemory, site: &mcount::McountSite) -> std::result::Result<Candidate, &'static str> {
    let call = site.found.call_bytes();
    let mut live = [0u8; 6];
    let len = call.len().max(mcount::SITE_LEN);
    if !mem.read(site.addr, &mut live[..len]) {
        return Err("the -pg site's bytes cannot be read");
    }
    let rewrite = if !call.is_empty() && live[..len] == *call {
        Some(site.found)
    } else if live[..mcount::SITE_LEN] == mcount::NOP
        && (call.is_empty() || live[mcount::SITE_LEN..len] == site.found.rewritten()[mcount::SITE_LEN..])
    {
        None
    } else {
        return Err("the -pg site's bytes differ from the file's");
    };
    Ok(Candidate {
        sled: patchable::Sled {
            recorded: site.addr,
            entry: site.addr,
            found: mcount::NOP,
            shape: patchable::SledShape::Nops,
        },
        function: site.function,
        provider: Provider::Mcount,
        shape: Shape::Function(site.frame),
        prep: rewrite.map_or(Prep::Sled, Prep::Call),
        body: None,
    })
}

/// Rewrites the last 6 bytes of the XRay sled at `addr` to one NOP
/// ([`providers::xray`]), so that a call in its first 5 bytes returns onto
/// an instruction that ends where the sled ends.
fn xray_tail(addr: u64) -> std::result::Result<(), String> {
    let at = addr + SLED_LEN as u64;
    let tail = &providers::xray::TAIL;
    wordpatch::make_writable(at as *const u8, tail.len()).map_err(|e| e.to_string())?;
    // SAFETY: bytes 5-10 of the sled, whose page was just made writable.
    // No thread runs them: the sled's first instruction, `jmp .+11` (checked
    // at registration, and again here with the store), jumps over them,
    // and the sled has no probe yet that could replace it.
    unsafe {
        let jmp = std::slice::from_raw_parts(addr as *const u8, 2);
        if jmp != providers::xray::JMP_OVER {
            return Err(format!("the sled begins with {jmp:02x?}, not jmp .+11"));
        }
        wordpatch::store_unexecuted(at as *mut u8, tail);
    }
    Ok(())
}

/// Rewrites a `-pg` profiling call to the NOP it is toggled from
/// ([`mcount::Found::rewritten`]), with the cross-modification protocol
/// of a toggle: threads may be running the code.
fn rewrite_call(addr: u64, found: &mcount::Found) -> std::result::Result<(), String> {
    let opts = wordpatch::PatchOptions {
        expected: Some(found.call_bytes()),
        wait: None,
    };
    // Why this is safe with threads running: the expected bytes are
    // checked atomically with the store (or under the INT3 lock); a thread
    // in the called function returns to the call's end, a boundary of the
    // NOP form too (a 6-byte call's trailing NOP was never a boundary to
    // be stopped at); the profiling functions preserve what the code reads.
    // SAFETY: `addr` starts one call instruction of exactly `expected`;
    // both forms are valid code with the boundaries above.
    unsafe { wordpatch::patch_with(addr as *mut u8, found.rewritten(), &opts) }.map_err(|e| e.to_string())
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
