//! The profiler's budget: how many of the set timed calls it makes, so
//! that its own share of the program's CPU time stays bounded.
//!
//! Each function gets about K timed calls an epoch (`Settings::samples`),
//! more where its durations spread (`super::spread`, up to 16 times).
//! That is a load per function, whatever the functions cost: 200
//! functions of a few nanoseconds, called in turn, ran nine tenths of
//! their time in the hooks of their timed calls. It is not only slow.
//! A window's rate is its calls over the program's own time in it, and
//! the hooks' time it takes off is their calibrated charge, which misses
//! part of what they cost (the CPU samples found a third more profiler
//! time than was charged there): where the hooks fill the window, that
//! miss is most of what is left, and the calls read 10-50% low.
//!
//! So at each epoch's end the profiler's share of the threads' CPU time
//! (from the CPU samples, which see all of it, `super::slowing`; else
//! from the hooks' charges) sets a scale on every function's timed
//! calls: it falls where the share is over the target
//! ([`Settings::share`](super::Settings::share), [`DEFAULT_SHARE`] unless
//! set) and climbs back to 1 where it is under, by at most a factor of 2
//! an epoch. The allocation between functions is kept; only its total
//! shrinks. The timed calls keep their weights, so every figure stays
//! unbiased, with the spread of fewer calls. The report gives the scale's
//! mean.

/// The share of the threads' CPU time, in percent, the profiler is held
/// to by timing fewer calls, unless set otherwise.
///
/// The hooks cost more than their charge, so the share that is theirs in
/// a window reads its rate low, by about the charge's error times that
/// share: most where functions are short, and more so with threads
/// sharing CPUs. Lower targets read such programs' calls less low and
/// time fewer calls; this one leaves the sled builds of the accuracy
/// harness's programs their timed calls, which lower ones began to cut
/// (`crates/benches/results/accuracy.md`, the curve).
pub const DEFAULT_SHARE: u32 = 20;

/// The least scale: a function keeps a timed call in about this many
/// times its set number, whatever the load (counting alone can fill
/// the share, and nothing timed would leave no durations).
pub const MIN_SCALE: f64 = 1.0 / 256.0;

/// The scale and its running mean (the schedule's lock holder only).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Budget {
    scale: f64,
    sum: f64,
    epochs: u64,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            scale: 1.0,
            sum: 0.0,
            epochs: 0,
        }
    }
}

impl Budget {
    /// The scale on the set timed calls now.
    pub(crate) fn scale(&self) -> f64 {
        self.scale
    }

    /// The scale's mean over the epochs so far (1 before any).
    pub(crate) fn mean(&self) -> f64 {
        if self.epochs == 0 {
            1.0
        } else {
            self.sum / self.epochs as f64
        }
    }

    /// Ends an epoch in which the profiler took `share` of the threads'
    /// CPU time (`None`: unknown, the scale stays), against the `target`
    /// share; returns the scale for the next.
    pub(crate) fn end_epoch(&mut self, share: Option<f64>, target: f64) -> f64 {
        self.sum += self.scale;
        self.epochs += 1;
        if let Some(s) = share.filter(|s| s.is_finite()) {
            self.scale = next_scale(self.scale, s, target);
        }
        self.scale
    }
}

/// The scale after an epoch at scale `scale` in which the profiler took
/// `share` of the CPU time, for a `target` share: moved by the ratio of
/// the target's odds to
/// the share's (the profiler's time over the program's grows about as
/// the timed calls do), at most halved or doubled, within
/// [[`MIN_SCALE`], 1].
pub fn next_scale(scale: f64, share: f64, target: f64) -> f64 {
    let odds = |s: f64| s.clamp(0.0, 0.999) / (1.0 - s.clamp(0.0, 0.999));
    let want = odds(target);
    let have = odds(share).max(1e-6);
    (scale * (want / have).clamp(0.5, 2.0)).clamp(MIN_SCALE, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The target the first test's figures are for.
    const T: f64 = 0.4;

    #[test]
    fn the_scale_falls_over_the_target_and_climbs_back_under_it() {
        assert_eq!(next_scale(1.0, 0.1, T), 1.0, "under the target: as set");
        assert_eq!(next_scale(1.0, 0.9, T), 0.5, "far over: halved, no more");
        let s = next_scale(1.0, 0.5, T);
        assert!(s < 1.0 && s > 0.5, "a little over: a little less: {s}");
        assert_eq!(next_scale(0.25, 0.0, T), 0.5, "idle: doubled back");
        assert_eq!(next_scale(MIN_SCALE, 1.0, T), MIN_SCALE, "never under the floor");
        assert_eq!(next_scale(0.5, T, T), 0.5, "on the target: held");
    }

    #[test]
    fn a_load_that_shrinks_with_the_scale_settles_on_the_target() {
        // A program whose profiler time is `k` times its own time at
        // scale 1 and shrinks in proportion to the scale.
        for target in [0.2, T, 0.9] {
            for k in [0.5, 3.0, 40.0] {
                let mut b = Budget::default();
                for _ in 0..60 {
                    let odds = k * b.scale();
                    b.end_epoch(Some(odds / (1.0 + odds)), target);
                }
                let odds = k * b.scale();
                let share = odds / (1.0 + odds);
                if k / (1.0 + k) <= target {
                    assert_eq!(b.scale(), 1.0, "k {k} target {target}: never over, never cut");
                } else {
                    assert!((share - target).abs() < 0.01, "k {k} target {target}: share {share}");
                }
                assert!(b.mean() <= 1.0 && b.mean() >= b.scale().min(1.0) * 0.5);
            }
        }
        assert_eq!(Budget::default().mean(), 1.0);
        let mut b = Budget::default();
        assert_eq!(b.end_epoch(None, T), 1.0, "no share known: as it was");
    }
}
