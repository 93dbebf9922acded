//! What a hook's clock stamps cannot see, measured at start: a hook's `call` and
//! return, the instructions around its two TSC reads, and the parts of
//! those reads outside what they stamp. Each path is run in a loop with an
//! id no probe has, beside the same loop without the hook; what the loop
//! took more than the stamps show, per hook, is that path's unseen cost.
//! The sled loop watches the exit too (the return through the exit
//! trampoline, with its mispredicted return). Left in, this cost made a
//! traced program's own time several times its real run.

use crate::clock::{
    current, fast_cost, fast_exit_cost, set_clocked, set_fast_cost, set_fast_exit_cost, set_unseen, unseen_ticks,
};
use wordpatch::tsc;

/// An id no probe has: the hooks find no probe for it and return, so
/// a call costs exactly a hook's fixed path.
const NO_PROBE: u32 = providers::tag::MAX_SIGN_ID - 1;

/// Which `-finstrument-functions` hook path a calibration loop calls.
#[derive(Clone, Copy)]
enum FiPath {
    /// The entry hook.
    Entry,
    /// The calibration's copy of the exit hook
    /// (`crate::hooks::calibration_cyg_exit`), whose cheap path is
    /// always open.
    CheapExit,
}

/// Runs `n` calls of hook path `path` with a tagged id no probe has,
/// from a loop in assembly (`hook`; else the same loop without the
/// calls); returns the loop's ticks, and this thread's hook ticks, hooks
/// and cheap exits it added.
fn fi_loop(path: FiPath, n: u64, hook: bool) -> (u64, u64, u64, u64) {
    let read = || current().map_or((0, 0, 0), |c| (c.hook_ticks(), c.hooks(), c.fast_exits()));
    let before = read();
    let tag = providers::tag::sign(NO_PROBE);
    let t0 = tsc::now();
    for _ in 0..n {
        // By the stubs' hidden names: the exported one resolves through
        // the global scope, to the C library's no-op when this library
        // was loaded into a running process (an attach), and the
        // calibration timed that instead, a "hook" that ran none.
        match (hook, path) {
            // SAFETY: the hook takes (this_fn, call_site), reads its own
            // return address and returns; it clobbers what a C function
            // may.
            (true, FiPath::Entry) => unsafe {
                crate::arch::stubs::call_hook!(crate::hooks::fastinst_own_cyg_enter, tag, 0u64)
            },
            // SAFETY: as the entry hook's: the exit hook's copy has the
            // same contract.
            (true, FiPath::CheapExit) => unsafe {
                crate::arch::stubs::call_hook!(crate::hooks::calibration_cyg_exit, tag, 0u64)
            },
            // The same argument set-up without the call.
            (false, _) => crate::arch::stubs::keep(tag),
        }
    }
    let t1 = tsc::now();
    let after = read();
    (t1 - t0, after.0 - before.0, after.1 - before.1, after.2 - before.2)
}

/// Runs `n` calls of `f` from a loop; returns the loop's ticks, and this
/// thread's hook ticks and hooks it added.
fn call_loop(f: usize, n: u64) -> (u64, u64, u64) {
    let before = current().map_or((0, 0), |c| (c.hook_ticks(), c.hooks()));
    let t0 = tsc::now();
    for _ in 0..n {
        // SAFETY: `f` is one of `calibration_functions`: a sled (a call
        // through the sled trampoline, which preserves every register)
        // and a return.
        unsafe { crate::arch::stubs::call_address(f) };
    }
    let t1 = tsc::now();
    let after = current().map_or((0, 0), |c| (c.hook_ticks(), c.hooks()));
    (t1 - t0, after.0 - before.0, after.1 - before.1)
}

/// Ticks a sled probe's hook costs beyond its own stamps (the call,
/// the stub, a function stub's disarmed counting path as every real one
/// has it, the trampolines' saves and restores, the return through
/// the exit trampoline, the TSC reads' halves), averaged over its entry
/// and its exit, as [`fi_costs`] measures them; and what a whole sled
/// hook costs, stamped part included (its handler finds no probe, so a
/// real handler costs more), from the same rounds. `None` when the sled
/// trampoline cannot be placed.
fn sled_costs(rounds: usize, n: u64) -> Option<Costs> {
    let id = crate::sled::shadow::CALIBRATION_ID;
    let (on, off, _) = crate::sled::trampoline::calibration_functions(id.get(), true)?;
    least_costs(rounds, |hooked| call_loop(if hooked { on } else { off }, n))
}

/// What a call through a sled's counting path costs, in hooks of the
/// full path: [`fast_cost`] over the calibration's whole sled hook; 1
/// before both are measured. The profiler's density shares hook time, and
/// a window of a function whose stub counts costs this much of a hook per
/// call. Against the calibration's hook, whose handler does nothing, so
/// it errs high.
pub(crate) fn counted_call_hooks() -> f64 {
    match SLED_HOOK_TICKS.load(std::sync::atomic::Ordering::Relaxed) {
        0 => 1.0,
        h => (fast_cost() / f64::from(h)).min(1.0),
    }
}

/// What the calibration's whole sled hook costs (ticks; 0 before it is
/// measured).
static SLED_HOOK_TICKS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Ticks a call through a sled's counting path costs (the call, the
/// path, the return; `crate::sled::counter`) beyond the same call to a
/// switched-off sled: the quietest of `rounds` rounds of `n` calls each.
/// `None` when no counting stub could be made, or its calls were not
/// counted on this thread (it has no clock).
pub fn counting_cost(rounds: usize, n: u64) -> Option<f64> {
    let id = crate::sled::shadow::CALIBRATION_ID;
    let (on, off, counter) = crate::sled::trampoline::calibration_functions(id.get(), true)?;
    // Armed, with no call ever drawn: every call takes the counting path.
    counter?.arm(0, || u64::MAX / 2);
    least_unseen(rounds, |counting| {
        let before = current().map_or(0, |c| c.fast_calls());
        let (wall, _, _) = call_loop(if counting { on } else { off }, n);
        // What the path charges is what is being measured: no stamped
        // part.
        (wall, 0, current().map_or(0, |c| c.fast_calls()) - before)
    })
}

/// Ticks an exit through the exit hook's cheap path costs (the call, the
/// path, the return) beyond the loop without it: the quietest of `rounds`
/// rounds of `n` calls each. `None` when the calls did not take the path
/// (this thread has no clock, or a timed call in flight).
pub fn cheap_exit_cost(rounds: usize, n: u64) -> Option<f64> {
    least_unseen(rounds, |hooked| {
        let (wall, _, _, exits) = fi_loop(FiPath::CheapExit, n, hooked);
        // What the path charges is what is being measured: no stamped
        // part.
        (wall, 0, exits)
    })
}

/// What an exit through the exit hook's cheap path costs, in hooks of
/// the full path ([`fast_exit_cost`] over the calibration's whole
/// `-finstrument-functions` hook); 1 before both are measured.
pub(crate) fn cheap_exit_hooks() -> f64 {
    match FI_HOOK_TICKS.load(std::sync::atomic::Ordering::Relaxed) {
        0 => 1.0,
        h => (fast_exit_cost() / f64::from(h)).min(1.0),
    }
}

/// What the calibration's whole `-finstrument-functions` hook costs
/// (ticks; 0 before it is measured).
static FI_HOOK_TICKS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Ticks a `-finstrument-functions` hook costs beyond its own stamps:
/// the call and return, the stub's first instructions and the halves
/// of the two TSC reads that fall outside what they stamp. The quietest
/// of `rounds` rounds of `n` calls each ([`least_unseen`]); `None` when
/// its calls reached no hook.
///
/// And what the whole hook costs, from the same rounds.
fn fi_costs(rounds: usize, n: u64) -> Option<Costs> {
    least_costs(rounds, |hooked| {
        let (wall, ticks, hooks, _) = fi_loop(FiPath::Entry, n, hooked);
        (wall, ticks, hooks)
    })
}

/// What a hook costs beyond its stamps, from `rounds` runs of a loop
/// with hooks (`run(true)`: wall, stamped ticks, hooks) and as many
/// without (`run(false)`): the least wall time of the loop without, and
/// the least wall time less stamped ticks of the loop with, their
/// difference per hook (at least 0).
///
/// The least, not the median: whatever disturbs a round (an interrupt,
/// a preemption, another thread's cache traffic) only lengthens it, so
/// the quietest round of each kind is the truest. With the median, a
/// start in a process whose threads kept every CPU busy (an attach) read
/// several times what a quiet one reads, and every hook of the attached
/// run was charged that.
///
/// `None` when a loop with hooks ran none (its calls did not reach the
/// runtime's hook): there is nothing to measure.
fn least_unseen(rounds: usize, run: impl FnMut(bool) -> (u64, u64, u64)) -> Option<f64> {
    least_costs(rounds, run).map(|c| c.unseen)
}

/// A hook path's costs per hook, from its quietest rounds.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Costs {
    /// Beyond its stamps ([`least_unseen`]).
    unseen: f64,
    /// In all: the least wall time of the loop with hooks less the least
    /// without, per hook.
    whole: f64,
}

/// [`least_unseen`], and the whole cost from the same rounds.
fn least_costs(rounds: usize, mut run: impl FnMut(bool) -> (u64, u64, u64)) -> Option<Costs> {
    let mut base = u64::MAX;
    let mut hooked = (u64::MAX, 1);
    let mut wall_least = u64::MAX;
    for _ in 0..rounds.max(1) {
        base = base.min(run(false).0);
        let (wall, ticks, hooks) = run(true);
        if hooks == 0 {
            return None;
        }
        wall_least = wall_least.min(wall);
        let unstamped = wall.saturating_sub(ticks);
        if unstamped < hooked.0 {
            hooked = (unstamped, hooks);
        }
    }
    let per_hook = |t: u64| t.saturating_sub(base) as f64 / hooked.1 as f64;
    Some(Costs {
        unseen: per_hook(hooked.0),
        whole: per_hook(wall_least),
    })
}

/// Rounds of each calibration: enough that one of each kind runs
/// undisturbed on a busy machine; each is tens of microseconds.
const ROUNDS: usize = 15;

/// Turns the hooks' self-timing on, measuring first, once per process,
/// what a hook's stamps miss on each path (a fraction of a millisecond).
/// Run on the thread of a tool's start, before its probes go on.
pub fn start_clock() {
    set_clocked(true);
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let ticks = |x: f64| x.round().max(0.0) as u32;
        let fi_costs = fi_costs(ROUNDS, 500);
        if let Some(c) = fi_costs {
            FI_HOOK_TICKS.store(ticks(c.whole), std::sync::atomic::Ordering::Relaxed);
        }
        let fi = fi_costs.map(|c| c.unseen);
        // One path's figure stands for the other's where that one could
        // not be measured (a sled stub needs a page near enough; both
        // hooks cost about the same beyond their stamps).
        let sled = sled_costs(ROUNDS, 500);
        if let Some(c) = sled {
            SLED_HOOK_TICKS.store(ticks(c.whole), std::sync::atomic::Ordering::Relaxed);
        }
        match (fi, sled.map(|c| c.unseen)) {
            (Some(f), Some(s)) => set_unseen(ticks(f), ticks(s)),
            (Some(f), None) => {
                set_unseen(ticks(f), ticks(f));
                crate::log::warn(format_args!(
                    "clock: the sled calibration found no page near enough for its stub; using the -finstrument-functions figure"
                ));
            }
            (None, Some(s)) => {
                set_unseen(ticks(s), ticks(s));
                crate::log::warn(format_args!(
                    "clock: the -finstrument-functions calibration reached no hook; using the sled figure"
                ));
            }
            (None, None) => crate::log::warn(format_args!(
                "clock: no hook path could be calibrated; hooks are charged their stamps alone"
            )),
        }
        match counting_cost(ROUNDS, 500) {
            Some(c) => set_fast_cost(c),
            None => crate::log::warn(format_args!(
                "clock: the sleds' counting path could not be calibrated; its calls are charged nothing"
            )),
        }
        match cheap_exit_cost(ROUNDS, 500) {
            Some(c) => set_fast_exit_cost(c),
            None => crate::log::warn(format_args!(
                "clock: the exit hook's cheap path could not be calibrated; its exits are charged nothing"
            )),
        }
        crate::log::info(format_args!(
            "clock: a hook's stamps miss {:?} ticks (finstrument, sled); a counted call costs {:.2} ({:.3} hooks); a cheap exit {:.2} ({:.3} hooks)",
            unseen_ticks(),
            fast_cost(),
            counted_call_hooks(),
            fast_exit_cost(),
            cheap_exit_hooks()
        ));
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rounds lengthened by what else runs (most of them, here) do not
    /// move the figure: the quietest round of each kind gives it. The
    /// median of the rounds' own figures, as before, reads them.
    #[test]
    fn disturbed_rounds_do_not_move_the_figure() {
        // 500 hooks of 100 stamped and 40 unseen ticks each, in a loop of
        // 10,000 ticks; every hooked round but the third lengthened by a
        // preemption.
        let round = |k: u64, hooked: bool| {
            if hooked {
                let noise = if k == 6 { 0 } else { 5_000_000 };
                (10_000 + 500 * 140 + noise, 500 * 100, 500)
            } else {
                (10_000, 0, 0)
            }
        };
        let mut k = 0u64;
        let unseen = least_unseen(15, |hooked| {
            k += 1;
            round(k, hooked)
        });
        assert_eq!(unseen, Some(40.0));
        let mut k = 0u64;
        let costs = least_costs(15, |hooked| {
            k += 1;
            round(k, hooked)
        });
        assert_eq!(
            costs,
            Some(Costs {
                unseen: 40.0,
                whole: 140.0
            }),
            "the quietest round whole"
        );
        let mut per_round: Vec<f64> = (0..15u64)
            .map(|r| {
                let (base, _, _) = round(2 * r + 1, false);
                let (wall, ticks, hooks) = round(2 * r + 2, true);
                (wall as f64 - base as f64 - ticks as f64) / hooks as f64
            })
            .collect();
        per_round.sort_by(f64::total_cmp);
        assert!(per_round[7] > 10_000.0, "the median reads {}", per_round[7]);
        // A quiet base and no quiet hooked round (or the reverse) cannot
        // go below 0.
        let unseen = least_unseen(3, |hooked| if hooked { (100, 500, 5) } else { (10_000, 0, 0) });
        assert_eq!(unseen, Some(0.0));
        // A loop whose calls reached no hook measures nothing (it once
        // timed the C library's no-op as a hook).
        assert_eq!(
            least_unseen(3, |hooked| if hooked { (2_500, 0, 0) } else { (100, 0, 0) }),
            None
        );
    }

    /// The calibration runs both real hook paths and the sleds' counting
    /// path: each call is charged to the thread as one hook (a counted
    /// call as one fast call), and what the stamps miss comes out as a
    /// finite, non-negative number of ticks (its size is the
    /// benchmark's business, not a test's).
    #[test]
    fn calibration_runs_every_hook_path_once_per_call() {
        std::thread::spawn(|| {
            set_clocked(true);
            let e = fi_costs(3, 200).expect("the entry hook is reached").unseen;
            let before = current().expect("the hooks registered this thread").hooks();
            let sled = sled_costs(3, 200).expect("a page for the sled stub");
            let s = sled.unseen;
            assert!(
                sled.whole >= s,
                "a whole hook {} costs at least its unseen part {s}",
                sled.whole
            );
            let after = current().expect("record").hooks();
            // Three rounds of 200 calls, each an entry and a watched exit.
            assert_eq!(after - before, 3 * 200 * 2, "every sled call is two hooks");
            let f = current().expect("record").fast_calls();
            let c = counting_cost(3, 200).expect("a counting stub, on a thread with a clock");
            assert_eq!(
                current().expect("record").fast_calls() - f,
                3 * 200,
                "every counted call is charged"
            );
            let x = current().expect("record").fast_exits();
            let (h0, s0) = (current().expect("record").hooks(), current().expect("record").stamped());
            let cheap = cheap_exit_cost(3, 200).expect("the cheap exit is taken on a thread with a clock");
            let rec = current().expect("record");
            assert_eq!(rec.fast_exits() - x, 3 * 200, "every cheap exit is counted");
            // But for one in CHEAP_EXIT_LOOK_EVERY, by the count, which runs
            // the whole hook: the multiples of it the count passed.
            let look = crate::clock::CHEAP_EXIT_LOOK_EVERY;
            let whole = (x + 3 * 200) / look - x / look;
            assert_eq!(
                rec.hooks() - h0,
                whole,
                "a cheap exit runs no hook, but for one in {look}"
            );
            assert_eq!(rec.stamped() > s0, whole > 0, "only the whole hooks stamp");
            // An exit called where the thread's innermost timed call
            // called its entry hook, or above, is a whole hook; one from
            // 16 bytes or more below is still cheap. The calibration's
            // calls are made a few frames below this one: far above a
            // point a mebibyte down, and below one a page up.
            let here = {
                let probe = 0u8;
                std::ptr::addr_of!(probe) as u64
            };
            rec.set_timed(Some(here - (1 << 20)));
            assert_eq!(cheap_exit_cost(1, 50), None, "an exit from above runs its hook");
            assert_eq!(rec.hooks() - h0, whole + 50, "each exit ran its hook");
            rec.set_timed(Some(here + 4096));
            assert!(cheap_exit_cost(1, 50).is_some(), "an exit from below is cheap");
            rec.set_timed(None);
            for v in [e, s, c, cheap] {
                assert!(v.is_finite() && v >= 0.0, "{e} {s} {c} {cheap}");
            }
            eprintln!(
                "unseen per hook: finstrument {e:.1} ticks, sled {s:.1}; a counted call {c:.1}; a cheap exit {cheap:.1}"
            );
        })
        .join()
        .unwrap();
    }
}
