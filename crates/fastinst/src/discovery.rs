//! The slow path: recognising a site on its first hook call, registering
//! its probe, rewriting its argument load, and telling the callbacks.

use crate::code::ON;
use crate::modules::{self, LiveMemory, Module, Modules};
use crate::probe::{ProbeId, ProbeKind, ProbeMeta, Provider};
use crate::registry::{self, Probe, Site};
use crate::sitetable::{self, key};
use crate::stats::{self, bump};
use callpatch::CallSite;
use parking_lot::Mutex;
use providers::decode::Checkpoints;
use providers::finstrument::{call_site_at, tail_sites, HookKind, HookSite, Hooks};
use providers::{argload, Memory};
use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::ffi::{CStr, CString};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;

/// A discovery callback (the C API's wraps its function pointer).
pub(crate) struct Callback(pub(crate) Box<dyn Fn(&ProbeMeta) + Send + Sync>);

impl Callback {
    pub(crate) fn call(&self, m: &ProbeMeta) {
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (self.0)(m))).is_err() {
            crate::log::error(format_args!("a discovery callback panicked on probe {}", m.id));
        }
    }
}

/// Largest value + 1 of the low tag encoding (from `vm.mmap_min_addr`);
/// 0 disables it.
pub(crate) static LOW_LIMIT: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Set while this thread runs discovery or its callbacks.
    static IN_DISCOVERY: Cell<bool> = const { Cell::new(false) };
}

/// Marks this thread as running discovery (or its callbacks) for as long
/// as it lives: hook calls it makes meanwhile are not discovered, and no
/// callback may be registered from it.
pub(crate) struct DiscoveryGuard(());

impl DiscoveryGuard {
    /// The guard, or `None` if this thread already runs discovery.
    pub(crate) fn enter() -> Option<DiscoveryGuard> {
        // Lazily: a guard made and dropped here would clear the flag.
        (!IN_DISCOVERY.with(|d| d.replace(true))).then(|| DiscoveryGuard(()))
    }

    /// Whether this thread runs discovery now.
    pub(crate) fn held() -> bool {
        IN_DISCOVERY.with(|d| d.get())
    }
}

impl Drop for DiscoveryGuard {
    fn drop(&mut self) {
        IN_DISCOVERY.with(|d| d.set(false));
    }
}

/// Most discovery callbacks at once.
pub const MAX_CALLBACKS: usize = 16;

pub(crate) struct State {
    pub modules: Modules,
    next_module: u32,
    /// Function names by entry address (a look-up and an insert per
    /// function at start-up: a fast hash of the address).
    names: fastinst_report::fx::FxMap<u64, &'static CStr>,
    /// Where those names are kept.
    name_store: NameStore,
    pub callbacks: Vec<Callback>,
    /// Whether to rewrite `this_fn` loads (`FASTINST_REWRITE`).
    pub rewrite: bool,
    /// Modules whose sled tables have been read (by index).
    pub sled_modules: std::collections::HashSet<u32>,
    /// Decode checkpoints of the functions whose argument loads were
    /// searched, by function start.
    checkpoints: HashMap<u64, Checkpoints>,
    /// Executable segments made writable in one call, by start.
    writable: HashSet<u64>,
    /// Return addresses of exit hook calls that could not be recognised,
    /// mapped to their function's tail probe ([`key::ret`]); forgotten with
    /// their module.
    unrecognised_rets: Vec<u64>,
}

pub(crate) static STATE: Mutex<Option<State>> = Mutex::new(None);
/// Whether the arg rewrite is on (read before the state exists).
pub(crate) static REWRITE: AtomicBool = AtomicBool::new(true);

fn low_limit() -> u64 {
    std::fs::read_to_string("/proc/sys/vm/mmap_min_addr")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map(|v| v.min(65536))
        .unwrap_or(0)
}

impl State {
    fn new() -> State {
        LOW_LIMIT.store(low_limit(), Ordering::Relaxed);
        let mut next = 0;
        let (modules, _) = modules::rescan(&Modules::default(), &mut next);
        crate::log::debug(format_args!("{} modules loaded", modules.loaded.len()));
        State {
            modules,
            next_module: next,
            names: Default::default(),
            name_store: NameStore::default(),
            callbacks: Vec::new(),
            rewrite: REWRITE.load(Ordering::Relaxed),
            sled_modules: Default::default(),
            checkpoints: HashMap::new(),
            writable: HashSet::new(),
            unrecognised_rets: Vec::new(),
        }
    }

    /// Rescans modules; returns those that went away, whose addresses are
    /// forgotten here (another module may be loaded there next).
    pub fn rescan(&mut self) -> Vec<Arc<Module>> {
        let (m, gone) = modules::rescan(&self.modules, &mut self.next_module);
        self.modules = m;
        let in_gone = |a: u64| gone.iter().any(|m| m.contains(a));
        self.checkpoints.retain(|&f, _| !in_gone(f));
        self.names.retain(|&f, _| !in_gone(f));
        self.writable.retain(|&a| !in_gone(a));
        self.unrecognised_rets.retain(|&a| {
            if in_gone(a) {
                sitetable::remove(key::ret(a));
            }
            !in_gone(a)
        });
        gone
    }

    /// Makes the executable segment holding `addr` writable in one call (one
    /// maps read and one `mprotect`, where a page at a time cost a maps read
    /// per page: a third of discovery on SQLite). Every function of a
    /// `-finstrument-functions` module has hook sites, so its text is
    /// patched page by page anyway; pages without sites become writable
    /// but are not copied. If that fails, each site's own patch says why.
    fn make_segment_writable(&mut self, addr: u64) {
        let Some(&(start, end, _)) = self
            .modules
            .find(addr)
            .and_then(|m| m.segments.iter().find(|&&(s, e, x)| x && addr >= s && addr < e))
        else {
            return;
        };
        if self.writable.insert(start) {
            if let Err(e) = wordpatch::make_writable(start as *const u8, (end - start) as usize) {
                crate::log::debug(format_args!("segment at {start:#x} not writable at once: {e}"));
            }
        }
    }

    /// Whether the hook site at `site`, whose `this_fn` is `f`, lies in a
    /// copy of `f` inlined into another function ([`ProbeMeta::inlined`]):
    /// the symbol holding it is neither `f` nor a part of `f` (a symbol
    /// named `f`'s name and a `.` suffix).
    pub(crate) fn in_inlined_copy(&self, site: u64, f: u64) -> bool {
        let holder = self.modules.find(site).and_then(|m| m.function(site));
        let own = self
            .modules
            .find(f)
            .and_then(|m| m.function(f))
            .filter(|x| x.start == f);
        match (holder, own) {
            (Some(holder), Some(own)) => holder.start != f && !is_part_of(&holder.name, &own.name),
            _ => false,
        }
    }

    /// The name of the function starting at `f`, made once (empty without
    /// a symbol), and its size published in the site table
    /// ([`key::extent`]) where its symbol gives one: a lock-free lookup for
    /// the profiler's handlers and sampler, which may not take the
    /// discovery lock. One symbol lookup for both: a sled build's start-up
    /// does both for every function, and the lookups were a sixth of its
    /// sled registration.
    pub(crate) fn name_and_extent(&mut self, f: u64) -> &'static CStr {
        let named = self.names.get(&f).copied();
        let published = sitetable::get(key::extent(f)).is_some();
        if let (Some(n), true) = (named, published) {
            return n;
        }
        let func = self
            .modules
            .find(f)
            .and_then(|m| m.function(f))
            .filter(|func| func.start == f);
        if !published {
            publish_extent_of(f, func);
        }
        if let Some(n) = named {
            return n;
        }
        let name = func.map_or("", |func| func.name.as_str());
        // Symbol names end at their NUL, so only a name from elsewhere
        // needs its NULs taken out.
        let c = if name.contains('\0') {
            self.name_store.keep(name.replace('\0', "").as_bytes())
        } else {
            self.name_store.keep(name.as_bytes())
        };
        self.names.insert(f, c);
        c
    }

    /// `name` (NULs taken out), kept for the process's life: a name that
    /// is not a symbol's (a point probe's).
    pub(crate) fn keep_name(&mut self, name: &str) -> &'static CStr {
        self.name_store.keep(name.replace('\0', "").as_bytes())
    }

    /// Makes room for `n` more function names.
    pub(crate) fn reserve_names(&mut self, n: usize) {
        self.names.reserve(n);
    }
}

/// Function names kept for the process's life (probes hand them out as
/// `&'static CStr`), laid end to end in leaked chunks: a block of its own
/// each, as they were, was an allocation per function at start-up (QuickJS:
/// ~1,300, SQLite ~1,500).
#[derive(Default)]
struct NameStore {
    rest: &'static mut [u8],
}

impl NameStore {
    /// Bytes per chunk; a longer name gets a block of its own.
    const CHUNK: usize = 64 << 10;

    /// `bytes` (no NUL inside) with a NUL after them, kept.
    fn keep(&mut self, bytes: &[u8]) -> &'static CStr {
        let need = bytes.len() + 1;
        if need > Self::CHUNK / 8 {
            let c = CString::new(bytes).unwrap_or_default();
            return Box::leak(c.into_boxed_c_str());
        }
        if self.rest.len() < need {
            self.rest = Box::leak(vec![0u8; Self::CHUNK].into_boxed_slice());
        }
        let (mine, rest) = std::mem::take(&mut self.rest).split_at_mut(need);
        self.rest = rest;
        mine[..bytes.len()].copy_from_slice(bytes);
        mine[bytes.len()] = 0;
        let mine: &'static [u8] = mine;
        CStr::from_bytes_with_nul(mine).unwrap_or_default()
    }
}

/// Publishes the size of function `f` from its symbol `func` (found at `f`).
fn publish_extent_of(f: u64, func: Option<&providers::elf::Function>) {
    let size = func
        .filter(|s| s.start == f)
        .and_then(|s| u32::try_from(s.end() - f).ok());
    if let Some(size) = size {
        sitetable::insert(key::extent(f), size);
    }
}

/// Whether symbol `holder` is a part of function `f` that the compiler
/// split off or cloned (`f.cold`, `f.part.0`, `f.constprop.0`, `f.isra.0`,
/// and their combinations): `f`'s name and a `.` suffix.
fn is_part_of(holder: &str, f: &str) -> bool {
    !f.is_empty() && holder.strip_prefix(f).is_some_and(|rest| rest.starts_with('.'))
}

/// Creates the discovery state now (reads every loaded module's symbols),
/// so that the first hook call does not pay for it, and runs `then` before
/// the discovery lock goes (so before any discovery after it can patch
/// code). Returns the ticks spent.
pub(crate) fn init(then: impl FnOnce()) -> u64 {
    let t0 = wordpatch::tsc::now();
    with_state(|_| then());
    INIT_TICKS.store(wordpatch::tsc::now().wrapping_sub(t0), Ordering::Relaxed);
    INIT_TICKS.load(Ordering::Relaxed)
}

/// Ticks the start-up [`init`] took.
pub(crate) static INIT_TICKS: AtomicU64 = AtomicU64::new(0);

/// Runs `f` with the discovery state (created on first use).
pub(crate) fn with_state<R>(f: impl FnOnce(&mut State) -> R) -> R {
    let mut g = STATE.lock();
    let s = g.get_or_insert_with(State::new);
    f(s)
}

/// A hook call being discovered.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HookCall {
    /// Entry or exit hook.
    pub kind: HookKind,
    /// The hook's first argument: the instrumented function.
    pub this_fn: u64,
    /// The hook call's return address.
    pub ret: u64,
    /// The hook's second argument: the function's return address. A call
    /// whose `ret` differs from it came from a `call` of the hook, never
    /// from a tail jump.
    pub call_site: u64,
    /// The hooks' addresses, which a recognised site must reach.
    pub hooks: Hooks,
}

/// Discovers the probe hook call `call` belongs to. Holds the discovery
/// lock.
///
/// `tail` is the function's tail-exit probe when the caller found one but
/// judged that the call came from another site (`hooks::undiscovered_call`):
/// the call is then looked up by its return address only, and if it turns
/// out to come from no new site, `tail` is its probe.
pub(crate) fn discover(call: HookCall, tail: Option<ProbeId>) -> Option<ProbeId> {
    let HookCall { kind, this_fn, ret, .. } = call;
    with_state(|s| {
        sitetable::prepare(ret);
        sitetable::prepare(this_fn);
        let known = sitetable::probe(key::ret(ret)).or_else(|| match tail {
            Some(_) => None,
            None => sitetable::probe(key::function(this_fn, kind as u8)),
        });
        if let Some(id) = known {
            return Some(id);
        }
        if s.modules.find(ret).is_none() || s.modules.find(this_fn).is_none() {
            // A library loaded since: reading its symbols is module
            // loading, not discovery, and is not counted as such.
            s.rescan();
        }
        let t0 = wordpatch::tsc::now();
        let r = discover_locked(s, call, tail);
        stats::DISCOVERY_TICKS.fetch_add(wordpatch::tsc::now().wrapping_sub(t0), Ordering::Relaxed);
        bump(&stats::DISCOVERIES);
        r
    })
}

fn discover_locked(s: &mut State, call: HookCall, tail: Option<ProbeId>) -> Option<ProbeId> {
    let HookCall {
        kind,
        this_fn,
        ret,
        call_site,
        hooks,
    } = call;
    let site = call_site_at(&LiveMemory { modules: &s.modules }, &hooks, kind, ret);
    match site {
        Ok(site) => {
            let id = register(s, Some(site), kind, this_fn, hooks.enter)?;
            sitetable::insert(key::ret(site.end()), id.get());
            Some(id)
        }
        Err(why) => {
            if kind == HookKind::Exit {
                let bounds = s
                    .modules
                    .find(this_fn)
                    .and_then(|m| m.function(this_fn))
                    .filter(|f| f.start == this_fn && f.size > 0)
                    .map(|f| (f.start, f.end()));
                if let Some((start, end)) = bounds {
                    let tails = tail_sites(&LiveMemory { modules: &s.modules }, &hooks, start, end);
                    let mut first = None;
                    for t in &tails {
                        if sitetable::get(key::site(t.addr)).is_some() {
                            continue;
                        }
                        if let Some(id) = register(s, Some(*t), kind, this_fn, hooks.enter) {
                            first.get_or_insert(id);
                        }
                    }
                    if let Some(id) = first {
                        if tails.len() > 1 {
                            bump(&stats::TAIL_AMBIGUOUS);
                            sitetable::insert(key::tails_ambiguous(this_fn), 1);
                        }
                        sitetable::insert(key::function(this_fn, kind as u8), id.get());
                        return Some(id);
                    }
                }
                if let Some(id) = tail {
                    if ret != call_site {
                        // A `call` of the hook that cannot be recognised
                        // (so never switched): its return address is
                        // mapped to the tail probe, whose function's exit it
                        // is, so that its next calls do not come back here.
                        // Only such a call: a tail jump's return address
                        // lies in the function's caller, where another
                        // function's tail jump may return to it as well.
                        bump(&stats::UNRECOGNISED);
                        crate::log::info(format_args!(
                            "unrecognised exit hook site (this_fn {this_fn:#x}, return address {ret:#x}): {why:?}; it stays on"
                        ));
                        sitetable::insert(key::ret(ret), id.get());
                        s.unrecognised_rets.push(ret);
                    }
                    // Else a thread that fetched the tail jump just before
                    // it was switched off. It stays the tail's call.
                    return tail;
                }
            }
            bump(&stats::UNRECOGNISED);
            crate::log::info(format_args!(
                "unrecognised {kind:?} hook site (this_fn {this_fn:#x}, return address {ret:#x}): {why:?}; it stays on"
            ));
            let id = register(s, None, kind, this_fn, hooks.enter)?;
            sitetable::insert(key::function(this_fn, kind as u8), id.get());
            Some(id)
        }
    }
}

/// Registers the probe of hook call site `site` (`None`: not recognised)
/// of `this_fn`; an entry call is given a counting stub that reaches the
/// entry hook at `enter_hook` where it can have one (`crate::callcount`).
fn register(s: &mut State, site: Option<HookSite>, kind: HookKind, this_fn: u64, enter_hook: u64) -> Option<ProbeId> {
    if registry::count() as usize >= registry::MAX_PROBES || registry::count() as usize > sitetable::CAPACITY / 5 {
        bump(&stats::FULL);
        crate::log::warn(format_args!(
            "probe tables full; hook calls at {this_fn:#x} stay on, unmanaged"
        ));
        return None;
    }
    let name = s.name_and_extent(this_fn);
    let module = site
        .and_then(|t| s.modules.find(t.addr))
        .or_else(|| s.modules.find(this_fn))
        .map(|m| m.index)
        .unwrap_or(u32::MAX);
    if let Some(t) = site {
        s.make_segment_writable(t.addr);
    }
    let call = site.and_then(|t| {
        if kind == HookKind::Enter && t.form.call_form() == callpatch::Form::CallRel32 {
            let given =
                // SAFETY: as below; the entry call's stub reaches the same
                // hook, and no other thread writes the site (the discovery
                // lock is held, and its probe is not registered yet).
                unsafe { crate::callcount::retarget(t.addr as usize, t.operand, enter_hook as usize) };
            if let Some((c, counted)) = given {
                return Some((c, Some(counted)));
            }
        }
        // SAFETY: the site was recognised as a whole call/jmp of this form
        // to the hook, whose callee follows the ABI; the runtime owns its
        // toggling from now on.
        match unsafe { CallSite::new(t.addr as *mut u8, t.form.call_form(), t.operand) } {
            Ok(c) => Some((c, None)),
            Err(e) => {
                crate::log::warn(format_args!("site {:#x} cannot be toggled ({e}); it stays on", t.addr));
                None
            }
        }
    });
    let site = if call.is_some() { site } else { None };
    let kind = match kind {
        HookKind::Enter => ProbeKind::Entry,
        HookKind::Exit => ProbeKind::Exit,
    };
    let p = registry::push(|id| Probe {
        meta: ProbeMeta {
            id,
            kind,
            function: this_fn as usize,
            function_name: name,
            site: site.map_or(0, |t| t.addr as usize),
            site_len: site.map_or(0, |t| t.len() as u8),
            split: site.map_or(0, |t| wordpatch::split(t.addr as usize, t.len()) as u8),
            form: site.map(|t| t.form),
            provider: Provider::Finstrument,
            arg_rewritten: false,
            inlined: site.is_some_and(|t| s.in_inlined_copy(t.addr, this_fn)),
        },
        handler: AtomicUsize::new(0),
        state: AtomicU8::new(ON),
        lock: AtomicBool::new(false),
        unloaded: AtomicBool::new(false),
        rewrite_at: AtomicU64::new(0),
        module,
        site: call.map_or(Site::Unrecognised, |(c, counted)| Site::Call(c, counted)),
        tool: AtomicU64::new(0),
        inactive_hits: AtomicU64::new(0),
    })?;
    let id = p.meta.id;
    if let Some(t) = site {
        sitetable::insert(key::site(t.addr), id.get());
        sitetable::insert(key::patched(t.addr), t.len() as u32);
        if s.rewrite {
            rewrite_arg(s, p, &t, this_fn);
        }
    }
    let meta = p.meta();
    for cb in &s.callbacks {
        cb.call(&meta);
    }
    Some(id)
}

/// Rewrites the `this_fn` load feeding `site` to load probe `p`'s tag.
fn rewrite_arg(s: &mut State, p: &Probe, site: &HookSite, this_fn: u64) {
    let mem = LiveMemory { modules: &s.modules };
    let Some(f) = s.modules.find(site.addr).and_then(|m| m.function(site.addr)) else {
        return;
    };
    let from = s
        .checkpoints
        .entry(f.start)
        .or_insert_with(|| Checkpoints::new(f.start, f.end()))
        .before(&mem, site.addr, argload::WINDOW);
    let rw = match argload::find(&mem, from, site.addr, this_fn) {
        Ok(rw) => rw,
        Err(why) => {
            crate::log::debug(format_args!("no argument rewrite at {:#x}: {why:?}", site.addr));
            return;
        }
    };
    let Some(tag) = rw.tag_for(p.meta.id.get(), LOW_LIMIT.load(Ordering::Relaxed)) else {
        return;
    };
    // The bytes must still be what was decoded.
    let mut now = [0u8; 8];
    if !mem.read(rw.addr, &mut now[..rw.len]) || now[..rw.len] != rw.old[..rw.len] {
        return;
    }
    let new = rw.new_bytes(tag);
    let opts = wordpatch::PatchOptions {
        expected: Some(&rw.old[..rw.len]),
        wait: None,
    };
    // Why this is sound: `rw` covers one whole instruction (or the imm64 of
    // one, inside a cache line), replaced by one of the same length and
    // boundaries that loads the tag into the same register; argload checked
    // that nothing but the hook reads the value. The probe is published
    // before the tag can be seen.
    // SAFETY: see above; the bytes were just re-read and are `rw.old`.
    let r = unsafe { wordpatch::patch_with(rw.addr as *mut u8, &new[..rw.len], &opts) };
    match r {
        Ok(()) => {
            sitetable::insert(key::patched(rw.insn), rw.insn_len as u32);
            p.rewrite_at.store(rw.insn, Ordering::Release);
            bump(&stats::REWRITTEN);
        }
        Err(e) => crate::log::debug(format_args!("argument rewrite at {:#x} failed: {e}", rw.addr)),
    }
}

/// Marks the probes of modules that went away as unloaded and forgets
/// their keys and pages. Caller holds the discovery lock.
pub(crate) fn forget_modules(gone: &[Arc<Module>]) {
    for m in gone {
        crate::log::info(format_args!("{} unloaded", m.path));
        for p in registry::iter().filter(|p| p.module == m.index) {
            let _g = p.lock();
            p.unloaded.store(true, Ordering::Release);
            let meta = p.meta;
            if meta.site != 0 {
                let end = (meta.site + meta.site_len as usize) as u64;
                sitetable::remove(key::ret(end));
                sitetable::remove(key::site(meta.site as u64));
                sitetable::remove(key::patched(meta.site as u64));
            }
            sitetable::remove(key::function(meta.function as u64, meta.kind as u8));
            sitetable::remove(key::tails_ambiguous(meta.function as u64));
            let rw = p.rewrite_at.load(Ordering::Relaxed);
            if rw != 0 {
                sitetable::remove(key::patched(rw));
            }
        }
        for &(start, end, _) in &m.segments {
            wordpatch::forget_pages(start as *const u8, (end - start) as usize);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{is_part_of, DiscoveryGuard, NameStore};
    use std::ffi::CStr;

    #[test]
    fn a_nested_discovery_guard_is_refused_and_leaves_the_outer_one_held() {
        std::thread::spawn(|| {
            assert!(!DiscoveryGuard::held());
            let outer = DiscoveryGuard::enter().expect("the first guard");
            assert!(DiscoveryGuard::enter().is_none(), "a nested one is refused");
            assert!(DiscoveryGuard::held(), "and the refusal leaves the outer one held");
            assert!(DiscoveryGuard::enter().is_none());
            drop(outer);
            assert!(!DiscoveryGuard::held());
            assert!(DiscoveryGuard::enter().is_some());
        })
        .join()
        .unwrap();
    }

    #[test]
    fn clones_and_cold_parts_are_the_functions_own_code() {
        for holder in ["f.cold", "f.part.0", "f.constprop.0", "f.isra.0.cold", "_ZN1a1fEv.cold"] {
            let f = holder.split_once('.').unwrap().0;
            assert!(is_part_of(holder, f), "{holder} is part of {f}");
        }
        // Another function whose name merely starts with f's, or the same
        // name with no suffix (an alias is handled by its address).
        for (holder, f) in [("fx", "f"), ("f_cold", "f"), ("g.cold", "f"), ("f", "f"), (".cold", "")] {
            assert!(!is_part_of(holder, f), "{holder} is not part of {f:?}");
        }
    }

    #[test]
    fn kept_names_read_back_across_chunks() {
        let mut store = NameStore::default();
        let names: Vec<String> = (0..20_000)
            .map(|i| match i % 97 {
                0 => "x".repeat(NameStore::CHUNK / 8 + i % 5),
                1 => String::new(),
                _ => format!("function_{i}_{}", "y".repeat(i % 40)),
            })
            .collect();
        let kept: Vec<&'static CStr> = names.iter().map(|n| store.keep(n.as_bytes())).collect();
        for (n, c) in names.iter().zip(&kept) {
            assert_eq!(c.to_bytes(), n.as_bytes());
        }
    }
}
