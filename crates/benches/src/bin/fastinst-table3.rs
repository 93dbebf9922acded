//! `fastinst-table3`: the latency profiler on real programs (the paper's
//! Table 3) on this machine. See the `fastinst_benches` crate.

use fastinst_benches::programs::{build_all, installed, work_dir};
use fastinst_benches::table3::{measure_row, render_markdown, Options};
use fastinst_benches::{sources, Argv, CommonArgs, EvalError, Result};
use std::process::ExitCode;

const USAGE: &str = concat!(
    "\
usage: fastinst-table3 [options]

The latency profiler on real programs (bzip2, QuickJS, SQLite; sources from
crates.io via cargo), each built with gcc -finstrument-functions and clang
-finstrument-functions-after-inlining, against the plain build, the build
as compiled, and the all-off floor, in the same run. Prints a Markdown table.

options:
  --quick             3 rounds, all-on in 1 (default: 7 rounds, all-on in 1)
  --rounds N          measured rounds (one warm-up round comes first)
  --all-on-rounds N   rounds that include the all-on configuration (0: none)
",
    fastinst_benches::common_options_usage!(),
    "  --lib PATH          libfastinst.so (default: as `fastinst run` finds it)
  --json PATH         also write every run as JSON
  -h, --help          this text
"
);

struct Args {
    rounds: usize,
    all_on_rounds: usize,
    common: CommonArgs,
}

fn parse(argv: &[String]) -> Result<Option<Args>> {
    let mut a = Args {
        rounds: 7,
        all_on_rounds: 1,
        common: CommonArgs::default(),
    };
    let mut argv = Argv::new(argv);
    while let Some(opt) = argv.next_opt() {
        match opt {
            "-h" | "--help" => return Ok(None),
            "--quick" => (a.rounds, a.all_on_rounds) = (3, 1),
            "--rounds" => a.rounds = argv.number(opt)?.max(1),
            "--all-on-rounds" => a.all_on_rounds = argv.number(opt)?,
            opt if a.common.take(opt, &mut argv)? => {}
            other => return Err(EvalError::Usage(format!("unknown option {other}"))),
        }
    }
    a.all_on_rounds = a.all_on_rounds.min(a.rounds);
    Ok(Some(a))
}

fn run(a: Args) -> Result<()> {
    let lib = fastinst_cli::library::find(a.common.lib.as_deref()).map_err(|e| EvalError::Tool(e.to_string()))?;
    let work = work_dir(&a.common.work)?;
    let compilers = installed(&a.common.compilers, "its builds are left out");
    let srcs = sources::fetch(&work)?;
    let bins = build_all(&work, &srcs, &a.common.programs, &compilers)?;
    let opts = Options {
        rounds: a.rounds,
        all_on_rounds: a.all_on_rounds,
        work: work.clone(),
        lib,
    };
    let mut rows = Vec::new();
    for &p in &a.common.programs {
        let args = p.workload_repeated(&work, a.common.repeat)?;
        for &c in &compilers {
            let find = |inst: bool| {
                bins.iter()
                    .find(|b| b.program == p && b.compiler == c && b.instrumented == inst)
                    .expect("built above")
            };
            rows.push(measure_row(&opts, find(false), find(true), &args)?);
        }
    }
    let header = format!(
        "Profiler slowdown in CPU time (user + system), {} rounds ({} with all-on) after a warm-up, {}.",
        a.rounds,
        a.all_on_rounds,
        fastinst_benches::provenance("fastinst-table3")
    );
    print!("{}", render_markdown(&rows, &a.common.programs, &header));
    if let Some(p) = &a.common.json {
        fastinst_benches::write_json(p, &rows)?;
    }
    Ok(())
}

fn main() -> ExitCode {
    fastinst_benches::harness_main("fastinst-table3", USAGE, parse, run)
}
