//! What a calibration run sweeps, and how long each trial may take.
//!
//! The run length is set by a time budget rather than a toggle count: the
//! number of cells (W × S × N) varies with the machine's cores, and a default
//! run must finish in under 10 minutes and `--quick` in under 60 s anywhere.
//! Cells that fail stop at their first failed trial, so low waits, which fail,
//! cost little, and the budget goes to the waits that need evidence.

use std::time::Duration;

/// Per-trial overhead (fork, fixture, executor start-up) assumed when
/// dividing the budget into trials.
const TRIAL_OVERHEAD: Duration = Duration::from_millis(25);

/// A calibration sweep.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// Waits W to test, in TSC ticks, ascending.
    pub waits: Vec<u64>,
    /// Straddle splits S (bytes of the 5-byte call before the line boundary).
    pub splits: Vec<usize>,
    /// Executor thread counts N.
    pub executors: Vec<usize>,
    /// Trials per (W, S, N).
    pub trials: u64,
    /// Trials per (S, N) at the smallest wait, the positive control: the
    /// sweep must see failures somewhere to prove it can, and on machines
    /// where they are rare that takes more trials. Its cells stop at their
    /// first failure, so where failures are common this costs little.
    pub control_trials: u64,
    /// Toggle limit per trial.
    pub toggles: u64,
    /// Time limit per trial.
    pub trial_time: Duration,
    /// Safety margin the smallest clean wait is multiplied by.
    pub margin: f64,
    /// Time limit per trial of the verification run at the recommended T_max.
    pub verify_time: Duration,
    /// Whether this is the `--quick` plan (recorded in the config).
    pub quick: bool,
}

/// Executor counts for a machine with `cores` CPUs: 1 .. cores-1 (thinned to
/// powers of two and cores-1 on big machines), plus one oversubscribed run
/// with as many executors as cores, so executors and patcher compete for CPUs.
pub fn executor_counts(cores: usize) -> Vec<usize> {
    let mut v: Vec<usize> = Vec::new();
    let mut n = 1;
    while n < cores.saturating_sub(1) {
        v.push(n);
        n *= 2;
    }
    if cores > 1 {
        v.push(cores - 1);
    }
    v.push(cores.max(2));
    v.dedup();
    v
}

/// How a run's time is shared out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// The positive control (the smallest wait), at most.
    pub control: Duration,
    /// Every other wait.
    pub sweep: Duration,
    /// The verification run at the candidate T_max.
    pub verify: Duration,
}

impl Budget {
    /// The default run: under 10 minutes with the cost measurement.
    pub const FULL: Budget = Budget {
        control: Duration::from_secs(60),
        sweep: Duration::from_secs(400),
        verify: Duration::from_secs(60),
    };
    /// `--quick`: under 60 s.
    pub const QUICK: Budget = Budget {
        control: Duration::from_secs(10),
        sweep: Duration::from_secs(30),
        verify: Duration::from_secs(8),
    };
}

impl Plan {
    /// The default run: W = 0..=3000 in steps of 100, S = 1..4, 3 trials,
    /// about 8 minutes of trials.
    pub fn full(cores: usize) -> Plan {
        let mut p = Plan {
            waits: (0..=30).map(|i| i * 100).collect(),
            splits: vec![1, 2, 3, 4],
            executors: executor_counts(cores),
            trials: 3,
            control_trials: 3,
            toggles: 50_000_000,
            trial_time: Duration::ZERO,
            margin: 2.0,
            verify_time: Duration::ZERO,
            quick: false,
        };
        p.fit(Budget::FULL);
        p
    }

    /// `--quick`: W = 0..=3000 in steps of 500, 2 trials, about 40 s.
    pub fn quick(cores: usize) -> Plan {
        let mut p = Plan {
            waits: (0..=6).map(|i| i * 500).collect(),
            trials: 2,
            quick: true,
            ..Plan::full(cores)
        };
        p.fit(Budget::QUICK);
        p
    }

    /// Cells (S, N) per wait.
    fn cells_per_wait(&self) -> u64 {
        (self.splits.len() * self.executors.len()) as u64
    }

    /// Trials in the sweep, the control included (an upper bound: failing
    /// cells stop early).
    pub fn trial_count(&self) -> u64 {
        let rest = self.waits.len().saturating_sub(1) as u64;
        self.cells_per_wait() * (self.control_trials + rest * self.trials)
    }

    /// Sets the per-trial times and the control's trials to the budget.
    pub fn fit(&mut self, b: Budget) {
        let cells = self.cells_per_wait().max(1) as f64;
        let overhead = TRIAL_OVERHEAD.as_secs_f64();
        let rest = (self.waits.len().saturating_sub(1) as f64 * cells * self.trials as f64).max(1.0);
        let per = (b.sweep.as_secs_f64() / rest - overhead).clamp(0.05, 5.0);
        self.trial_time = Duration::from_secs_f64(per);
        let control = (b.control.as_secs_f64() / cells / (per + overhead)).floor() as u64;
        self.control_trials = control.max(self.trials);
        let v = b.verify.as_secs_f64() / cells - overhead;
        self.verify_time = Duration::from_secs_f64(v.clamp(0.05, 5.0));
    }

    /// The longest the sweep and verification can take, overheads included.
    pub fn time_bound(&self) -> Duration {
        let per = self.trial_time + TRIAL_OVERHEAD;
        per * self.trial_count() as u32 + (self.verify_time + TRIAL_OVERHEAD) * self.cells_per_wait() as u32
    }

    /// Checks the plan makes sense; the message names the bad setting.
    pub fn validate(&self) -> Result<(), String> {
        if self.waits.is_empty() {
            return Err("no waits to test".into());
        }
        if self.waits.windows(2).any(|w| w[0] >= w[1]) {
            return Err("waits must be strictly ascending".into());
        }
        if self.splits.is_empty() || self.splits.iter().any(|&s| !(1..=4).contains(&s)) {
            return Err("splits must be in 1..=4 (a 5-byte call straddles a line boundary in 4 ways)".into());
        }
        if self.executors.is_empty() || self.executors.contains(&0) {
            return Err("executor counts must be at least 1".into());
        }
        if self.trials == 0 || self.toggles == 0 {
            return Err("trials and toggles must be at least 1".into());
        }
        if !(self.margin >= 1.0 && self.margin.is_finite()) {
            return Err("the safety margin must be a number >= 1".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn executor_counts_cover_one_to_cores_minus_one_and_oversubscribe() {
        assert_eq!(executor_counts(1), vec![2]);
        assert_eq!(executor_counts(2), vec![1, 2]);
        assert_eq!(executor_counts(4), vec![1, 2, 3, 4]);
        assert_eq!(executor_counts(16), vec![1, 2, 4, 8, 15, 16]);
    }

    #[test]
    fn budgets_hold_on_small_and_big_machines() {
        for cores in [1, 2, 4, 16, 64] {
            let q = Plan::quick(cores);
            q.validate().unwrap();
            assert!(
                q.time_bound() < Duration::from_secs(55),
                "{cores}: {:?}",
                q.time_bound()
            );
            let f = Plan::full(cores);
            f.validate().unwrap();
            assert!(
                f.time_bound() < Duration::from_secs(9 * 60 + 30),
                "{cores}: {:?}",
                f.time_bound()
            );
            assert_eq!(*f.waits.last().unwrap(), 3000);
        }
    }

    #[test]
    fn bad_plans_are_refused() {
        let mut p = Plan::quick(2);
        p.waits = vec![100, 0];
        assert!(p.validate().unwrap_err().contains("ascending"));
        let mut p = Plan::quick(2);
        p.splits = vec![5];
        assert!(p.validate().is_err());
        let mut p = Plan::quick(2);
        p.margin = 0.5;
        assert!(p.validate().is_err());
    }
}
