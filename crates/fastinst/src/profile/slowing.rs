//! How much the profiler slows the program, as the CPU samples see it.
//!
//! A function counted whole is judged busy by its calls in an epoch
//! scaled by the profiler's slowing ([`super::window::stretch`]): with
//! every call hooked, a program of many short functions slows so much
//! that each epoch holds a call or two of each, and judged by that count
//! they stay whole. The hooks' charges measure the slowing only in part:
//! what no stamp covers (the cache lines a hook's records take from the
//! program, the handlers' paths around the stamps) is not in them. On
//! 20,000 functions called in turn, the charges held well under the
//! profiler's time that the samples found, the stretch read a few where
//! the program ran at a fiftieth of its speed, and every function stayed
//! whole. The CPU samples see it all: a sample in a hook's handler or in
//! fastinst's library is the profiler's time, whatever its cause.
//!
//! Each epoch's samples are tallied (`super::cpusample::tally_since`, by
//! the sampler) into sums that decay by half every [`HALF_LIFE_EPOCHS`], so a few
//! tens of samples an epoch make a steady figure.

/// Epochs over which the tallies' weight halves.
pub const HALF_LIFE_EPOCHS: f64 = 4.0;

/// Samples (decayed) needed before the tally is read: fewer say too
/// little of the split.
pub const MIN_SAMPLES: f64 = 16.0;

/// The decayed tallies of the samples (the schedule's lock holder only).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Slowing {
    /// The next sample slot to tally.
    cursor: u64,
    /// Samples, and those in the profiler's code, decayed.
    samples: f64,
    profiler: f64,
}

impl Slowing {
    /// Tallies that start with the sample slot `slot` (the next one to be
    /// taken: `super::cpusample::next_slot`).
    pub(crate) fn starting_at(slot: u64) -> Slowing {
        Slowing {
            cursor: slot,
            ..Slowing::default()
        }
    }

    /// The next sample slot to tally.
    pub(crate) fn cursor(&self) -> u64 {
        self.cursor
    }

    /// Folds an epoch's tally (`super::cpusample::tally_since` from
    /// [`Slowing::cursor`]): `samples` of which `profiler` were in the
    /// profiler's code, the next to tally at `cursor`. Returns what the
    /// recent samples show, or `None` while there are too few.
    pub(crate) fn fold(&mut self, cursor: u64, samples: u64, profiler: u64) -> Option<Tally> {
        self.cursor = cursor;
        let keep = (-std::f64::consts::LN_2 / HALF_LIFE_EPOCHS).exp();
        self.samples = self.samples * keep + samples as f64;
        self.profiler = self.profiler * keep + profiler as f64;
        (self.samples >= MIN_SAMPLES).then(|| Tally {
            share: self.profiler / self.samples,
            // The program's part counts as at least one sample: a tally
            // all in the profiler reads as long as its samples.
            stretch: super::window::stretch(self.samples, self.samples - self.profiler),
        })
    }
}

/// What the recent samples show.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Tally {
    /// The profiler's share of the threads' CPU time.
    pub share: f64,
    /// How many times as long as its own the program's CPU time ran
    /// ([`super::window::stretch`] of the samples over the program's).
    pub stretch: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_samples_split_reads_as_the_slowing() {
        let read = |samples: u64, profiler: u64| Slowing::default().fold(samples, samples, profiler).map(|t| t.stretch);
        assert_eq!(read(100, 0), Some(1.0), "no profiler time");
        assert_eq!(read(100, 50), Some(2.0), "half the time the profiler's");
        assert_eq!(read(100, 98), Some(50.0), "a fiftieth the program's");
        assert_eq!(read(100, 100), Some(100.0), "all: as many as the samples");
        assert_eq!(read(0, 0), None, "none");
    }

    #[test]
    fn a_tally_is_read_once_it_holds_enough_samples_and_follows_a_change() {
        let mut s = Slowing::default();
        assert_eq!(s.fold(10, 10, 9), None, "too few yet");
        let t = s.fold(20, 10, 9).expect("20 samples");
        assert_eq!(s.cursor(), 20);
        assert!((t.share - 0.9).abs() < 1e-9, "{t:?}");
        let first = t.stretch;
        assert!((first - 10.0).abs() < 1e-9, "{first}");
        // The program speeds up once its functions are windowed: within a
        // few half-lives the old epochs weigh little.
        let mut last = first;
        for _ in 0..(4.0 * HALF_LIFE_EPOCHS) as usize {
            last = s.fold(s.cursor() + 20, 20, 2).expect("enough").stretch;
        }
        assert!(last < 1.3, "{last}");
        assert!(last > 1.0, "the old epochs still weigh a little: {last}");
    }
}
