//! `fastinst-eval`: the paper's section 8 on this machine (Table 2, Fig. 10,
//! Fig. 11-13, section 8.5, Table 1). See the `fastinst_benches` crate.

use fastinst_benches::eval::{run, Options, Section, FIELD};
use fastinst_benches::programs::work_dir;
use fastinst_benches::{EvalError, Result};
use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "\
usage: fastinst-eval [options]

The paper's evaluation (section 8) on this machine, written as Markdown
(eval.md, also printed), JSON (eval.json) and SVG plots (fig10.svg,
fig11-aa.svg, fig11-ad.svg):
  table2    activation, deactivation and invocation cost in TSC ticks per
            strategy, straddlers separately, both providers, beside a
            static guard `if (flag[id]) fn[id](id)`
  fig10     latency histograms of deactivating then re-activating 20,000
            probes (10% straddlers)
  fig11     calls/s through one hot probe, 1..N executors, a toggler at
            1 kHz..1 MHz (activate<->activate, activate<->deactivate), balance
  inactive  latent cost of an inactive probe in each off form vs an empty loop
  table1    probe initialisation cost as % of run time on bzip2, QuickJS, SQLite

options:
  --quick           fewer passes, shorter runs, gcc builds only in table1
                    (under 2 minutes once the real programs are built)
  --only LIST       comma-separated subset of the sections above
  --threads N       most executor threads in fig11 (default: CPUs online)
  --field N         functions in the generated -finstrument-functions field
                    (default 16000: 32000 sites, 2000 of them straddlers;
                    fewer build faster and fig10 then toggles fewer probes)
  --out DIR         report directory (default: target/fastinst-eval/report)
  --work DIR        builds and scratch (default: target/fastinst-eval)
  --lib PATH        libfastinst.so (default: as `fastinst run` finds it)
  -h, --help        this text
";

fn parse(argv: &[String]) -> Result<Option<Options>> {
    let usage = |m: String| EvalError::Usage(m);
    let mut o = Options {
        quick: false,
        sections: Section::ALL.to_vec(),
        work: PathBuf::from("target/fastinst-eval"),
        out: PathBuf::new(),
        lib: PathBuf::new(),
        max_threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        field: FIELD,
        command: std::iter::once("fastinst-eval".to_string())
            .chain(argv.iter().cloned())
            .collect::<Vec<_>>()
            .join(" "),
    };
    let (mut out, mut lib) = (None, None);
    let mut it = argv.iter();
    while let Some(opt) = it.next() {
        let mut value = || it.next().cloned().ok_or_else(|| usage(format!("{opt} needs a value")));
        match opt.as_str() {
            "-h" | "--help" => return Ok(None),
            "--quick" => o.quick = true,
            "--out" => out = Some(PathBuf::from(value()?)),
            "--work" => o.work = value()?.into(),
            "--lib" => lib = Some(PathBuf::from(value()?)),
            "--threads" => {
                let v = value()?;
                o.max_threads = v
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=256).contains(n))
                    .ok_or_else(|| usage(format!("--threads: `{v}` is not a number from 1 to 256")))?;
            }
            "--field" => {
                let v = value()?;
                o.field = v
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (10..=100_000).contains(n))
                    .ok_or_else(|| usage(format!("--field: `{v}` is not a number from 10 to 100000")))?;
            }
            "--only" => {
                o.sections = value()?
                    .split(',')
                    .map(|name| {
                        Section::ALL
                            .into_iter()
                            .find(|s| s.name() == name)
                            .ok_or_else(|| usage(format!("--only: no section `{name}`")))
                    })
                    .collect::<Result<_>>()?
            }
            other => return Err(usage(format!("unknown option {other}"))),
        }
    }
    o.lib = fastinst_cli::library::find(lib.as_deref()).map_err(|e| EvalError::Tool(e.to_string()))?;
    o.work = work_dir(&o.work)?;
    o.out = out.unwrap_or_else(|| o.work.join("report"));
    Ok(Some(o))
}

fn main() -> ExitCode {
    fastinst_benches::harness_main("fastinst-eval", USAGE, parse, |o| {
        let r = run(&o)?;
        print!("{}", r.markdown());
        eprintln!("report written to {}", o.out.display());
        Ok(())
    })
}
