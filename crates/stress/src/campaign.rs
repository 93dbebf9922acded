//! Runs trials for each configuration and reports `N toggles, F failures`.

use crate::trial::{run_forked, Outcome, TrialSpec};
use std::fmt;

/// A trial counts as evidence only if at least this many toggles overlapped
/// executor progress...
pub const MIN_CORUN_TOGGLES: u64 = 100;
/// ...and at least this fraction of its toggles did. On a loaded machine the
/// executors may not run while the patcher toggles; a clean trial then proves
/// nothing, so it is reported as inconclusive instead of passed.
pub const MIN_CORUN_RATIO: f64 = 0.01;

/// The aggregate of all trials of one configuration.
#[derive(Clone, Debug, Default)]
pub struct ConfigResult {
    /// Configuration label: strategy, form, split, executors, fetch, and `wx`
    /// for W^X.
    pub label: String,
    /// Trials run.
    pub trials: u64,
    /// Trials with enough co-run evidence (or that failed).
    pub counted: u64,
    /// Clean trials without enough co-run evidence.
    pub inconclusive: u64,
    /// Trials that crashed, hung, or saw torn code or wrong state.
    pub failures: u64,
    /// Toggles over all trials (a failed trial's up to its failure).
    pub toggles: u64,
    /// Toggles in counted trials.
    pub counted_toggles: u64,
    /// Toggles that overlapped executor progress.
    pub corun_toggles: u64,
    /// Executor calls while toggling.
    pub calls: u64,
    /// Calls that found the site active.
    pub seen_on: u64,
    /// Calls that found it inactive.
    pub seen_off: u64,
    /// How each failure ended.
    pub failure_kinds: Vec<String>,
}

fn signal_name(s: i32) -> String {
    match s {
        libc::SIGSEGV => "SIGSEGV".into(),
        libc::SIGILL => "SIGILL".into(),
        libc::SIGTRAP => "SIGTRAP".into(),
        libc::SIGBUS => "SIGBUS".into(),
        libc::SIGFPE => "SIGFPE".into(),
        libc::SIGABRT => "SIGABRT".into(),
        s => format!("signal {s}"),
    }
}

/// Runs up to `trials` forked trials of `spec`; with `stop_at_failure`, stops
/// at the first failure (negative controls).
pub fn run_config(spec: &TrialSpec, trials: u64, stop_at_failure: bool) -> ConfigResult {
    let mut r = ConfigResult {
        label: format!(
            "{} {:?} {} executors={} fetch={}{}",
            spec.strategy,
            spec.form,
            spec.place,
            spec.executors,
            spec.fetch,
            if spec.wx { " wx" } else { "" }
        ),
        ..Default::default()
    };
    for _ in 0..trials {
        r.trials += 1;
        let out = run_forked(spec);
        match &out {
            Outcome::Completed(s) => {
                r.toggles += s.toggles;
                r.corun_toggles += s.corun_toggles;
                r.calls += s.calls_during;
                r.seen_on += s.seen_on;
                r.seen_off += s.seen_off;
                let evidence = s.corun_toggles >= MIN_CORUN_TOGGLES
                    && s.corun_toggles as f64 >= MIN_CORUN_RATIO * s.toggles as f64;
                if out.is_failure() {
                    r.failures += 1;
                    r.counted += 1;
                    r.counted_toggles += s.toggles;
                    r.failure_kinds
                        .push(format!("{} torn results, {} toggle errors", s.bad, s.toggle_errors));
                } else if evidence {
                    r.counted += 1;
                    r.counted_toggles += s.toggles;
                } else {
                    r.inconclusive += 1;
                }
            }
            Outcome::Crashed { signal, toggles } => {
                r.failures += 1;
                r.counted += 1;
                r.toggles += toggles;
                r.counted_toggles += toggles;
                r.failure_kinds.push(signal_name(*signal));
            }
            Outcome::Hung { toggles } => {
                r.failures += 1;
                r.counted += 1;
                r.toggles += toggles;
                r.counted_toggles += toggles;
                r.failure_kinds.push("hung".into());
            }
            Outcome::Error(e) => {
                r.failures += 1;
                r.counted += 1;
                r.failure_kinds.push(e.clone());
            }
        }
        if stop_at_failure && r.failures > 0 {
            break;
        }
    }
    r
}

impl ConfigResult {
    /// The machine-readable line tests parse.
    pub fn result_line(&self) -> String {
        format!(
            "RESULT {} toggles={} failures={} trials={} counted={} inconclusive={} corun={} calls={} on={} off={}",
            self.label.replace(' ', ","),
            self.toggles,
            self.failures,
            self.trials,
            self.counted,
            self.inconclusive,
            self.corun_toggles,
            self.calls,
            self.seen_on,
            self.seen_off
        )
    }
}

impl fmt::Display for ConfigResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pct = |a: u64, b: u64| if b == 0 { 0.0 } else { 100.0 * a as f64 / b as f64 };
        write!(
            f,
            "{}: {} toggles, {} failures ({} trials: {} counted, {} inconclusive; co-run {:.0}% of toggles; {} calls, {:.0}% active)",
            self.label,
            self.toggles,
            self.failures,
            self.trials,
            self.counted,
            self.inconclusive,
            pct(self.corun_toggles, self.toggles),
            self.calls,
            pct(self.seen_on, self.seen_on + self.seen_off),
        )?;
        if !self.failure_kinds.is_empty() {
            write!(f, " [{}]", self.failure_kinds.join(", "))?;
        }
        Ok(())
    }
}
