//! `fastinst-shares`: where the profiled runs of Table 3's programs spend
//! their CPU time, as shares of each run's own samples (see
//! `fastinst_benches::shares`).

use fastinst_benches::measure::geomean;
use fastinst_benches::programs::{build_all, installed, named, work_dir};
use fastinst_benches::shares::{Objects, Saved, SavedRow, Shares, PHASES};
use fastinst_benches::table3::Config;
use fastinst_benches::{sources, Argv, CommonArgs, EvalError, Result};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

const USAGE: &str = concat!(
    "\
usage: fastinst-shares [options]

Records runs of Table 3's programs with `perf record -g` (cpu-clock) and
charges every CPU sample to the program or to a part of the runtime
(handlers, sampler, reports, start-up) by its call chain: the runtime's
direct cost as a share of each run, which the machine's speed between runs
does not move. Needs perf (Debian: apt-get install linux-perf) and
builds its own libfastinst.so with frame pointers. Prints a Markdown table.

options:
  --runs N            runs per configuration (default 5)
  --configs LIST      subset of plain,floor,profile (default: all three)
  --freq HZ           samples per second (default 4000)
",
    fastinst_benches::common_options_usage!(),
    "  --lib PATH          a libfastinst.so built with frame pointers (default:
                      build one under WORK/fp-target)
  --json PATH         also write the shares as JSON
  --from-json PATH    print the tables of an earlier run's JSON instead
  -h, --help          this text
"
);

struct Args {
    runs: usize,
    common: CommonArgs,
    configs: Vec<Config>,
    freq: u32,
    from_json: Option<PathBuf>,
}

/// The configurations this harness records.
const RECORDED: [Config; 3] = [Config::Plain, Config::Floor, Config::Profile];

fn parse(argv: &[String]) -> Result<Option<Args>> {
    let mut a = Args {
        runs: 5,
        common: CommonArgs::default(),
        configs: RECORDED.to_vec(),
        freq: 4000,
        from_json: None,
    };
    let mut argv = Argv::new(argv);
    while let Some(opt) = argv.next_opt() {
        match opt {
            "-h" | "--help" => return Ok(None),
            "--runs" => a.runs = argv.number(opt)?.max(1),
            "--freq" => a.freq = argv.number(opt)?.clamp(100, 50_000) as u32,
            "--from-json" => a.from_json = Some(argv.value(opt)?.into()),
            opt if a.common.take(opt, &mut argv)? => {}
            "--configs" => a.configs = named(&argv.value(opt)?, opt, &RECORDED, Config::name)?,
            other => return Err(EvalError::Usage(format!("unknown option {other}"))),
        }
    }
    Ok(Some(a))
}

/// `libfastinst.so` with frame pointers, so that perf can walk from a
/// handler's innermost function out to the hook that called it.
fn frame_pointer_library(work: &Path) -> Result<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let target = work.join("fp-target");
    let flags = match std::env::var("RUSTFLAGS") {
        Ok(f) if !f.is_empty() => format!("{f} -C force-frame-pointers=yes"),
        _ => "-C force-frame-pointers=yes".to_string(),
    };
    eprintln!("building libfastinst.so with frame pointers under {}", target.display());
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(&root)
        .args(["build", "--release", "-p", "fastinst", "--target-dir"])
        .arg(&target)
        .env("RUSTFLAGS", flags)
        .status()
        .map_err(|e| EvalError::Tool(format!("cargo: {e}")))?;
    if !status.success() {
        return Err(EvalError::Tool(format!(
            "cargo build of the frame-pointer library: {status}"
        )));
    }
    Ok(target.join("release/libfastinst.so"))
}

fn perf_available() -> Result<()> {
    if fastinst_benches::perf::available() {
        Ok(())
    } else {
        Err(EvalError::Tool(
            "perf not found or not working (Debian: apt-get install linux-perf)".into(),
        ))
    }
}

/// One recorded run, its samples added to `shares`.
fn record(
    bin: &Path,
    args: &[String],
    env: &[(String, String)],
    out: &Path,
    freq: u32,
    objects: &Objects,
    shares: &mut Shares,
) -> Result<()> {
    let data = out.join("perf.data");
    let stdout = std::fs::File::create(out.join("stdout")).map_err(|e| EvalError::Io {
        path: out.join("stdout"),
        source: e,
    })?;
    let mut cmd = Command::new("perf");
    cmd.args(["record", "-q", "-e", "cpu-clock", "-g", "-F", &freq.to_string(), "-o"])
        .arg(&data)
        .arg("--")
        .arg(bin)
        .args(args)
        .stdout(Stdio::from(stdout))
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let o = cmd.output().map_err(|e| EvalError::Tool(format!("perf record: {e}")))?;
    if !o.status.success() {
        return Err(EvalError::WrongResult(format!(
            "{} under perf: {}\n{}",
            bin.display(),
            o.status,
            String::from_utf8_lossy(&o.stderr)
        )));
    }
    let script = Command::new("perf")
        .args(["script", "-F", "pid,tid,ip,sym,dso", "-i"])
        .arg(&data)
        .stderr(Stdio::null())
        .output()
        .map_err(|e| EvalError::Tool(format!("perf script: {e}")))?;
    let read = shares.add_script(&String::from_utf8_lossy(&script.stdout), objects);
    if read == 0 {
        return Err(EvalError::Tool(format!(
            "perf script read no samples from {}",
            data.display()
        )));
    }
    shares.runs += 1;
    Ok(())
}

fn run(a: Args) -> Result<()> {
    if let Some(p) = &a.from_json {
        let saved: Saved = fastinst_benches::read_json(p, "fastinst-shares")?;
        print!("{}", render(&saved));
        return Ok(());
    }
    perf_available()?;
    let work = work_dir(&a.common.work)?;
    let lib = match &a.common.lib {
        Some(l) => l.clone(),
        None => frame_pointer_library(&work)?,
    };
    let runtime = lib
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| EvalError::Usage(format!("--lib {}: not a file", lib.display())))?;
    let compilers = installed(&a.common.compilers, "its builds are left out");
    let srcs = sources::fetch(&work)?;
    let bins = build_all(&work, &srcs, &a.common.programs, &compilers)?;
    let mut rows = Vec::new();
    for &p in &a.common.programs {
        let args = p.workload_repeated(&work, a.common.repeat)?;
        for &c in &compilers {
            for &config in &a.configs {
                let bin = bins
                    .iter()
                    .find(|b| b.program == p && b.compiler == c && b.instrumented == (config != Config::Plain))
                    .expect("built above");
                let program = bin
                    .path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let objects = Objects {
                    runtime: runtime.clone(),
                    program,
                };
                let out = work
                    .join("out")
                    .join(format!("shares-{}-{}-{}", p.name(), c.name(), config.name()));
                let mut shares = Shares::default();
                for i in 0..a.runs {
                    let _ = std::fs::remove_dir_all(&out);
                    std::fs::create_dir_all(&out).map_err(|e| EvalError::Io {
                        path: out.clone(),
                        source: e,
                    })?;
                    record(
                        &bin.path,
                        &args,
                        &config.env(&lib, &out),
                        &out,
                        a.freq,
                        &objects,
                        &mut shares,
                    )?;
                    eprintln!(
                        "  {}-{} {} run {}: {} samples so far",
                        p.name(),
                        c.name(),
                        config.name(),
                        i + 1,
                        shares.total()
                    );
                }
                let _ = std::fs::remove_dir_all(&out);
                rows.push(SavedRow {
                    program: p.name().into(),
                    build: c.name().into(),
                    config: config.name().into(),
                    shares,
                });
            }
        }
    }
    let saved = Saved {
        header: format!(
            "CPU samples by part of the run, % of each configuration's samples ({} runs each, perf cpu-clock at {} Hz, call chains by frame pointers), {}.",
            a.runs,
            a.freq,
            fastinst_benches::provenance("fastinst-shares")
        ),
        rows,
    };
    print!("{}", render(&saved));
    if let Some(p) = &a.common.json {
        fastinst_benches::write_json(p, &saved)?;
    }
    Ok(())
}

fn render(saved: &Saved) -> String {
    let rows = &saved.rows;
    let mut s = format!("{}\n\n", saved.header);
    s.push_str("| program | build | config | samples |");
    for p in PHASES {
        let _ = write!(s, " {} |", p.name());
    }
    s.push_str(" **runtime / rest** |\n| --- | --- | --- | ---: |");
    for _ in PHASES {
        s.push_str(" ---: |");
    }
    s.push_str(" ---: |\n");
    for r in rows {
        let _ = write!(
            s,
            "| {} | {} | {} | {} |",
            r.program,
            r.build,
            r.config,
            r.shares.total()
        );
        for p in PHASES {
            let _ = write!(s, " {:.2} |", r.shares.pct(p));
        }
        let _ = writeln!(s, " **{:+.2}%** |", r.shares.direct_slowdown_pct());
    }
    // The direct cost each target is about: a `-finstrument-functions`
    // build's profile against its floor (which pays start-up too), a sled
    // build's against the plain build (which pays nothing).
    s.push_str("\nDirect cost of the profile runs: `-finstrument-functions` builds over their floor (handlers, sampler, reports over the program and start-up), sled builds over the plain build (every runtime part over the program); the sleds' NOPs run inside the program's share and are not in it.\n\n| build | ");
    let programs: Vec<&str> = rows.iter().fold(Vec::new(), |mut v, r| {
        if !v.contains(&r.program.as_str()) {
            v.push(&r.program);
        }
        v
    });
    for p in &programs {
        let _ = write!(s, "{p} | ");
    }
    s.push_str("geomean |\n| --- |");
    for _ in 0..=programs.len() {
        s.push_str(" ---: |");
    }
    s.push('\n');
    let builds: Vec<&str> = rows.iter().fold(Vec::new(), |mut v, r| {
        if !v.contains(&r.build.as_str()) {
            v.push(&r.build);
        }
        v
    });
    for b in builds {
        let costs: Vec<f64> = programs.iter().filter_map(|p| saved.direct_cost(p, b)).collect();
        if costs.len() != programs.len() {
            continue;
        }
        let _ = write!(s, "| {b} |");
        for c in &costs {
            let _ = write!(s, " {c:+.2}% |");
        }
        let g = geomean(&costs.iter().map(|c| 1.0 + c / 100.0).collect::<Vec<_>>());
        let _ = writeln!(s, " **{:+.2}%** |", (g - 1.0) * 100.0);
    }
    s
}

fn main() -> ExitCode {
    fastinst_benches::harness_main("fastinst-shares", USAGE, parse, run)
}
