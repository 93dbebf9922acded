//! What a hook's clock stamps cannot see, measured at start: a hook's `call` and
//! return, the instructions around its two TSC reads, and the parts of
//! those reads outside what they stamp. Each path is run in a loop with an
//! id no probe has, beside the same loop without the hook; what the loop
//! took more than the stamps show, per hook, is that path's unseen cost.
//! The sled loop watches the exit too (the return through the exit
//! trampoline, with its mispredicted return). Left in, this cost made a
//! traced program's own time several times its real run.

use crate::clock::{current, set_clocked, set_unseen, unseen_ticks};
use wordpatch::tsc;

/// An id no probe has: the hooks find no probe for it and return, so
/// a call costs exactly a hook's fixed path.
const NO_PROBE: u32 = providers::tag::MAX_SIGN_ID - 1;

/// Runs `n` calls of the `-finstrument-functions` entry hook with a
/// tagged id no probe has, from a loop in assembly; returns the loop's
/// ticks, and this thread's hook ticks and hooks it added.
fn fi_loop(n: u64, hook: bool) -> (u64, u64, u64) {
    let before = current().map_or((0, 0), |c| (c.hook_ticks(), c.hooks()));
    let tag = providers::tag::sign(NO_PROBE);
    let t0 = tsc::now();
    if hook {
        for _ in 0..n {
            // SAFETY: the hook takes (this_fn, call_site), reads its
            // own return address and returns; it clobbers what a C
            // function may.
            unsafe { crate::arch::stubs::call_hook!(crate::hooks::__cyg_profile_func_enter, tag, 0u64) };
        }
    } else {
        for _ in 0..n {
            // The same argument set-up without the call.
            crate::arch::stubs::keep(tag);
        }
    }
    let t1 = tsc::now();
    let after = current().map_or((0, 0), |c| (c.hook_ticks(), c.hooks()));
    (t1 - t0, after.0 - before.0, after.1 - before.1)
}

/// Runs `n` calls of `f` from a loop; returns as [`fi_loop`] does.
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
/// the stub, the trampolines' saves and restores, the return through
/// the exit trampoline, the TSC reads' halves), averaged over its entry
/// and its exit, as [`fi_unseen`] measures them. `None` when the sled
/// trampoline cannot be placed.
pub fn sled_unseen(rounds: usize, n: u64) -> Option<f64> {
    let id = crate::sled::shadow::CALIBRATION_ID;
    let (on, off) = crate::sled::trampoline::calibration_functions(id.get())?;
    Some(median_unseen(rounds, |hooked| {
        call_loop(if hooked { on } else { off }, n)
    }))
}

/// Ticks a `-finstrument-functions` hook costs beyond its own stamps:
/// the call and return, the stub's first instructions and the halves
/// of the two TSC reads that fall outside what they stamp. The median
/// of `rounds` rounds of `n` calls each.
pub fn fi_unseen(rounds: usize, n: u64) -> f64 {
    median_unseen(rounds, |hooked| fi_loop(n, hooked))
}

/// The median over `rounds` of what a hook costs beyond its stamps: a
/// loop's wall ticks with hooks (`run(true)`: wall, stamped ticks, hooks)
/// less the same loop's without (`run(false)`) and less the stamped
/// ticks, per hook.
fn median_unseen(rounds: usize, mut run: impl FnMut(bool) -> (u64, u64, u64)) -> f64 {
    let mut v: Vec<f64> = (0..rounds.max(1))
        .map(|_| {
            let (base, _, _) = run(false);
            let (wall, ticks, hooks) = run(true);
            (wall as f64 - base as f64 - ticks as f64) / hooks.max(1) as f64
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Turns the hooks' self-timing on, measuring first, once per process,
/// what a hook's stamps miss on each path (a fraction of a millisecond).
/// Run on the thread of a tool's start, before its probes go on.
pub fn start_clock() {
    set_clocked(true);
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let fi = fi_unseen(5, 500);
        let ticks = |x: f64| x.round().max(0.0) as u32;
        match sled_unseen(5, 500) {
            Some(s) => set_unseen(ticks(fi), ticks(s)),
            None => {
                set_unseen(ticks(fi), ticks(fi));
                crate::log::warn(format_args!(
                    "clock: the sled calibration found no page near enough for its stub; using the -finstrument-functions figure"
                ));
            }
        }
        crate::log::info(format_args!("clock: a hook's stamps miss {:?} ticks (finstrument, sled)", unseen_ticks()));
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calibration runs both real hook paths: each call is charged to
    /// the thread as one hook, and what the stamps miss comes out as a
    /// finite, non-negative number of ticks (its size is the
    /// benchmark's business, not a test's).
    #[test]
    fn calibration_runs_every_hook_path_once_per_call() {
        std::thread::spawn(|| {
            set_clocked(true);
            let e = fi_unseen(3, 200);
            let before = current().expect("the hooks registered this thread").hooks();
            let s = sled_unseen(3, 200).expect("a page for the sled stub");
            let after = current().expect("record").hooks();
            // Three rounds of 200 calls, each an entry and a watched exit.
            assert_eq!(after - before, 3 * 200 * 2, "every sled call is two hooks");
            assert!(e.is_finite() && e >= 0.0 && s.is_finite() && s >= 0.0, "{e} {s}");
            eprintln!("unseen per hook: finstrument {e:.1} ticks, sled {s:.1}");
        })
        .join()
        .unwrap();
    }
}
