//! A function's counting windows and its call estimate.
//!
//! A function is counted in one of two ways ([`Kind`]):
//! - *whole*: every call, with its entry probe on all the time. Its count
//!   is exact. Every function starts so, and one with few calls stays so:
//!   counting them costs less than scheduling windows.
//! - *windowed*: only inside counting windows, stretches of time that the
//!   schedule (`super::schedule`) fixes before they begin, placed at random
//!   in the epochs. Calls inside a window are counted exactly;
//!   the rest are estimated from them.
//!
//! The estimate is in *exposure*: the program's own time summed over its
//! threads (`super::exposure`), wall time less the hooks' time. A window's
//! `n` calls over its exposure `x` is a rate; an epoch's rate `R` is the
//! mean of its windows' rates, each weighed by its threads' CPU time `c`
//! (the time the windows are placed and sized in), the epoch's calls are
//! `R P` for its exposure `P`, and the exposure between two epochs with
//! windows (an epoch where the function got no window) is split half and
//! half between their rates. So each stretch of time is estimated from the
//! windows nearest it.
//!
//! Why windows fixed in time: a count taken over a stretch that does not
//! depend on the calls is an unbiased sample whatever their pattern
//! (loops, bursts, phases). The estimates this replaced timed a window's
//! first K calls, or opened one function's window when another's closed,
//! and both read functions called in bursts many times low.
//!
//! The spread is reported with the estimate: for each epoch, the variance
//! of the weighted mean from how its windows' rates scatter (at least the
//! Poisson `n / x^2`), scaled by the time the rate stands for, plus, for
//! each gap, the squared difference of the rates on either side, plus the
//! systematic part of the hooks' charges ([`HOOK_COST_SPREAD`]). The
//! accuracy harness (`fastinst-accuracy`) measures how well it covers.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};

/// How a function is counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    /// Every call, every epoch.
    Whole = 0,
    /// Only inside its windows.
    Windowed = 1,
}

/// A whole function goes windowed once an epoch holds more calls than
/// this; a windowed one goes back to whole once its rate predicts fewer
/// than [`WHOLE_BELOW`] per epoch. Both counts are for epochs of the
/// default length; longer epochs scale the first
/// (`Settings::epoch_scale`).
pub const WINDOWED_ABOVE: f64 = 16.0;
/// See [`WINDOWED_ABOVE`].
pub const WHOLE_BELOW: f64 = 4.0;

/// How many times an epoch's calls would have been, had its threads'
/// CPU time `cpu` all been the program's own rather than only `own` of it
/// (the rest was hooks): what the counts compared with [`WINDOWED_ABOVE`]
/// and [`WHOLE_BELOW`] are scaled by, so that the profiler's own slowing
/// of a program does not keep its functions whole. At least 1, at most
/// [`MAX_STRETCH`].
pub fn stretch(cpu: f64, own: f64) -> f64 {
    if cpu <= 0.0 {
        return 1.0;
    }
    (cpu / own.max(1.0)).clamp(1.0, MAX_STRETCH)
}

/// The most [`stretch`] gives.
pub const MAX_STRETCH: f64 = 1000.0;

/// Calls a thread may count of a whole function in one epoch of the default
/// length (scaled with longer ones, as [`WINDOWED_ABOVE`]): past it the
/// function's entry probe goes off at once and the function goes windowed
/// at the epoch's end. (A quiet function that turns busy would otherwise
/// be counted whole, a hook a call, to the end of the epoch: on QuickJS,
/// GC and JSON functions at the start of each of their phases, a third of
/// all hooks.)
pub const WHOLE_OVERFLOW: u64 = 64;

/// How far a hook's cost inside a program may stand from what the clock
/// charges it (its stamps and the calibrated cost they miss), as a
/// fraction of that charge. A window's exposure is its threads' time less
/// its hooks' charges, so an error in them moves the rate it reads by
/// this fraction times the window's hook time over its exposure. How much
/// a hook really costs depends on the code around it: a loop of hooks
/// (the calibration) overlaps nothing, a program's loads and branches
/// overlap part of it, and a hook's cache misses slow the code after it.
/// So the error has a sign of its own in each part of a program (Lua's
/// sort comparisons read high, its allocator low), and no one scale of
/// the calibrated cost removes it (one that fixed the first worsened the
/// second, and SQLite and QuickJS). The estimate's deviation includes it,
/// as a systematic part that more windows do not shrink; this fraction
/// is the one whose deviations covered the counts of the accuracy
/// harness's programs about 19 times in 20 at two deviations
/// (`crates/benches/results/accuracy.md`).
pub const HOOK_COST_SPREAD: f64 = 0.05;

/// The least exposure a counted call stands for (ticks): no call of a
/// program's own takes under a few ticks, so a window whose exposure is
/// under this per call is void (`super::schedule`), and an epoch's count
/// over less exposure than this per call gives no rate
/// ([`Estimate::go_windowed_after_epoch`]).
pub const MIN_TICKS_PER_CALL: f64 = 4.0;

/// The rate of `n` calls over `x` ticks of exposure, where `x` is enough
/// to read one from: at least [`MIN_TICKS_PER_CALL`] a call (and a tick);
/// `None` where it is noise about zero. A window and a whole epoch are
/// judged alike.
pub(crate) fn rate_of(n: f64, x: f64) -> Option<f64> {
    (x >= (n * MIN_TICKS_PER_CALL).max(1.0)).then(|| n / x)
}

/// Whether a whole function's stubs count it ([`Window::take_stub_count`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum StubCount {
    /// Its handlers count it.
    No = 0,
    /// A handler is handing its count to its stubs.
    Arming = 1,
    /// Its stubs count it.
    Counting = 2,
}

/// A function's window state (read by its handlers) and its estimate
/// (the schedule's lock holder only).
pub(crate) struct Window {
    kind: AtomicU8,
    /// Its window is open: its calls are counted.
    open: AtomicBool,
    /// The last epoch a whole function counted a call in (its first count
    /// of an epoch hands it to the sampler).
    pub counted_epoch: AtomicU32,
    /// When a whole function passed [`WHOLE_OVERFLOW`] calls on a thread
    /// in an epoch (wall TSC; 0: it has not).
    pub overflow_at: AtomicU64,
    /// What its entry stubs' counters (`crate::sled::counter`) read when
    /// its window opened, or when a whole function's stubs took over its
    /// count.
    pub counted_from: AtomicU64,
    /// Whether a whole function's stubs count its calls to the epoch's end
    /// (its count overflowed: [`WHOLE_OVERFLOW`]): [`StubCount`].
    stub_count: AtomicU8,
    est: UnsafeCell<Estimate>,
}

// SAFETY: `est` is touched only by the holder of the schedule's lock
// (`Window::estimate_mut`'s contract); the rest are atomics.
unsafe impl Sync for Window {}

/// The estimate's state.
#[derive(Clone, Debug, Default)]
pub(crate) struct Estimate {
    /// The running epoch's windows: their calls `n` and exposure `x`
    /// summed, and, with each window weighed by its CPU time `c`, the sums
    /// of `c`, `c^2`, `c r` and `c r^2` for its rate `r = n / x`; and how
    /// many.
    n: f64,
    x: f64,
    c: f64,
    cc: f64,
    cr: f64,
    crr: f64,
    windows: u32,
    /// Over the run, the windows' hook time over their exposure, each
    /// weighed by its CPU time, summed, and the CPU times summed: how much
    /// of what was counted was hook time (see [`HOOK_COST_SPREAD`]).
    hook_share_c: f64,
    share_c: f64,
    /// Calls counted exactly (whole epochs).
    pub counted: f64,
    /// Calls estimated, and the estimate's variance.
    est: f64,
    var: f64,
    /// The rate of the last epoch with windows (or the last whole epoch),
    /// and the exposure where the time it covers ends: what lies after it
    /// waits for the next rate.
    last_rate: Option<f64>,
    last_var_r: f64,
    /// The exposure the last fold's epoch spanned.
    last_span: f64,
    /// The rates of the epochs with windows, averaged with weights that
    /// halve about every two epochs: whether the function is quiet enough
    /// to be counted whole (one quiet epoch is not enough: a busy function
    /// counted whole through its next busy phase costs a hook a call).
    slow_rate: f64,
    /// The highest recent epoch rate (decaying): a window's length is
    /// chosen from it, so that a busy phase does not fill a window sized
    /// for a quiet one.
    peak_rate: f64,
    /// The time since `mark` has no rate before it to share with: it is
    /// all taken at the next epoch's rate.
    gap_to_next: bool,
    /// Calls per window, averaged over recent windows (weights halving
    /// about every 8): how bursty the function is at a window's scale.
    mean_n: f64,
    mark: f64,
    /// Windows folded over the run.
    pub windows_total: u64,
}

/// Calls a function must have been counted exactly (in its whole epochs,
/// [`Estimate::counted`]) before its
/// [`stretch`]ed count alone may make it windowed. The stretch undoes a
/// lasting slowing of the program by the profiler; one epoch's is no
/// evidence of that: the epoch in which a program's threads start runs
/// mostly hooks (each thread's first, the run's whole counts), and a
/// thread body called once on each of four threads there read as sixty
/// calls an epoch and went windowed, its 4 calls then estimated. A
/// function called a call or two an epoch under a lasting slowing passes
/// this in a few tens of epochs.
pub const STRETCH_AFTER_CALLS: u64 = 2 * WINDOWED_ABOVE as u64;

/// Whether a whole function whose epoch held `n` calls, [`stretch`]ed by
/// `stretch`, goes windowed against the threshold `above`
/// ([`WINDOWED_ABOVE`] scaled to the epoch): at once where its own count
/// passes it; by the stretch once `counted` (its exact calls so far, this
/// epoch's among them) reaches [`STRETCH_AFTER_CALLS`].
pub fn stretched_past(n: u64, stretch: f64, above: f64, counted: f64) -> bool {
    let n = n as f64;
    n > above || (n * stretch > above && counted >= STRETCH_AFTER_CALLS as f64)
}

impl Default for Window {
    fn default() -> Self {
        Window::new()
    }
}

impl Window {
    /// A function counted whole from the start.
    pub(crate) fn new() -> Window {
        Window {
            kind: AtomicU8::new(Kind::Whole as u8),
            open: AtomicBool::new(false),
            counted_epoch: AtomicU32::new(u32::MAX),
            overflow_at: AtomicU64::new(0),
            counted_from: AtomicU64::new(0),
            stub_count: AtomicU8::new(StubCount::No as u8),
            est: UnsafeCell::new(Estimate::default()),
        }
    }

    /// How the function is counted now.
    #[inline(always)]
    pub(crate) fn kind(&self) -> Kind {
        if self.kind.load(Ordering::Relaxed) == Kind::Windowed as u8 {
            Kind::Windowed
        } else {
            Kind::Whole
        }
    }

    pub(crate) fn set_kind(&self, k: Kind) {
        self.kind.store(k as u8, Ordering::Release);
    }

    /// Whether its window is open.
    #[inline(always)]
    pub(crate) fn is_open(&self) -> bool {
        self.open.load(Ordering::Relaxed)
    }

    /// Elects the one thread that hands a whole function's count to its
    /// stubs: true for the first caller since the sampler last took the
    /// count ([`Window::take_stub_count`]). That thread then arms them and
    /// calls [`Window::stub_count_armed`].
    pub(crate) fn start_stub_count(&self) -> bool {
        self.stub_count
            .compare_exchange(
                StubCount::No as u8,
                StubCount::Arming as u8,
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    /// The elected thread has armed the stubs and noted where they count
    /// from.
    pub(crate) fn stub_count_armed(&self) {
        self.stub_count.store(StubCount::Counting as u8, Ordering::Release);
    }

    /// Whether the stubs count for a whole function: a count being handed
    /// over is left for the next fold; one handed over is taken (back to
    /// [`StubCount::No`]) for the sampler to read and disarm.
    pub(crate) fn take_stub_count(&self) -> StubCount {
        match self.stub_count.load(Ordering::Acquire) {
            x if x == StubCount::Arming as u8 => StubCount::Arming,
            x if x == StubCount::Counting as u8 => {
                self.stub_count.store(StubCount::No as u8, Ordering::Release);
                StubCount::Counting
            }
            _ => StubCount::No,
        }
    }

    /// Opens or closes its window.
    pub(crate) fn set_open(&self, open: bool) {
        self.open.store(open, Ordering::Release);
    }

    /// No window (a forked child starts afresh).
    pub(crate) fn reset(&self) {
        self.set_kind(Kind::Whole);
        self.open.store(false, Ordering::Relaxed);
        self.counted_epoch.store(u32::MAX, Ordering::Relaxed);
        self.overflow_at.store(0, Ordering::Relaxed);
        self.counted_from.store(0, Ordering::Relaxed);
        self.stub_count.store(StubCount::No as u8, Ordering::Relaxed);
        // SAFETY: only the forked child's one thread runs.
        unsafe { *self.est.get() = Estimate::default() };
    }

    /// The estimate's state.
    ///
    /// # Safety
    /// The caller holds the schedule's lock (or is the only thread), and
    /// drops the reference before releasing it.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn estimate_mut(&self) -> &mut Estimate {
        // SAFETY: the caller's contract.
        unsafe { &mut *self.est.get() }
    }
}

impl Estimate {
    /// Adds a window of the running epoch: `n` calls in `x` of
    /// exposure, over `c` ticks of its threads' CPU time, of which its
    /// hooks' charges took `hooks`.
    pub(crate) fn add_window(&mut self, n: u64, x: f64, c: f64, hooks: f64) {
        if x <= 0.0 {
            return;
        }
        let n = n as f64;
        let c = c.max(x);
        self.mean_n = if self.windows_total == 0 && self.windows == 0 {
            n
        } else {
            0.92 * self.mean_n + 0.08 * n
        };
        let r = n / x;
        self.n += n;
        self.x += x;
        self.c += c;
        self.cc += c * c;
        self.cr += c * r;
        self.crr += c * r * r;
        self.windows += 1;
        // Where hook time is hundreds of times the exposure the rate is
        // anybody's guess; the share is capped so one such window does not
        // swamp the run's.
        self.hook_share_c += c * (hooks.max(0.0) / x).min(100.0);
        self.share_c += c;
    }

    /// Folds an epoch that spanned exposure `[from, to)`, with the
    /// windows added since the last fold. An epoch without windows folds
    /// nothing: its time waits for the next rate.
    pub(crate) fn fold_epoch(&mut self, from: f64, to: f64) {
        if self.windows == 0 || self.x <= 0.0 {
            return;
        }
        // Each window's own rate, weighed by its CPU time: windows are
        // placed and sized in the threads' time, and the exposure a window
        // holds shrinks with the hooks it runs, most where its function is
        // called most densely. Pooled as calls over exposure, a window in
        // a burst counted for the few ticks of program time its hooks left
        // it, and a function called in bursts read a fraction of its calls
        // (Lua's `luaM_free_`, called in garbage-collection sweeps, at
        // 0.2-0.6 of them).
        let r = self.cr / self.c;
        // The weighted rates' scatter over the effective number of windows,
        // and no less than a Poisson count's.
        let w = f64::from(self.windows);
        let scatter = (self.crr / self.c - r * r).max(0.0);
        let scatter = if w > 1.0 { scatter * w / (w - 1.0) } else { scatter };
        let effective = self.c * self.c / self.cc.max(f64::MIN_POSITIVE);
        let var_r = (scatter / effective).max(self.n.max(1.0) / (self.x * self.x));
        let gap = (from - self.mark).max(0.0);
        let own = match (self.last_rate, self.gap_to_next) {
            (Some(r0), false) => {
                self.est += r0 * gap / 2.0;
                self.var += (gap / 2.0).powi(2) * (r - r0).powi(2);
                gap / 2.0
            }
            // The gap after a cut count waits for this rate, as the rate
            // the count was cut at is biased high for a burst; but which of
            // the two held there is unknown: their difference is part of
            // its uncertainty. (Without it, a short run whose one later
            // window fell in the exit path, where the function is no longer
            // called, read a few percent of its calls with the deviation of
            // one window.)
            (Some(r0), true) => {
                self.var += (gap * (r - r0)).powi(2);
                gap
            }
            (None, _) => gap,
        };
        let span = own + (to - from).max(0.0);
        self.est += r * span;
        self.var += span * span * var_r;
        self.slow_rate = if self.last_rate.is_some() {
            0.7 * self.slow_rate + 0.3 * r
        } else {
            r
        };
        self.peak_rate = (0.8 * self.peak_rate).max(r);
        self.gap_to_next = false;
        self.last_rate = Some(r);
        self.last_var_r = var_r;
        self.last_span = (to - from).max(0.0);
        self.mark = to;
        self.windows_total += u64::from(self.windows);
        self.n = 0.0;
        self.x = 0.0;
        self.c = 0.0;
        self.cc = 0.0;
        self.cr = 0.0;
        self.crr = 0.0;
        self.windows = 0;
    }

    /// The function goes windowed at exposure `at`, having been counted
    /// whole at `rate` calls per tick of exposure: that rate stands until
    /// its first windows.
    pub(crate) fn go_windowed(&mut self, at: f64, rate: f64) {
        self.last_rate = Some(rate);
        self.slow_rate = rate;
        self.peak_rate = rate;
        self.mark = at;
    }

    /// The function goes windowed at exposure `at`, its last whole epoch
    /// having counted `n` calls over exposure `x`. That count over that
    /// exposure is the rate that stands until its first windows, unless
    /// the exposure is too small to read one from (under
    /// [`MIN_TICKS_PER_CALL`] a call): then no rate is known, and the time
    /// after `at` waits for the first windows' ([`Self::go_windowed_from`]).
    ///
    /// Why: exposure is CPU time less the hooks' and the samples' signals'
    /// charges, and in an epoch a thread spent mostly asleep those can take
    /// nearly all of it. A burst that began at the end of such an epoch
    /// counted its calls over almost no exposure, and the rate carried from
    /// there read many calls a tick: a short function's estimate came out
    /// many times its calls, by orders of magnitude at worst.
    pub(crate) fn go_windowed_after_epoch(&mut self, at: f64, n: f64, x: f64) {
        match rate_of(n, x) {
            Some(r) => self.go_windowed(at, r),
            None => self.go_windowed_from(at, 1.0 / MIN_TICKS_PER_CALL),
        }
    }

    /// The function goes windowed at exposure `at`, its count exact until
    /// then but no rate known (its count was cut short when it passed
    /// [`WHOLE_OVERFLOW`]: a rate over a stretch that ends on a count is
    /// biased high). `guess` stands for the time after `at` only if no
    /// window comes.
    pub(crate) fn go_windowed_from(&mut self, at: f64, guess: f64) {
        self.go_windowed(at, guess);
        self.gap_to_next = true;
    }

    /// The function goes windowed after its whole count was cut short at
    /// TSC `overflow` (it passed [`WHOLE_OVERFLOW`]): `n` calls were counted
    /// from the epoch's start (TSC `t0`, exposure `epoch_x`) until then, and
    /// `p_epoch` is the epoch's exposure until now (TSC `now`). The
    /// exposure at the cut is taken by the wall time into the epoch. (Taken
    /// instead from the cutting thread's CPU clock less its hooks, the
    /// guesses of real programs' counts came out worse: the hooks' time,
    /// dense before a cut, is not subtracted to the tick.)
    pub(crate) fn go_windowed_after_overflow(
        &mut self,
        n: f64,
        overflow: u64,
        t0: u64,
        now: u64,
        epoch_x: f64,
        p_epoch: f64,
    ) {
        let frac = (overflow.saturating_sub(t0) as f64 / now.saturating_sub(t0).max(1) as f64).min(1.0);
        // A guess, and at most a call every few ticks (as above).
        let guess = rate_of(n, p_epoch * frac).unwrap_or(1.0 / MIN_TICKS_PER_CALL);
        self.go_windowed_from(epoch_x + p_epoch * frac, guess);
    }

    /// The function goes whole at exposure `at`: its windowed estimate is
    /// closed there at the last rate.
    pub(crate) fn go_whole(&mut self, at: f64) {
        if let Some(r) = self.last_rate {
            self.est += r * (at - self.mark).max(0.0);
        }
        self.mark = at;
    }

    /// The rate a window's length is chosen from (see `peak_rate`).
    pub(crate) fn sizing_rate(&self) -> f64 {
        self.peak_rate.max(self.last_rate.unwrap_or(0.0))
    }

    /// Calls per window, averaged over recent windows.
    pub(crate) fn mean_calls(&self) -> f64 {
        self.mean_n
    }

    /// The rate averaged over recent epochs (see `slow_rate`).
    pub(crate) fn slow_rate(&self) -> f64 {
        self.slow_rate
    }

    /// The estimate at exposure `now` for a windowed function (its last
    /// rate carried to `now`), plus the exact count: `(calls, standard
    /// deviation, exact)`. `counting_whole` adds the calls counted since
    /// the last fold of a whole function.
    pub(crate) fn calls(&self, now: f64, windowed: bool, counting_whole: f64) -> (f64, f64, bool) {
        let mut est = self.est + self.counted + counting_whole;
        let mut var = self.var;
        let mut measured = self.est;
        if windowed {
            if let Some(r) = self.last_rate {
                let tail = (now - self.mark).max(0.0);
                est += r * tail;
                measured += r * tail;
                // The tail has no rate after it to check against: as
                // uncertain as the last epoch's rate, and, past two
                // epochs without a window (windows that could not open),
                // wholly unmeasured: it could be anything from none to
                // twice the extrapolation.
                var += tail * tail * self.last_var_r;
                let stale = (tail - 2.0 * self.last_span).max(0.0);
                var += (r * stale).powi(2);
            }
        }
        // The hooks' charges err alike in every window of a function,
        // so this part is one error over all its windows' calls.
        if self.share_c > 0.0 {
            var += (HOOK_COST_SPREAD * self.hook_share_c / self.share_c * measured).powi(2);
        }
        // A rate, once known (a window's, or one the function went
        // windowed at), has carried part of the estimate: not exact, even
        // if no window ever opened.
        (est, var.sqrt(), self.windows_total == 0 && self.last_rate.is_none())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_epoch_the_hooks_filled_is_judged_in_the_programs_own_time() {
        assert_eq!(stretch(1_000.0, 1_000.0), 1.0, "no hooks: as counted");
        assert_eq!(stretch(1_000.0, 20.0), 50.0, "hooks took 98%");
        assert_eq!(stretch(1_000.0, 0.0), MAX_STRETCH, "hooks took it all");
        assert_eq!(stretch(0.0, 0.0), 1.0, "no time: as counted");
        // Two calls in an epoch whose hooks took 98% of it stand for 100:
        // windowed, where counted by the wall they stayed whole.
        assert!(2.0 * stretch(1_000.0, 20.0) > WINDOWED_ABOVE && 2.0 < WHOLE_BELOW);
    }
    use testkit::Rng;

    /// A program whose calls of one function arrive as a Poisson process of
    /// a rate that changes over time (`rate(t)`, per tick of exposure),
    /// profiled in epochs of `len` alternating counting and timing, with
    /// `per_epoch` windows of `win` ticks at random places in each counting
    /// epoch. Returns (estimate, truth, sd).
    fn simulate(
        rate: impl Fn(f64) -> f64,
        epochs: usize,
        len: f64,
        per_epoch: usize,
        win: f64,
        seed: u64,
    ) -> (f64, f64, f64) {
        let mut rng = Rng(seed);
        let mut e = Estimate::default();
        let mut truth = 0.0;
        let mut t = 0.0;
        for k in 0..epochs {
            // Jittered epoch length, as the sampler's.
            let l = len * (0.5 + rng.unit());
            let counting = k % 2 == 0;
            // The epoch's calls, as arrival times.
            let mut calls = Vec::new();
            let step = 50.0;
            let mut s = t;
            while s < t + l {
                let lam = rate(s) * step;
                let n = rng.poisson(lam);
                for _ in 0..n {
                    calls.push(s + rng.unit() * step);
                }
                s += step;
            }
            truth += calls.len() as f64;
            if counting {
                for _ in 0..per_epoch {
                    let a = t + rng.unit() * (l - win).max(0.0);
                    let n = calls.iter().filter(|&&c| c >= a && c < a + win).count();
                    e.add_window(n as u64, win, win, 0.0);
                }
                e.fold_epoch(t, t + l);
            }
            t += l;
        }
        let (est, sd, _) = e.calls(t, true, 0.0);
        (est, truth, sd)
    }

    #[test]
    fn a_gap_after_a_cut_count_is_as_uncertain_as_the_two_rates_differ() {
        // Cut at 64 calls a fiftieth into an epoch of 1,000,000 ticks: a
        // rate of 3.2e-3 guessed; the one window after it read none (the
        // program was in its exit path) over 30,000 ticks.
        let mut e = Estimate {
            counted: 64.0,
            ..Default::default()
        };
        e.go_windowed_after_overflow(64.0, 20_000, 0, 1_000_000, 0.0, 1_000_000.0);
        e.add_window(0, 30_000.0, 30_000.0, 0.0);
        e.fold_epoch(1_000_000.0, 1_100_000.0);
        let (est, sd, exact) = e.calls(1_100_000.0, true, 0.0);
        assert!(!exact);
        // The estimate takes the window's rate for the gap; the deviation
        // says the guess's 3,500 calls there were as likely.
        assert!(est < 100.0, "{est}");
        let gap_at_guess = 3.2e-3 * (1_100_000.0 - 20_000.0);
        assert!(sd >= 0.9 * gap_at_guess, "{sd} vs {gap_at_guess}");
    }

    /// A burst that began at the end of an epoch its thread spent asleep:
    /// the whole count's 64 calls over a few ticks of exposure (the
    /// samples' signal charge took nearly all of the epoch's CPU time).
    /// Read as a rate, 64 calls in 8 ticks carried over the gap to the
    /// first window made the estimate many times the calls; now that epoch
    /// gives no rate, and the gap is taken at the first window's.
    #[test]
    fn an_epoch_count_over_almost_no_exposure_gives_no_rate() {
        let mut e = Estimate {
            counted: 64.0,
            ..Default::default()
        };
        e.go_windowed_after_epoch(1_000.0, 64.0, 8.0);
        // The next epoch's first window, 10,000 ticks in: a call every 10
        // ticks, the truth throughout.
        e.add_window(100, 1_000.0, 1_000.0, 0.0);
        e.fold_epoch(11_000.0, 21_000.0);
        let (est, sd, exact) = e.calls(21_000.0, true, 0.0);
        assert!(!exact);
        let truth = 64.0 + 0.1 * 20_000.0;
        assert!((est - truth).abs() < 0.05 * truth, "{est} vs {truth}");
        assert!(sd.is_finite(), "{sd}");
        // Carried alone, with no window since, the guess is at most a call
        // every few ticks, with a deviation to match.
        let mut e = Estimate::default();
        e.go_windowed_after_epoch(0.0, 64.0, 1e-9);
        let (est, sd, _) = e.calls(1e6, true, 0.0);
        assert!(est <= 1e6 / MIN_TICKS_PER_CALL, "{est}");
        assert!(sd >= 0.5 * est, "{est} +- {sd}");
        // An epoch with exposure enough for its calls gives its rate.
        let mut e = Estimate::default();
        e.go_windowed_after_epoch(0.0, 64.0, 6_400.0);
        assert_eq!(e.last_rate, Some(0.01));
        // And a cut count over almost no exposure likewise guesses no more.
        let mut e = Estimate::default();
        e.go_windowed_after_overflow(64.0, 101, 100, 10_100, 0.0, 100.0);
        assert!(e.last_rate.unwrap() <= 1.0 / MIN_TICKS_PER_CALL, "{:?}", e.last_rate);
    }

    /// A thread body called once on each of four threads, in an epoch
    /// the threads' start slowed twentyfold, stays whole; a function
    /// called a call or two an epoch under a lasting slowing goes windowed
    /// once it has had enough calls; one past the threshold by its own
    /// count goes at once.
    #[test]
    fn only_a_lasting_stretch_makes_a_whole_function_windowed() {
        assert!(!stretched_past(4, 20.0, WINDOWED_ABOVE, 4.0));
        assert!(!stretched_past(0, 20.0, WINDOWED_ABOVE, 4.0));
        let mut counted = 4.0;
        let epochs = (1..100)
            .find(|_| {
                counted += 2.0;
                stretched_past(2, 50.0, WINDOWED_ABOVE, counted)
            })
            .unwrap();
        assert_eq!(4 + 2 * epochs, STRETCH_AFTER_CALLS);
        assert!(stretched_past(17, 1.0, WINDOWED_ABOVE, 17.0));
    }

    #[test]
    fn a_count_carried_at_a_rate_is_never_called_exact() {
        let mut e = Estimate {
            counted: 65.0,
            ..Default::default()
        };
        assert!(e.calls(100.0, false, 0.0).2, "counted whole: exact");
        // Its count cut short and carried at a rate, no window since.
        e.go_windowed_after_overflow(65.0, 150, 100, 200, 0.0, 100.0);
        let (est, sd, exact) = e.calls(100.0, true, 0.0);
        assert!(!exact, "an extrapolation is not exact");
        assert!(est > 65.0 && sd > 0.0, "{est} {sd}");
        // Whole again: what was carried stays an estimate.
        e.go_whole(100.0);
        assert!(!e.calls(100.0, false, 0.0).2);
    }

    #[test]
    fn a_steady_rate_is_estimated_within_its_spread() {
        let (est, truth, sd) = simulate(|_| 0.01, 200, 100_000.0, 4, 5_000.0, 7);
        assert!(
            (est - truth).abs() < 4.0 * sd.max(1.0),
            "est {est} truth {truth} sd {sd}"
        );
        assert!((est / truth - 1.0).abs() < 0.05, "est {est} truth {truth}");
    }

    #[test]
    fn bursts_and_phases_are_estimated_without_bias() {
        // Calls only in the first fifth of every 300,000 ticks, at five
        // times the mean rate, and a slow change of phase over the run.
        let rate = |t: f64| {
            let burst = if (t % 300_000.0) < 60_000.0 { 0.05 } else { 0.0 };
            burst * (1.0 + 0.5 * (t / 5.0e6).sin())
        };
        let mut errs = Vec::new();
        let mut z2 = 0.0;
        for seed in 1..=20 {
            let (est, truth, sd) = simulate(rate, 150, 100_000.0, 6, 5_000.0, seed);
            errs.push(est / truth - 1.0);
            z2 += ((est - truth) / sd).powi(2);
        }
        // Unbiased: the mean error over the seeds is within what its own
        // spread (about 0.13 / sqrt(20)) allows.
        let mean = errs.iter().sum::<f64>() / errs.len() as f64;
        assert!(mean.abs() < 0.06, "bias {mean}: {errs:?}");
        // The reported spread is the right size: the errors' RMS in units of
        // it is near 1 (not 0.1, not 10).
        let rms_z = (z2 / 20.0).sqrt();
        assert!((0.4..2.5).contains(&rms_z), "rms z {rms_z}");
    }

    #[test]
    fn a_burst_is_not_read_low_where_the_windows_hooks_stretch_it() {
        // Program time: bursts of 0.04 calls a tick for 40,000 ticks in
        // every 300,000, none between. A window lasts 20,000 ticks of its
        // threads' time from a uniformly random start, and each call it
        // counts takes its hook 180 ticks more: in a burst a window holds
        // 20,000 / (1 + 0.04 * 180) = 2,439 ticks of program time, outside
        // one 20,000. Calls over exposure pooled read such a function at
        // about a seventh of its calls.
        let (burst, every, rate, hook, len) = (40_000.0, 300_000.0, 0.04, 180.0, 20_000.0);
        let rate_at = |t: f64| if t % every < burst { rate } else { 0.0 };
        let mut rng = Rng(11);
        let mut errs = Vec::new();
        for _ in 0..20 {
            let mut e = Estimate::default();
            let (epoch, epochs) = (1_000_000.0, 50);
            for k in 0..epochs {
                let t0 = k as f64 * epoch;
                for _ in 0..4 {
                    // Walk the window through program time until its
                    // threads' time is spent; calls at their mean rate.
                    let mut t = t0 + rng.unit() * (epoch - len);
                    let (mut left, mut n, mut x) = (len, 0.0, 0.0);
                    let step = 10.0;
                    while left > 0.0 {
                        let calls = rate_at(t) * step;
                        left -= step + calls * hook;
                        n += calls;
                        x += step;
                        t += step;
                    }
                    e.add_window(n.round() as u64, x, len, len - x);
                }
                e.fold_epoch(t0, t0 + epoch);
            }
            let truth = rate * burst / every * epoch * epochs as f64;
            let (est, _, _) = e.calls(epoch * epochs as f64, true, 0.0);
            errs.push(est / truth - 1.0);
        }
        let mean = errs.iter().sum::<f64>() / errs.len() as f64;
        assert!(mean.abs() < 0.1, "bias {mean}: {errs:?}");
    }

    #[test]
    fn the_hooks_share_of_a_window_is_a_spread_more_windows_do_not_shrink() {
        // A steady 0.01 calls a tick, many windows: the statistical spread
        // is small. With no hook time it is all there is; with hooks that
        // took as long as the exposure, a quarter of the estimate more.
        let run = |hooks: f64| {
            let mut e = Estimate::default();
            for k in 0..100 {
                let t0 = k as f64 * 1e6;
                for _ in 0..4 {
                    e.add_window(100, 10_000.0, 10_000.0 + hooks, hooks);
                }
                e.fold_epoch(t0, t0 + 1e6);
            }
            e.calls(1e8, true, 0.0)
        };
        let (est, sd, _) = run(0.0);
        assert!((est / 1e6 - 1.0).abs() < 1e-9, "{est}");
        assert!(sd < 0.01 * est, "{sd}");
        let (est, sd, _) = run(10_000.0);
        assert!((est / 1e6 - 1.0).abs() < 1e-9, "{est}");
        assert!((sd / (HOOK_COST_SPREAD * est) - 1.0).abs() < 0.05, "{sd} {est}");
    }

    #[test]
    fn a_rate_that_changes_once_is_followed() {
        // A hundredfold slowdown halfway: the epochs on either side carry
        // their own rates; only the gap between them is interpolated.
        let rate = |t: f64| if t < 1.0e7 { 0.02 } else { 0.0002 };
        let (est, truth, _) = simulate(rate, 200, 100_000.0, 4, 5_000.0, 3);
        assert!((est / truth - 1.0).abs() < 0.05, "est {est} truth {truth}");
    }

    #[test]
    fn whole_counts_and_windows_join_at_the_switch() {
        // Counted whole over [0, 1000): 10 calls.
        let mut e = Estimate {
            counted: 10.0,
            ..Default::default()
        };
        e.go_windowed(1000.0, 0.01);
        assert_eq!(e.sizing_rate(), 0.01);
        // An epoch [1000, 2000) whose windows read 0.02.
        e.add_window(2, 100.0, 100.0, 0.0);
        e.fold_epoch(1000.0, 2000.0);
        let (calls, _, exact) = e.calls(2000.0, true, 0.0);
        assert!(!exact);
        assert!((calls - 30.0).abs() < 1e-9, "{calls}");
        // Back to whole at 3000: the gap [2000, 3000) at the last rate.
        e.go_whole(3000.0);
        let (calls, _, _) = e.calls(3000.0, false, 5.0);
        assert!((calls - 55.0).abs() < 1e-9, "{calls}");
    }
}
