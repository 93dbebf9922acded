//! The paper's Table 3 on this machine: the latency profiler's slowdown on
//! real programs, against three baselines measured in the same run.
//!
//! Configurations, per program and compiler:
//!
//! | name | binary | preload |
//! | --- | --- | --- |
//! | `plain` | uninstrumented `-O2` | none |
//! | `compiled` | instrumented | none: every hook call runs glibc's empty hook |
//! | `floor` | instrumented | `FASTINST_TOOL=off`: every probe off at discovery |
//! | `profile` | instrumented | the profiler (10 samples per window, 10 ms epochs) |
//! | `all-on` | instrumented | the profiler with every probe on for good (no sampling) |
//!
//! Runs are interleaved round by round (every configuration once per
//! round), so drift in the machine's speed hits all of them alike; a
//! slowdown is the median over rounds of the paired CPU-time ratio, with
//! its 90th percentile beside it. Every run's output must equal the plain
//! build's and its exit status must be 0, or the evaluation stops.

use crate::error::{EvalError, Result};
use crate::measure::{geomean, median, quantile, run_once, Run};
use crate::programs::{Binary, Compiler, Program};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// A way of running a program.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Config {
    /// Uninstrumented build.
    Plain,
    /// Instrumented build as compiled, no runtime.
    Compiled,
    /// Instrumented build, every probe off.
    Floor,
    /// Instrumented build under the profiler.
    Profile,
    /// Instrumented build, profiler measuring every call.
    AllOn,
}

/// All configurations, in run order within a round.
pub const CONFIGS: [Config; 5] = [
    Config::Plain,
    Config::Compiled,
    Config::Floor,
    Config::Profile,
    Config::AllOn,
];

impl Config {
    /// Short name.
    pub fn name(self) -> &'static str {
        match self {
            Config::Plain => "plain",
            Config::Compiled => "compiled",
            Config::Floor => "floor",
            Config::Profile => "profile",
            Config::AllOn => "all-on",
        }
    }

    /// The environment a run in this configuration gets.
    pub fn env(self, lib: &Path, out: &Path) -> Vec<(String, String)> {
        let preload = |tool: &str| {
            vec![
                ("LD_PRELOAD".to_string(), lib.display().to_string()),
                ("FASTINST_TOOL".to_string(), tool.to_string()),
                ("FASTINST_OUT".to_string(), out.display().to_string()),
            ]
        };
        match self {
            Config::Plain | Config::Compiled => Vec::new(),
            Config::Floor => preload("off"),
            Config::Profile => preload("profile"),
            Config::AllOn => {
                let mut e = preload("profile");
                e.push(("FASTINST_PROFILE_SAMPLES".into(), u32::MAX.to_string()));
                e
            }
        }
    }
}

/// The profiler's own account of a run (from its JSON report).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ProfileStats {
    /// Probes discovered.
    pub probes: u64,
    /// Samples per second.
    pub samples_per_s: f64,
    /// Toggles per second.
    pub toggles_per_s: f64,
    /// Milliseconds in handlers.
    pub handler_ms: f64,
    /// Milliseconds of the sampler thread's CPU time.
    pub sampler_ms: f64,
}

/// One configuration's runs.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Series {
    /// Which.
    pub config: Config,
    /// The measured runs, round by round.
    pub runs: Vec<Run>,
    /// Profiler statistics per run (profile and all-on only).
    pub stats: Vec<ProfileStats>,
}

/// One program built by one compiler, every configuration.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Row {
    /// Program name.
    pub program: String,
    /// Compiler.
    pub compiler: Compiler,
    /// Series in [`CONFIGS`] order.
    pub series: Vec<Series>,
}

impl Row {
    fn series(&self, c: Config) -> &Series {
        self.series.iter().find(|s| s.config == c).expect("every config is run")
    }

    /// Median CPU seconds of `c`.
    pub fn cpu(&self, c: Config) -> f64 {
        median(&self.series(c).runs.iter().map(|r| r.cpu_s).collect::<Vec<_>>())
    }

    /// Paired per-round CPU ratios `num / den`: (median, p90).
    pub fn ratio(&self, num: Config, den: Config) -> (f64, f64) {
        let (a, b) = (&self.series(num).runs, &self.series(den).runs);
        // Rounds are aligned from the first: all-on runs in the first ones.
        let r: Vec<f64> = a.iter().zip(b).map(|(x, y)| x.cpu_s / y.cpu_s).collect();
        (median(&r), quantile(&r, 0.9))
    }

    /// Median of a profiler statistic over the runs of `c`.
    pub fn stat(&self, c: Config, f: impl Fn(&ProfileStats) -> f64) -> f64 {
        median(&self.series(c).stats.iter().map(f).collect::<Vec<_>>())
    }
}

/// How to run the evaluation.
#[derive(Clone, Debug)]
pub struct Options {
    /// Measured rounds (after one warm-up round).
    pub rounds: usize,
    /// Rounds that include `all-on` (it is the slowest by far).
    pub all_on_rounds: usize,
    /// Scratch directory.
    pub work: PathBuf,
    /// The preload library.
    pub lib: PathBuf,
}

fn read_stats(dir: &Path) -> Result<ProfileStats> {
    let json = std::fs::read_dir(dir)
        .map_err(EvalError::io(dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "json"))
        .ok_or_else(|| EvalError::WrongResult(format!("{}: the profiler wrote no JSON report", dir.display())))?;
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).map_err(EvalError::io(&json))?)
        .map_err(|e| EvalError::WrongResult(format!("{}: {e}", json.display())))?;
    let o = &v["overhead"];
    Ok(ProfileStats {
        probes: o["probes"].as_u64().unwrap_or(0),
        samples_per_s: o["samples_per_s"].as_f64().unwrap_or(0.0),
        toggles_per_s: o["toggles_per_s"].as_f64().unwrap_or(0.0),
        handler_ms: o["handler_ms"].as_f64().unwrap_or(0.0),
        sampler_ms: o["sampler_ms"].as_f64().unwrap_or(0.0),
    })
}

/// Runs every configuration of `plain` / `inst` (the same program and
/// compiler) for the rounds asked.
pub fn measure_row(opts: &Options, plain: &Binary, inst: &Binary, args: &[String]) -> Result<Row> {
    let tag = format!("{}-{}", plain.program.name(), plain.compiler.name());
    let mut series: Vec<Series> = CONFIGS
        .iter()
        .map(|&config| Series {
            config,
            runs: Vec::new(),
            stats: Vec::new(),
        })
        .collect();
    let mut reference: Option<(u64, u64)> = None;
    for round in 0..=opts.rounds {
        for s in series.iter_mut() {
            let measured = round > 0;
            // all-on is the slowest by far (every call measured) and gets no
            // warm-up round: the others have warmed the caches by then.
            if s.config == Config::AllOn && (round == 0 || round > opts.all_on_rounds) {
                continue;
            }
            let bin = if s.config == Config::Plain { plain } else { inst };
            let out = opts.work.join("out").join(format!("{tag}-{}", s.config.name()));
            let _ = std::fs::remove_dir_all(&out);
            std::fs::create_dir_all(&out).map_err(EvalError::io(&out))?;
            let run = run_once(&bin.path, args, &s.config.env(&opts.lib, &out), &out.join("stdout"))?;
            if run.code != Some(0) {
                return Err(EvalError::WrongResult(format!(
                    "{tag} {}: exit status {:?}\n{}",
                    s.config.name(),
                    run.code,
                    run.stderr
                )));
            }
            let fingerprint = (run.stdout_hash, run.stdout_len);
            match reference {
                None => reference = Some(fingerprint),
                Some(r) if r != fingerprint => {
                    return Err(EvalError::WrongResult(format!(
                        "{tag} {}: output differs from the plain build's ({} bytes vs {})",
                        s.config.name(),
                        run.stdout_len,
                        r.1
                    )))
                }
                Some(_) => {}
            }
            eprintln!(
                "  {tag:<16} {:<9} round {round}{} cpu {:.3} s",
                s.config.name(),
                if measured { "" } else { " (warm-up)" },
                run.cpu_s
            );
            if measured {
                if matches!(s.config, Config::Profile | Config::AllOn) {
                    s.stats.push(read_stats(&out)?);
                }
                s.runs.push(run);
            }
            let _ = std::fs::remove_dir_all(&out);
        }
    }
    Ok(Row {
        program: plain.program.name().into(),
        compiler: plain.compiler,
        series,
    })
}

fn pct(r: f64) -> String {
    if r.is_nan() {
        "n/a".into()
    } else {
        format!("{:+.1}%", (r - 1.0) * 100.0)
    }
}

/// The table as Markdown, with the summary against the targets.
pub fn render_markdown(rows: &[Row], programs: &[Program], header: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{header}\n");
    let _ = writeln!(
        s,
        "| program | build | probes | plain CPU s | compiled vs plain | floor vs plain | **profile vs floor** (p90) | profile vs plain | all-on vs floor | samples/s | toggles/s | handlers % of CPU | sampler % of CPU |"
    );
    let _ = writeln!(
        s,
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    for r in rows {
        let (pf, pf90) = r.ratio(Config::Profile, Config::Floor);
        let share = |ms: f64| ms / 1e3 / r.cpu(Config::Profile) * 100.0;
        let handler = share(r.stat(Config::Profile, |x| x.handler_ms));
        let sampler = share(r.stat(Config::Profile, |x| x.sampler_ms));
        let _ = writeln!(
            s,
            "| {} | {} {} | {:.0} | {:.3} | {} | {} | **{}** ({}) | {} | {} | {:.0} | {:.0} | {:.2} | {:.2} |",
            r.program,
            r.compiler.command(),
            r.compiler.instrument_flag(),
            r.stat(Config::Profile, |x| x.probes as f64),
            r.cpu(Config::Plain),
            pct(r.ratio(Config::Compiled, Config::Plain).0),
            pct(r.ratio(Config::Floor, Config::Plain).0),
            pct(pf),
            pct(pf90),
            pct(r.ratio(Config::Profile, Config::Plain).0),
            pct(r.ratio(Config::AllOn, Config::Floor).0),
            r.stat(Config::Profile, |x| x.samples_per_s),
            r.stat(Config::Profile, |x| x.toggles_per_s),
            handler,
            sampler
        );
    }
    let _ = writeln!(s);
    for c in Compiler::ALL {
        let against = |base: Config| -> Option<(f64, f64)> {
            let v: Vec<f64> = rows
                .iter()
                .filter(|r| r.compiler == c)
                .map(|r| r.ratio(Config::Profile, base).0)
                .collect();
            (!v.is_empty()).then(|| (geomean(&v), v.iter().cloned().fold(f64::MIN, f64::max)))
        };
        let (Some(floor), Some(plain)) = (against(Config::Floor), against(Config::Plain)) else {
            continue;
        };
        // The sled provider's target is against the plain build (its floor
        // is the plain build's speed, issue 6); the -finstrument-functions
        // provider's is against its own floor (issue 5).
        let (flag, (main, mg), (other, og), target) = if matches!(c, Compiler::GccSled | Compiler::ClangSled) {
            (
                "-fpatchable-function-entry=5",
                ("plain", plain),
                ("floor", floor),
                "+3%",
            )
        } else {
            ("-finstrument-functions", ("floor", floor), ("plain", plain), "+2%")
        };
        let _ = writeln!(
            s,
            "- {} {flag} builds: profile vs {main} geomean **{}**, max **{}** (target: geomean <= {target}, max <= +10%); profile vs {other} geomean {}, max {}.",
            c.command(),
            pct(mg.0),
            pct(mg.1),
            pct(og.0),
            pct(og.1)
        );
    }
    let _ = writeln!(s, "\nPrograms:");
    for p in programs {
        let _ = writeln!(s, "- {}: {}", p.name(), p.describe());
    }
    s
}
