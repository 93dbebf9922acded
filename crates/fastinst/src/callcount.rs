//! Counting stubs for `-finstrument-functions` entry calls: the sleds'
//! counting path (`crate::sled::counter`) for the other build kind.
//!
//! A `-finstrument-functions` entry is `call __cyg_profile_func_enter`,
//! whose full hook (the PLT's jump, the stub's stamps, the look-up, the
//! handler) costs several times what many hot functions take. A profiler
//! window counting such a function ran mostly hook time, and its rate
//! stood on the difference of the window's time and the hooks' charges,
//! so any error in those charges (what a hook costs beyond its stamps
//! grows when threads share a CPU) moved the estimate by as much, times
//! the hooks' share.
//!
//! While the profiler runs, each entry call discovered whose 4-byte
//! operand lies in one cache line is given a counting stub of its own:
//! the operand is rewritten, with one atomic store, to call the stub
//! instead of the hook. Instruction fetch sees the old call or the new,
//! both whole calls, whichever the store came between; no other byte
//! changes. The stub is the sleds' counting stub with another tail: while
//! its counter is disarmed, and for the calls drawn for timing, it jumps
//! to the entry hook itself, which sees the return address the site's
//! call pushed, exactly as if the site had called it directly. Its site
//! is then toggled as before (flip, paper or word strategies, against the
//! new call's bytes).
//!
//! A call the stub sends on runs its few instructions before the hook's
//! first stamp, beyond what the calibration's direct call of the hook
//! runs (`crate::hookcost`): within that calibration's own spread, and
//! not charged.
//!
//! A call whose operand crosses a cache line keeps calling the hook: one
//! store cannot change it whole. Its function counts through its hooks,
//! as every function did before (`Func::counts_in_stubs` is false when
//! any entry of a function lacks a stub).
//!
//! The stubs are made an area at a time near the code that needs them
//! (within `call rel32` reach), read+execute, never written again; their
//! counters follow them in read+write pages, zeroed (disarmed). A detach
//! puts each rewritten operand back from the file with every other byte
//! the runtime changed; an attach after it gives each site its stub
//! again ([`reapply`]).

use crate::sled::counter::Counter;
use callpatch::{CallSite, Form};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Stubs per area: an area is made when no area within reach of a site
/// has a stub left.
const AREA_STUBS: usize = 512;

/// What a counted entry call site was given.
pub(crate) struct Counted {
    /// The stub's counter.
    pub(crate) counter: &'static Counter,
    /// The call's operand as compiled (to the hook, through the PLT):
    /// what a detach puts back. (The operand to the stub is the site's
    /// own: `CallSite::on`.)
    pub(crate) original: i32,
}

/// Whether entry calls discovered from now on get counting stubs.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Gives every entry call discovered from now on a counting stub, where
/// it can have one (the profiler, at its start).
pub(crate) fn enable() {
    ENABLED.store(true, Ordering::Relaxed);
}

/// One area of stubs: their addresses and counters, and how many are
/// given out.
struct Area {
    stubs: Vec<(usize, &'static Counter)>,
    used: usize,
}

static AREAS: Mutex<Vec<Area>> = Mutex::new(Vec::new());

/// The operand of a `call rel32` at `site` that reaches `target`, if
/// within reach.
fn rel_to(site: usize, target: usize) -> Option<i32> {
    i32::try_from(target as i64 - (site as i64 + 5)).ok()
}

/// Gives the `call rel32` at `site`, with operand `operand` (to the entry
/// hook at `hook`), a counting stub, rewriting its operand; returns the
/// site's toggling view for the new call, and what it was given. `None`,
/// with the site unchanged: stubs are off, the operand crosses a line,
/// no stub area could be mapped near the site, or the site does not hold
/// that call now.
///
/// # Safety
/// `site` is a `call rel32` to the entry hook, with `operand`, whose
/// toggling the caller owns from now on (the discovery, registering its
/// probe), and no other thread writes it meanwhile.
pub(crate) unsafe fn retarget(site: usize, operand: i32, hook: usize) -> Option<(CallSite, &'static Counted)> {
    if !ENABLED.load(Ordering::Relaxed) {
        return None;
    }
    // SAFETY: forwarded contract.
    unsafe { give_stub(site, operand, hook) }
}

/// [`retarget`], whether stubs are on or not.
///
/// # Safety
/// As for [`retarget`].
unsafe fn give_stub(site: usize, operand: i32, hook: usize) -> Option<(CallSite, &'static Counted)> {
    if wordpatch::split(site + 1, 4) != 0 {
        return None;
    }
    let mut areas = AREAS.lock().unwrap_or_else(|e| e.into_inner());
    let within = |a: &Area| {
        a.used < a.stubs.len()
            && rel_to(site, a.stubs[0].0).is_some()
            && rel_to(site, a.stubs[a.stubs.len() - 1].0).is_some()
    };
    let k = match areas.iter().position(within) {
        Some(k) => k,
        None => {
            let stubs = crate::sled::stubarea::make_hook_stubs(site, site + 5, AREA_STUBS, hook)?;
            areas.push(Area { stubs, used: 0 });
            areas.len() - 1
        }
    };
    let (stub, counter) = areas[k].stubs[areas[k].used];
    let to_stub = rel_to(site, stub)?;
    // SAFETY: the caller's contract: a `call rel32` the caller owns; this
    // makes its page writable and computes the new call's forms.
    let call = unsafe { CallSite::prepared(site as *mut u8, Form::CallRel32, to_stub) }.ok()?;
    // SAFETY: as above; the operand lies in one line (checked), and every
    // value it passes through is a whole call: to the hook or to a stub
    // that reaches it.
    unsafe { swap_operand(site, operand, to_stub) }.then_some(())?;
    areas[k].used += 1;
    // One record per site, kept for the probe's life (as probes are).
    let counted = Box::leak(Box::new(Counted {
        counter,
        original: operand,
    }));
    Some((call, counted))
}

/// Rewrites the operand of the `call rel32` at `site` from `from` to
/// `to` with one atomic store, if the site holds that call now.
///
/// # Safety
/// The operand lies in one cache line, the site's page was made writable
/// (`CallSite::prepared`), and both calls are valid for every thread
/// running the site.
unsafe fn swap_operand(site: usize, from: i32, to: i32) -> bool {
    let mut now = [0u8; 5];
    // SAFETY: the page is mapped (made writable by the caller).
    unsafe { wordpatch::read_code(site as *const u8, &mut now) };
    if now[0] != 0xE8 || now[1..] != from.to_le_bytes() {
        return false;
    }
    // SAFETY: forwarded contract; the store re-checks the operand.
    unsafe { wordpatch::store_in_line((site + 1) as *mut u8, &to.to_le_bytes(), Some(&from.to_le_bytes())) }.is_ok()
}

/// After a detach put the file's bytes back (the call to the hook) and an
/// attach took over again: gives the site at `site` its stub again.
/// Returns whether it now calls its stub.
pub(crate) fn reapply(site: &CallSite, counted: &Counted) -> bool {
    if site.is_active() {
        return true;
    }
    if wordpatch::split(site.addr() + 1, 4) != 0 {
        return false;
    }
    // SAFETY: the probe's site, whose toggling the runtime owns and whose
    // caller holds its lock; its page was made writable when the probe was
    // registered, and the operand lies in one line (checked when the stub
    // was given, and again above).
    unsafe { swap_operand(site.addr(), counted.original, to_stub(site)) }
}

/// The operand of the call to its stub that `site` was made for.
fn to_stub(site: &CallSite) -> i32 {
    let on = site.on();
    i32::from_le_bytes([on[1], on[2], on[3], on[4]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_reaches_what_its_operand_says() {
        assert_eq!(rel_to(0x1000, 0x1005), Some(0));
        assert_eq!(rel_to(0x1000, 0x1000), Some(-5));
        assert_eq!(rel_to(0, 1 << 32), None);
    }

    /// The entry hook, by its own name (what a site of this library's
    /// calls reaches).
    fn enter_hook() -> usize {
        crate::hooks::fastinst_own_cyg_enter as *const () as usize
    }

    /// A tag no probe has: the hook finds nothing and returns.
    fn no_probe() -> u64 {
        providers::tag::sign(providers::tag::MAX_SIGN_ID - 1)
    }

    /// Code as `-finstrument-functions` makes it, in a fresh page near
    /// this library: `mov rdi, tag; xor esi, esi; call hook; ret`, its
    /// call `split` bytes before a line's end (0: inside a line).
    /// Returns the function and its call's address and operand.
    fn hooked_function(split: usize) -> (extern "C" fn(), usize, i32) {
        let page = callpatch::map_near(enter_hook(), enter_hook(), 5, wordpatch::PAGE_SIZE).expect("a page near");
        let site = if split == 0 {
            page + 128 + 16
        } else {
            page + 192 - split
        };
        let start = site - 12;
        let operand = rel_to(site, enter_hook()).expect("within reach");
        let mut code = vec![0x48, 0xBF];
        code.extend_from_slice(&no_probe().to_le_bytes());
        code.extend_from_slice(&[0x31, 0xF6, 0xE8]);
        code.extend_from_slice(&operand.to_le_bytes());
        code.push(0xC3);
        // SAFETY: a fresh read+write page of ours; made read+execute, as
        // a program's code is, before anything runs it.
        let f = unsafe {
            std::ptr::copy_nonoverlapping(code.as_ptr(), start as *mut u8, code.len());
            assert_eq!(
                libc::mprotect(
                    page as *mut libc::c_void,
                    wordpatch::PAGE_SIZE,
                    libc::PROT_READ | libc::PROT_EXEC
                ),
                0
            );
            std::mem::transmute::<usize, extern "C" fn()>(start)
        };
        (f, site, operand)
    }

    /// A site given a stub: its call reaches the hook through the
    /// disarmed stub as before; armed, its calls are counted (and charged
    /// to the thread as counted calls) without a hook until the drawn
    /// one; the site's bytes are the new call, which a restore of the
    /// file's call and [`reapply`] give back.
    #[test]
    fn an_entry_call_given_a_stub_counts_without_its_hook() {
        std::thread::spawn(|| {
            crate::clock::set_clocked(true);
            let (f, site, operand) = hooked_function(0);
            f();
            let clock = crate::clock::current().expect("the hook made this thread's clock");
            let h0 = clock.hooks();
            f();
            assert_eq!(clock.hooks() - h0, 1, "called directly, one hook a call");
            // SAFETY: the site is that call, ours alone.
            let (call, counted) = unsafe { give_stub(site, operand, enter_hook()) }.expect("a stub");
            assert!(call.is_active(), "the site calls its stub");
            let (h1, c1) = (clock.hooks(), counted.counter.calls());
            for _ in 0..10 {
                f();
            }
            assert_eq!(clock.hooks() - h1, 10, "disarmed, every call reaches the hook");
            assert_eq!(counted.counter.calls(), c1, "and none is counted");
            let from = counted.counter.arm(0, || 40);
            let (h2, f2) = (clock.hooks(), clock.fast_calls());
            for _ in 0..100 {
                f();
            }
            assert_eq!(counted.counter.calls() - from, 100);
            assert_eq!(clock.fast_calls() - f2, 100, "each charged as a counted call");
            // No handler claims the drawn call (the 40th), so it and every
            // later one go on to the hook.
            assert_eq!(clock.hooks() - h2, 61);
            counted.counter.disarm();
            // A detach's restore: the file's call again.
            assert!(call.deactivate(callpatch::Mode::Flip).is_ok() && call.activate().is_ok());
            // SAFETY: as above.
            let back = unsafe { swap_operand(site, to_stub(&call), operand) };
            assert!(back, "the file's call put back");
            assert!(!call.is_active());
            assert!(reapply(&call, counted) && call.is_active(), "its stub again");
            let h3 = clock.hooks();
            f();
            assert_eq!(clock.hooks() - h3, 1);
        })
        .join()
        .unwrap();
    }

    /// One store changes an operand only inside a line: a call whose
    /// operand crosses one keeps its hook; one split before it (the
    /// opcode alone in the first line) gets a stub.
    #[test]
    fn only_operands_inside_a_line_are_rewritten() {
        for split in 1..5 {
            let (f, site, operand) = hooked_function(split);
            assert_eq!(wordpatch::split(site, 5), split);
            // SAFETY: the site is that call, ours alone.
            let given = unsafe { give_stub(site, operand, enter_hook()) };
            assert_eq!(given.is_some(), split == 1, "split {split}");
            let mut now = [0u8; 5];
            // SAFETY: the page is mapped.
            unsafe { wordpatch::read_code(site as *const u8, &mut now) };
            let expect = given.as_ref().map_or(operand, |(c, _)| to_stub(c));
            assert_eq!(now[1..], expect.to_le_bytes(), "split {split}");
            f();
        }
    }
}
