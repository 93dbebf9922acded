//! How well a percentile of the timed calls knows the function's: its
//! 95% range ([`fastinst_report::Range`]).
//!
//! The timed calls are a sample, each standing for the calls its weight
//! says (`super::choose`). Woodruff's interval: the share of calls below
//! the true q-quantile is estimated by the share of timed weight below
//! it, with a spread of `sqrt(q (1 - q) / n)` for `n` the effective number
//! of timed calls, `(sum w)^2 / sum w^2`; so the true quantile lies,
//! with 95% confidence, between the timed calls' quantiles at
//! `q -+ 1.96` spreads. Where that reaches past the last timed call, the
//! percentile may lie beyond every timed call: no upper bound. (A p99
//! of a few tens of timed calls can stand several times off the traced
//! one: a figure without its range said nothing of that.)
//!
//! Two more parts widen it:
//! - the histogram's bucket (a percentile is a bucket's middle);
//! - the hooks' charges: a duration is its stretch less the hooks' time
//!   charged inside it, and a charge errs by a fraction of itself
//!   ([`HOOK_COST_SPREAD`], as the call estimates' does) alike in every
//!   call. A call that runs many instrumented callees with their probes
//!   on is known only that well: the trace tool's, which runs every
//!   probe, most (a garbage collector's step, whose own time is a small
//!   part of its callees' hooks' time).

use super::window::HOOK_COST_SPREAD;
use fastinst_report::Range;

/// Standard normal deviates for 95% on both sides.
const Z: f64 = 1.96;

/// The effective number of timed calls of total weight `w` and squared
/// weights `w2`: as many equally weighted calls would estimate a share
/// as well.
pub(crate) fn effective(w: u64, w2: u64) -> f64 {
    if w2 == 0 {
        return 0.0;
    }
    let w = w as f64;
    w * w / w2 as f64
}

/// The quantile levels bounding the true `q`-quantile's rank among `n`
/// effective calls: `(lower, upper)`, `upper` `None` when it reaches the
/// last call. Half a call of continuity correction on each side.
pub(crate) fn levels(q: f64, n: f64) -> (f64, Option<f64>) {
    let d = Z * (q * (1.0 - q) / n).sqrt() + 0.5 / n;
    let hi = q + d;
    ((q - d).max(0.0), (hi < 1.0).then_some(hi))
}

/// What a function's percentiles are uncertain by.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Error {
    /// The effective number of timed calls ([`effective`]).
    pub n: f64,
    /// The histogram's buckets' relative half-width.
    pub half_bucket: f64,
    /// The hooks' part, relative ([`systematic`]).
    pub systematic: f64,
}

/// The hooks' part of a duration's error, relative, for timed calls with
/// `hooks` ticks charged to hooks inside them over `own` ticks of their
/// own time (both summed alike): two of [`HOOK_COST_SPREAD`]'s deviations
/// of the charges, over the time they were taken from.
pub(crate) fn systematic(hooks: f64, own: f64) -> f64 {
    Z * charges_error(hooks, own)
}

/// One deviation of the hooks' charges inside timed calls with `hooks`
/// ticks charged to hooks over `own` ticks of their own time, relative to
/// that time: [`HOOK_COST_SPREAD`] of the charges. A total holds it as
/// its percentiles do (`super::report`).
pub(crate) fn charges_error(hooks: f64, own: f64) -> f64 {
    if own <= 0.0 {
        return 0.0;
    }
    HOOK_COST_SPREAD * hooks.max(0.0) / own
}

/// The range of the `q`-quantile of a function's timed calls, given
/// their quantile function `at` (ticks at a level), what they are
/// uncertain by, and the shortest and longest timed call (ticks); `to_us`
/// converts ticks. `None` with no timed call.
pub(crate) fn range(
    q: f64,
    err: Error,
    at: impl Fn(f64) -> f64,
    (min, max): (f64, f64),
    to_us: impl Fn(f64) -> f64,
) -> Option<Range> {
    if err.n <= 0.0 || !err.n.is_finite() {
        return None;
    }
    let (lo, hi) = levels(q, err.n);
    // Below the lowest rank the true quantile may lie under every timed
    // call: bounded by none but 0.
    let lo = if lo > 0.0 {
        widen_down(at(lo), err.half_bucket, err.systematic, (min, max))
    } else {
        0.0
    };
    let hi = hi.map(|h| widen_up(at(h), err.half_bucket, err.systematic, (min, max)));
    Some(Range {
        lo: to_us(lo),
        hi: hi.map(to_us),
    })
}

/// The range of a percentile `mid` (ticks) known to its bucket and the
/// hooks' part: every call timed (the trace tool).
pub(crate) fn exact_range(mid: f64, half_bucket: f64, systematic: f64, bounds: (f64, f64)) -> Range {
    Range {
        lo: widen_down(mid, half_bucket, systematic, bounds),
        hi: Some(widen_up(mid, half_bucket, systematic, bounds)),
    }
}

/// A bucket's middle `x` moved down by the bucket and the hooks' part:
/// kept within the timed calls' bounds before the hooks' part (which may
/// take it below every timed call), and not below 0.
fn widen_down(x: f64, half_bucket: f64, systematic: f64, (min, max): (f64, f64)) -> f64 {
    (x / (1.0 + half_bucket)).clamp(min, max) * (1.0 - systematic).max(0.0)
}

/// [`widen_down`]'s upward counterpart.
fn widen_up(x: f64, half_bucket: f64, systematic: f64, (min, max): (f64, f64)) -> f64 {
    (x * (1.0 + half_bucket)).clamp(min, max) * (1.0 + systematic)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::hist::{Hist, PROFILE_BITS};
    use testkit::Rng;

    /// A duration of a skewed distribution: mostly short calls, a tail of
    /// slow ones (ticks).
    fn duration(rng: &mut Rng) -> u64 {
        let u = rng.unit().max(1e-12);
        let base = 2_000.0 * (-u.ln());
        let slow = if rng.unit() < 0.03 { 40_000.0 * rng.unit() } else { 0.0 };
        (500.0 + base + slow) as u64
    }

    /// The distribution's exact quantiles, from a million draws sorted.
    fn exact_quantiles(qs: &[f64]) -> Vec<f64> {
        let mut rng = Rng(0x1234_5678_9abc_def1);
        let mut v: Vec<u64> = (0..1_000_000).map(|_| duration(&mut rng)).collect();
        v.sort_unstable();
        qs.iter()
            .map(|&q| v[((v.len() - 1) as f64 * q).round() as usize] as f64)
            .collect()
    }

    /// Timed calls drawn as the profiler draws them (each window at its
    /// own shift, each timed call weighted by `2^j`), their ranges
    /// computed as the report does: the true quantile falls inside in
    /// about 95% of trials, p50, p90 and p99 alike, from a few tens of
    /// timed calls to thousands. A range without the weights' effect
    /// (every timed call counted once) or without its bucket falls short.
    #[test]
    fn ranges_cover_the_true_quantile_nineteen_times_in_twenty() {
        let qs = [0.5, 0.9, 0.99];
        let truth = exact_quantiles(&qs);
        let half = Hist::<PROFILE_BITS>::HALF_BUCKET;
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let trials = 600;
        let mut covered = [0u32; 3];
        let mut covered_unweighted = [0u32; 3];
        let mut unbounded = 0;
        for t in 0..trials {
            let timed = [30, 100, 400, 2_000][t % 4];
            let mut h = Hist::<PROFILE_BITS>::default();
            let (mut w, mut w2, mut n) = (0u64, 0u64, 0u64);
            let (mut min, mut max) = (u64::MAX, 0u64);
            for _ in 0..timed {
                // Shifts 0 to 4: weights 1 to 16.
                let wt = 1u64 << (rng.next_u64() % 5);
                let d = duration(&mut rng);
                h.add_weighted(d, wt);
                w += wt;
                w2 += wt * wt;
                n += 1;
                min = min.min(d);
                max = max.max(d);
            }
            let bounds = (min as f64, max as f64);
            for (k, &q) in qs.iter().enumerate() {
                let err = Error {
                    n: effective(w, w2),
                    half_bucket: half,
                    systematic: 0.0,
                };
                let r = range(q, err, |l| h.percentile(w, l), bounds, |x| x).unwrap();
                covered[k] += u32::from(r.contains(truth[k]));
                unbounded += u32::from(r.hi.is_none());
                let plain = range(q, Error { n: n as f64, ..err }, |l| h.percentile(w, l), bounds, |x| x).unwrap();
                covered_unweighted[k] += u32::from(plain.contains(truth[k]));
            }
        }
        for k in 0..3 {
            let share = f64::from(covered[k]) / trials as f64;
            assert!((0.9..=0.995).contains(&share), "q {} covered {share}", qs[k]);
        }
        // The p99 of 30 and 100 timed calls has no upper bound.
        assert!(unbounded >= trials as u32 / 2, "{unbounded}");
        let weighted: u32 = covered.iter().sum();
        let plain: u32 = covered_unweighted.iter().sum();
        assert!(
            plain < weighted,
            "counting each timed call once covers as well: {plain} {weighted}"
        );
    }

    /// Thousands of equally weighted timed calls pin the median to a few
    /// percent: the range is no wider than the sampling needs.
    #[test]
    fn many_timed_calls_make_a_narrow_range() {
        let mut rng = Rng(7);
        let mut h = Hist::<PROFILE_BITS>::default();
        let n = 20_000u64;
        for _ in 0..n {
            h.add(duration(&mut rng));
        }
        let half = Hist::<PROFILE_BITS>::HALF_BUCKET;
        let mid = h.percentile(n, 0.5);
        let err = Error {
            n: effective(n, n),
            half_bucket: half,
            systematic: 0.0,
        };
        let r = range(0.5, err, |l| h.percentile(n, l), (0.0, f64::MAX), |x| x).unwrap();
        assert!(r.lo >= 0.9 * mid && r.hi.unwrap() <= 1.1 * mid, "{r:?} around {mid}");
        assert!(r.contains(mid));
    }

    /// A call that spends four times its own time in its callees' hooks
    /// is known to within two deviations of those hooks' charges: the
    /// range widens by that share, and a range never goes below 0.
    #[test]
    fn hooks_inside_widen_the_range_by_their_share() {
        let sys = systematic(4.0, 1.0);
        assert!((sys - 1.96 * HOOK_COST_SPREAD * 4.0).abs() < 1e-12);
        assert_eq!(systematic(5.0, 0.0), 0.0);
        let r = exact_range(1000.0, 0.0, sys, (0.0, f64::MAX));
        assert!((r.lo - 1000.0 * (1.0 - sys)).abs() < 1e-9 && (r.hi.unwrap() - 1000.0 * (1.0 + sys)).abs() < 1e-9);
        assert_eq!(exact_range(1000.0, 0.0, 3.0, (0.0, f64::MAX)).lo, 0.0);
        let err = Error {
            n: 1e6,
            half_bucket: 0.0,
            systematic: sys,
        };
        let r = range(0.5, err, |_| 1000.0, (0.0, f64::MAX), |x| x).unwrap();
        assert!(
            r.lo < 1000.0 * (1.0 - sys) + 1e-9 && r.hi.unwrap() > 1000.0 * (1.0 + sys) - 1e-9,
            "{r:?}"
        );
    }

    #[test]
    fn levels_reach_the_last_call_only_when_few() {
        assert_eq!(levels(0.99, 100.0).1, None);
        let (lo, hi) = levels(0.99, 10_000.0);
        assert!(lo > 0.985 && hi.unwrap() < 0.995, "{lo} {hi:?}");
        assert_eq!(levels(0.5, 4.0).0, 0.0);
        assert_eq!(effective(0, 0), 0.0);
        assert_eq!(effective(10, 100), 1.0);
    }
}
