//! fastinst's reports as people and tools read them: the data model of a
//! profile (the latency profiler's and the trace tool's) and its renderings.
//!
//! The profile as people read it: a text table sorted by time, folded
//! stacks and a flame graph (inferno), and JSON (schema below).
//!
//! What each figure is:
//! - **Calls**: counted exactly for functions counted whole, otherwise
//!   estimated from counting windows (`window`), with a standard
//!   deviation (`calls_sd`; the text report's `±`, or `=` when exact).
//! - **Inclusive time** (`total_ms`): the mean duration of a function's
//!   timed *outermost* activations times its estimated outermost calls,
//!   so a recursive function's nested activations are not counted again
//!   (`recursive` marks the function, `~` in the text). Timed calls whose
//!   exit went unwatched count as lasting at least until then
//!   (right-censored, weighed in by Kaplan-Meier), and a function whose
//!   durations spread more gets more of its calls timed. It is capped at
//!   the run's wall time times its threads, and at its callers' inclusive
//!   time (`total_capped`, `!`). Its standard deviation (`total_sd`, the
//!   text's second `+-`) joins the call estimate's and the sampled
//!   mean's: a rare long call (a thread preempted inside it) that a few
//!   timed calls caught or missed moves the mean, and the spread says by
//!   how much; so do the hooks' charges taken off inside the timed calls,
//!   which err alike in every call.
//! - **Self time**: the function's CPU samples (`cpusample`) times the
//!   sampling interval; `self_share` is its percentage of the program's
//!   samples (the profiler's own excluded). Without CPU samples it is
//!   inclusive time minus the callees' edges.
//! - **Latencies** (min/p50/p90/p99/max/mean): order statistics of timed
//!   calls, each in the program's own time (the hooks' time taken off).
//!   Each percentile has a 95% range ([`Range`]): the text marks with `?`
//!   one whose range reaches past 10% of it.
//! - **Edges** and **paths**: a callee's timed calls split by the function
//!   holding their return address; paths are built from timed frames
//!   only, `[...]` standing for frames that were not timed, so no path
//!   shows a call that did not happen.
//!
//! JSON schema `fastinst-profile/4`: `{schema, program, pid, wall_ms,
//! tsc_mhz, settings: {samples_per_window, epoch_ms, inlined, changed,
//! windows, density, share, cpu_samples, drawn, timing_scale}, overhead:
//! {probes, functions, samples, samples_per_s, toggles, toggles_per_s,
//! handler_ms, sampler_ms, sampler_wakeups, unmatched_exits, abandoned_frames, censored_frames, too_deep,
//! no_cfa, no_thread, stacks_merged, inlined_copies_off, open_at_exit,
//! windows_planned, windows_opened, windows_void, cpu_wait_share},
//! functions: [{name, address, calls_sampled, calls_estimated, calls_sd,
//! calls_exact, total_ms, total_sd, recursive, total_capped, self_ms, cpu_samples,
//! self_share, self_sd_ms, mean_us, min_us, p50_us, p90_us, p99_us, p50_range,
//! p90_range, p99_range ({lo, hi} or null; hi null: unbounded),
//! calls_effective, max_us, threads:
//! [tid]}], edges: [{caller, callee, calls_sampled, calls_estimated,
//! total_ms}], stacks: {names: [name], paths: [{frames: [index into
//! names], samples, self_ms}]}, cpu: {interval_us, samples,
//! profiler_samples, lost, signal_us, handler_lost, other: [{name,
//! samples, share}], threads: [{tid, samples, profiler_samples,
//! charged_ms}]} or null, began_running}`
//! (paths ordered as their folded lines sort: by their frames' names,
//! outermost first); times in milliseconds (`_ms`) or microseconds
//! (`_us`). Versions 1 to 3 are still read; their missing fields take
//! their defaults.

//!
//! This crate does no probing: the runtime (`fastinst`) collects a
//! [`Report`] and writes it with [`write_all`]; the `fastinst report`
//! command reads one back (plain serde) and renders it again, without
//! linking the runtime.

mod decimal;
pub mod diff;
mod flame;
pub mod fx;
mod json;
pub mod pathtree;
pub mod pprof;
pub mod speedscope;
mod svg;
pub mod timeline;

pub use pprof::render_pprof;
pub use speedscope::render_speedscope;

use fx::FxMap;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The most distinct call-path prefixes the profiler keeps per thread;
/// samples past it are shown as `[...];function`
/// ([`Overhead::stacks_merged`]).
pub const MAX_PATH_NODES: usize = 6144;

/// The schema name and version this crate writes.
pub const SCHEMA: &str = "fastinst-profile/4";

/// The schemas this crate reads: version 1 spelled each stack's frames out
/// as names; version 2 lists the names once (`stacks.names`) and the
/// frames as indices into it (smaller, and written faster).
///
/// Version 3 adds each function's call uncertainty, CPU-sample self time
/// and inclusive-time marks, and the CPU samples' summary; version 4 each
/// percentile's range and the timed calls' effective number.
pub const SCHEMAS_READ: [&str; 4] = [SCHEMA, "fastinst-profile/3", "fastinst-profile/2", "fastinst-profile/1"];

/// The report's root.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct Report {
    /// [`SCHEMA`] (or, read from an older file, one of [`SCHEMAS_READ`]).
    pub schema: String,
    /// `argv[0]`.
    pub program: String,
    /// Process id.
    pub pid: u32,
    /// Wall time profiled.
    pub wall_ms: f64,
    /// TSC ticks per microsecond.
    pub tsc_mhz: f64,
    /// Sampling settings.
    pub settings: SettingsOut,
    /// What the profiler cost and dropped.
    pub overhead: Overhead,
    /// Per function, by total time.
    pub functions: Vec<FunctionRow>,
    /// Caller -> callee, by time.
    pub edges: Vec<EdgeRow>,
    /// Sampled call paths.
    pub stacks: Stacks,
    /// The CPU samples self time comes from (none in reports written
    /// before they were taken, or where the program handles `SIGPROF`).
    #[serde(default)]
    pub cpu: Option<CpuOut>,
    /// The profile began in a process already running (an attach): calls
    /// in flight then, `main`'s and thread bodies' above all, were never
    /// timed, so their functions' totals and call edges miss that time,
    /// where self times (CPU samples) hold it.
    #[serde(default)]
    pub began_running: bool,
}

/// The CPU samples (`cpusample`): where the program counter was, every
/// [`CpuOut::interval_us`] of the process's CPU time.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct CpuOut {
    /// Microseconds of CPU time between samples.
    pub interval_us: f64,
    /// Samples taken.
    pub samples: u64,
    /// Of those, in the profiler's own code (left out of every share).
    pub profiler_samples: u64,
    /// Taken but not kept (the buffer was full).
    pub lost: u64,
    /// The program's samples outside instrumented functions, by symbol
    /// (`[unknown]` where there is none), most first: the shares of code
    /// that has no probes (the C library, uninstrumented objects).
    pub other: Vec<CpuRow>,
    /// Each sampled thread's samples beside the profiler time charged to
    /// it, by thread id (reports written before they were kept: none).
    #[serde(default)]
    pub threads: Vec<CpuThread>,
    /// What one sample's signal cost the thread it landed on (us: the
    /// kernel's interrupt, signal frame and return, and the handler),
    /// measured once at start and charged to that thread at each sample,
    /// so no duration holds it; 0 where it was not measured (and reports
    /// written before it was).
    #[serde(default)]
    pub signal_us: f64,
    /// The program installed its own handler for the samples' signal after
    /// they began: no sample was kept after that, so the self times cover
    /// only the time before.
    #[serde(default)]
    pub handler_lost: bool,
}

impl CpuOut {
    /// The threads `tids` (all of them: `None`) summed: their CPU time,
    /// the profiler's time in their samples, and the time charged to them
    /// (ms). `None` without per-thread figures.
    pub fn profiler_time(&self, tids: Option<&[i32]>) -> Option<ProfilerTime> {
        let rows: Vec<&CpuThread> = self
            .threads
            .iter()
            .filter(|t| tids.is_none_or(|ids| ids.contains(&t.tid)))
            .collect();
        if rows.is_empty() {
            return None;
        }
        let ms = self.interval_us / 1e3;
        let seen: u64 = rows.iter().map(|t| t.profiler_samples).sum();
        Some(ProfilerTime {
            cpu_ms: rows.iter().map(|t| t.samples).sum::<u64>() as f64 * ms,
            seen_ms: seen as f64 * ms,
            seen_sd_ms: (seen as f64).sqrt() * ms,
            charged_ms: rows.iter().map(|t| t.charged_ms).sum(),
        })
    }

    /// The profiler's time in the CPU samples of the threads `tids` beyond
    /// what was charged to them, and that figure's standard deviation (ms)
    /// ([`CpuOut::profiler_time`]).
    pub fn uncharged_ms(&self, tids: Option<&[i32]>) -> Option<(f64, f64)> {
        Some(self.profiler_time(tids)?.uncharged_ms())
    }
}

impl ProfilerTime {
    /// The profiler's time in the samples beyond what was charged, and
    /// that figure's standard deviation (ms).
    pub fn uncharged_ms(&self) -> (f64, f64) {
        (self.seen_ms - self.charged_ms, self.seen_sd_ms)
    }
}

/// The profiler's time on some threads, seen and charged
/// ([`CpuOut::profiler_time`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProfilerTime {
    /// The threads' CPU time in their samples (ms).
    pub cpu_ms: f64,
    /// Of it, in the profiler's code (ms).
    pub seen_ms: f64,
    /// Its standard deviation: the samples there are a count, whose
    /// spread is its square root (ms).
    pub seen_sd_ms: f64,
    /// The profiler's time charged to the threads (ms).
    pub charged_ms: f64,
}

/// One thread's CPU samples and the profiler time charged to it over the
/// same stretch: the charge is what the program clock takes off the
/// thread's durations (its hooks as stamped, with what the stamps miss, and
/// its counted calls and cheap exits at their calibrated costs); the
/// samples in the profiler's code measure that time another way, with
/// whatever the calibration did not see (a counter's cache line missed
/// in a real program, say).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct CpuThread {
    /// Kernel thread id.
    pub tid: i32,
    /// Its samples.
    pub samples: u64,
    /// Of those, in the profiler's own code.
    pub profiler_samples: u64,
    /// The profiler's time charged to it until the samples stopped (ms):
    /// its hooks', without the samples' own signals ([`CpuOut::signal_us`]
    /// each), which no sample can see.
    pub charged_ms: f64,
}

/// CPU samples in one place.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct CpuRow {
    /// Symbol.
    pub name: String,
    /// Samples.
    pub samples: u64,
    /// Percent of the program's samples.
    pub share: f64,
}

/// The sampled call paths, in the JSON's own form: each frame name once
/// ([`Stacks::names`]) and each path's frames as indices into them.
///
/// A path is a list of numbers, not of names: a name object per frame (a
/// reference count taken for each of tens of thousands of frames, then
/// every name found again by its address to number it for the JSON) was a
/// measurable part of the program's exit.
#[derive(Serialize, Debug, Clone, PartialEq, Default)]
pub struct Stacks {
    /// Frame names: functions, and `[...]` for frames not sampled.
    pub names: Vec<Arc<str>>,
    /// The paths, ordered as their folded lines sort (by their frames'
    /// names, outermost first).
    pub paths: Vec<StackRow>,
}

impl Stacks {
    /// The name of frame `i` (`?` for an index past the names, which
    /// reading a file rejects).
    pub fn name(&self, i: u32) -> &str {
        self.names.get(i as usize).map_or("?", |n| n)
    }

    /// `row`'s frame names, outermost first.
    pub fn frames<'a>(&'a self, row: &'a StackRow) -> impl Iterator<Item = &'a str> + 'a {
        row.frames.iter().map(move |&i| self.name(i))
    }

    /// Paths given by their frames' names (version 1's form, tests,
    /// reports built by hand), each name listed once, in order of first
    /// use. Not ordered or merged.
    pub fn from_named<N: AsRef<str>>(rows: impl IntoIterator<Item = (Vec<N>, u64, f64)>) -> Stacks {
        let mut ids: FxMap<Arc<str>, u32> = FxMap::default();
        let mut st = Stacks::default();
        for (frames, samples, self_ms) in rows {
            let frames = frames
                .iter()
                .map(|f| {
                    let f = f.as_ref();
                    if let Some(&i) = ids.get(f) {
                        return i;
                    }
                    let name: Arc<str> = Arc::from(f);
                    st.names.push(name.clone());
                    ids.insert(name, st.names.len() as u32 - 1);
                    st.names.len() as u32 - 1
                })
                .collect();
            st.paths.push(StackRow {
                frames,
                samples,
                self_ms,
            });
        }
        st
    }

    /// The number of paths.
    pub fn len(&self) -> usize {
        self.paths.len()
    }

    /// True if no path was sampled.
    pub fn is_empty(&self) -> bool {
        self.paths.is_empty()
    }
}

/// Reading [`Stacks`]: version 2's `{names, paths}`, checked, or version
/// 1's list of paths that spell their frames' names.
mod stacks_json {
    use super::{StackRow, Stacks};
    use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
    use serde::de::{MapAccess, SeqAccess, Visitor};
    use serde::{Deserialize, Deserializer};
    use std::sync::Arc;

    #[derive(Deserialize)]
    struct In {
        names: Vec<Arc<str>>,
        paths: Vec<StackRow>,
    }

    #[derive(Deserialize)]
    struct NamedRow {
        frames: Vec<String>,
        samples: u64,
        self_ms: f64,
    }

    /// Which form a file holds is decided by its shape (an object: version
    /// 2; a list: version 1), not by trying each in turn: serde's untagged
    /// enum buffered the whole field first and, on any error inside it,
    /// said only that the data "did not match any variant".
    struct Form;

    impl<'de> Visitor<'de> for Form {
        type Value = Stacks;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("stacks as {names, paths} or, in version 1, a list of {frames, samples, self_ms}")
        }

        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
            let t = In::deserialize(MapAccessDeserializer::new(map))?;
            let n = t.names.len();
            if t.paths.iter().any(|p| p.frames.iter().any(|&i| i as usize >= n)) {
                return Err(serde::de::Error::custom(format!(
                    "a stack's frame indexes past the {n} names"
                )));
            }
            Ok(Stacks {
                names: t.names,
                paths: t.paths,
            })
        }

        fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
            let rows = Vec::<NamedRow>::deserialize(SeqAccessDeserializer::new(seq))?;
            Ok(Stacks::from_named(
                rows.into_iter().map(|r| (r.frames, r.samples, r.self_ms)),
            ))
        }
    }

    impl<'de> Deserialize<'de> for Stacks {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Stacks, D::Error> {
            d.deserialize_any(Form)
        }
    }
}

/// Sampling settings as reported.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct SettingsOut {
    /// Calls timed per function per epoch: drawn at random among the
    /// counted calls where [`SettingsOut::drawn`], else the first calls of
    /// each timing epoch (the name is kept from schema 1, when they were a
    /// window's samples).
    pub samples_per_window: u32,
    /// Epoch in ms.
    pub epoch_ms: f64,
    /// Whether copies of functions inlined into others were sampled
    /// (`FASTINST_INLINED`); false in reports written before the
    /// setting existed, which did sample them.
    #[serde(default)]
    pub inlined: bool,
    /// Counting windows per busy function per counting epoch
    /// (`FASTINST_PROFILE_WINDOWS`); 0 in reports before schema 3 and in
    /// traces.
    #[serde(default)]
    pub windows: u32,
    /// Counting hooks per 1,000 ticks of program time that the open
    /// windows could run together (`FASTINST_PROFILE_DENSITY`); 0 in
    /// reports written before the setting existed and in traces.
    #[serde(default)]
    pub density: u32,
    /// The share of the threads' CPU time, in percent, the profiler held
    /// itself to by timing fewer calls (`FASTINST_PROFILE_SHARE`; see
    /// [`SettingsOut::timing_scale`]); 40 in reports written before the
    /// setting existed (the share they held), 0 in traces.
    #[serde(default = "forty")]
    pub share: u32,
    /// Whether CPU samples were asked for (`FASTINST_PROFILE_CPU`); false
    /// in reports before schema 3 and in traces.
    #[serde(default)]
    pub cpu_samples: bool,
    /// Whether the timed calls were drawn at random among the counted
    /// ones, each weighted by the calls it stands for; false in reports
    /// whose epochs alternated timing the first calls and counting.
    #[serde(default)]
    pub drawn: bool,
    /// How many times the settings were changed while the program ran
    /// (the control socket's `set`); the fields above are the last ones.
    /// 0 in reports written before.
    #[serde(default)]
    pub changed: u32,
    /// The share of [`SettingsOut::samples_per_window`] the profiler
    /// timed, averaged over the epochs: under 1 where it timed fewer calls
    /// to hold its own share of the program's CPU time (1 in traces and
    /// in reports written before).
    #[serde(default = "one")]
    pub timing_scale: f64,
}

/// The default of fields whose absence means "as set".
fn one() -> f64 {
    1.0
}

/// The profiler's share before it was a setting.
fn forty() -> u32 {
    40
}

/// The profiler's own cost and losses.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct Overhead {
    /// Probes discovered.
    pub probes: u32,
    /// Functions with probes.
    pub functions: u32,
    /// Sampled calls.
    pub samples: u64,
    /// Per second of wall time.
    pub samples_per_s: f64,
    /// Probe activations and deactivations by the profiler.
    pub toggles: u64,
    /// Per second of wall time.
    pub toggles_per_s: f64,
    /// Time spent in the profiler's hooks (dispatch and handlers), all
    /// threads, as their program clocks charged it.
    pub handler_ms: f64,
    /// CPU time of the sampler thread (re-arming each epoch and waking up
    /// for it); 0 in reports written before it was recorded.
    #[serde(default)]
    pub sampler_ms: f64,
    /// Times the sampler thread woke to open and close windows (its epochs'
    /// turns aside); 0 in traces and in reports written before it was
    /// recorded.
    #[serde(default)]
    pub sampler_wakeups: u64,
    /// Exits whose entry was not sampled (dropped).
    pub unmatched_exits: u64,
    /// Sampled activations left without an exit (longjmp, exceptions,
    /// thread exit, or an exit probe that went off while they ran).
    pub abandoned_frames: u64,
    /// Of those, the ones whose exit probe went off while they ran: known
    /// to have lasted at least until then, they are kept as censored
    /// durations (Kaplan-Meier) in their function's mean, totals and
    /// percentiles, not dropped. 0 in reports written before.
    #[serde(default)]
    pub censored_frames: u64,
    /// Sampled calls deeper than the shadow stack (dropped).
    pub too_deep: u64,
    /// Hooks whose frame could not be found (dropped).
    pub no_cfa: u64,
    /// Hooks on a thread that was exiting (dropped).
    pub no_thread: u64,
    /// Samples whose call path was new after a thread's path table was
    /// full ([`MAX_PATH_NODES`]): kept as `[...];function`.
    #[serde(default)]
    pub stacks_merged: u64,
    /// Probes of inlined copies left off for the whole run (unless
    /// [`SettingsOut::inlined`]).
    #[serde(default)]
    pub inlined_copies_off: u64,
    /// Probes left off because the function filter
    /// (`FASTINST_FUNCTIONS`, `FASTINST_EXCLUDE`, `FASTINST_MODULES`)
    /// refused their function.
    #[serde(default)]
    pub filtered_off: u64,
    /// Sampled calls still in flight when their thread or the process
    /// ended, recorded as ending then (`main` when the program calls
    /// `exit`).
    #[serde(default)]
    pub open_at_exit: u64,
    /// Counting windows planned, and of them opened: a window that found
    /// no room under the schedule's density cap before its epoch ended
    /// never opens (0 in traces and reports before schema 3).
    #[serde(default)]
    pub windows_planned: u64,
    /// See [`Overhead::windows_planned`].
    #[serde(default)]
    pub windows_opened: u64,
    /// Opened windows left out of the estimates: their exposure (CPU time
    /// less the hooks' time) was too small for the calls they counted, a
    /// reading that is noise.
    #[serde(default)]
    pub windows_void: u64,
    /// Of the time the program's threads could run, the share (percent)
    /// they spent waiting for a CPU (the kernel's run delay, of the
    /// threads alive at the report); `None` where it could not be read.
    /// Where it is high, timed calls' durations are uncertain beyond
    /// their spread (see the text's warning).
    #[serde(default)]
    pub cpu_wait_share: Option<f64>,
}

/// One function.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct FunctionRow {
    /// Demangled name, or the address.
    pub name: String,
    /// Entry address.
    pub address: String,
    /// Calls sampled (entry and exit seen).
    pub calls_sampled: u64,
    /// Estimated calls in all.
    pub calls_estimated: f64,
    /// The call estimate's standard deviation (0 for an exact count).
    #[serde(default)]
    pub calls_sd: f64,
    /// Every call was counted: `calls_estimated` is a count.
    #[serde(default)]
    pub calls_exact: bool,
    /// Estimated total (inclusive) time: each outermost activation once
    /// (a recursive function's nested activations are inside it).
    pub total_ms: f64,
    /// `total_ms`'s standard deviation: the call estimate's spread, the
    /// timed calls' mean's (their durations' spread over the square root
    /// of their number) and that of the hooks' charges taken off inside
    /// them (5% of those charges, as the percentiles' ranges hold)
    /// together; at most the total when it was capped.
    #[serde(default)]
    pub total_sd: f64,
    /// Activations of this function were sampled inside others of it: a
    /// call made from its own code, or one with a timed activation of it
    /// below on its thread. A call nested deeper in a mutual recursion
    /// whose enclosing activations were not timed counts as outermost,
    /// so `total_ms` is less certain.
    #[serde(default)]
    pub recursive: bool,
    /// `total_ms` exceeded the profiled wall time times the threads it ran
    /// on, or its callers' inclusive time (with two standard deviations of
    /// room), and was cut to it.
    #[serde(default)]
    pub total_capped: bool,
    /// Self time: its CPU samples times their interval (CPU time), or,
    /// without CPU samples, total time less its sampled callees' time.
    pub self_ms: f64,
    /// CPU samples with the program counter in it.
    #[serde(default)]
    pub cpu_samples: u64,
    /// Its share of the program's CPU samples (percent), if any were
    /// taken.
    #[serde(default)]
    pub self_share: Option<f64>,
    /// The standard deviation of [`FunctionRow::self_ms`] from the CPU
    /// samples' count alone (binomial: the interval times
    /// `sqrt(n (1 - n/N))` for `n` of the program's `N` samples); 0
    /// without CPU samples, and in reports written before it was stated.
    /// The text marks a self time `?` whose 95% range (1.96 of these)
    /// reaches past 10% of it.
    #[serde(default)]
    pub self_sd_ms: f64,
    /// Mean sampled duration.
    pub mean_us: f64,
    /// Sampled duration statistics.
    pub min_us: f64,
    /// Median.
    pub p50_us: f64,
    /// 90th percentile.
    pub p90_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// The 95% confidence ranges of `p50_us`, `p90_us` and `p99_us`
    /// ([`Range`]); `None` in a report of schema 3 or older.
    #[serde(default)]
    pub p50_range: Option<Range>,
    /// See `p50_range`.
    #[serde(default)]
    pub p90_range: Option<Range>,
    /// See `p50_range`.
    #[serde(default)]
    pub p99_range: Option<Range>,
    /// How many independent calls the timed calls are worth for the
    /// percentiles: fewer than `calls_sampled` where the timed calls
    /// stand for different numbers of calls (`(sum w)^2 / sum w^2`).
    #[serde(default)]
    pub calls_effective: f64,
    /// Maximum.
    pub max_us: f64,
    /// Threads (tids) it was sampled on.
    pub threads: Vec<i32>,
}

/// Where a latency percentile lies, with 95% confidence (microseconds).
///
/// The profiler times a sample of the calls, so each percentile it shows
/// is an estimate: the range is the percentiles of the timed calls at
/// the ranks that bound the true one's (Woodruff's interval, from the
/// effective number of timed calls), widened by the histogram's bucket.
/// The trace tool times every call: its range is its bucket's.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Default)]
pub struct Range {
    /// Lower bound.
    pub lo: f64,
    /// Upper bound; `None` where too few calls were timed to bound it
    /// (the percentile may lie past the longest timed call).
    pub hi: Option<f64>,
}

impl Range {
    /// Whether `x` lies in the range.
    pub fn contains(&self, x: f64) -> bool {
        x >= self.lo && self.hi.is_none_or(|h| x <= h)
    }

    /// Whether the two ranges overlap: the two figures agree within what
    /// each says it is uncertain by.
    pub fn meets(&self, other: &Range) -> bool {
        self.hi.is_none_or(|h| other.lo <= h) && other.hi.is_none_or(|h| self.lo <= h)
    }

    /// Whether the whole range lies within `tolerance` (a fraction) of
    /// `x`: a percentile shown as `x` is known that well.
    pub fn within(&self, x: f64, tolerance: f64) -> bool {
        self.lo >= x * (1.0 - tolerance) && self.hi.is_some_and(|h| h <= x * (1.0 + tolerance))
    }
}

/// How far a percentile may stand from its figure for the text report
/// to show it unmarked: past it, the figure is marked `?`.
pub const PERCENTILE_MARK_TOLERANCE: f64 = 0.10;

/// One caller -> callee edge.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct EdgeRow {
    /// The function holding the call's return address.
    pub caller: String,
    /// The instrumented callee.
    pub callee: String,
    /// Sampled calls along this edge.
    pub calls_sampled: u64,
    /// Estimated calls.
    pub calls_estimated: f64,
    /// Estimated time in the callee along this edge.
    pub total_ms: f64,
}

/// One sampled call path.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct StackRow {
    /// Outermost first, as indices into [`Stacks::names`] (whose `[...]`
    /// marks frames not sampled).
    pub frames: Vec<u32>,
    /// Sampled calls ending this path.
    pub samples: u64,
    /// Estimated self time of the last frame along this path.
    pub self_ms: f64,
}

/// The text's line on the profiler time the CPU samples saw against what
/// was charged ([`CpuOut::threads`]), if there are per-thread figures and
/// samples in the profiler's code. Where the samples saw more than two
/// deviations beyond the charge, that time is in the program's durations:
/// a call's total holds its share of it, a thread body's or `main`'s
/// nearly all of its thread's.
fn uncharged_line(cpu: &CpuOut) -> Option<String> {
    let ProfilerTime {
        cpu_ms,
        seen_ms: seen,
        seen_sd_ms: sd,
        charged_ms: charged,
    } = cpu.profiler_time(None)?;
    if seen == 0.0 {
        return None;
    }
    let diff = seen - charged;
    let head = format!(
        "profiler time: {seen:.1} +- {sd:.1} ms of the sampled threads' CPU samples in the profiler's code, {charged:.1} ms charged to them"
    );
    Some(if diff > 2.0 * sd {
        format!(
            "{head}: the {diff:.1} ms more ({:.1}% of their CPU time) stays in the durations, which read up to that share long (main's and thread bodies' totals nearly all of it), besides the profiler's effect on the program's caches, which no figure here measures (docs/profiler.md)",
            100.0 * diff / cpu_ms.max(f64::MIN_POSITIVE)
        )
    } else {
        format!("{head}: the two agree within two deviations")
    })
}

/// The text report.
pub fn render_text(r: &Report) -> String {
    let mut s = String::new();
    let _ = text_to(r, &mut s);
    s
}

/// A run-queue wait share (percent) from which the text report warns that
/// timed durations are uncertain.
pub const CONTENDED_PERCENT: f64 = 5.0;

/// [`render_text`] into `s`.
fn text_to(r: &Report, s: &mut impl std::fmt::Write) -> std::fmt::Result {
    let o = &r.overhead;
    writeln!(
        s,
        "fastinst profile: {} (pid {}), {:.3} s profiled, TSC {:.0} MHz",
        r.program,
        r.pid,
        r.wall_ms / 1e3,
        r.tsc_mhz
    )?;
    if r.settings.samples_per_window == 0 {
        writeln!(s, "tracing: every call timed and counted")?;
    } else {
        if r.settings.drawn {
            writeln!(
                s,
                "sampling: epochs of {} ms; {} windows per busy function at random times count its calls, and about {} calls of each function an epoch are timed, drawn at random among the counted ones",
                r.settings.epoch_ms, r.settings.windows, r.settings.samples_per_window
            )?;
            if r.settings.timing_scale < 0.995 {
                writeln!(
                    s,
                    "timing: {:.1}% of those calls on average, to hold the profiler's share of the program's CPU time near {}% (docs/profiler.md)",
                    100.0 * r.settings.timing_scale,
                    r.settings.share
                )?;
            }
            if r.settings.changed > 0 {
                writeln!(
                    s,
                    "settings: changed {} times while running (`fastinst ctl ... set`); the line above gives the last",
                    r.settings.changed
                )?;
            }
        } else {
            writeln!(
                s,
                "sampling: epochs of {} ms, alternately timing (the first {} calls of each function) and counting ({} windows per busy function, at random times)",
                r.settings.epoch_ms, r.settings.samples_per_window, r.settings.windows
            )?;
        }
    }
    writeln!(
        s,
        "overhead: {} probes in {} functions; {} samples ({:.0}/s); {} toggles ({:.0}/s); {:.2} ms in hooks, {:.2} ms of sampler CPU{}",
        o.probes,
        o.functions,
        o.samples,
        o.samples_per_s,
        o.toggles,
        o.toggles_per_s,
        o.handler_ms,
        o.sampler_ms,
        if o.sampler_wakeups > 0 {
            format!(" ({} wake-ups)", o.sampler_wakeups)
        } else {
            String::new()
        }
    )?;
    writeln!(
        s,
        "dropped: {} exits whose entry was not sampled, {} activations left without exit ({} of them censored: weighted as lasting past the moment their exit stopped being watched), {} too deep, {} without frame, {} on exiting threads",
        o.unmatched_exits, o.abandoned_frames, o.censored_frames, o.too_deep, o.no_cfa, o.no_thread
    )?;
    if r.began_running {
        writeln!(s, "{}", began_running_line(&r.functions))?;
    }
    if o.inlined_copies_off > 0 {
        writeln!(
            s,
            "inlined copies: {} probes in functions' copies inlined into other functions are off; their time is their callers' (FASTINST_INLINED=1 samples them)",
            o.inlined_copies_off
        )?;
    }
    if o.filtered_off > 0 {
        writeln!(
            s,
            "filtered: {} probes left off: their functions are outside FASTINST_FUNCTIONS / FASTINST_EXCLUDE / FASTINST_MODULES",
            o.filtered_off
        )?;
    }
    if o.stacks_merged > 0 {
        writeln!(
            s,
            "call paths: {} samples past the table's {} distinct path prefixes per thread are shown as [...];function",
            o.stacks_merged, MAX_PATH_NODES
        )?;
    }
    if let Some(cpu) = &r.cpu {
        writeln!(
            s,
            "cpu samples: {} (every {:.0} us of a thread's CPU time), {} in the profiler left out, {} lost",
            cpu.samples, cpu.interval_us, cpu.profiler_samples, cpu.lost
        )?;
        if cpu.handler_lost {
            writeln!(
                s,
                "cpu samples stopped: the program installed its own handler for their signal after they began; self times cover only the time before"
            )?;
        }
        if cpu.signal_us > 0.0 {
            writeln!(
                s,
                "sampling signals: each cost its thread {:.1} us (measured at start), {:.1} ms over the samples, charged to their threads as profiler time: in no duration",
                cpu.signal_us,
                cpu.signal_us * cpu.samples as f64 / 1e3
            )?;
        } else if cpu.samples > 0 {
            writeln!(
                s,
                "sampling signals: what one costs its thread could not be measured at start, so none is charged: every duration holds its share of them (docs/limits.md)"
            )?;
        }
        if let Some(line) = uncharged_line(cpu) {
            writeln!(s, "{line}")?;
        }
    }
    if let Some(w) = o.cpu_wait_share.filter(|&w| w >= CONTENDED_PERCENT) {
        writeln!(
            s,
            "cpu contention: the threads waited for a CPU {w:.0}% of the time they could run; timed calls' durations (totals and latencies), the calls of a run of a few epochs, and the calls of functions counted through whole hooks (a -finstrument-functions entry call whose operand crosses a cache line has no counting stub), may be biased beyond their +- (docs/limits.md)"
        )?;
    }
    if o.windows_planned > 0 {
        writeln!(
            s,
            "counting windows: {} planned, {} opened ({:.0}%), {} void (too little exposure for their calls)",
            o.windows_planned,
            o.windows_opened,
            100.0 * o.windows_opened as f64 / o.windows_planned as f64,
            o.windows_void
        )?;
    }
    if o.open_at_exit > 0 {
        writeln!(
            s,
            "in flight at exit: {} sampled calls, timed to their thread's end",
            o.open_at_exit
        )?;
    }
    writeln!(
        s,
        "calls: = counted exactly, else estimated +- one standard deviation; total: inclusive, each outermost call once (~ recursive, ! capped at the run or at its callers'), +- one standard deviation of sampling and hook charges (a long call, main or a thread body above all, also holds the profiler's slowing of the program beyond its charges, which no +- holds: the profiler time line measures its own code's part; docs/profiler.md); self: CPU samples, ? where their count's 95% range (JSON: self_sd_ms) reaches past {:.0}% of it",
        100.0 * PERCENTILE_MARK_TOLERANCE
    )?;
    writeln!(
        s,
        "latencies: of the timed calls; ? where the percentile's 95% range (JSON: p50_range...) reaches past {:.0}% of the figure",
        100.0 * PERCENTILE_MARK_TOLERANCE
    )?;
    writeln!(s)?;
    writeln!(
        s,
        "{:>12} {:>9} {:>8} {:>11} {:>9} {:>10} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}  {:<8} function",
        "calls",
        "+-",
        "sampled",
        "total ms",
        "+-",
        "self ms",
        "self%",
        "min us",
        "p50 us",
        "p90 us",
        "p99 us",
        "max us",
        "mean us",
        "threads"
    )?;
    // The rows are most of the text (SQLite: ~1,700 rows, ~15,000
    // numbers): each is built in one line buffer, numbers right-aligned
    // by hand, and written once, where `writeln!` with a width per field
    // went through the formatting machinery ~15 times a row.
    let mut line = Columns::default();
    for f in &r.functions {
        line.fixed(12, f.calls_estimated, 0);
        if f.calls_exact {
            line.field.clear();
            line.field.push('=');
            line.column(9);
        } else {
            line.fixed(9, f.calls_sd, 0);
        }
        line.int(8, f.calls_sampled);
        line.fixed(10, f.total_ms, 3);
        line.text.push(if f.total_capped {
            '!'
        } else if f.recursive {
            '~'
        } else {
            ' '
        });
        line.fixed(9, f.total_sd, 3);
        line.fixed(9, f.self_ms, 3);
        line.text.push(self_mark(f.self_ms, f.self_sd_ms));
        match f.self_share {
            Some(x) => line.fixed(6, x, 1),
            None => {
                line.field.clear();
                line.field.push('-');
                line.column(6);
            }
        }
        line.fixed(9, f.min_us, 2);
        for (us, range) in [
            (f.p50_us, f.p50_range),
            (f.p90_us, f.p90_range),
            (f.p99_us, f.p99_range),
        ] {
            line.fixed(8, us, 2);
            line.text.push(percentile_mark(us, range));
        }
        for us in [f.max_us, f.mean_us] {
            line.fixed(9, us, 2);
        }
        line.text.push(' ');
        line.int(0, f.threads.len() as u64);
        let pad = 8usize.saturating_sub(line.field.len());
        line.text.extend(std::iter::repeat_n(' ', pad));
        line.text.push(' ');
        line.text.push_str(&f.name);
        line.end(s)?;
    }
    writeln!(s)?;
    writeln!(s, "call edges (caller -> callee): calls(est), sampled, total ms")?;
    for e in &r.edges {
        line.fixed(12, e.calls_estimated, 0);
        line.int(8, e.calls_sampled);
        line.fixed(10, e.total_ms, 3);
        line.text.push_str("  ");
        line.text.push_str(&e.caller);
        line.text.push_str(" -> ");
        line.text.push_str(&e.callee);
        line.end(s)?;
    }
    Ok(())
}

/// The standard deviation of a count of `k` of `n` samples (binomial,
/// `sqrt(k (1 - k/n))`; 0 for none or all of them): a self time's in
/// samples ([`FunctionRow::self_sd_ms`] over the interval), and a share's
/// times `100/n`.
pub fn count_sd(k: f64, n: f64) -> f64 {
    if n <= 0.0 {
        return 0.0;
    }
    let k = k.clamp(0.0, n);
    (k * (1.0 - k / n)).sqrt()
}

/// The text report's mark after a self time: `?` where its 95% range
/// from the samples' count (`1.96 sd`) reaches past
/// [`PERCENTILE_MARK_TOLERANCE`] of it, as a percentile's.
pub fn self_mark(self_ms: f64, sd_ms: f64) -> char {
    if self_ms > 0.0 && 1.96 * sd_ms > PERCENTILE_MARK_TOLERANCE * self_ms {
        '?'
    } else {
        ' '
    }
}

/// The text report's mark after a percentile: `?` where its range
/// reaches past [`PERCENTILE_MARK_TOLERANCE`] of it.
pub fn percentile_mark(us: f64, range: Option<Range>) -> char {
    match range {
        Some(r) if !r.within(us, PERCENTILE_MARK_TOLERANCE) => '?',
        _ => ' ',
    }
}

/// A text report line of right-aligned columns, each after a space but
/// the first: what `{:>W}` of each field, separated by spaces, writes.
#[derive(Default)]
struct Columns {
    text: String,
    /// The field being written.
    field: String,
}

impl Columns {
    fn column(&mut self, width: usize) {
        if !self.text.is_empty() {
            self.text.push(' ');
        }
        // Digits, a point and a sign: one byte per character.
        let pad = width.saturating_sub(self.field.len());
        self.text.extend(std::iter::repeat_n(' ', pad));
        self.text.push_str(&self.field);
    }

    /// `{:>width$.places$}` of `x`.
    fn fixed(&mut self, width: usize, x: f64, places: u32) {
        self.field.clear();
        decimal::push_fixed(&mut self.field, x, places);
        self.column(width);
    }

    /// `{:>width$}` of `n`.
    fn int(&mut self, width: usize, n: u64) {
        self.field.clear();
        let _ = write!(self.field, "{n}");
        self.column(width);
    }

    /// Writes the line and a newline to `s`, and starts the next.
    fn end(&mut self, s: &mut impl std::fmt::Write) -> std::fmt::Result {
        self.text.push('\n');
        let r = s.write_str(&self.text);
        self.text.clear();
        r
    }
}

/// Folded stacks (`a;b;c weight`), weights in nanoseconds of self time.
pub fn render_folded(r: &Report) -> String {
    let mut s = String::new();
    let _ = folded_to(r, &mut s);
    s
}

/// [`render_folded`] into `out`, a line at a time; returns whether the
/// lines came out sorted, as inferno compares them (each line, without its
/// newline, at least the one before).
fn folded_to(r: &Report, out: &mut impl std::fmt::Write) -> Result<bool, std::fmt::Error> {
    let names = folded_names(&r.stacks);
    let (mut line, mut prev) = (String::new(), String::new());
    let mut sorted = true;
    for st in &r.stacks.paths {
        let w = folded_weight(st);
        if w == 0 {
            continue;
        }
        line.clear();
        for (i, &f) in st.frames.iter().enumerate() {
            if i > 0 {
                line.push(';');
            }
            line.push_str(names.get(f as usize).map_or("?", |n| n));
        }
        write!(line, " {w}")?;
        sorted &= prev <= line;
        out.write_str(&line)?;
        out.write_char('\n')?;
        std::mem::swap(&mut line, &mut prev);
    }
    Ok(sorted)
}

/// Each of `st`'s names as the folded stacks write it ([`folded_name`]),
/// copied only where it differs.
pub(crate) fn folded_names(st: &Stacks) -> Vec<std::borrow::Cow<'_, str>> {
    st.names
        .iter()
        .map(|n| {
            if n.bytes().any(|b| b == b';' || b == b' ') {
                // ASCII bytes replaced by an ASCII byte: still UTF-8.
                String::from_utf8(folded_name(n).collect())
                    .expect("separators replaced by `_`")
                    .into()
            } else {
                std::borrow::Cow::Borrowed(&**n)
            }
        })
        .collect()
}

/// A path's weight in the folded stacks: nanoseconds of self time. Paths
/// that round to 0 are left out.
pub(crate) fn folded_weight(st: &StackRow) -> u64 {
    (st.self_ms * 1e6).round() as u64
}

/// The flame graph of the folded stacks.
pub fn render_svg(r: &Report) -> Result<String, String> {
    let mut folded = String::new();
    let sorted = folded_to(r, &mut folded).map_err(|e| e.to_string())?;
    if folded.is_empty() {
        return Ok(String::new());
    }
    let mut out = Vec::new();
    svg_to(r, Some(&folded), sorted, &mut out).map_err(|e| e.to_string())?;
    String::from_utf8(out).map_err(|e| e.to_string())
}

/// `paths` (frames numbered in `names`) with only the names they use,
/// renumbered in order of first use.
pub fn used_names(names: &[Arc<str>], mut paths: Vec<StackRow>) -> Stacks {
    let mut new_id = vec![u32::MAX; names.len()];
    let mut used = Vec::new();
    for f in paths.iter_mut().flat_map(|p| p.frames.iter_mut()) {
        let id = &mut new_id[*f as usize];
        if *id == u32::MAX {
            *id = used.len() as u32;
            used.push(names[*f as usize].clone());
        }
        *f = *id;
    }
    Stacks { names: used, paths }
}

/// What a profile that began in a running process cannot time, with the
/// functions where it shows: self time (CPU samples, which saw the calls
/// in flight) past the inclusive total, each less two of its deviations
/// (a sample count's square root, for the self time).
fn began_running_line(functions: &[FunctionRow]) -> String {
    let self_low = |f: &FunctionRow| f.self_ms - 2.0 * f.self_ms / (f.cpu_samples.max(1) as f64).sqrt();
    let short: Vec<&str> = functions
        .iter()
        .filter(|f| self_low(f) > f.total_ms + 2.0 * f.total_sd)
        .map(|f| f.name.as_str())
        .collect();
    let mut line = "began in a running process (attached): calls in flight then, main's and thread bodies' above all, were never timed; their functions' totals and call edges miss that time, where self times (CPU samples) hold it (docs/attach.md)".to_string();
    if !short.is_empty() {
        let more = short.len().saturating_sub(3);
        line.push_str(&format!(
            "; self time past the total in {}",
            short[..short.len().min(3)].join(", ")
        ));
        if more > 0 {
            line.push_str(&format!(" and {more} more"));
        }
    }
    line
}

/// A report of `stacks` alone, the rest made up (tests).
#[cfg(test)]
pub(crate) fn test_report(stacks: Stacks) -> Report {
    Report {
        began_running: false,
        schema: "test".into(),
        program: "t".into(),
        pid: 1,
        wall_ms: 1.0,
        tsc_mhz: 1.0,
        settings: SettingsOut {
            samples_per_window: 10,
            epoch_ms: 10.0,
            inlined: false,
            windows: 2,
            density: 20,
            share: 20,
            cpu_samples: true,
            drawn: true,
            changed: 0,
            timing_scale: 1.0,
        },
        overhead: Overhead::default(),
        functions: Vec::new(),
        edges: Vec::new(),
        stacks,
        cpu: None,
    }
}

/// Paths built by hand (tests) put in order and merged as the runtime's
/// collection does.
#[cfg(test)]
pub(crate) fn order_and_merge(st: &mut Stacks) {
    let mut tree = pathtree::PathTree::default();
    for (i, n) in st.names.iter().enumerate() {
        tree.name(i as u32, n);
    }
    for r in &st.paths {
        let node = tree.path(&r.frames);
        tree.end(node, r.samples, r.self_ms);
    }
    *st = used_names(&st.names, tree.rows(&st.names));
}

/// A frame's name as the folded stacks write it: `;` separates frames and
/// ` ` the weight.
pub(crate) fn folded_name(name: &str) -> impl Iterator<Item = u8> + '_ {
    name.bytes().map(|c| if c == b';' || c == b' ' { b'_' } else { c })
}

/// The flame graph of `r`'s folded stacks into `out`, whose lines are
/// `sorted` as inferno compares them; `folded` is [`render_folded`]'s
/// output, if made (only unsorted lines need it).
fn svg_to(r: &Report, folded: Option<&str>, sorted: bool, out: &mut impl std::io::Write) -> std::io::Result<()> {
    let mut opt = flame_options(r);
    // Reports list their paths in the flame graph's order (`by_frames`), so
    // its own sort, which compared every line as a string again, is needed
    // only when two paths print alike (and for older reports).
    if sorted {
        // The same flame graph from the frames it draws (`flame.rs`), whose
        // lines keep the folded order without sorting: a flame chart is
        // inferno's way to take lines in the order given (it reverses them
        // first, and does nothing else differently).
        let cut = flame::drawable(r, opt.min_width);
        if svg::write(r, &cut, out)? {
            return Ok(());
        }
        opt.flame_chart = true;
        return inferno::flamegraph::from_lines(&mut opt, cut.text().lines().rev(), out);
    }
    let made;
    let folded = match folded {
        Some(f) => f,
        None => {
            made = render_folded(r);
            &made
        }
    };
    inferno::flamegraph::from_lines(&mut opt, folded.lines(), out)
}

/// The flame graph's options for `r` (sorting aside).
pub(crate) fn flame_options(r: &Report) -> inferno::flamegraph::Options<'static> {
    let mut opt = inferno::flamegraph::Options::default();
    opt.title = format!("fastinst profile: {} (pid {})", r.program, r.pid);
    opt.count_name = "ns".into();
    // Colours from the names' hashes: a function has the same colour in
    // every report, and a report renders the same each time (inferno's
    // default draws them from a generator that carries on from one graph
    // to the next in a process).
    opt.hash = true;
    opt
}

/// Whether inferno takes `folded`'s lines as sorted (the check
/// [`folded_to`] makes as it writes them, for the tests).
#[cfg(test)]
pub(crate) fn lines_sorted(folded: &str) -> bool {
    let mut prev = "";
    folded.lines().all(|line| std::mem::replace(&mut prev, line) <= line)
}

/// Writes `fastinst-profile.<pid>.{txt,json,folded,svg}` under `dir`;
/// returns the paths, the text report first.
///
/// Written at the program's exit, so this is part of the profiler's cost.
/// Every file is streamed through one 64 KiB buffer each: the JSON is
/// compact (`fastinst report --format json FILE` pretty-prints it), and
/// the text, the folded stacks and the flame graph are not built whole in
/// memory first.
pub fn write_all(r: &Report, dir: &Path) -> std::io::Result<Written> {
    write_named(r, dir, "fastinst-profile")
}

/// What [`write_all`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Written {
    /// The files, in the order written (text, JSON, pprof, then folded
    /// stacks and the flame graph when there are stacks).
    pub files: Vec<PathBuf>,
    /// Why the flame graph could not be drawn, if it could not; the other
    /// files are written all the same.
    pub flame_error: Option<String>,
}

/// [`write_all`] with another file name stem (`<stem>.<pid>.<ext>`).
pub fn write_named(r: &Report, dir: &Path, stem: &str) -> std::io::Result<Written> {
    use std::io::Write as _;
    let path = |ext: &str| dir.join(format!("{stem}.{}.{ext}", r.pid));
    let mut out = Vec::new();
    // The writer is a concrete type, not `dyn Write`: serde_json writes
    // the JSON in many small pieces, each then a call through a vtable
    // where it could be an inlined copy into the buffer.
    type Out = std::io::BufWriter<std::fs::File>;
    let mut put = |p: PathBuf, write: &mut dyn FnMut(&mut Out) -> std::io::Result<()>| {
        let tmp = p.with_extension("tmp");
        let mut file = std::io::BufWriter::with_capacity(1 << 16, std::fs::File::create(&tmp)?);
        let written = write(&mut file).and_then(|()| file.into_inner().map(drop).map_err(|e| e.into_error()));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        std::fs::rename(&tmp, &p)?;
        out.push(p);
        Ok::<(), std::io::Error>(())
    };
    put(path("txt"), &mut |w| fmt_io(w, |f| text_to(r, f)))?;
    put(path("json"), &mut |w| {
        json::write(r, w)?;
        w.write_all(b"\n")
    })?;
    put(path("pb.gz"), &mut |w| w.write_all(&pprof::render_pprof(r)))?;
    let mut flame_error = None;
    if r.stacks.paths.iter().any(|st| folded_weight(st) > 0) {
        let mut sorted = false;
        put(path("folded"), &mut |w| {
            fmt_io(w, |f| folded_to(r, f).map(|s| sorted = s))
        })?;
        if let Err(e) = put(path("svg"), &mut |w| svg_to(r, None, sorted, w)) {
            flame_error = Some(e.to_string());
        }
    }
    Ok(Written {
        files: out,
        flame_error,
    })
}

/// Runs `write` on a [`std::fmt::Write`] view of `w`, returning the first
/// I/O error it met.
fn fmt_io<W: std::io::Write>(
    w: &mut W,
    write: impl FnOnce(&mut FmtIo<'_, W>) -> std::fmt::Result,
) -> std::io::Result<()> {
    let mut f = FmtIo { w, err: None };
    match (write(&mut f), f.err) {
        (_, Some(e)) => Err(e),
        (Err(_), None) => Err(std::io::Error::other("formatting failed")),
        (Ok(()), None) => Ok(()),
    }
}

/// A [`std::fmt::Write`] over an [`std::io::Write`] that keeps the first
/// I/O error (`fmt::Error` carries none).
struct FmtIo<'a, W> {
    w: &'a mut W,
    err: Option<std::io::Error>,
}

impl<W: std::io::Write> std::fmt::Write for FmtIo<'_, W> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.w.write_all(s.as_bytes()).map_err(|e| {
            self.err.get_or_insert(e);
            std::fmt::Error
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A function row with these columns and the rest default, for the
    /// crate's tests.
    pub(crate) fn test_row(name: &str, calls: f64, total_ms: f64, self_ms: f64) -> FunctionRow {
        FunctionRow {
            name: name.into(),
            calls_estimated: calls,
            total_ms,
            self_ms,
            p50_us: self_ms,
            ..Default::default()
        }
    }

    #[test]
    fn a_counts_deviation_is_binomial_and_none_at_either_end() {
        assert_eq!(count_sd(0.0, 100.0), 0.0);
        assert_eq!(count_sd(100.0, 100.0), 0.0);
        assert_eq!(count_sd(50.0, 100.0), 5.0);
        assert_eq!(count_sd(1.0, 0.0), 0.0, "no samples");
    }

    /// A self time is marked where its samples' count leaves its 95%
    /// range wider than 10% of it: about 384 samples for a small share.
    #[test]
    fn a_self_time_of_few_samples_is_marked() {
        // 400 samples of 0.5 ms, a small share: sd sqrt(400) = 20 samples.
        assert_eq!(self_mark(200.0, 10.0), ' ');
        // 100 samples: sd 10 samples, 20% at 95%.
        assert_eq!(self_mark(50.0, 5.0), '?');
        // None, or not sampled (sd 0): nothing to mark.
        assert_eq!(self_mark(0.0, 0.0), ' ');
        assert_eq!(self_mark(3.0, 0.0), ' ');
    }

    /// The tables' rows, written by hand, are what `{:>W.P}` per field
    /// writes.
    #[test]
    fn text_rows_are_what_the_format_widths_write() {
        let mut rng = testkit::Rng(0x2545_F491_4F6C_DD1D);
        let mut num = move || {
            let r = rng.next_u64();
            let x = rng.unit() * 10f64.powi((r % 18) as i32 - 6);
            // Now and then a half at two or three places, or a huge one.
            match r >> 60 {
                0 => (r % 1000) as f64 / 1000.0 + 0.0005,
                1 => (r % 100) as f64 / 100.0 + 0.005,
                2 => 1e15 * x,
                _ => x,
            }
        };
        let functions: Vec<FunctionRow> = (0..400)
            .map(|i| FunctionRow {
                name: format!("f{i} <g>"),
                address: format!("{:#x}", 0x1000 + i),
                calls_sampled: (num() * 1e3) as u64,
                calls_estimated: num(),
                calls_sd: num(),
                calls_exact: i % 2 == 0,
                total_ms: num(),
                total_sd: num(),
                recursive: i % 5 == 0,
                total_capped: i % 7 == 0,
                self_ms: num(),
                cpu_samples: i as u64,
                self_share: if i % 3 != 0 { Some(num()) } else { None },
                self_sd_ms: if i % 2 == 0 { num() } else { 0.0 },
                mean_us: num(),
                min_us: num(),
                p50_us: num(),
                p90_us: num(),
                p99_us: num(),
                p50_range: (i % 4 != 0).then(|| Range { lo: num(), hi: None }),
                p90_range: (i % 3 == 0).then_some(Range {
                    lo: 0.0,
                    hi: Some(1e30),
                }),
                p99_range: (i % 2 == 0).then(|| {
                    let x = num();
                    Range { lo: x, hi: Some(x) }
                }),
                calls_effective: num(),
                max_us: num(),
                threads: vec![1; i % 12],
            })
            .collect();
        let edges: Vec<EdgeRow> = (0..400)
            .map(|i| EdgeRow {
                caller: format!("c{i}"),
                callee: format!("f{i}"),
                calls_sampled: i as u64 * 977,
                calls_estimated: num(),
                total_ms: num(),
            })
            .collect();
        let mut want = String::new();
        for f in &functions {
            let sd = if f.calls_exact {
                "=".to_string()
            } else {
                format!("{:.0}", f.calls_sd)
            };
            let mark = if f.total_capped {
                '!'
            } else if f.recursive {
                '~'
            } else {
                ' '
            };
            let share = f.self_share.map_or("-".to_string(), |x| format!("{x:.1}"));
            writeln!(
                want,
                "{:>12.0} {:>9} {:>8} {:>10.3}{} {:>9.3} {:>9.3}{} {:>6} {:>9.2} {:>8.2}{} {:>8.2}{} {:>8.2}{} {:>9.2} {:>9.2}  {:<8} {}",
                f.calls_estimated,
                sd,
                f.calls_sampled,
                f.total_ms,
                mark,
                f.total_sd,
                f.self_ms,
                self_mark(f.self_ms, f.self_sd_ms),
                share,
                f.min_us,
                f.p50_us,
                percentile_mark(f.p50_us, f.p50_range),
                f.p90_us,
                percentile_mark(f.p90_us, f.p90_range),
                f.p99_us,
                percentile_mark(f.p99_us, f.p99_range),
                f.max_us,
                f.mean_us,
                f.threads.len(),
                f.name
            )
            .unwrap();
        }
        let mut want_edges = String::new();
        for e in &edges {
            writeln!(
                want_edges,
                "{:>12.0} {:>8} {:>10.3}  {} -> {}",
                e.calls_estimated, e.calls_sampled, e.total_ms, e.caller, e.callee
            )
            .unwrap();
        }
        let r = Report {
            functions,
            edges,
            ..test_report(Stacks::default())
        };
        let text = render_text(&r);
        let rows = text.split_once(" function\n").expect("the functions' header").1;
        let (rows, edge_rows) = rows
            .split_once("\ncall edges (caller -> callee): calls(est), sampled, total ms\n")
            .expect("the edges' header");
        assert_eq!(rows, want);
        assert_eq!(edge_rows, want_edges);
    }

    #[test]
    fn the_timing_line_names_the_share_held_and_older_reports_held_forty() {
        let mut r = test_report(Stacks::default());
        r.settings.timing_scale = 0.5;
        r.settings.share = 20;
        assert!(
            render_text(&r).contains(
                "timing: 50.0% of those calls on average, to hold the profiler's share of the program's CPU time near 20%"
            ),
            "{}",
            render_text(&r)
        );
        r.settings.timing_scale = 1.0;
        assert!(!render_text(&r).contains("timing:"), "nothing cut, no line");
        let mut v = serde_json::to_value(&r.settings).unwrap();
        v.as_object_mut().unwrap().remove("share");
        let old: SettingsOut = serde_json::from_value(v).unwrap();
        assert_eq!(old.share, 40, "a report from before the setting");
    }

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Wrap {
        stacks: Stacks,
    }

    #[test]
    fn stacks_are_written_with_a_names_table_and_read_in_both_forms() {
        let s = Wrap {
            stacks: Stacks::from_named([(vec!["main", "[...]", "f"], 3, 1.5), (vec!["main", "g"], 1, 0.5)]),
        };
        assert_eq!(s.stacks.names.len(), 4, "each name once");
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(
            json,
            r#"{"stacks":{"names":["main","[...]","f","g"],"paths":[{"frames":[0,1,2],"samples":3,"self_ms":1.5},{"frames":[0,3],"samples":1,"self_ms":0.5}]}}"#
        );
        assert_eq!(serde_json::from_str::<Wrap>(&json).unwrap(), s);
        let v1 = r#"{"stacks":[{"frames":["main","[...]","f"],"samples":3,"self_ms":1.5},{"frames":["main","g"],"samples":1,"self_ms":0.5}]}"#;
        assert_eq!(serde_json::from_str::<Wrap>(v1).unwrap(), s);
        let row = &s.stacks.paths[0];
        assert_eq!(s.stacks.frames(row).collect::<Vec<_>>(), ["main", "[...]", "f"]);
        let bad = r#"{"stacks":{"names":["main"],"paths":[{"frames":[0,1],"samples":1,"self_ms":0}]}}"#;
        assert!(serde_json::from_str::<Wrap>(bad).is_err());
    }

    #[test]
    fn a_broken_stacks_field_is_named_by_what_is_wrong_in_it() {
        let err = |j: &str| serde_json::from_str::<Wrap>(j).unwrap_err().to_string();
        let e = err(r#"{"stacks":{"names":["main"],"paths":[{"frames":[0],"samples":"x","self_ms":0}]}}"#);
        assert!(e.contains("invalid type: string \"x\", expected u64"), "{e}");
        let e = err(r#"{"stacks":{"names":["main"]}}"#);
        assert!(e.contains("missing field `paths`"), "{e}");
        let e = err(r#"{"stacks":[{"frames":["main"],"self_ms":0}]}"#);
        assert!(e.contains("missing field `samples`"), "{e}");
        let e = err(r#"{"stacks":{"names":["main"],"paths":[{"frames":[3],"samples":1,"self_ms":0}]}}"#);
        assert!(e.contains("a stack's frame indexes past the 1 names"), "{e}");
        let e = err(r#"{"stacks":7}"#);
        assert!(e.contains("expected stacks as {names, paths}"), "{e}");
    }

    #[test]
    fn merged_paths_keep_only_the_names_they_use() {
        let mut st = Stacks::from_named([
            (vec!["main", "g h"], 1, 1.0),
            (vec!["unused"], 0, 0.0),
            (vec!["main", "g_h"], 2, 2.0),
        ]);
        st.paths.remove(1);
        order_and_merge(&mut st);
        // `g h` and `g_h` print alike: one path, under one of the two.
        assert_eq!(st.paths.len(), 1);
        assert_eq!(st.paths[0].samples, 3);
        assert_eq!(st.names.len(), 2, "{:?}", st.names);
        let frames: Vec<&str> = st.frames(&st.paths[0]).collect();
        assert!(frames == ["main", "g h"] || frames == ["main", "g_h"], "{frames:?}");
    }

    #[test]
    fn paths_order_as_their_folded_lines_sort() {
        let names: Vec<Arc<str>> = ["main", "f", "f.cold", "f2", "g h", "g;h", "g_h", "a:b", "a", "ab", "a0"]
            .into_iter()
            .map(Arc::from)
            .collect();
        // Every path of up to three frames over these names.
        let mut paths: Vec<Vec<Arc<str>>> = Vec::new();
        for x in &names {
            paths.push(vec![x.clone()]);
            for y in &names {
                paths.push(vec![x.clone(), y.clone()]);
                for z in names.iter().step_by(3) {
                    paths.push(vec![Arc::from(&**x), y.clone(), z.clone()]);
                }
            }
        }
        let mut st = Stacks::from_named(paths.into_iter().map(|frames| (frames, 1, 1.0)));
        order_and_merge(&mut st);
        let lines: Vec<String> = st
            .paths
            .iter()
            .map(|p| {
                let frames: Vec<String> = st
                    .frames(p)
                    .map(|f| String::from_utf8(folded_name(f).collect()).unwrap())
                    .collect();
                format!("{} 7", frames.join(";"))
            })
            .collect();
        for w in lines.windows(2) {
            assert!(
                w[0] < w[1],
                "{:?} before {:?}: out of order, or alike and not merged",
                w[0],
                w[1]
            );
        }
    }

    /// A profile begun in a running process says what it could not time,
    /// naming the functions whose self time shows it; one begun with the
    /// process says nothing of it.
    #[test]
    fn a_profile_begun_in_a_running_process_says_what_it_missed() {
        // Self time from samples of 0.5 ms.
        let row = |name: &str, total_ms: f64, total_sd: f64, self_ms: f64| FunctionRow {
            name: name.into(),
            total_ms,
            total_sd,
            self_ms,
            cpu_samples: (self_ms / 0.5) as u64,
            ..FunctionRow::default()
        };
        let mut r = Report {
            functions: vec![
                row("luaV_execute", 200.9, 4.1, 799.0),
                row("sort", 744.0, 12.8, 0.0),
                // Past the total by more than its deviations, but not by
                // more than its samples' (one sample).
                row("one_sample", 0.3, 0.1, 0.5),
                // 13 samples, 6.5 ms +- 1.8: not past 3 ms +- 0.5 by two
                // of both.
                row("noisy", 3.0, 0.25, 6.5),
            ],
            ..Report::default()
        };
        assert!(!render_text(&r).contains("began in a running process"));
        r.began_running = true;
        let text = render_text(&r);
        assert!(
            text.contains("began in a running process (attached): calls in flight then"),
            "{text}"
        );
        assert!(text.contains("; self time past the total in luaV_execute\n"), "{text}");
        for f in ["luaV_execute", "a", "b", "c"] {
            r.functions.push(row(f, 1.0, 0.0, 20.0));
        }
        assert!(render_text(&r).contains("in luaV_execute, luaV_execute, a and 2 more"));
    }

    /// The samples' signals are stated with their cost and total where it
    /// was measured, and as uncharged where it was not.
    #[test]
    fn the_sampling_signals_cost_is_stated_where_it_was_measured() {
        let mut cpu = CpuOut {
            interval_us: 500.0,
            samples: 400,
            signal_us: 15.0,
            ..CpuOut::default()
        };
        let text = |cpu: &CpuOut| {
            render_text(&Report {
                cpu: Some(cpu.clone()),
                ..Report::default()
            })
        };
        assert!(text(&cpu).contains(
            "sampling signals: each cost its thread 15.0 us (measured at start), 6.0 ms over the samples, charged to their threads as profiler time: in no duration"
        ));
        // Unmeasured, they are said to be uncharged; no samples, no line.
        cpu.signal_us = 0.0;
        assert!(text(&cpu).contains("sampling signals: what one costs its thread could not be measured"));
        cpu.samples = 0;
        assert!(!text(&cpu).contains("sampling signals"));
        // Samples a program's own handler took are said to have stopped.
        assert!(!text(&cpu).contains("cpu samples stopped"));
        cpu.handler_lost = true;
        assert!(text(&cpu).contains("cpu samples stopped: the program installed its own handler"));
    }

    /// The profiler time the samples saw, against the charge: stated in
    /// the text where it is more than two deviations beyond it, with its
    /// share of the threads' CPU time.
    #[test]
    fn time_the_charges_missed_is_stated_where_the_samples_show_it() {
        let thread = |tid, samples, profiler_samples, charged_ms| CpuThread {
            tid,
            samples,
            profiler_samples,
            charged_ms,
        };
        // 400 samples of 500 us in the profiler's code, 200 ms; 150 ms
        // charged; 2,000 samples in all, 1,000 ms.
        let mut cpu = CpuOut {
            interval_us: 500.0,
            threads: vec![thread(7, 1500, 300, 100.0), thread(8, 500, 100, 50.0)],
            ..CpuOut::default()
        };
        let line = uncharged_line(&cpu).expect("a line");
        assert!(
            line.starts_with("profiler time: 200.0 +- 10.0 ms of the sampled threads' CPU samples in the profiler's code, 150.0 ms charged to them: the 50.0 ms more (5.0% of their CPU time)"),
            "{line}"
        );
        let r = Report {
            cpu: Some(cpu.clone()),
            ..Report::default()
        };
        assert!(render_text(&r).contains(&line));
        // 15 ms more is within two deviations of 10 ms.
        cpu.threads[0].charged_ms = 135.0;
        let line = uncharged_line(&cpu).unwrap();
        assert!(
            line.ends_with("185.0 ms charged to them: the two agree within two deviations"),
            "{line}"
        );
        // Nothing to say without per-thread figures or profiler samples.
        cpu.threads.iter_mut().for_each(|t| t.profiler_samples = 0);
        assert_eq!(uncharged_line(&cpu), None);
        cpu.threads.clear();
        assert_eq!(uncharged_line(&cpu), None);
    }
}
