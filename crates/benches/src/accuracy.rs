//! The accuracy harness (`fastinst-accuracy`): the latency profiler's
//! numbers against exact references, on real programs.
//!
//! For each program and build it runs, on the same workload:
//! - the plain build under `perf record -e cpu-clock` (when perf is
//!   installed), several times ([`crate::perf`]): every function's share of
//!   the CPU samples, the reference for self time, and how far it moves
//!   between runs of the plain build alone;
//! - the plain build alone, and the instrumented build with every probe off
//!   (`FASTINST_TOOL=off`);
//! - the instrumented build under `FASTINST_TOOL=count`: every function's
//!   exact calls;
//! - under `FASTINST_TOOL=trace`: every call timed, the reference for
//!   latency percentiles;
//! - under the trace again with only the top-level functions probed
//!   (`main` and the thread bodies the first trace found,
//!   `FASTINST_FUNCTIONS`), once before each profiled run: their inclusive
//!   times (the median of those runs), at the cost of two hooks a call
//!   (the full trace's hooks lengthen every thread's life, and the
//!   probes-off run's wall time holds the process's start and exit
//!   besides `main`);
//! - under the trace again with only the functions whose percentiles are
//!   checked probed, once before each profiled run: their p50 and p99
//!   without the hooks of their short callees, whose cost beyond the
//!   charges lengthens every caller's duration in the full trace;
//! - the instrumented build with every probe off once more, under `perf
//!   record --call-graph dwarf` ([`crate::children`]): each function's
//!   inclusive CPU time, each sample once, measured from outside the
//!   profiled binary (single-threaded programs);
//! - under the profiler (the default tool), `runs` times;
//! - under the full trace again, after the profiled runs: how often the
//!   reference meets itself within the percentiles' target.
//!
//! and compares, per function, against the targets:
//! - calls within ±15% of exact, for every function with at least 1% of
//!   all calls;
//! - self share within ±2 points of perf's, for every function above 2%;
//!   and, where it misses, whether it lies within three of the deviations
//!   its run's count of samples gives it (a binomial count's): how many
//!   misses the profile's own sampling explains;
//! - inclusive time of `main` and the thread bodies within ±5% of the
//!   top-level trace's;
//! - the inclusive time of each function whose calls are checked within
//!   three of its stated standard deviations of the trace's: whether the
//!   report's `+-` covers its error (no fixed target: the traced run
//!   differs from the profiled one by the trace's own cost); and within
//!   three deviations, its own and the reference's joined, of perf's
//!   inclusive CPU time of the probes-off build, which no hook lengthens;
//! - p50 and p99 within ±10% of the trace's, for functions whose traced
//!   p50 is at least 1 µs; and within ±10% of the trace of those
//!   functions alone, for those whose p50 there is at least 1 µs.

use crate::error::{EvalError, Result};
use crate::measure::run_once;
use crate::perf::{PerfShares, SelfReferences};
use crate::programs::{Binary, Program};
use fastinst::profile::report::Range;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The targets.
pub const CALLS_TOLERANCE: f64 = 0.15;
/// Share of all calls from which a function's calls are checked.
pub const CALLS_FLOOR: f64 = 0.01;
/// Self share tolerance, percentage points.
pub const SELF_TOLERANCE_PP: f64 = 2.0;
/// Share (percent) from which a function's self share is checked.
pub const SELF_FLOOR_PCT: f64 = 2.0;
/// Inclusive time tolerance of top-level functions.
pub const INCLUSIVE_TOLERANCE: f64 = 0.05;
/// Percentile tolerance.
pub const PERCENTILE_TOLERANCE: f64 = 0.10;
/// Traced p50 (microseconds) from which percentiles are checked.
pub const PERCENTILE_FLOOR_US: f64 = 1.0;
/// Calls (traced) from which percentiles are checked: fewer make no
/// distribution whose p99 means anything.
pub const PERCENTILE_MIN_CALLS: u64 = 20;

/// What one configuration (program, build) measured.
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct Config {
    /// Program name.
    pub program: String,
    /// Build name (`gcc`, `clang`, `gcc-sled`, `clang-sled`).
    pub build: String,
    /// Profiler runs compared.
    pub runs: usize,
    /// Calls: per checked function, estimated over exact, each run.
    pub calls: Vec<CallCheck>,
    /// Self shares: per checked function, the profile's and perf's.
    pub shares: Vec<ShareCheck>,
    /// Inclusive times of the top-level functions.
    pub inclusive: Vec<InclusiveCheck>,
    /// Inclusive times of the most-called functions, with their stated
    /// spread, against the trace's.
    #[serde(default)]
    pub totals: Vec<TotalCheck>,
    /// Percentiles of functions of at least 1 µs.
    pub percentiles: Vec<PercentileCheck>,
    /// Wall time (s): plain build, instrumented with the profiler (mean).
    pub plain_s: f64,
    /// The instrumented build's wall time with every probe off.
    #[serde(default)]
    pub off_s: f64,
    /// Profiled run's wall time (mean over runs).
    pub profile_s: f64,
}

/// One function's calls.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct CallCheck {
    /// Function.
    pub name: String,
    /// Exact calls (count tool).
    pub exact: u64,
    /// Estimated calls, per run.
    pub estimated: Vec<f64>,
    /// The profile's stated standard deviation, per run.
    pub sd: Vec<f64>,
}

/// One function's self share.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct ShareCheck {
    /// Function.
    pub name: String,
    /// perf's share of the plain build's samples (percent), the mean over
    /// its runs.
    pub perf: f64,
    /// perf's share in each run of the plain build (older results: none).
    #[serde(default)]
    pub perf_runs: Vec<f64>,
    /// perf's share of the instrumented build's samples with every probe
    /// off (mean over its runs; older results: none).
    #[serde(default)]
    pub off: Option<f64>,
    /// The profile's share, per run (percent).
    pub profile: Vec<f64>,
    /// Its standard deviation from the run's count of program samples
    /// (percentage points, binomial: `fastinst_report::FunctionRow::self_sd_ms`'s,
    /// for the share), per run; older results: none.
    #[serde(default)]
    pub profile_sd: Vec<f64>,
}

/// One top-level function's inclusive time.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct InclusiveCheck {
    /// Function.
    pub name: String,
    /// The reference (ms): the top-level trace's inclusive time (older
    /// results: the probes-off run's wall time for `main`, the full
    /// trace's for a thread body).
    pub reference_ms: f64,
    /// The top-level trace's figure in each of its runs, one before each
    /// profiled run (older results: none).
    #[serde(default)]
    pub reference_runs: Vec<f64>,
    /// What the reference is.
    pub reference: String,
    /// The profile's inclusive time, per run (ms).
    pub profile_ms: Vec<f64>,
    /// Per run, the profiler's time in the CPU samples of the threads the
    /// function ran on beyond what was charged to them, and its standard
    /// deviation (ms; `fastinst_report::CpuOut::uncharged_ms`): time in
    /// the profile's figure that is not the program's (older results, or
    /// a run without per-thread samples: none).
    #[serde(default)]
    pub uncharged_ms: Vec<Option<(f64, f64)>>,
    /// Per run of a single-threaded process (one thread in its CPU
    /// samples, so a function that never blocks lasts its CPU time), the
    /// function's threads' CPU samples outside the profiler's code (ms):
    /// the program's own code's time under the profiler, which the
    /// reference measures without it. Over the reference, how much the
    /// profiler slowed the program's own code, which no charge takes off
    /// (other runs, or older results: none).
    #[serde(default)]
    pub program_cpu_ms: Vec<Option<f64>>,
}

/// One function's inclusive time and its stated standard deviation.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct TotalCheck {
    /// Function.
    pub name: String,
    /// The trace's inclusive time (ms): every call timed.
    pub trace_ms: f64,
    /// The profile's inclusive time and its standard deviation (ms), per
    /// run.
    pub profile: Vec<(f64, f64)>,
    /// perf's inclusive CPU time of the probes-off build and its sampling
    /// deviation (ms), for a single-threaded program.
    #[serde(default)]
    pub perf: Option<(f64, f64)>,
}

/// One function's percentiles.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct PercentileCheck {
    /// Function.
    pub name: String,
    /// The trace's p50 and p99 (us).
    pub trace: (f64, f64),
    /// The trace's own ranges of them: its calls' durations are known to
    /// the hooks' charges inside them (`None`: a report without them).
    #[serde(default)]
    pub trace_ranges: (Option<Range>, Option<Range>),
    /// The profile's, per run.
    pub profile: Vec<(f64, f64)>,
    /// Timed samples behind the profile's, per run.
    pub samples: Vec<u64>,
    /// The profile's stated 95% ranges of its p50 and p99, per run
    /// (`None`: a report without them).
    #[serde(default)]
    pub ranges: Vec<(Option<Range>, Option<Range>)>,
    /// The trace of the checked functions alone (`FASTINST_FUNCTIONS`),
    /// one run before each profiled run: the p50 and p99 (us) of the run
    /// whose p50 is the median, and that run's ranges of them (`None`:
    /// older results, or a function that trace did not see). With only
    /// these functions probed, a call holds none of the hooks of its many
    /// short callees, whose cost beyond their charges lengthens the full
    /// trace's durations.
    #[serde(default)]
    pub alone: Option<Traced>,
    /// The full trace's p50 and p99 (us) in a second run, after the
    /// profiled runs (`None`: older results, or a function it did not
    /// see): how far the reference itself moves between runs.
    #[serde(default)]
    pub trace_again: Option<(f64, f64)>,
}

/// A traced p50 and p99 (us) and their ranges.
pub type Traced = ((f64, f64), (Option<Range>, Option<Range>));

/// A pass count: `ok` of `of`.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq)]
pub struct Tally {
    /// Within the target.
    pub ok: usize,
    /// Checked.
    pub of: usize,
}

impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.ok, self.of)
    }
}

impl Config {
    /// Calls within target, over every (function, run).
    pub fn calls_tally(&self) -> Tally {
        tally(self.calls.iter().flat_map(|c| {
            c.estimated
                .iter()
                .map(move |&e| ratio_ok(e, c.exact as f64, CALLS_TOLERANCE))
        }))
    }

    /// Self shares within target of the plain build's, for functions above
    /// the floor there.
    pub fn shares_tally(&self) -> Tally {
        tally(
            self.plain_shares()
                .flat_map(|s| s.profile.iter().map(move |&x| (x - s.perf).abs() <= SELF_TOLERANCE_PP)),
        )
    }

    /// Self shares within target of the probes-off run's, for functions
    /// above the floor there.
    pub fn shares_off_tally(&self) -> Tally {
        tally(
            self.shares
                .iter()
                .filter_map(|s| s.off.map(|o| (s, o)))
                .filter(|&(_, o)| o >= SELF_FLOOR_PCT)
                .flat_map(|(s, o)| s.profile.iter().map(move |&x| (x - o).abs() <= SELF_TOLERANCE_PP)),
        )
    }

    /// Self shares within target of the plain build's, or within three of
    /// their stated deviations ([`ShareCheck::profile_sd`]) of it: how many
    /// of the misses the samples' count alone explains.
    pub fn shares_sd_tally(&self) -> Tally {
        tally(self.plain_shares().flat_map(|s| {
            s.profile.iter().enumerate().map(move |(k, &x)| {
                let sd = s.profile_sd.get(k).copied().unwrap_or(0.0);
                (x - s.perf).abs() <= SELF_TOLERANCE_PP.max(3.0 * sd)
            })
        }))
    }

    fn plain_shares(&self) -> impl Iterator<Item = &ShareCheck> {
        self.shares.iter().filter(|s| s.perf >= SELF_FLOOR_PCT)
    }

    /// Self shares within target of the nearest of the plain build's own
    /// runs: within 2 points of the range its perf runs span.
    pub fn shares_spread_tally(&self) -> Tally {
        tally(self.plain_shares().flat_map(|s| {
            let (lo, hi) = s
                .perf_runs
                .iter()
                .fold((s.perf, s.perf), |(lo, hi), &x| (lo.min(x), hi.max(x)));
            s.profile
                .iter()
                .map(move |&x| x >= lo - SELF_TOLERANCE_PP && x <= hi + SELF_TOLERANCE_PP)
        }))
    }

    /// Inclusive times within target.
    pub fn inclusive_tally(&self) -> Tally {
        tally(self.inclusive.iter().flat_map(|i| {
            i.profile_ms
                .iter()
                .map(move |&x| ratio_ok(x, i.reference_ms, INCLUSIVE_TOLERANCE))
        }))
    }

    /// Inclusive times within target once the profiler's time that the
    /// CPU samples saw beyond its charge ([`InclusiveCheck::uncharged_ms`])
    /// is taken off: how much of the misses that time explains. A run
    /// without the figure counts as it stands.
    pub fn inclusive_less_uncharged_tally(&self) -> Tally {
        tally(self.inclusive.iter().flat_map(|i| {
            i.profile_ms.iter().enumerate().map(move |(k, &x)| {
                let u = i.uncharged_ms.get(k).copied().flatten().map_or(0.0, |(u, _)| u);
                ratio_ok(x - u, i.reference_ms, INCLUSIVE_TOLERANCE)
            })
        }))
    }

    /// Each single-threaded run's program code's CPU time over the
    /// inclusive reference ([`InclusiveCheck::program_cpu_ms`]), for every
    /// function checked: above 1, the profiler slowed the program's own
    /// code by that much.
    pub fn program_cpu_ratios(&self) -> Vec<f64> {
        self.inclusive
            .iter()
            .filter(|i| i.reference_ms > 0.0)
            .flat_map(|i| i.program_cpu_ms.iter().flatten().map(move |&x| x / i.reference_ms))
            .collect()
    }

    /// Inclusive times whose distance from the trace's is within three of
    /// their stated standard deviations: whether the stated spread covers
    /// the error (the runs differ too: the trace's own cost moves it).
    pub fn totals_tally(&self) -> Tally {
        tally(
            self.totals
                .iter()
                .flat_map(|t| t.profile.iter().map(move |&(x, sd)| (x - t.trace_ms).abs() <= 3.0 * sd)),
        )
    }

    /// Inclusive times within three standard deviations, theirs and the
    /// reference's joined, of perf's inclusive CPU time in the probes-off
    /// build (single-threaded programs; none checked otherwise).
    pub fn totals_perf_tally(&self) -> Tally {
        tally(self.totals.iter().flat_map(|t| {
            t.perf.into_iter().flat_map(move |(r, rsd)| {
                t.profile
                    .iter()
                    .map(move |&(x, sd)| (x - r).abs() <= 3.0 * sd.hypot(rsd))
            })
        }))
    }

    /// p50s and p99s whose stated 95% range meets the trace's (each
    /// counted): whether the two agree within what each says it is
    /// uncertain by.
    pub fn ranges_tally(&self) -> Tally {
        tally(self.percentiles.iter().flat_map(|p| {
            p.ranges.iter().flat_map(move |&(a, b)| {
                [
                    a.is_some_and(|r| agree(r, p.trace.0, p.trace_ranges.0)),
                    b.is_some_and(|r| agree(r, p.trace.1, p.trace_ranges.1)),
                ]
            })
        }))
    }

    /// p50s and p99s whose stated 95% range lies within
    /// [`PERCENTILE_TOLERANCE`] of the figure (each counted): how many the
    /// report shows unmarked.
    pub fn narrow_tally(&self) -> Tally {
        tally(self.percentiles.iter().flat_map(|p| {
            p.ranges.iter().zip(&p.profile).flat_map(move |(&(a, b), &(x, y))| {
                [
                    a.is_some_and(|r| r.within(x, PERCENTILE_TOLERANCE)),
                    b.is_some_and(|r| r.within(y, PERCENTILE_TOLERANCE)),
                ]
            })
        }))
    }

    /// The checks against the trace of the checked functions alone whose
    /// p50 there is at least [`PERCENTILE_FLOOR_US`], with that trace's
    /// figures.
    fn alone(&self) -> impl Iterator<Item = (&PercentileCheck, &Traced)> {
        self.percentiles
            .iter()
            .filter_map(|p| Some((p, p.alone.as_ref()?)))
            .filter(|(_, t)| t.0 .0 >= PERCENTILE_FLOOR_US)
    }

    /// p50s and p99s within target of the trace of the checked functions
    /// alone (each counted).
    pub fn percentiles_alone_tally(&self) -> Tally {
        tally(self.alone().flat_map(|(p, t)| {
            p.profile.iter().flat_map(move |&(a, b)| {
                [
                    ratio_ok(a, t.0 .0, PERCENTILE_TOLERANCE),
                    ratio_ok(b, t.0 .1, PERCENTILE_TOLERANCE),
                ]
            })
        }))
    }

    /// p50s and p99s whose stated range meets that of the trace of the
    /// checked functions alone.
    pub fn ranges_alone_tally(&self) -> Tally {
        tally(self.alone().flat_map(|(p, t)| {
            p.ranges.iter().flat_map(move |&(a, b)| {
                [
                    a.is_some_and(|r| agree(r, t.0 .0, t.1 .0)),
                    b.is_some_and(|r| agree(r, t.0 .1, t.1 .1)),
                ]
            })
        }))
    }

    /// The second full trace's p50s and p99s within the target of the
    /// first's: how often the reference meets itself on this machine.
    pub fn trace_repeat_tally(&self) -> Tally {
        tally(self.percentiles.iter().flat_map(|p| {
            p.trace_again.into_iter().flat_map(move |(a, b)| {
                [
                    ratio_ok(a, p.trace.0, PERCENTILE_TOLERANCE),
                    ratio_ok(b, p.trace.1, PERCENTILE_TOLERANCE),
                ]
            })
        }))
    }

    /// p50s and p99s within target (each counted).
    pub fn percentiles_tally(&self) -> Tally {
        tally(self.percentiles.iter().flat_map(|p| {
            p.profile.iter().flat_map(move |&(a, b)| {
                [
                    ratio_ok(a, p.trace.0, PERCENTILE_TOLERANCE),
                    ratio_ok(b, p.trace.1, PERCENTILE_TOLERANCE),
                ]
            })
        }))
    }

    /// The geometric mean of estimated over exact calls.
    pub fn calls_geomean(&self) -> f64 {
        let v: Vec<f64> = self
            .calls
            .iter()
            .flat_map(|c| c.estimated.iter().map(move |&e| (e / c.exact.max(1) as f64).max(1e-9)))
            .collect();
        crate::measure::geomean(&v)
    }

    /// The largest self-share difference (points).
    pub fn worst_share_pp(&self) -> f64 {
        self.plain_shares()
            .flat_map(|s| s.profile.iter().map(move |&x| (x - s.perf).abs()))
            .fold(0.0, f64::max)
    }
}

fn ratio_ok(est: f64, exact: f64, tol: f64) -> bool {
    exact > 0.0 && (est / exact - 1.0).abs() <= tol
}

fn tally(it: impl Iterator<Item = bool>) -> Tally {
    let mut t = Tally::default();
    for ok in it {
        t.of += 1;
        t.ok += usize::from(ok);
    }
    t
}

/// How to run.
pub struct Options {
    /// `libfastinst.so`.
    pub lib: PathBuf,
    /// Scratch.
    pub work: PathBuf,
    /// Profiler runs per configuration.
    pub runs: usize,
    /// Extra environment for the profiler runs.
    pub profile_env: Vec<(String, String)>,
}

/// Measures one configuration.
pub fn measure(
    opts: &Options,
    plain: &Binary,
    inst: &Binary,
    args: &[String],
    perf: Option<&SelfReferences>,
    children: Option<&crate::children::Children>,
) -> Result<Config> {
    let dir = opts
        .work
        .join("accuracy")
        .join(format!("{}-{}", inst.program.name(), inst.compiler.name()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(EvalError::io(&dir))?;
    let plain_run = run_once(&plain.path, args, &[], &dir.join("plain.out"))?;
    let tool_with = |name: &str, sub: &str, extra: &[(String, String)]| -> Result<(PathBuf, f64)> {
        let out = dir.join(sub);
        std::fs::create_dir_all(&out).map_err(EvalError::io(&out))?;
        let mut env = vec![
            ("LD_PRELOAD".to_string(), opts.lib.display().to_string()),
            ("FASTINST_TOOL".to_string(), name.to_string()),
            ("FASTINST_OUT".to_string(), out.display().to_string()),
        ];
        if name == "profile" {
            env.extend(opts.profile_env.iter().cloned());
        }
        env.extend(extra.iter().cloned());
        let r = run_once(&inst.path, args, &env, &out.join("stdout"))?;
        if r.code != Some(0) {
            return Err(EvalError::Tool(format!(
                "{} under {name}: exit {:?}: {}",
                inst.path.display(),
                r.code,
                r.stderr
            )));
        }
        if r.stdout_hash != plain_run.stdout_hash {
            return Err(EvalError::Tool(format!(
                "{} under {name}: output differs from the plain build's",
                inst.path.display()
            )));
        }
        Ok((out, r.wall_s))
    };
    let tool = |name: &str, sub: &str| tool_with(name, sub, &[]);
    let (_, off_s) = tool("off", "off")?;
    let (count_dir, _) = tool("count", "count")?;
    let exact = read_counts(&count_dir)?;
    let (trace_dir, _) = tool("trace", "trace")?;
    let trace = read_report(&trace_dir, "fastinst-trace")?;
    // The top-level functions' own durations, with only their probes on:
    // the full trace's hooks lengthen every thread's life, and the probes-
    // off run's wall time holds the process's start and exit besides main.
    // One such run before each profiled run: the machine's speed drifts
    // between runs by more than the target, and the median of runs made
    // alternately with the profile's stands for the same stretch of time.
    let top_names = top_level(&trace);
    let only = [("FASTINST_FUNCTIONS".to_string(), top_names.join(","))];
    // The functions whose percentiles are checked, traced alone: the full
    // trace's short callees' hooks cost more than their charges inside
    // every caller's durations. Alternated with the profiles, as above.
    let checked = percentile_names(&trace);
    let only_checked = [("FASTINST_FUNCTIONS".to_string(), checked.join(","))];
    let mut top = Vec::new();
    let mut alone = Vec::new();
    let mut profiles = Vec::new();
    let mut walls = Vec::new();
    for i in 0..opts.runs.max(1) {
        if !top_names.is_empty() {
            let (d, _) = tool_with("trace", &format!("trace-top-{i}"), &only)?;
            top.push(read_report(&d, "fastinst-trace")?);
        }
        if !checked.is_empty() {
            let (d, _) = tool_with("trace", &format!("trace-checked-{i}"), &only_checked)?;
            alone.push(read_report(&d, "fastinst-trace")?);
        }
        let (d, wall) = tool("profile", &format!("profile-{i}"))?;
        profiles.push(read_report(&d, "fastinst-profile")?);
        walls.push(wall);
    }
    // The full trace again, after the profiles: how far the reference
    // itself moves between runs on this machine.
    let (again_dir, _) = tool("trace", "trace-again")?;
    let again = read_report(&again_dir, "fastinst-trace")?;
    Ok(compare(
        inst.program,
        inst.compiler.name(),
        &exact,
        &trace,
        &References {
            top: &top,
            alone: &alone,
            again: Some(&again),
            children,
        },
        &profiles,
        perf,
        plain_run.wall_s,
        off_s,
        walls.iter().sum::<f64>() / walls.len() as f64,
    ))
}

/// The second references: traces of a few functions alone, one before
/// each profiled run, whose durations hold little of the probes' cost;
/// and the full trace again.
pub struct References<'a> {
    /// `main` and the thread bodies alone ([`top_level`]).
    pub top: &'a [fastinst::profile::report::Report],
    /// The functions whose percentiles are checked alone
    /// ([`percentile_names`]).
    pub alone: &'a [fastinst::profile::report::Report],
    /// The full trace run a second time.
    pub again: Option<&'a fastinst::profile::report::Report>,
    /// perf's inclusive CPU times of the probes-off build
    /// ([`crate::children`]), for a single-threaded program.
    pub children: Option<&'a crate::children::Children>,
}

/// Whether the trace's row `t` is one whose percentiles are checked.
fn checked_percentiles(t: &fastinst::profile::report::FunctionRow) -> bool {
    t.p50_us >= PERCENTILE_FLOOR_US && t.calls_sampled >= PERCENTILE_MIN_CALLS
}

/// The names of the functions whose percentiles are checked, each once,
/// as `FASTINST_FUNCTIONS` globs: a name holding a comma (a C++
/// template's) cannot be one, and is left out.
pub fn percentile_names(trace: &fastinst::profile::report::Report) -> Vec<String> {
    let mut v: Vec<String> = trace
        .functions
        .iter()
        .filter(|t| checked_percentiles(t) && !t.name.contains(','))
        .map(|t| t.name.clone())
        .collect();
    v.sort();
    v.dedup();
    v
}

/// Compares profiles against the references.
#[allow(clippy::too_many_arguments)]
pub fn compare(
    program: Program,
    build: &str,
    exact: &BTreeMap<String, u64>,
    trace: &fastinst::profile::report::Report,
    refs: &References,
    profiles: &[fastinst::profile::report::Report],
    perf: Option<&SelfReferences>,
    plain_s: f64,
    off_s: f64,
    profile_s: f64,
) -> Config {
    // Static functions of one name in several files (zstd's inline
    // helpers) are one row each; the count tool's file is summed by name,
    // so the profile's rows are too (independent estimates: their
    // variances add).
    let by_name = |r: &fastinst::profile::report::Report| -> BTreeMap<String, fastinst::profile::report::FunctionRow> {
        let mut m: BTreeMap<String, fastinst::profile::report::FunctionRow> = BTreeMap::new();
        for f in &r.functions {
            match m.get_mut(&f.name) {
                Some(g) => {
                    g.calls_estimated += f.calls_estimated;
                    g.calls_sd = g.calls_sd.hypot(f.calls_sd);
                    g.calls_exact &= f.calls_exact;
                    g.total_ms += f.total_ms;
                    g.total_sd = g.total_sd.hypot(f.total_sd);
                    g.cpu_samples += f.cpu_samples;
                    g.self_share = match (g.self_share, f.self_share) {
                        (Some(a), Some(b)) => Some(a + b),
                        (a, b) => a.or(b),
                    };
                }
                None => {
                    m.insert(f.name.clone(), f.clone());
                }
            }
        }
        m
    };
    let runs: Vec<_> = profiles.iter().map(by_name).collect();
    let total: u64 = exact.values().sum();
    let mut calls: Vec<CallCheck> = exact
        .iter()
        .filter(|(_, &c)| total > 0 && c as f64 >= CALLS_FLOOR * total as f64)
        .map(|(n, &c)| CallCheck {
            name: n.clone(),
            exact: c,
            estimated: runs
                .iter()
                .map(|r| r.get(n).map_or(0.0, |f| f.calls_estimated))
                .collect(),
            sd: runs.iter().map(|r| r.get(n).map_or(0.0, |f| f.calls_sd)).collect(),
        })
        .collect();
    calls.sort_by_key(|c| std::cmp::Reverse(c.exact));

    let mut shares = Vec::new();
    if let Some(perf) = perf {
        // The profile's shares by name: instrumented functions and the
        // rest of the program's samples, by symbol.
        let share_maps: Vec<BTreeMap<String, f64>> = profiles
            .iter()
            .map(|r| {
                let mut m: BTreeMap<String, f64> = BTreeMap::new();
                for f in &r.functions {
                    *m.entry(perf.plain.aliases.canonical(&f.name)).or_default() += f.self_share.unwrap_or(0.0);
                }
                if let Some(cpu) = &r.cpu {
                    for o in &cpu.other {
                        *m.entry(perf.plain.aliases.canonical(&o.name)).or_default() += o.share;
                    }
                }
                m
            })
            .collect();
        let plain = perf.plain.mean();
        let off = perf.off.as_ref().map(PerfShares::mean);
        let mut names: Vec<&String> = plain
            .iter()
            .filter(|(_, &p)| p >= SELF_FLOOR_PCT)
            .map(|(n, _)| n)
            .collect();
        if let Some(off) = &off {
            names.extend(off.iter().filter(|(_, &p)| p >= SELF_FLOOR_PCT).map(|(n, _)| n));
        }
        names.sort();
        names.dedup();
        for name in names {
            shares.push(ShareCheck {
                name: name.clone(),
                perf: plain.get(name).copied().unwrap_or(0.0),
                perf_runs: perf.plain.of(name),
                off: off.as_ref().map(|o| o.get(name).copied().unwrap_or(0.0)),
                profile: share_maps.iter().map(|m| m.get(name).copied().unwrap_or(0.0)).collect(),
                profile_sd: profiles
                    .iter()
                    .zip(&share_maps)
                    .map(|(r, m)| share_sd(m.get(name).copied().unwrap_or(0.0), r))
                    .collect(),
            });
        }
        shares.sort_by(|a, b| b.perf.total_cmp(&a.perf));
    }

    let trace_rows = by_name(trace);
    let top_rows: Vec<_> = refs.top.iter().map(by_name).collect();
    let alone_rows: Vec<_> = refs.alone.iter().map(by_name).collect();
    let again_rows = refs.again.map(by_name).unwrap_or_default();
    let inclusive: Vec<InclusiveCheck> = top_level(trace)
        .into_iter()
        .map(|name| {
            // A top-level trace's figure where there is one; else the
            // probes-off run's wall time for main, the full trace's for a
            // thread body.
            let reference_runs: Vec<f64> = top_rows
                .iter()
                .filter_map(|t| t.get(&name))
                .map(|t| t.total_ms)
                .collect();
            let (reference_ms, reference) = if !reference_runs.is_empty() {
                (
                    crate::measure::median(&reference_runs),
                    "median of the traces of the top-level functions alone",
                )
            } else if name == "main" {
                (off_s * 1e3, "the build's run with every probe off")
            } else {
                (
                    trace_rows.get(&name).map_or(0.0, |t| t.total_ms),
                    "trace's inclusive time",
                )
            };
            // Each run's CPU samples on the function's threads, and whether
            // they are the whole process's (one thread).
            let times: Vec<Option<(fastinst::profile::report::ProfilerTime, bool)>> = profiles
                .iter()
                .zip(&runs)
                .map(|(p, r)| {
                    let cpu = p.cpu.as_ref()?;
                    Some((cpu.profiler_time(Some(&r.get(&name)?.threads))?, cpu.threads.len() == 1))
                })
                .collect();
            InclusiveCheck {
                profile_ms: runs.iter().map(|r| r.get(&name).map_or(0.0, |f| f.total_ms)).collect(),
                uncharged_ms: times.iter().map(|t| t.map(|(t, _)| t.uncharged_ms())).collect(),
                program_cpu_ms: times
                    .iter()
                    .map(|t| t.filter(|&(_, one)| one).map(|(t, _)| t.cpu_ms - t.seen_ms))
                    .collect(),
                name,
                reference_ms,
                reference_runs,
                reference: reference.into(),
            }
        })
        .collect();

    let totals: Vec<TotalCheck> = calls
        .iter()
        .filter_map(|c| {
            let t = trace_rows.get(&c.name)?;
            Some(TotalCheck {
                // CPU time is a call's duration only on a program's one
                // thread.
                perf: refs
                    .children
                    .filter(|_| top_level(trace).len() <= 1)
                    .and_then(|ch| ch.ms(&c.name)),
                name: c.name.clone(),
                trace_ms: t.total_ms,
                profile: runs
                    .iter()
                    .map(|r| r.get(&c.name).map_or((0.0, 0.0), |f| (f.total_ms, f.total_sd)))
                    .collect(),
            })
        })
        .collect();

    let mut percentiles: Vec<PercentileCheck> = trace
        .functions
        .iter()
        .filter(|t| checked_percentiles(t))
        .map(|t| PercentileCheck {
            trace_again: again_rows.get(&t.name).map(|f| (f.p50_us, f.p99_us)),
            alone: {
                let mut seen: Vec<Traced> = alone_rows
                    .iter()
                    .filter_map(|r| r.get(&t.name))
                    .map(|f| ((f.p50_us, f.p99_us), (f.p50_range, f.p99_range)))
                    .collect();
                seen.sort_by(|a, b| a.0 .0.total_cmp(&b.0 .0));
                seen.get(seen.len() / 2).copied()
            },
            name: t.name.clone(),
            trace: (t.p50_us, t.p99_us),
            trace_ranges: (t.p50_range, t.p99_range),
            profile: runs
                .iter()
                .map(|r| r.get(&t.name).map_or((0.0, 0.0), |f| (f.p50_us, f.p99_us)))
                .collect(),
            samples: runs
                .iter()
                .map(|r| r.get(&t.name).map_or(0, |f| f.calls_sampled))
                .collect(),
            ranges: runs
                .iter()
                .map(|r| r.get(&t.name).map_or((None, None), |f| (f.p50_range, f.p99_range)))
                .collect(),
        })
        .collect();
    percentiles.sort_by(|a, b| b.trace.0.total_cmp(&a.trace.0));

    Config {
        program: program.name().into(),
        build: build.into(),
        runs: profiles.len(),
        calls,
        shares,
        inclusive,
        totals,
        percentiles,
        plain_s,
        off_s,
        profile_s,
    }
}

/// The standard deviation (percentage points) of a self share of
/// `share` percent of report `r`'s program samples: a binomial count's;
/// 0 without samples.
fn share_sd(share: f64, r: &fastinst::profile::report::Report) -> f64 {
    let Some(cpu) = &r.cpu else { return 0.0 };
    let n = cpu.samples.saturating_sub(cpu.profiler_samples + cpu.lost) as f64;
    if n < 1.0 {
        return 0.0;
    }
    100.0 * fastinst::profile::report::count_sd(share / 100.0 * n, n) / n
}

/// The top-level functions a trace saw: `main`, and the functions called
/// from outside any instrumented function on threads other than the
/// process's first (thread bodies), each once.
pub fn top_level(trace: &fastinst::profile::report::Report) -> Vec<String> {
    let mut names = Vec::new();
    if trace.functions.iter().any(|f| f.name == "main") {
        names.push("main".to_string());
    }
    for e in trace
        .edges
        .iter()
        .filter(|e| e.caller.starts_with('[') && e.callee != "main")
    {
        let on_other_threads = trace
            .functions
            .iter()
            .filter(|f| f.name == e.callee)
            .any(|f| f.threads.len() >= 2 || f.threads.iter().any(|&tid| tid != trace.pid as i32));
        if on_other_threads && !names.contains(&e.callee) {
            names.push(e.callee.clone());
        }
    }
    names
}

/// The count tool's exact calls, by function.
pub fn read_counts(dir: &Path) -> Result<BTreeMap<String, u64>> {
    let file = find(dir, "fastinst-count.", ".txt")?;
    let text = std::fs::read_to_string(&file).map_err(EvalError::io(&file))?;
    let mut m = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let mut it = line.split('\t');
        let (Some(c), Some(n)) = (it.next(), it.next()) else {
            continue;
        };
        if let Ok(c) = c.trim().parse::<u64>() {
            *m.entry(n.to_string()).or_default() += c;
        }
    }
    Ok(m)
}

/// The report (JSON) written under `dir` as `{prefix}.{pid}.json`.
pub fn read_report(dir: &Path, prefix: &str) -> Result<fastinst::profile::report::Report> {
    let rd = std::fs::read_dir(dir).map_err(EvalError::io(dir))?;
    let file = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.strip_prefix(prefix)
                    .and_then(|rest| rest.strip_prefix('.'))
                    .and_then(|rest| rest.strip_suffix(".json"))
                    .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
            })
        })
        .ok_or_else(|| EvalError::Tool(format!("no {prefix}.PID.json in {}", dir.display())))?;
    crate::read_json(&file, prefix)
}

fn find(dir: &Path, prefix: &str, suffix: &str) -> Result<PathBuf> {
    let rd = std::fs::read_dir(dir).map_err(EvalError::io(dir))?;
    rd.filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix) && n.ends_with(suffix))
        })
        .ok_or_else(|| EvalError::Tool(format!("no {prefix}*{suffix} in {}", dir.display())))
}

/// Whether a profile's range `r` agrees with the trace's figure `x`,
/// whose own range (if it has one) is `traced`: the two ranges meet.
fn agree(r: Range, x: f64, traced: Option<Range>) -> bool {
    match traced {
        Some(t) => r.meets(&t),
        None => r.contains(x),
    }
}

/// The Markdown summary of `configs`.
pub fn render_markdown(configs: &[Config], header: &str) -> String {
    let mut s = String::new();
    s.push_str(header);
    s.push_str("\n| program | build | calls ±15% | geomean | self ±2pp | self ±2pp or 3 sd | self ±2pp of plain's range | self ±2pp of probes off | worst pp | inclusive ±5% | inclusive ±5% less uncharged | program code's CPU / inclusive reference | totals in 3 sd | totals in 3 sd of perf's | p50/p99 ±10% | p50/p99 ranges meet | ranges in ±10% | p50/p99 ±10% of the checked alone | ranges meet theirs | trace again ±10% of trace | plain s | off s | profiled s |\n");
    s.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for c in configs {
        s.push_str(&format!(
            "| {} | {} | {} | {:.3} | {} | {} | {} | {} | {:.1} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.2} | {:.2} | {:.2} |\n",
            c.program,
            c.build,
            c.calls_tally(),
            c.calls_geomean(),
            c.shares_tally(),
            c.shares_sd_tally(),
            c.shares_spread_tally(),
            c.shares_off_tally(),
            c.worst_share_pp(),
            c.inclusive_tally(),
            c.inclusive_less_uncharged_tally(),
            match c.program_cpu_ratios().as_slice() {
                [] => "-".to_string(),
                r => format!("{:.3}", crate::measure::median(r)),
            },
            c.totals_tally(),
            c.totals_perf_tally(),
            c.percentiles_tally(),
            c.ranges_tally(),
            c.narrow_tally(),
            c.percentiles_alone_tally(),
            c.ranges_alone_tally(),
            c.trace_repeat_tally(),
            c.plain_s,
            c.off_s,
            c.profile_s
        ));
    }
    s
}

/// The per-function detail of one configuration, as Markdown.
pub fn render_detail(c: &Config) -> String {
    let mut s = format!(
        "\n### {} {}\n\ncalls (estimated / exact, each run; stated sd):\n\n",
        c.program, c.build
    );
    for k in &c.calls {
        let ratios: Vec<String> = k
            .estimated
            .iter()
            .map(|e| format!("{:.2}", e / k.exact.max(1) as f64))
            .collect();
        let sd: Vec<String> =
            k.sd.iter()
                .map(|e| format!("{:.2}", e / k.exact.max(1) as f64))
                .collect();
        s.push_str(&format!(
            "- {} ({}): {} (sd {})\n",
            k.name,
            k.exact,
            ratios.join(" "),
            sd.join(" ")
        ));
    }
    if !c.shares.is_empty() {
        s.push_str(
            "\nself share (profile, each run with its samples' sd, vs perf's mean over the plain build's runs (each run), and over the probes-off runs, percent):\n\n",
        );
        for k in &c.shares {
            let v: Vec<String> = k
                .profile
                .iter()
                .enumerate()
                .map(|(i, x)| match k.profile_sd.get(i) {
                    Some(sd) => format!("{x:.1} (sd {sd:.1})"),
                    None => format!("{x:.1}"),
                })
                .collect();
            let r: Vec<String> = k.perf_runs.iter().map(|x| format!("{x:.1}")).collect();
            let off = k.off.map_or(String::new(), |o| format!(", off {o:.1}"));
            s.push_str(&format!(
                "- {}: {} vs {:.1} ({}){off}\n",
                k.name,
                v.join(" "),
                k.perf,
                r.join(" ")
            ));
        }
    }
    s.push_str("\ninclusive (ms):\n\n");
    for k in &c.inclusive {
        let v: Vec<String> = k
            .profile_ms
            .iter()
            .enumerate()
            .map(|(i, x)| {
                let program = match k.program_cpu_ms.get(i).copied().flatten() {
                    Some(p) if k.reference_ms > 0.0 => {
                        format!(
                            ", program code's CPU {p:.1}: {:.3} of the reference",
                            p / k.reference_ms
                        )
                    }
                    _ => String::new(),
                };
                match k.uncharged_ms.get(i).copied().flatten() {
                    Some((u, sd)) => format!("{x:.1} (uncharged {u:.1} +- {sd:.1}{program})"),
                    None => format!("{x:.1}"),
                }
            })
            .collect();
        let r: Vec<String> = k.reference_runs.iter().map(|x| format!("{x:.1}")).collect();
        s.push_str(&format!(
            "- {}: {} vs {:.1} ({}: {})\n",
            k.name,
            v.join(" "),
            k.reference_ms,
            k.reference,
            r.join(" ")
        ));
    }
    s.push_str("\ntotals (ms; profile +- sd, each run, vs trace):\n\n");
    for k in &c.totals {
        let v: Vec<String> = k.profile.iter().map(|(x, sd)| format!("{x:.1} +- {sd:.1}")).collect();
        s.push_str(&format!("- {}: {} vs {:.1}\n", k.name, v.join(", "), k.trace_ms));
    }
    s.push_str("\npercentiles (us; profile p50/p99 [stated 95% ranges] vs trace [its ranges], and the trace of the checked functions alone):\n\n");
    let range = |r: &Option<Range>| match r {
        Some(Range { lo, hi: Some(hi) }) => format!(" [{lo:.2}, {hi:.2}]"),
        Some(Range { lo, hi: None }) => format!(" [{lo:.2}, -]"),
        None => String::new(),
    };
    for k in &c.percentiles {
        let v: Vec<String> = k
            .profile
            .iter()
            .enumerate()
            .map(|(i, (a, b))| {
                let (ra, rb) = k.ranges.get(i).copied().unwrap_or((None, None));
                format!("{a:.2}{}/{b:.2}{}", range(&ra), range(&rb))
            })
            .collect();
        let alone = k.alone.map_or(String::new(), |((a, b), (ra, rb))| {
            format!(", alone {a:.2}{}/{b:.2}{}", range(&ra), range(&rb))
        });
        s.push_str(&format!(
            "- {}: {} vs {:.2}{}/{:.2}{}{alone} ({} samples)\n",
            k.name,
            v.join(" "),
            k.trace.0,
            range(&k.trace_ranges.0),
            k.trace.1,
            range(&k.trace_ranges.1),
            k.samples.first().copied().unwrap_or(0)
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// main, and the functions entered from outside any instrumented one on
    /// a thread other than the first: not a callback the first thread
    /// enters from uninstrumented code, and each once.
    #[test]
    fn top_level_functions_are_main_and_thread_bodies() {
        use fastinst::profile::report::{EdgeRow, FunctionRow, Report};
        let f = |name: &str, threads: Vec<i32>| FunctionRow {
            name: name.into(),
            threads,
            ..FunctionRow::default()
        };
        let e = |caller: &str, callee: &str| EdgeRow {
            caller: caller.into(),
            callee: callee.into(),
            calls_sampled: 1,
            calls_estimated: 1.0,
            total_ms: 1.0,
        };
        let trace = Report {
            pid: 10,
            functions: vec![
                f("main", vec![10]),
                f("worker", vec![11, 12]),
                f("compare", vec![10]),
                f("helper", vec![11]),
            ],
            edges: vec![
                e("[root]", "main"),
                e("[root]", "worker"),
                e("[root]", "worker"),
                e("[qsort]", "compare"),
                e("worker", "helper"),
            ],
            ..Report::default()
        };
        assert_eq!(top_level(&trace), ["main", "worker"]);
        let no_main = Report {
            functions: trace.functions[1..].to_vec(),
            ..trace.clone()
        };
        assert_eq!(top_level(&no_main), ["worker"]);
    }

    #[test]
    fn tallies_count_each_run() {
        let c = Config {
            calls: vec![CallCheck {
                name: "f".into(),
                exact: 100,
                estimated: vec![90.0, 120.0],
                sd: vec![0.0, 0.0],
            }],
            totals: vec![TotalCheck {
                name: "f".into(),
                trace_ms: 100.0,
                // Within 3 sd; 3.5 sd off; exactly 3 sd off.
                profile: vec![(110.0, 5.0), (65.0, 10.0), (70.0, 10.0)],
                // perf's: 80 +- 5, so the deviations join to 7.1 and 11.2.
                perf: Some((80.0, 5.0)),
            }],
            ..Config::default()
        };
        assert_eq!(c.calls_tally(), Tally { ok: 1, of: 2 });
        assert_eq!(c.totals_tally(), Tally { ok: 2, of: 3 });
        // 30 off is past 3 x 7.1; 15 and 10 off are within 3 x 11.2.
        assert_eq!(c.totals_perf_tally(), Tally { ok: 2, of: 3 });
        let no_perf = Config {
            totals: vec![TotalCheck {
                perf: None,
                ..c.totals[0].clone()
            }],
            ..c.clone()
        };
        assert_eq!(no_perf.totals_perf_tally(), Tally { ok: 0, of: 0 });
        let c = Config {
            percentiles: vec![PercentileCheck {
                name: "f".into(),
                trace: (10.0, 100.0),
                trace_ranges: (None, None),
                alone: None,
                trace_again: None,
                profile: vec![(10.0, 90.0), (12.0, 300.0)],
                samples: vec![50, 50],
                // Holds p50; p99 unbounded above, from 95; p50 from 11;
                // no range for p99.
                ranges: vec![
                    (
                        Some(Range {
                            lo: 9.0,
                            hi: Some(11.0),
                        }),
                        Some(Range { lo: 95.0, hi: None }),
                    ),
                    (
                        Some(Range {
                            lo: 11.0,
                            hi: Some(13.0),
                        }),
                        None,
                    ),
                ],
            }],
            ..Config::default()
        };
        assert_eq!(c.ranges_tally(), Tally { ok: 2, of: 4 });
        assert_eq!(c.percentiles_tally(), Tally { ok: 2, of: 4 });
        // Both p50 ranges lie within 10% of their figures (10 and 12);
        // neither p99's does.
        assert_eq!(c.narrow_tally(), Tally { ok: 2, of: 4 });
        // The trace's own ranges: the second run's p50 range [11, 13]
        // meets [10.5, 11.5]; p99 [95, -] meets [80, 96].
        let mut c = c;
        c.percentiles[0].trace_ranges = (
            Some(Range {
                lo: 10.5,
                hi: Some(11.5),
            }),
            Some(Range {
                lo: 80.0,
                hi: Some(96.0),
            }),
        );
        assert_eq!(c.ranges_tally(), Tally { ok: 3, of: 4 });
    }

    /// The demo's gcc configuration of `main` (one exact call) from these
    /// reports, with the self-share references `refs`.
    fn demo_main(
        trace: &fastinst::profile::report::Report,
        top: &[fastinst::profile::report::Report],
        profiles: &[fastinst::profile::report::Report],
        refs: Option<&SelfReferences>,
    ) -> Config {
        let exact = BTreeMap::from([("main".to_string(), 1u64)]);
        let traces = References {
            top,
            alone: &[],
            again: None,
            children: None,
        };
        compare(
            Program::Demo,
            "gcc",
            &exact,
            trace,
            &traces,
            profiles,
            refs,
            0.0,
            0.0,
            0.0,
        )
    }

    /// A report of process 1 holding `rows`, whose root calls `main`, with
    /// CPU samples `cpu`.
    fn rooted(
        rows: Vec<fastinst::profile::report::FunctionRow>,
        cpu: Option<fastinst::profile::report::CpuOut>,
    ) -> fastinst::profile::report::Report {
        use fastinst::profile::report::{EdgeRow, Report};
        Report {
            pid: 1,
            edges: vec![EdgeRow {
                caller: "[root]".into(),
                callee: "main".into(),
                calls_sampled: 1,
                calls_estimated: 1.0,
                total_ms: 1.0,
            }],
            functions: rows,
            cpu,
            ..Report::default()
        }
    }

    /// Self shares against the plain mean, the plain runs' range and the
    /// probes-off runs, each over the functions above the floor in its own
    /// reference; the inclusive reference is the median of the top-level
    /// traces, and profile names meet perf's through the aliases.
    #[test]
    fn self_shares_and_inclusive_meet_their_references() {
        use crate::aliases::Aliases;
        use fastinst::profile::report::{FunctionRow, Report};
        let row = |name: &str, total_ms: f64, share: f64| FunctionRow {
            name: name.into(),
            threads: vec![1],
            total_ms,
            self_share: Some(share),
            self_sd_ms: 0.0,
            ..FunctionRow::default()
        };
        let report = |rows: Vec<FunctionRow>| rooted(rows, None);
        let trace = report(vec![row("main", 0.0, 0.0)]);
        let top: Vec<Report> = [100.0, 130.0, 90.0]
            .iter()
            .map(|&t| report(vec![row("main", t, 0.0)]))
            .collect();
        // `free` reaches the profile as `cfree`.
        let profile = report(vec![
            row("main", 104.0, 50.0),
            row("cfree", 0.0, 10.0),
            row("tiny", 0.0, 1.5),
        ]);
        let aliases = Aliases::from_symbols([(0, 0x10, "free".to_string()), (0, 0x10, "cfree".to_string())]);
        let runs = |v: &[(&str, f64)]| v.iter().map(|&(n, x)| (n.to_string(), x)).collect::<BTreeMap<_, _>>();
        let plain = PerfShares {
            // main: mean 55 over runs 51-59, so 50 misses the mean by 5
            // but lies within 2 of the range; free: 13 in each.
            runs: vec![
                runs(&[("main", 59.0), ("free", 13.0)]),
                runs(&[("main", 51.0), ("free", 13.0)]),
            ],
            aliases: aliases.clone(),
        };
        // `tiny` is above the floor only with the probes off.
        let off = PerfShares {
            runs: vec![runs(&[("main", 49.0), ("free", 10.5), ("tiny", 2.5)])],
            aliases,
        };
        let refs = SelfReferences { plain, off: Some(off) };
        let c = demo_main(&trace, &top, &[profile], Some(&refs));
        let names: Vec<&str> = c.shares.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["main", "free", "tiny"]);
        // Against the plain mean: main off by 5, free by 3.
        assert_eq!(c.shares_tally(), Tally { ok: 0, of: 2 });
        // The samples' count explains free's 3 points where its share's
        // deviation is 1.2 (3 of them: 3.6), not main's 5 at 1.0.
        let mut c = c;
        c.shares[0].profile_sd = vec![1.0];
        c.shares[1].profile_sd = vec![1.2];
        assert_eq!(c.shares_sd_tally(), Tally { ok: 1, of: 2 });
        // Within 2 of the plain runs' range: main (49-61), not free (11-15).
        assert_eq!(c.shares_spread_tally(), Tally { ok: 1, of: 2 });
        // Against the probes-off mean: main, free and tiny all within 2.
        assert_eq!(c.shares_off_tally(), Tally { ok: 3, of: 3 });
        assert!((c.worst_share_pp() - 5.0).abs() < 1e-9);
        let main = &c.inclusive[0];
        assert_eq!(main.reference_runs, vec![100.0, 130.0, 90.0]);
        assert!((main.reference_ms - 100.0).abs() < 1e-9, "{}", main.reference_ms);
        assert_eq!(c.inclusive_tally(), Tally { ok: 1, of: 1 });
    }

    /// The profiler time the CPU samples saw beyond its charge is read from
    /// the threads the function ran on, and taken off in the second
    /// inclusive tally only.
    #[test]
    fn time_the_charges_missed_is_read_from_the_functions_threads() {
        use fastinst::profile::report::{CpuOut, CpuThread, FunctionRow};
        let report = |total_ms: f64, cpu: Option<CpuOut>| {
            let main = FunctionRow {
                name: "main".into(),
                threads: vec![1],
                total_ms,
                ..FunctionRow::default()
            };
            rooted(vec![main], cpu)
        };
        let thread = |tid: i32, profiler_samples: u64, charged_ms: f64| CpuThread {
            tid,
            samples: 1000,
            profiler_samples,
            charged_ms,
        };
        // main's thread: 20 samples of 500 us in the profiler's code, 2 ms
        // charged: 8 ms uncharged; thread 2's 100 ms are another thread's.
        let cpu = CpuOut {
            interval_us: 500.0,
            threads: vec![thread(1, 20, 2.0), thread(2, 200, 0.0)],
            ..CpuOut::default()
        };
        let trace = report(0.0, None);
        let top = [report(100.0, None)];
        let profiles = [report(112.0, Some(cpu)), report(112.0, None)];
        let c = demo_main(&trace, &top, &profiles, None);
        let main = &c.inclusive[0];
        let (u, sd) = main.uncharged_ms[0].expect("per-thread figures");
        assert!(
            (u - 8.0).abs() < 1e-9 && (sd - 20f64.sqrt() * 0.5).abs() < 1e-9,
            "{u} {sd}"
        );
        assert_eq!(main.uncharged_ms[1], None);
        // 112 against 100 misses by 12%; 104 is within 5%; the run without
        // figures stays a miss.
        assert_eq!(c.inclusive_tally(), Tally { ok: 0, of: 2 });
        assert_eq!(c.inclusive_less_uncharged_tally(), Tally { ok: 1, of: 2 });
        // Two threads sampled: no program-code figure (a thread body's
        // time holds its waits, and main's its joins).
        assert!(c.program_cpu_ratios().is_empty() && main.program_cpu_ms[0].is_none());
        // One thread: 220 samples of 500 us, 20 in the profiler's code:
        // the program's own code took 100 ms of CPU, 1.0 of the reference.
        let one = CpuOut {
            interval_us: 500.0,
            threads: vec![CpuThread {
                samples: 220,
                ..thread(1, 20, 2.0)
            }],
            ..CpuOut::default()
        };
        let c = demo_main(&trace, &top, &[report(112.0, Some(one))], None);
        assert_eq!(c.inclusive[0].program_cpu_ms, [Some(100.0)]);
        assert_eq!(c.program_cpu_ratios(), [1.0]);
        assert!(render_detail(&c).contains("program code's CPU 100.0: 1.000 of the reference"));
        assert!(render_markdown(std::slice::from_ref(&c), "").contains("| 1.000 |"));
    }

    /// The percentiles against the trace of the checked functions alone:
    /// the median of its runs, and only the functions at least the floor
    /// long there.
    #[test]
    fn percentiles_meet_the_checked_functions_traced_alone() {
        use fastinst::profile::report::{FunctionRow, Report};
        let row = |name: &str, p50_us: f64, p99_us: f64| FunctionRow {
            name: name.into(),
            threads: vec![1],
            calls_sampled: 100,
            calls_estimated: 100.0,
            p50_us,
            p99_us,
            ..FunctionRow::default()
        };
        let report = |rows: Vec<FunctionRow>| rooted(rows, None);
        // The full trace holds its callees' hooks: f 10/20 us, g 2/4.
        let trace = report(vec![row("f", 10.0, 20.0), row("g", 2.0, 4.0), row("h", 0.5, 1.0)]);
        assert_eq!(percentile_names(&trace), ["f", "g"]);
        // Alone, f reads 5, 7 and 6 (median 6, p99 12); g under the floor.
        let alone: Vec<Report> = [5.0, 7.0, 6.0]
            .iter()
            .map(|&x| report(vec![row("f", x, 2.0 * x), row("g", 0.5, 1.0)]))
            .collect();
        let profile = report(vec![row("f", 6.3, 11.5), row("g", 0.6, 1.1)]);
        let exact = BTreeMap::from([("main".to_string(), 1u64)]);
        let again = report(vec![row("f", 10.5, 23.0)]);
        let refs = References {
            top: &[],
            alone: &alone,
            again: Some(&again),
            children: None,
        };
        let c = compare(
            Program::Demo,
            "gcc",
            &exact,
            &trace,
            &refs,
            &[profile],
            None,
            0.0,
            0.0,
            0.0,
        );
        let f = c.percentiles.iter().find(|p| p.name == "f").unwrap();
        assert_eq!(f.alone.map(|t| t.0), Some((6.0, 12.0)));
        // Against the full trace: none within 10%; alone: f's two.
        assert_eq!(c.percentiles_tally(), Tally { ok: 0, of: 4 });
        assert_eq!(c.percentiles_alone_tally(), Tally { ok: 2, of: 2 });
        // The trace again: f's p50 within 10% of the first's, its p99 not;
        // g it did not see.
        assert_eq!(c.trace_repeat_tally(), Tally { ok: 1, of: 2 });
    }
}
