//! From the failure table to a recommendation: T_max and the default wait.
//!
//! The rule (the paper's §8.1, made explicit):
//! 1. The sweep must have seen failures somewhere (normally at W = 0). A
//!    sweep that never failed could not provoke the hazard it measures, so a
//!    clean wait proves nothing and no T_max is recommended.
//! 2. W* is the smallest tested W such that every tested W' >= W* is clean
//!    with evidence at every split: 0 failed trials, and at least one counted
//!    trial (one whose executors co-ran with the toggles) per split. A wait
//!    with an uncounted split breaks the chain: silence is not safety.
//! 3. T_max = ceil(W* × margin). The margin (default 2) covers the gap
//!    between W* and the last failing wait below it, which the sweep's step
//!    leaves unmeasured, and rare long stalls the sweep was too short to see.
//! 4. The clean stretch must be significant. Let r be the failure rate per
//!    toggle below W* (failed trials over toggles). If the wait made no
//!    difference, the N toggles of counted trials at W >= W* would show
//!    N·r failures on average; seeing none is evidence only when
//!    N·r >= [`NULL_EXPECTED_FAILURES`] (chance of a clean stretch <= 1%).
//!    Without this a machine whose failures are rare and do not fall with the
//!    wait (this project's VM: about one per million toggles at every wait
//!    from 0 to 12,000) yields a "T_max" wherever the dice fell. N must also
//!    reach [`Thresholds::min_evidence`], and a verification run at T_max
//!    itself must be clean with evidence.
//! 5. The default wait is `tmax` when a T_max passed (4) and its measured
//!    cost is below SyncCore's (both measured with an executor running the
//!    site, as a hot probe is); else `synccore`, which needs no T_max.

use crate::sweep::{Sweep, Tally};
use wordpatch::Wait;

/// Failures a clean stretch of waits would have shown on average if the
/// wait made no difference, below which the stretch is not significant:
/// a Poisson count with mean 4.6 is 0 with probability 1%.
pub const NULL_EXPECTED_FAILURES: f64 = 4.6;

/// Clean toggles a T_max needs at W >= W*, whatever the failure rate below
/// W* suggests. The rate below W* comes mostly from the positive control,
/// whose failing trials stop at their first failure, so it says little about
/// rare stalls: a shared VM can tear once in millions of toggles at waits
/// it otherwise looks safe at (`docs/calibration.md`), and a quick run whose
/// top waits happened to be clean for a few million toggles once trusted a
/// T_max that `--check` then saw tear. 20 M clean toggles make a stretch
/// that clean by chance unlikely (< 1% at one tear per 4 M).
pub const MIN_EVIDENCE: u64 = 20_000_000;

/// Knobs of the rule.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Thresholds {
    /// Safety margin W* is multiplied by.
    pub margin: f64,
    /// Toggles of counted trials needed at W >= W* before T_max is trusted,
    /// whatever the failure rate below W*.
    pub min_evidence: u64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            margin: 2.0,
            min_evidence: MIN_EVIDENCE,
        }
    }
}

/// Measured costs of one straddler patch (median ticks) under each wait.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct WaitCosts {
    /// SyncCore, idle site; `None` if the kernel lacks the membarrier command.
    pub synccore_idle: Option<f64>,
    /// SyncCore, while another thread executes the site.
    pub synccore_busy: Option<f64>,
    /// Tmax at the tested T, idle.
    pub tmax_idle: f64,
    /// Tmax at the tested T, busy.
    pub tmax_busy: f64,
    /// The T the Tmax costs were measured at.
    pub tmax_ticks: u64,
}

/// Why no T_max could be derived from the sweep.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NoTmax {
    /// No trial failed at any wait: the sweep could not see the hazard.
    NeverFailed,
    /// The largest wait tested failed.
    TopWaitFailed(u64),
    /// The largest wait tested had a split with no counted trial.
    TopWaitUnproven(u64),
}

impl std::fmt::Display for NoTmax {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NoTmax::NeverFailed => write!(
                f,
                "no trial failed at any wait, not even the smallest: the benchmark could not provoke torn \
                 straddlers here, so a clean wait proves nothing"
            ),
            NoTmax::TopWaitFailed(w) => write!(
                f,
                "failures at the largest wait tested ({w} ticks): no tested wait is safe, the INT3 + wait protocol \
                 has no T_max within the sweep on this machine"
            ),
            NoTmax::TopWaitUnproven(w) => write!(
                f,
                "the largest wait tested ({w} ticks) has a split with no counted trial (executors did not co-run \
                 with the toggles): not enough evidence"
            ),
        }
    }
}

/// The smallest wait W* from which every larger tested wait is clean with
/// evidence at every split (rule steps 1-2).
pub fn min_clean_wait(sweep: &Sweep) -> Result<u64, NoTmax> {
    let waits = sweep.waits();
    let splits = sweep.splits();
    if sweep.tally(|_| true).failures == 0 {
        return Err(NoTmax::NeverFailed);
    }
    let clean = |w: u64| splits.iter().all(|&s| sweep.at(w, s).clean_with_evidence());
    let mut best = None;
    for &w in waits.iter().rev() {
        if !clean(w) {
            break;
        }
        best = Some(w);
    }
    match best {
        Some(w) => Ok(w),
        None => {
            let top = *waits.last().expect("a sweep that failed has waits");
            if sweep.row(top).failures > 0 {
                Err(NoTmax::TopWaitFailed(top))
            } else {
                Err(NoTmax::TopWaitUnproven(top))
            }
        }
    }
}

/// T_max from W* and the margin (rule step 3).
pub fn with_margin(w_star: u64, margin: f64) -> u64 {
    (w_star as f64 * margin).ceil() as u64
}

/// The outcome of a calibration.
#[derive(Clone, Debug, PartialEq)]
pub struct Recommendation {
    /// W*, if the sweep has one.
    pub min_clean_wait: Result<u64, NoTmax>,
    /// T_max (W* × margin) if it passed the evidence threshold and the
    /// verification; this is what the config's `tmax_ticks` records.
    pub tmax: Option<u64>,
    /// The recommended default wait; `None` when neither a T_max passed nor
    /// the kernel has SyncCore (straddling word patches are then unsafe here).
    pub wait: Option<Wait>,
    /// One line per decision, for the output and the config.
    pub reasons: Vec<String>,
}

/// Applies the rule. `verify` is the verification run at the candidate
/// T_max (`None`: not run), `costs` the measured wait costs (`None`: not
/// measured; SyncCore is then assumed available and preferred only if no
/// T_max passed).
pub fn recommend(sweep: &Sweep, verify: Option<&Tally>, costs: Option<&WaitCosts>, th: &Thresholds) -> Recommendation {
    let mut reasons = Vec::new();
    let w_star = min_clean_wait(sweep);
    let mut tmax = None;
    match &w_star {
        Err(e) => reasons.push(format!("no T_max: {e}")),
        Ok(w) => {
            let t = with_margin(*w, th.margin);
            reasons.push(format!(
                "smallest wait clean from there up: W* = {w} ticks; x{} margin = {t} ticks",
                th.margin
            ));
            let below = sweep.tally(|c| c.wait < *w);
            let rate = below.failures as f64 / below.counted_toggles.max(1) as f64;
            let needed = ((NULL_EXPECTED_FAILURES / rate).ceil() as u64).max(th.min_evidence);
            let clean = sweep.tally(|c| c.wait >= *w).counted_toggles;
            reasons.push(format!(
                "failure rate below W*: {} failed trials in {} toggles (1 per {:.0}); clean stretch W >= {w}: {clean} \
                 toggles, {needed} needed",
                below.failures,
                below.counted_toggles,
                1.0 / rate.max(f64::MIN_POSITIVE)
            ));
            if clean < needed {
                reasons.push(format!(
                    "T_max {t} not trusted: if the wait made no difference, {clean} toggles would have shown no \
                     failure with probability {:.0}%",
                    100.0 * (-(clean as f64) * rate).exp()
                ));
            } else {
                match verify {
                    None => reasons.push(format!("T_max {t} not trusted: no verification run at it")),
                    Some(v) if v.failures > 0 => reasons.push(format!(
                        "T_max {t} rejected: the verification run at it failed {} of {} trials",
                        v.failures, v.trials
                    )),
                    Some(v) if v.counted == 0 => reasons.push(format!(
                        "T_max {t} not trusted: the verification run had no counted trial"
                    )),
                    Some(v) => {
                        reasons.push(format!(
                            "T_max {t} verified: {} toggles in {} counted trials, 0 failures",
                            v.counted_toggles, v.counted
                        ));
                        tmax = Some(t);
                    }
                }
            }
        }
    }
    let sync_available = costs.is_none_or(|c| c.synccore_busy.is_some());
    let wait = match (tmax, costs) {
        (Some(t), Some(c)) => match c.synccore_busy {
            Some(s) if s <= c.tmax_busy => {
                reasons.push(format!(
                    "default wait synccore: {s:.0} ticks per straddler patch against {:.0} for Tmax({})",
                    c.tmax_busy, c.tmax_ticks
                ));
                Some(Wait::SyncCore)
            }
            Some(s) => {
                reasons.push(format!(
                    "default wait tmax: {:.0} ticks per straddler patch against {s:.0} for SyncCore",
                    c.tmax_busy
                ));
                Some(Wait::Tmax(t))
            }
            None => {
                reasons.push("default wait tmax: the kernel has no membarrier SYNC_CORE".into());
                Some(Wait::Tmax(t))
            }
        },
        (Some(t), None) => {
            reasons.push("default wait tmax (costs not measured)".into());
            Some(Wait::Tmax(t))
        }
        (None, _) if sync_available => {
            reasons.push("default wait synccore: it needs no T_max".into());
            Some(Wait::SyncCore)
        }
        (None, _) => {
            reasons.push(
                "no safe wait: no T_max and no membarrier SYNC_CORE; straddling word patches are unsafe here, use \
                 callpatch"
                    .into(),
            );
            None
        }
    };
    Recommendation {
        min_clean_wait: w_star,
        tmax,
        wait,
        reasons,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::Cell;
    use stress::ConfigResult;

    /// A sweep from a compact description: (wait, split, failures, counted).
    /// A failing cell failed fast (10,000 toggles); a clean one ran 10 M.
    fn sweep(rows: &[(u64, usize, u64, u64)]) -> Sweep {
        Sweep {
            cells: rows
                .iter()
                .map(|&(wait, split, failures, counted)| {
                    let toggles = if failures > 0 { 10_000 } else { 10_000_000 * counted };
                    Cell {
                        wait,
                        split,
                        executors: 1,
                        result: ConfigResult {
                            trials: counted.max(1),
                            counted,
                            inconclusive: counted.max(1) - counted,
                            failures,
                            toggles,
                            counted_toggles: toggles,
                            corun_toggles: toggles / 2,
                            ..Default::default()
                        },
                    }
                })
                .collect(),
        }
    }

    /// Every split fails at the waits in `fail_at`; the rest are clean.
    fn grid(fail_at: &[u64], waits: &[u64]) -> Sweep {
        let mut rows = Vec::new();
        for &w in waits {
            for s in 1..=4 {
                rows.push((w, s, u64::from(fail_at.contains(&w)), 1));
            }
        }
        sweep(&rows)
    }

    fn clean_verify() -> Tally {
        Tally {
            trials: 4,
            counted: 4,
            counted_toggles: 10_000,
            ..Default::default()
        }
    }

    #[test]
    fn smallest_wait_after_the_last_failure() {
        let s = grid(&[0, 100, 300], &[0, 100, 200, 300, 400, 500]);
        assert_eq!(min_clean_wait(&s), Ok(400));
        let r = recommend(&s, Some(&clean_verify()), None, &Thresholds::default());
        assert_eq!(r.tmax, Some(800));
        assert_eq!(r.wait, Some(Wait::Tmax(800)));
    }

    #[test]
    fn rare_failures_that_do_not_fall_with_the_wait_give_no_tmax() {
        // One failure per ~130 M toggles at W = 0 and 300, none at
        // 400..600: 120 M clean toggles would stay clean by chance 40% of
        // the time.
        let mut rows = Vec::new();
        for w in [0, 100, 200, 300, 400, 500, 600] {
            for s in 1..=4 {
                let f = u64::from((w == 0 || w == 300) && s == 1);
                rows.push((w, s, f, 1));
            }
        }
        let s = sweep(&rows);
        assert_eq!(min_clean_wait(&s), Ok(400));
        let r = recommend(&s, Some(&clean_verify()), None, &Thresholds::default());
        assert_eq!((r.tmax, r.wait), (None, Some(Wait::SyncCore)), "{:?}", r.reasons);
        assert!(r.reasons.iter().any(|l| l.contains("not trusted")), "{:?}", r.reasons);
    }

    #[test]
    fn failure_at_the_top_means_no_tmax() {
        let s = grid(&[0, 500], &[0, 100, 500]);
        assert_eq!(min_clean_wait(&s), Err(NoTmax::TopWaitFailed(500)));
        let r = recommend(&s, None, None, &Thresholds::default());
        assert_eq!((r.tmax, r.wait), (None, Some(Wait::SyncCore)));
    }

    #[test]
    fn a_sweep_that_never_fails_proves_nothing() {
        let s = grid(&[], &[0, 100]);
        assert_eq!(min_clean_wait(&s), Err(NoTmax::NeverFailed));
    }

    #[test]
    fn an_uncounted_split_breaks_the_chain() {
        let mut rows = vec![(0, 1, 1, 1), (0, 2, 1, 1)];
        for s in 1..=4 {
            rows.push((100, s, 0, 1));
            rows.push((200, s, 0, u64::from(s != 3)));
            rows.push((300, s, 0, 1));
        }
        let sw = sweep(&rows);
        assert_eq!(min_clean_wait(&sw), Ok(300));
        rows.retain(|r| r.0 != 300);
        assert_eq!(min_clean_wait(&sweep(&rows)), Err(NoTmax::TopWaitUnproven(200)));
    }

    #[test]
    fn evidence_verification_and_cost_decide_the_default() {
        let s = grid(&[0], &[0, 100]);
        let th = Thresholds::default();
        let low = Thresholds {
            min_evidence: u64::MAX,
            ..th
        };
        assert_eq!(recommend(&s, Some(&clean_verify()), None, &low).tmax, None);
        let failed = Tally {
            failures: 1,
            ..clean_verify()
        };
        assert_eq!(recommend(&s, Some(&failed), None, &th).tmax, None);
        assert_eq!(recommend(&s, None, None, &th).tmax, None);
        let mut costs = WaitCosts {
            synccore_idle: Some(3000.0),
            synccore_busy: Some(60_000.0),
            tmax_idle: 1000.0,
            tmax_busy: 1200.0,
            tmax_ticks: 200,
        };
        let r = recommend(&s, Some(&clean_verify()), Some(&costs), &th);
        assert_eq!((r.tmax, r.wait), (Some(200), Some(Wait::Tmax(200))));
        costs.synccore_busy = Some(900.0);
        let r = recommend(&s, Some(&clean_verify()), Some(&costs), &th);
        assert_eq!((r.tmax, r.wait), (Some(200), Some(Wait::SyncCore)));
        costs.synccore_busy = None;
        let r = recommend(&grid(&[0, 100], &[0, 100]), None, Some(&costs), &th);
        assert_eq!((r.tmax, r.wait), (None, None));
    }
}
