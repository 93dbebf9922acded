//! How much a function's call durations spread, for deciding how many of
//! its calls to time.
//!
//! A function's inclusive time is its calls times the mean of its timed
//! calls, and that mean's relative error is the durations' coefficient of
//! variation over the square root of the timed calls. Most functions'
//! durations spread little, and ten timed calls an epoch read their mean
//! within a few percent over a run. A function whose rare calls are long
//! (one call in 64 waits on a cache miss that sleeps) spreads a hundred
//! times more: the same ten calls an epoch read its inclusive time at a
//! quarter to twice the truth, and its callers' below its callees'. The
//! sampler therefore times more calls of the functions that spread more
//! (a Neyman allocation), up to [`MAX_BOOST`] times as many, from these
//! running moments of the timed durations.

use std::sync::atomic::{AtomicU64, Ordering};

/// The most a function's timed calls are multiplied by.
pub const MAX_BOOST: f64 = 16.0;

/// The squared coefficient of variation at which a function gets no
/// more timed calls than the setting: an exponential distribution's.
const PLAIN_CV2: f64 = 1.0;

/// Durations are summed in units of `2^SHIFT` ticks and capped at
/// [`CAP`] ticks before squaring, so that a sum of squares fits in 64
/// bits for as many calls as a run times.
const SHIFT: u32 = 4;
const CAP: u64 = 1 << 32;

/// Running moments of a function's timed durations (unweighted: they only
/// steer how many calls are timed; every estimate is weighted).
#[derive(Default)]
pub(crate) struct Spread {
    n: AtomicU64,
    sum: AtomicU64,
    squares: AtomicU64,
}

impl Spread {
    /// Notes a timed call of `ticks`.
    pub(crate) fn record(&self, ticks: u64) {
        let d = ticks.min(CAP) >> SHIFT;
        self.n.fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(d, Ordering::Relaxed);
        self.squares.fetch_add(d * d, Ordering::Relaxed);
    }

    /// The durations' squared coefficient of variation so far (0 with
    /// fewer than two calls).
    pub(crate) fn cv2(&self) -> f64 {
        let n = self.n.load(Ordering::Relaxed) as f64;
        if n < 2.0 {
            return 0.0;
        }
        let mean = self.sum.load(Ordering::Relaxed) as f64 / n;
        if mean <= 0.0 {
            return 0.0;
        }
        let var = (self.squares.load(Ordering::Relaxed) as f64 / n - mean * mean).max(0.0);
        var / (mean * mean)
    }

    /// How many times the set number of calls to time: the squared
    /// coefficient of variation over a plain one's, from 1 to
    /// [`MAX_BOOST`].
    pub(crate) fn boost(&self) -> f64 {
        (self.cv2() / PLAIN_CV2).clamp(1.0, MAX_BOOST)
    }

    /// Forgets every call (a forked child).
    pub(crate) fn reset(&self) {
        self.n.store(0, Ordering::Relaxed);
        self.sum.store(0, Ordering::Relaxed);
        self.squares.store(0, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_durations_get_no_boost_and_rare_long_ones_the_most() {
        let s = Spread::default();
        assert_eq!(s.boost(), 1.0);
        for _ in 0..1000 {
            s.record(5000);
        }
        assert!(s.cv2() < 1e-9);
        assert_eq!(s.boost(), 1.0);
        // One call in 64 a hundred times as long: CV^2 about 39.
        let r = Spread::default();
        for i in 0..6400 {
            r.record(if i % 64 == 0 { 500_000 } else { 5000 });
        }
        let want = {
            let (p, a, b) = (1.0 / 64.0, 5000.0f64, 500_000.0f64);
            let m = (1.0 - p) * a + p * b;
            ((1.0 - p) * a * a + p * b * b - m * m) / (m * m)
        };
        assert!((r.cv2() - want).abs() < 0.01 * want, "{} vs {want}", r.cv2());
        assert_eq!(r.boost(), MAX_BOOST);
        r.reset();
        assert_eq!(r.cv2(), 0.0);
    }

    #[test]
    fn a_capped_duration_still_fits() {
        let s = Spread::default();
        for _ in 0..100_000 {
            s.record(u64::MAX);
        }
        assert!(s.cv2() < 1e-9);
    }
}
