//! `fastinst-accuracy`: the latency profiler's numbers against exact
//! references on real programs. See `fastinst_benches::accuracy`.

use fastinst_benches::accuracy::{self, Options};
use fastinst_benches::children::Children;
use fastinst_benches::perf::{PerfShares, SelfReferences};
use fastinst_benches::programs::{build_all, installed, work_dir, Program, UPSTREAM_PROGRAMS};
use fastinst_benches::{sources, Argv, CommonArgs, EvalError, Result};
use std::collections::BTreeMap;
use std::process::ExitCode;

const USAGE: &str = concat!(
    "\
usage: fastinst-accuracy [options]

Runs each program's instrumented build under the count tool (exact calls),
the trace tool (every call timed) and the latency profiler, and its plain
build alone and under perf (CPU samples), on the same workload; prints,
per program and build, how many of the profiler's numbers are within the
targets: calls ±15% of exact (functions with >= 1% of calls), self share
±2 points of perf's mean over 3 runs of the plain build (functions above
2%; a second column allows the plain runs' own range, a third compares
with the instrumented build's probes-off runs, whose functions are the
profiled ones where -finstrument-functions changed the inlining),
inclusive time of main and thread bodies ±5% of the median of their
traces (one before each profiled run), p50 and p99 ±10% of the trace
(functions of >= 1 us); and, with no fixed target, whether each checked
function's inclusive time is within 3 of its stated deviations of the
trace's, and of perf's inclusive CPU time (call graphs) of the
probes-off build (single-threaded programs).
Programs: bzip2, quickjs, sqlite, lua, zstd (sources from crates.io; the
default) and demo (fastinst's bundled example).

options:
  --runs N            profiler runs per configuration (default 3)
  --detail            also print every function compared
  --env K=V           extra environment for the profiler runs (repeatable)
",
    fastinst_benches::common_options_usage!(),
    "  --lib PATH          libfastinst.so (default: as `fastinst run` finds it)
  --json PATH         also write every comparison as JSON
  -h, --help          this text
"
);

struct Args {
    runs: usize,
    detail: bool,
    env: Vec<(String, String)>,
    common: CommonArgs,
}

fn parse(argv: &[String]) -> Result<Option<Args>> {
    let mut a = Args {
        runs: 3,
        detail: false,
        env: Vec::new(),
        common: CommonArgs {
            programs: UPSTREAM_PROGRAMS.to_vec(),
            ..CommonArgs::default()
        },
    };
    let mut argv = Argv::new(argv);
    while let Some(opt) = argv.next_opt() {
        match opt {
            "-h" | "--help" => return Ok(None),
            "--runs" => a.runs = argv.number(opt)?.max(1),
            "--detail" => a.detail = true,
            "--env" => {
                let v = argv.value(opt)?;
                let (k, v) = v
                    .split_once('=')
                    .ok_or_else(|| EvalError::Usage(format!("--env: `{v}` is not K=V")))?;
                a.env.push((k.to_string(), v.to_string()));
            }
            opt if a.common.take(opt, &mut argv)? => {}
            other => return Err(EvalError::Usage(format!("unknown option {other}"))),
        }
    }
    Ok(Some(a))
}

fn run(a: Args) -> Result<()> {
    let lib = fastinst_cli::library::find(a.common.lib.as_deref()).map_err(|e| EvalError::Tool(e.to_string()))?;
    let work = work_dir(&a.common.work)?;
    let compilers = installed(&a.common.compilers, "its builds are left out");
    let srcs = sources::fetch(&work)?;
    let bins = build_all(&work, &srcs, &a.common.programs, &compilers)?;
    let perf = fastinst_benches::perf::available();
    if !perf {
        eprintln!("perf not found: self shares are not checked (Debian: apt-get install linux-perf)");
    }
    let opts = Options {
        lib,
        work: work.clone(),
        runs: a.runs,
        profile_env: a.env.clone(),
    };
    let mut configs = Vec::new();
    let mut perf_by_plain: BTreeMap<String, PerfShares> = BTreeMap::new();
    for &p in &a.common.programs {
        let args = p.workload_repeated(&work, a.common.repeat)?;
        for &c in &compilers {
            let find = |inst: bool| {
                bins.iter()
                    .find(|b| b.program == p && b.compiler == c && b.instrumented == inst)
                    .expect("built above")
            };
            let plain = find(false);
            let key = plain.path.display().to_string();
            if perf && !perf_by_plain.contains_key(&key) {
                match PerfShares::record(&work, &plain.path, &args) {
                    Ok(m) => {
                        perf_by_plain.insert(key.clone(), m);
                    }
                    Err(e) => eprintln!("{e}: self shares of {} are not checked", p.name()),
                }
            }
            let inst = find(true);
            let refs = perf_by_plain.get(&key).map(|plain| SelfReferences {
                plain: plain.clone(),
                off: PerfShares::record_off(&work, &inst.path, &args, &opts.lib)
                    .map_err(|e| eprintln!("{e}: the probes-off shares of {} are left out", p.name()))
                    .ok(),
            });
            let children = if perf {
                Children::record_off(&work, &inst.path, &args, &opts.lib)
                    .map_err(|e| eprintln!("{e}: perf's inclusive times of {} are left out", p.name()))
                    .ok()
            } else {
                None
            };
            eprintln!("measuring {} {}", p.name(), c.name());
            let cfg = accuracy::measure(&opts, plain, inst, &args, refs.as_ref(), children.as_ref())?;
            if a.detail {
                eprint!("{}", accuracy::render_detail(&cfg));
            }
            configs.push(cfg);
        }
    }
    let header = format!(
        "{}\n\nprofiler runs per configuration: {}; programs: {}\n",
        fastinst_benches::provenance("fastinst-accuracy"),
        a.runs,
        a.common
            .programs
            .iter()
            .map(|p: &Program| p.name())
            .collect::<Vec<_>>()
            .join(", ")
    );
    print!("{}", accuracy::render_markdown(&configs, &header));
    if a.detail {
        for c in &configs {
            print!("{}", accuracy::render_detail(c));
        }
    }
    if let Some(path) = &a.common.json {
        fastinst_benches::write_json(path, &configs)?;
    }
    Ok(())
}

fn main() -> ExitCode {
    fastinst_benches::harness_main("fastinst-accuracy", USAGE, parse, run)
}
