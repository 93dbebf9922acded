//! Durations with censored calls: the Kaplan-Meier estimate, over the
//! weighted duration histograms.
//!
//! Some timed calls are known only to have lasted at least some time (their
//! exit went unwatched, see [`super::exitlog`]). Dropping them biases every
//! statistic of the durations low, since they are the long ones. The
//! product-limit (Kaplan-Meier) estimator uses them without bias when the
//! moment a call stopped being watched does not depend on how much longer it
//! would run, which holds here: it is set by other calls' exits. It is
//! computed as Efron's *redistribution to the right*: in order of duration,
//! each censored call's weight is handed to the calls known to be longer,
//! in proportion to what each already holds. The result is a distribution
//! of all the calls' weight, from which the mean and the quantiles are read
//! as from the timed calls alone. A censored call with no longer call
//! to hand its weight to keeps it at its censoring time: a lower bound,
//! reported as such ([`Adjusted::kept`]).
//!
//! Events and censorings in one histogram bucket are taken as events first,
//! the usual convention for ties.

use super::hist::Hist;

/// Durations adjusted for censored calls.
#[derive(Clone, Debug, Default)]
pub(crate) struct Adjusted {
    /// Each bucket's middle (ticks) and weight, in order.
    mass: Vec<(f64, f64)>,
    /// The weight moved onto longer calls, times their buckets' middles.
    moved_ticks: f64,
    /// Censored weight with no longer call to go to, left at its censoring
    /// time.
    pub kept: f64,
}

impl Adjusted {
    /// The timed calls' histogram `events` (weighted) with the censored
    /// calls' `censored` (weighted, at their censoring times).
    pub(crate) fn new(events: &Hist, censored: &Hist) -> Adjusted {
        // One row per bucket reached by either: (middle, events, censored).
        let mut rows: Vec<(f64, f64, f64)> = events.iter().map(|(m, c)| (m, c as f64, 0.0)).collect();
        for (m, c) in censored.iter() {
            match rows.binary_search_by(|r| r.0.total_cmp(&m)) {
                Ok(i) => rows[i].2 += c as f64,
                Err(i) => rows.insert(i, (m, 0.0, c as f64)),
            }
        }
        // Each censored bucket hands its weight to every call to its
        // right, censored ones included (which hand it on in turn), in
        // proportion to what each holds: all of them grow by one factor.
        let mut a = Adjusted::default();
        let mut right: f64 = rows.iter().map(|r| r.1 + r.2).sum();
        let mut factor = 1.0;
        for &(mid, e, c) in &rows {
            right -= e + c;
            let m = e * factor;
            a.moved_ticks += (m - e) * mid;
            let mut held = m;
            if c > 0.0 {
                if right > 0.0 {
                    factor *= 1.0 + c / right;
                } else {
                    held += c * factor;
                    a.moved_ticks += c * factor * mid;
                    a.kept += c * factor;
                }
            }
            a.mass.push((mid, held));
        }
        a
    }

    /// The mean duration in ticks, given the timed calls' exact weighted
    /// sum `sum` over weight `w`, and the censored calls' weight `wc`.
    pub(crate) fn mean(&self, sum: f64, w: f64, wc: f64) -> f64 {
        if w + wc <= 0.0 {
            return 0.0;
        }
        (sum + self.moved_ticks) / (w + wc)
    }

    /// The middle of the bucket holding the `q`-quantile (0 when empty),
    /// ranked as [`Hist::percentile`] ranks: the weight of rank
    /// `round((total - 1) q)`, 0-based.
    pub(crate) fn percentile(&self, q: f64) -> f64 {
        let total: f64 = self.mass.iter().map(|m| m.1).sum();
        let target = ((total - 1.0).max(0.0) * q).round();
        let mut seen = 0.0;
        for &(mid, m) in &self.mass {
            seen += m;
            if m > 0.0 && seen > target + 1e-9 {
                return mid;
            }
        }
        self.mass.iter().rev().find(|m| m.1 > 0.0).map_or(0.0, |m| m.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::hist::bucket_mid;

    /// The product-limit estimate's mean, from its definition: S(t) drops
    /// by d/n at each event time, n the calls still at risk (events and
    /// censorings at t or later; censorings at t count at risk at t).
    fn product_limit_mean(events: &[(u64, u64)], censored: &[(u64, u64)]) -> f64 {
        let mut times: Vec<u64> = events.iter().map(|e| e.0).collect();
        times.sort_unstable();
        times.dedup();
        let (mut s, mut mean, mut last_t) = (1.0, 0.0, 0.0);
        for &t in &times {
            let at_risk: u64 = events.iter().chain(censored).filter(|x| x.0 >= t).map(|x| x.1).sum();
            let d: u64 = events.iter().filter(|e| e.0 == t).map(|e| e.1).sum();
            mean += s * (t as f64 - last_t);
            last_t = t as f64;
            s *= 1.0 - d as f64 / at_risk as f64;
        }
        mean
    }

    fn hist(xs: &[(u64, u64)]) -> Hist {
        let mut h = Hist::default();
        for &(t, w) in xs {
            h.add_weighted(t, w);
        }
        h
    }

    #[test]
    fn redistribution_gives_the_product_limit_mean() {
        // Durations exactly at bucket middles (and below 2^B, exact), so
        // the histogram loses nothing.
        let mid = |b: usize| bucket_mid::<{ super::super::hist::PROFILE_BITS }>(b) as u64;
        let events = [(mid(3), 5), (mid(40), 2), (mid(60), 1), (mid(90), 3)];
        let censored = [(mid(10), 4), (mid(60), 2), (mid(70), 1)];
        let a = Adjusted::new(&hist(&events), &hist(&censored));
        let sum: u64 = events.iter().map(|e| e.0 * e.1).sum();
        let w: u64 = events.iter().map(|e| e.1).sum();
        let wc: u64 = censored.iter().map(|e| e.1).sum();
        let got = a.mean(sum as f64, w as f64, wc as f64);
        let want = product_limit_mean(&events, &censored);
        assert!((got - want).abs() <= 1e-9 * want, "{got} vs {want}");
        assert_eq!(a.kept, 0.0);
        // Dropping the censored calls reads low; keeping them as if they
        // ended when censored reads low too.
        assert!((sum as f64 / w as f64) < want);
        let as_ended = (sum + censored.iter().map(|e| e.0 * e.1).sum::<u64>()) as f64 / (w + wc) as f64;
        assert!(as_ended < want);
    }

    #[test]
    fn with_nothing_censored_it_is_the_timed_calls() {
        let events = [(10, 3), (1000, 1), (50_000, 2)];
        let a = Adjusted::new(&hist(&events), &Hist::default());
        let h = hist(&events);
        let sum: u64 = events.iter().map(|e| e.0 * e.1).sum();
        assert_eq!(a.mean(sum as f64, 6.0, 0.0), sum as f64 / 6.0);
        for q in [0.0, 0.5, 0.9, 0.99, 1.0] {
            assert_eq!(a.percentile(q), h.percentile(6, q), "q {q}");
        }
    }

    #[test]
    fn a_censored_call_longer_than_every_timed_one_stays_a_lower_bound() {
        let a = Adjusted::new(&hist(&[(10, 1)]), &hist(&[(5000, 2)]));
        assert_eq!(a.kept, 2.0);
        let m = a.mean(10.0, 1.0, 2.0);
        assert!(m > 3000.0, "{m}");
        assert!(a.percentile(0.9) >= 4500.0);
    }

    #[test]
    fn half_the_long_calls_censored_early_are_restored() {
        // 98 short calls, 2 long ones timed, 2 long ones censored early
        // (after the short calls' time): the mean is the one with all four
        // long calls timed.
        let short = 100u64;
        let long = 200_000u64;
        let events = [(short, 98), (long, 2)];
        let censored = [(short * 5, 2)];
        let a = Adjusted::new(&hist(&events), &hist(&censored));
        let sum = (short * 98 + long * 2) as f64;
        let got = a.mean(sum, 100.0, 2.0);
        let mid = bucket_mid::<{ super::super::hist::PROFILE_BITS }>(super::super::hist::bucket::<
            { super::super::hist::PROFILE_BITS },
        >(long));
        let want = (short as f64 * 98.0 + long as f64 * 2.0 + 2.0 * mid) / 102.0;
        assert!((got - want).abs() < 1e-9 * want, "{got} vs {want}");
    }
}
