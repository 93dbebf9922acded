//! The sweep: for each wait W, split S and executor count N, forked trials of
//! the INT3 protocol with `Wait::Tmax(W)` on a straddling `call rel32`.

use crate::plan::Plan;
use callpatch::Form;
use std::time::Duration;
use stress::{run_config, ConfigResult, Fetch, Method, TrialSpec};
use wordpatch::Wait;

/// The trials of one (W, S, N).
#[derive(Clone, Debug)]
pub struct Cell {
    /// Wait W in ticks.
    pub wait: u64,
    /// Split S.
    pub split: usize,
    /// Executors N.
    pub executors: usize,
    /// What its trials showed.
    pub result: ConfigResult,
}

/// Totals over the cells of one (W, S), or any other group of cells.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Trials run.
    pub trials: u64,
    /// Trials with co-run evidence, or that failed.
    pub counted: u64,
    /// Clean trials without enough co-run evidence (not counted).
    pub inconclusive: u64,
    /// Trials that failed (crash, hang, torn result).
    pub failures: u64,
    /// Toggles in all completed trials.
    pub toggles: u64,
    /// Toggles in counted trials.
    pub counted_toggles: u64,
    /// Toggles that overlapped executor progress.
    pub corun_toggles: u64,
}

impl From<&ConfigResult> for Tally {
    fn from(r: &ConfigResult) -> Tally {
        Tally {
            trials: r.trials,
            counted: r.counted,
            inconclusive: r.inconclusive,
            failures: r.failures,
            toggles: r.toggles,
            counted_toggles: r.counted_toggles,
            corun_toggles: r.corun_toggles,
        }
    }
}

impl Tally {
    /// Adds one cell's result.
    pub fn add(&mut self, r: &ConfigResult) {
        self.merge(&Tally::from(r));
    }

    /// Adds another tally.
    pub fn merge(&mut self, o: &Tally) {
        self.trials += o.trials;
        self.counted += o.counted;
        self.inconclusive += o.inconclusive;
        self.failures += o.failures;
        self.toggles += o.toggles;
        self.counted_toggles += o.counted_toggles;
        self.corun_toggles += o.corun_toggles;
    }

    /// Clean, with at least one counted trial.
    pub fn clean_with_evidence(&self) -> bool {
        self.failures == 0 && self.counted > 0
    }

    /// Share of toggles that overlapped executor progress.
    pub fn corun_ratio(&self) -> f64 {
        if self.toggles == 0 {
            0.0
        } else {
            self.corun_toggles as f64 / self.toggles as f64
        }
    }
}

/// The whole sweep's results, in the order run (W, then S, then N).
#[derive(Clone, Debug, Default)]
pub struct Sweep {
    /// Every cell run.
    pub cells: Vec<Cell>,
}

/// Runs the trials of one cell: `Wait::Tmax(wait)` sync wordpatch at `split`
/// with `executors` threads, stopping at the first failed trial.
///
/// Call from a single-threaded process: each trial is a forked child.
pub fn run_cell(wait: u64, split: usize, executors: usize, trials: u64, toggles: u64, time: Duration) -> Cell {
    let spec = TrialSpec {
        strategy: Method::WordSync(Wait::Tmax(wait)),
        form: Form::CallRel32,
        place: stress::Place::of_split(split),
        executors,
        fetch: Fetch::Warm,
        max_toggles: toggles,
        max_time: time,
        wx: false,
    };
    Cell {
        wait,
        split,
        executors,
        result: run_config(&spec, trials, true),
    }
}

impl Sweep {
    /// Runs `plan`, calling `progress(done, total, cell)` after each cell.
    pub fn run(plan: &Plan, mut progress: impl FnMut(usize, usize, &Cell)) -> Sweep {
        let total = plan.waits.len() * plan.splits.len() * plan.executors.len();
        let mut s = Sweep::default();
        for (i, &w) in plan.waits.iter().enumerate() {
            let trials = if i == 0 { plan.control_trials } else { plan.trials };
            for &split in &plan.splits {
                for &n in &plan.executors {
                    let c = run_cell(w, split, n, trials, plan.toggles, plan.trial_time);
                    s.cells.push(c);
                    progress(s.cells.len(), total, s.cells.last().expect("just pushed"));
                }
            }
        }
        s
    }

    /// The waits tested, ascending.
    pub fn waits(&self) -> Vec<u64> {
        let mut w: Vec<u64> = self.cells.iter().map(|c| c.wait).collect();
        w.sort_unstable();
        w.dedup();
        w
    }

    /// The splits tested, ascending.
    pub fn splits(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self.cells.iter().map(|c| c.split).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Totals of the cells that match.
    pub fn tally(&self, mut keep: impl FnMut(&Cell) -> bool) -> Tally {
        let mut t = Tally::default();
        for c in self.cells.iter().filter(|c| keep(c)) {
            t.add(&c.result);
        }
        t
    }

    /// Totals for one (W, S), over every N.
    pub fn at(&self, wait: u64, split: usize) -> Tally {
        self.tally(|c| c.wait == wait && c.split == split)
    }

    /// Totals for one W, over every S and N.
    pub fn row(&self, wait: u64) -> Tally {
        self.tally(|c| c.wait == wait)
    }
}
