//! The `__cyg_profile_func_enter/exit` entry points and the fast path.
//!
//! Each hook is a two-instruction naked stub that hands the return address
//! to Rust (`mov rdx,[rsp]; jmp`). The fast path: a tagged `this_fn` (the
//! rewritten argument load) is the probe id; otherwise the return address is
//! looked up in the lock-free site table; otherwise a function key (tail
//! jumps, unrecognised sites); only then the slow path, discovery. No locks,
//! allocation or system calls before discovery. The recursion guard and the
//! hook context are static TLS slots (`tls.rs`), so they work in
//! threads that are exiting and in signal handlers.

use crate::arch::tls::{self, guard_get, guard_set};
use crate::discovery::DiscoveryGuard;
use crate::probe::ProbeId;
use crate::registry;
use crate::sitetable::{self, key};
use crate::stats;
use providers::finstrument::{HookKind, Hooks};
use std::sync::atomic::Ordering;

/// What a handler may ask about the hook that called it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HookContext {
    /// The instrumented function's return address (in its caller): the
    /// `call_site` argument the compiler passes to the hook.
    pub call_site: usize,
    /// The instrumented function's stack pointer at the hook call; for a
    /// sled probe, the address of the slot that holds its return address.
    pub stack: usize,
    /// The function's canonical frame address (its stack pointer before the
    /// call that entered it) when the provider knows it exactly (sled
    /// probes); 0 when it must be found from `stack` and `call_site`.
    pub cfa: usize,
    /// The TSC when the hook began, before it did anything else, while
    /// hooks time themselves ([`crate::clock`]); 0 otherwise.
    pub started: u64,
}

/// The context of the hook whose handler is running on this thread. Only
/// meaningful inside a probe handler; elsewhere it is the last hook's.
pub fn context() -> HookContext {
    let (a, b, c, d) = tls::ctx_get();
    HookContext {
        call_site: a as usize,
        stack: b as usize,
        cfa: c as usize,
        started: d,
    }
}

/// The function's CFA: as the provider gives it (sled probes), else just
/// above the slot holding `call_site` (its return address), searched upward from its stack pointer at the hook. The search
/// starts one word lower: a tail-jump exit (`pop rbx; jmp exit_hook`)
/// reaches the hook with the function's own return address on top of the
/// stack; a called hook has its own return address there, which is never
/// `call_site`.
#[inline]
pub(crate) fn cfa(ctx: HookContext) -> Option<u64> {
    const WORDS: usize = 256;
    if ctx.cfa != 0 {
        return Some(ctx.cfa as u64);
    }
    let mut p = (ctx.stack & !7) - 8;
    for _ in 0..WORDS {
        // SAFETY: above an instrumented function's stack pointer lie its
        // frame, its callers' frames, then glibc's thread descriptor (or the
        // main thread's environment): 2 KiB up is mapped stack memory.
        let v = unsafe { std::ptr::read_volatile(p as *const usize) };
        if v == ctx.call_site {
            return Some(p as u64 + 8);
        }
        p += 8;
    }
    None
}

/// The hook stubs ([`crate::arch::stubs::hook_stub`]): the unclocked
/// path and the clocked one, chosen by the clock's flag.
macro_rules! hook_stub {
    ($unclocked:path, $clocked:path, $own:literal) => {
        crate::arch::stubs::hook_stub!(
            $unclocked,
            $clocked,
            flag: crate::clock::FASTINST_CLOCKED,
            end: crate::clock::end_fi,
            own: $own
        )
    };
    ($unclocked:path, $clocked:path, $own:literal, cheap: $cheap:path) => {
        crate::arch::stubs::hook_stub!(
            $unclocked,
            $clocked,
            flag: crate::clock::FASTINST_CLOCKED,
            end: crate::clock::end_fi,
            own: $own,
            cheap: $cheap
        )
    };
}

/// The entry hook gcc and clang call (`-finstrument-functions`).
///
/// # Safety
/// Called by compiler-generated code only.
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn __cyg_profile_func_enter(this_fn: *mut libc::c_void, call_site: *mut libc::c_void) {
    hook_stub!(enter_fast, enter_clocked, "fastinst_own_cyg_enter")
}

/// The exit hook gcc and clang call (`-finstrument-functions`).
///
/// # Safety
/// Called by compiler-generated code only.
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn __cyg_profile_func_exit(this_fn: *mut libc::c_void, call_site: *mut libc::c_void) {
    hook_stub!(
        exit_fast,
        exit_clocked,
        "fastinst_own_cyg_exit",
        cheap: crate::clock::FASTINST_CHEAP_EXITS
    )
}

/// The exit hook as the calibration runs it (`crate::hookcost`): the same
/// code, its cheap path always open, so that it can be timed whatever the
/// profiler's setting.
///
/// # Safety
/// As [`__cyg_profile_func_exit`].
#[unsafe(naked)]
pub(crate) unsafe extern "C" fn calibration_cyg_exit(this_fn: *mut libc::c_void, call_site: *mut libc::c_void) {
    hook_stub!(
        exit_fast,
        exit_clocked,
        "fastinst_calibration_cyg_exit",
        cheap: crate::clock::FASTINST_CHEAP_ALWAYS
    )
}

unsafe extern "C" {
    /// The first instruction of [`__cyg_profile_func_enter`], by a hidden
    /// name (see `arch::stubs::hook_stub`): what the hook calibration
    /// calls (`hookcost`), as the exported name reaches the C library's
    /// no-op in an attached process.
    pub(crate) fn fastinst_own_cyg_enter();
    /// The first instruction of [`__cyg_profile_func_exit`], likewise.
    fn fastinst_own_cyg_exit();
}

/// The hooks' addresses, as the site recogniser compares them: this
/// library's own, which the program's calls reach under `LD_PRELOAD` and
/// through the slots an attach binds. (Taken by their exported names they
/// would be the C library's in an attached process, and no site would be
/// recognised.)
pub(crate) fn hooks() -> Hooks {
    Hooks {
        enter: fastinst_own_cyg_enter as *const () as u64,
        exit: fastinst_own_cyg_exit as *const () as u64,
    }
}

extern "C" fn enter_fast(this_fn: u64, call_site: u64, ret: u64, stack: u64) {
    hook(HookKind::Enter, this_fn, ret, call_site, stack, 0);
}

extern "C" fn exit_fast(this_fn: u64, call_site: u64, ret: u64, stack: u64) {
    hook(HookKind::Exit, this_fn, ret, call_site, stack, 0);
}

/// The clocked fast paths: return the thread clock the stub charges with
/// the hook's time (0: none).
extern "C" fn enter_clocked(this_fn: u64, call_site: u64, ret: u64, stack: u64, started: u64) -> usize {
    hook(HookKind::Enter, this_fn, ret, call_site, stack, started)
}

extern "C" fn exit_clocked(this_fn: u64, call_site: u64, ret: u64, stack: u64, started: u64) -> usize {
    hook(HookKind::Exit, this_fn, ret, call_site, stack, started)
}

/// Finds the probe and fires it; returns the thread clock to charge with
/// the hook's time, for a hook that `started` (0: unclocked, nothing).
#[inline(always)]
fn hook(kind: HookKind, this_fn: u64, ret: u64, call_site: u64, stack: u64, started: u64) -> usize {
    let id = match providers::tag::decode(this_fn, crate::discovery::LOW_LIMIT.load(Ordering::Relaxed)) {
        Some(id) => ProbeId::new(id),
        None => match sitetable::probe(key::ret(ret)) {
            Some(id) => id,
            // A tail-jump exit (a function's last call is often its exit
            // hook, so a good share of exits), found by its function.
            None => match sitetable::probe(key::function(this_fn, kind as u8)) {
                Some(id) if !undiscovered_call(id, ret, call_site) => id,
                by_function => return slow(kind, this_fn, ret, call_site, stack, by_function, started),
            },
        },
    };
    fire(id, call_site, stack, 0, started)
}

/// Runs probe `id`'s handler, if it has one, under the recursion guard,
/// with the hook's context published for [`context`]. `started` is the
/// hook's TSC stamp (0 when hooks do not time themselves); returns the
/// thread clock its stub charges with the hook's time (0: none).
#[inline(always)]
pub(crate) fn fire(id: ProbeId, call_site: u64, stack: u64, cfa: u64, started: u64) -> usize {
    let (clock, started) = crate::clock::begin_hook(started);
    fire_inner(id, call_site, stack, cfa, started);
    clock
}

/// [`fire`] for a caller that begins the hook's clock itself (the sled
/// trampolines, whose work around the handler is the hook's too).
#[inline(always)]
pub(crate) fn fire_unclocked(id: ProbeId, call_site: u64, stack: u64, cfa: u64, started: u64) {
    fire_inner(id, call_site, stack, cfa, started)
}

/// Asks the sled entry trampoline running this handler not to watch the
/// call's exit (not to substitute its return address) although the exit
/// probe is on: an entry handler that counts a call without timing it.
/// No effect elsewhere (a `-finstrument-functions` exit is its own site).
#[inline(always)]
pub fn decline_exit() {
    tls::set_exit_declined(1);
}

#[inline(always)]
fn fire_inner(id: ProbeId, call_site: u64, stack: u64, cfa: u64, started: u64) {
    let Some(p) = registry::get(id) else { return };
    let h = p.handler.load(Ordering::Acquire);
    if h == 0 {
        if p.state.load(Ordering::Relaxed) & crate::code::ON == 0 {
            p.inactive_hits.fetch_add(1, Ordering::Relaxed);
        }
        return;
    }
    // SAFETY: a non-zero handler word was stored from a `Handler`.
    let h: crate::probe::Handler = unsafe { std::mem::transmute::<usize, crate::probe::Handler>(h) };
    if guard_get() {
        stats::bump(&stats::DROPPED_NESTED);
        return;
    }
    guard_set(true);
    tls::ctx_set(call_site, stack, cfa, started);
    h(id);
    guard_set(false);
}

/// Whether a hook call that found probe `id` only by its function came
/// from a site not discovered yet rather than from `id`'s own site.
///
/// A function's tail-jump exit (`jmp __cyg_profile_func_exit`) reaches the
/// hook with its caller's return address, so it is keyed by the function.
/// That key also catches every exit site of the same function that has not
/// been seen yet: the `call`s of copies inlined elsewhere, each with its own
/// return address. Two tests tell them apart:
/// - A tail jump leaves the function's own return address on top of the
///   stack, and that is the `call_site` the compiler passes: `ret ==
///   call_site`. A `call` of the hook pushes the address after it, inside
///   the code that made it, which is never the `call_site` of the function
///   it belongs to. So `ret != call_site` is a call from another site,
///   whatever state the tail site is in. Before this test, a copy's exit
///   ran the tail probe's handler for as long as that probe stayed on:
///   with inlined copies off (their entries never counted), a function
///   whose own code is seldom called stays counted whole, its tail exit
///   stays on for good, and on QuickJS's gcc build the exits of three
///   helpers' inlined copies (`JS_FreeValue`, `js_free_rt`, `set_value`)
///   ran the hook and an exit handler that matched nothing 320,000 times a
///   run, five for every sample.
/// - When the tail site is switched off it no longer calls the hook (a
///   thread that fetched it just before may, once; discovery then finds no
///   new site and returns `id`), so such a call is from elsewhere. SQLite's
///   gcc build made 1.2 million such calls per run with every probe off
///   before this was checked. A function with several tail jumps is left
///   to the first test (its other tail sites would send every call to
///   discovery).
#[inline]
fn undiscovered_call(id: ProbeId, ret: u64, call_site: u64) -> bool {
    registry::get(id).is_some_and(|p| {
        p.site.call().is_some_and(|c| c.form().is_tail())
            && (ret != call_site
                || (p.state.load(Ordering::Relaxed) & crate::code::ON == 0
                    && sitetable::get(key::tails_ambiguous(p.meta.function as u64)).is_none()))
    })
}

#[cold]
#[inline(never)]
fn slow(
    kind: HookKind,
    this_fn: u64,
    ret: u64,
    call_site: u64,
    stack: u64,
    by_function: Option<ProbeId>,
    started: u64,
) -> usize {
    if guard_get() {
        // A hook reached from discovery itself (a callback, a signal
        // handler that interrupted it) or from a handler: not discovered
        // now; the next call from outside discovers it.
        stats::bump(&stats::DROPPED_IN_DISCOVERY);
        return 0;
    }
    let Some(in_discovery) = DiscoveryGuard::enter() else {
        stats::bump(&stats::DROPPED_IN_DISCOVERY);
        return 0;
    };
    // Discovery is the runtime's time: charged to the thread's hook time
    // here, whole, and the hook's own clock starts after it (a hook's
    // stamped time is capped, so a discovery left in it would mostly count
    // as the program's own time, which the profiler's rates are measured
    // against).
    let discovery_from = wordpatch::tsc::now();
    let r = std::panic::catch_unwind(|| {
        let call = crate::discovery::HookCall {
            kind,
            this_fn,
            ret,
            call_site,
            hooks: hooks(),
        };
        crate::discovery::discover(call, by_function)
    });
    drop(in_discovery);
    let discovery_to = wordpatch::tsc::now();
    crate::clock::charge_discovery(discovery_to.wrapping_sub(discovery_from));
    let started = if started == 0 {
        0
    } else {
        started.wrapping_add(discovery_to.wrapping_sub(discovery_from))
    };
    match r {
        Ok(Some(id)) => fire(id, call_site, stack, 0, started),
        Ok(None) => crate::clock::begin_hook(started).0,
        Err(_) => {
            crate::log::error(format_args!("discovery panicked at {ret:#x}; the site stays unpatched"));
            crate::clock::begin_hook(started).0
        }
    }
}
