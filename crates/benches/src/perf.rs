//! The self-time reference: perf's CPU samples of the plain build.
//!
//! A share read from samples is itself an estimate, and the program's own
//! time moves between identical runs: QuickJS's property lookup took 16% of
//! one run and 23% of the next, on one binary, with address randomisation
//! off. So the plain build is recorded [`RUNS`] times at [`HZ`] samples a
//! second, the reference is the mean of the runs' shares, and each run's
//! share is kept: the spread between them is what the plain program alone
//! does, which no profile can be asked to beat.
//!
//! The instrumented build is recorded the same way with every probe off
//! (`FASTINST_TOOL=off`, the runtime's own samples left out):
//! `-finstrument-functions` changes what the compiler inlines (gcc's
//! bzip2 build keeps `mainGtU` out of line, which the plain build folds
//! into `mainSort`), so only that run has the profiled binary's functions.

use crate::aliases::Aliases;
use crate::error::{EvalError, Result};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

/// Runs of the plain build under perf.
pub const RUNS: usize = 3;
/// perf's sampling rate (Hz of CPU time): in a one-second run a 20% share
/// then has a sampling deviation under half a point.
pub const HZ: u32 = 10_000;

/// perf's self shares of a plain build, over several runs.
#[derive(Debug, Clone, Default)]
pub struct PerfShares {
    /// Each run's shares (percent of user-space samples), by one name per
    /// function ([`Aliases::canonical`]).
    pub runs: Vec<BTreeMap<String, f64>>,
    /// The names of the functions of the program's libraries.
    pub aliases: Aliases,
}

/// The self-time references of one instrumented build.
#[derive(Debug, Clone, Default)]
pub struct SelfReferences {
    /// The plain build's runs.
    pub plain: PerfShares,
    /// The instrumented build's runs with every probe off, where they could
    /// be recorded.
    pub off: Option<PerfShares>,
}

impl PerfShares {
    /// Records `bin args` [`RUNS`] times under `perf record -e cpu-clock`.
    pub fn record(work: &Path, bin: &Path, args: &[String]) -> Result<PerfShares> {
        PerfShares::record_with(work, bin, args, &[])
    }

    /// Records the instrumented `bin args` [`RUNS`] times with `lib`
    /// preloaded and every probe off.
    pub fn record_off(work: &Path, bin: &Path, args: &[String], lib: &Path) -> Result<PerfShares> {
        PerfShares::record_with(work, bin, args, &off_env(lib))
    }

    fn record_with(work: &Path, bin: &Path, args: &[String], env: &[String]) -> Result<PerfShares> {
        let aliases = Aliases::of_program(bin);
        let mut runs = Vec::new();
        for i in 0..RUNS {
            let text = record_once(
                work,
                bin,
                args,
                env,
                i,
                &["-F", &HZ.to_string()],
                &["--no-children", "--sort", "dso,sym"],
            )?;
            runs.push(parse_report(&text, &aliases));
        }
        Ok(PerfShares { runs, aliases })
    }

    /// Each run's share of `name` (a canonical name), 0 where a run has no
    /// sample of it.
    pub fn of(&self, name: &str) -> Vec<f64> {
        self.runs.iter().map(|r| r.get(name).copied().unwrap_or(0.0)).collect()
    }

    /// The mean share of every function sampled in any run.
    pub fn mean(&self) -> BTreeMap<String, f64> {
        let mut m: BTreeMap<String, f64> = BTreeMap::new();
        for r in &self.runs {
            for (k, v) in r {
                *m.entry(k.clone()).or_default() += v / self.runs.len() as f64;
            }
        }
        m
    }
}

/// The environment of a run with `lib` preloaded and every probe off.
pub(crate) fn off_env(lib: &Path) -> [String; 2] {
    [format!("LD_PRELOAD={}", lib.display()), "FASTINST_TOOL=off".to_string()]
}

/// Whether perf can record here.
pub fn available() -> bool {
    Command::new("perf")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// One `perf record -e cpu-clock` of `bin args` with `record` options
/// besides (through `env` with `env` set, so that perf itself runs without
/// it), as the text of `perf report --stdio -q` with `report` options.
pub(crate) fn record_once(
    work: &Path,
    bin: &Path,
    args: &[String],
    env: &[String],
    run: usize,
    record: &[&str],
    report: &[&str],
) -> Result<String> {
    let data = work.join(format!(
        "{}.{run}.perf.data",
        bin.file_name().and_then(|n| n.to_str()).unwrap_or("run")
    ));
    let rec = Command::new("perf")
        .args(["record", "-q", "-e", "cpu-clock"])
        .args(record)
        .arg("-o")
        .arg(&data)
        .arg("--")
        .args(if env.is_empty() {
            Vec::new()
        } else {
            vec!["env".to_string()]
        })
        .args(env)
        .arg(bin)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map_err(|e| EvalError::Tool(format!("perf record: {e}")))?;
    if !rec.success() {
        return Err(EvalError::Tool(format!("perf record of {} failed", bin.display())));
    }
    let out = Command::new("perf")
        .args(["report", "--stdio", "-q"])
        .args(report)
        .arg("-i")
        .arg(&data)
        .output()
        .map_err(|e| EvalError::Tool(format!("perf report: {e}")))?;
    let _ = std::fs::remove_file(&data);
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Parses `perf report --stdio --sort dso,sym -q` lines
/// (`  95.53%  bzip2  [.] compress`) into shares of the program's
/// user-space samples, by canonical name. Kernel symbols (`[k]`) and
/// fastinst's own library are left out, as they are from the profile.
pub fn parse_report(text: &str, aliases: &Aliases) -> BTreeMap<String, f64> {
    let mut m = BTreeMap::new();
    let mut left_out = 0.0;
    for line in text.lines() {
        let line = line.trim();
        let Some((pct, rest)) = line.split_once('%') else {
            continue;
        };
        let Ok(pct) = pct.trim().parse::<f64>() else { continue };
        let (dso, sym) = match rest.split_once("[.]") {
            Some((dso, sym)) => (dso.trim(), Some(sym.trim())),
            None => (rest.trim(), None),
        };
        match sym {
            Some(_) if dso.starts_with("libfastinst") => left_out += pct,
            Some(sym) => *m.entry(aliases.canonical(sym)).or_default() += pct,
            None if rest.contains("[k]") => left_out += pct,
            None => {}
        }
    }
    // Shares of the user-space samples, as the profile's are of the
    // program's (its handler runs in user space).
    let user = 100.0 - left_out;
    if user > 0.0 {
        for v in m.values_mut() {
            *v *= 100.0 / user;
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perf_lines_parse_into_user_shares() {
        let text = "    40.00%  demo  [.] compress\n    20.00%  demo  [.] render.constprop.0\n    \
                    20.00%  [kernel.kallsyms]  [k] finish_task_switch\n    20.00%  libfastinst.so  [.] fastinst::start\n";
        let m = parse_report(text, &Aliases::default());
        assert!((m["compress"] - 66.666).abs() < 0.01, "{m:?}");
        assert!((m["render"] - 33.333).abs() < 0.01, "{m:?}");
        assert!(!m.contains_key("finish_task_switch"));
        assert!(!m.contains_key("fastinst::start"));
    }

    #[test]
    fn aliases_sum_into_one_function_and_runs_average() {
        let aliases = Aliases::from_symbols([
            (0, 0x10, "free".to_string()),
            (0, 0x10, "cfree@GLIBC_2.2.5".to_string()),
        ]);
        let a = parse_report(
            "  30.00%  libc.so.6  [.] free\n  10.00%  libc.so.6  [.] cfree@GLIBC_2.2.5\n  60.00%  p  [.] main\n",
            &aliases,
        );
        assert!((a["free"] - 40.0).abs() < 1e-9, "{a:?}");
        let b = parse_report("  20.00%  libc.so.6  [.] free\n  80.00%  p  [.] main\n", &aliases);
        let p = PerfShares {
            runs: vec![a, b],
            aliases,
        };
        assert_eq!(p.of("free"), vec![40.0, 20.0]);
        assert!((p.mean()["free"] - 30.0).abs() < 1e-9);
        assert!((p.mean()["main"] - 70.0).abs() < 1e-9);
        assert_eq!(p.of("absent"), vec![0.0, 0.0]);
    }
}
