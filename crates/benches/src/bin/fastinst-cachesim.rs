//! `fastinst-cachesim`: the sleds' NOPs and the runtime's indirect cost on
//! Table 3's programs, counted by Valgrind's callgrind (see
//! `fastinst_benches::cachesim`).

use fastinst_benches::cachesim::{self, Counts, Sides};
use fastinst_benches::measure::{geomean, run_once};
use fastinst_benches::programs::{build_all, installed, work_dir, Binary, Compiler, Program};
use fastinst_benches::shares::Saved as SharesRun;
use fastinst_benches::table3::Config;
use fastinst_benches::{sources, Argv, CommonArgs, EvalError, Result};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const USAGE: &str = concat!(
    "\
usage: fastinst-cachesim [options]

Runs Table 3's programs under Valgrind's callgrind with its cache
simulation (plain build, every probe off, profiler) and compares the
program's own instructions and cache misses between them (the C library's
string and allocator functions count as the runtime's where the runtime
called them, as fastinst-shares counts them): the sleds' NOPs (floor over plain) and the runtime's
indirect cost (profile over floor), which CPU samples cannot see and runs
on a noisy machine cannot resolve. Counts become cycles by KCachegrind's
estimate (Ir + 10 L1 misses + 100 LL misses). The profiler's epoch is
stretched by the program's slowdown under Valgrind so that it samples as
often per unit of the program's work as it does natively. Needs valgrind
(Debian: apt-get install valgrind). Prints Markdown tables.

options:
  --jobs N            simulations at a time (default: CPUs)
  --native-runs N     native runs of each plain build, for the slowdown
                      under Valgrind (default 3; the fastest counts)
",
    fastinst_benches::common_options_usage!(),
    "  --lib PATH          libfastinst.so (default: as `fastinst run` finds it)
  --shares PATH       a `fastinst-shares --json` file: adds the direct cost
                      it measured and prints the three parts' sum
  --json PATH         also write the counts as JSON
  --from-json PATH    print the tables of an earlier run's JSON instead
  -h, --help          this text
"
);

struct Args {
    common: CommonArgs,
    jobs: usize,
    native_runs: usize,
    shares: Option<PathBuf>,
    from_json: Option<PathBuf>,
}

fn parse(argv: &[String]) -> Result<Option<Args>> {
    let mut a = Args {
        common: CommonArgs::default(),
        jobs: std::thread::available_parallelism().map_or(2, |n| n.get()),
        native_runs: 3,
        shares: None,
        from_json: None,
    };
    let mut argv = Argv::new(argv);
    while let Some(opt) = argv.next_opt() {
        match opt {
            "-h" | "--help" => return Ok(None),
            opt if a.common.take(opt, &mut argv)? => {}
            "--jobs" => a.jobs = argv.number(opt)?.max(1),
            "--native-runs" => a.native_runs = argv.number(opt)?.max(1),
            "--shares" => a.shares = Some(argv.value(opt)?.into()),
            "--from-json" => a.from_json = Some(argv.value(opt)?.into()),
            other => return Err(EvalError::Usage(format!("unknown option {other}"))),
        }
    }
    Ok(Some(a))
}

/// One simulated run.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
struct Simulated {
    sides: Sides,
    /// Wall-clock seconds under Valgrind.
    wall_s: f64,
    /// Samples the profiler reported (profile runs).
    samples: Option<u64>,
}

/// One program and build's three runs.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
struct Row {
    program: String,
    build: String,
    /// The plain build's slowdown under Valgrind, by which the profiled
    /// run's epoch was stretched.
    slowdown: f64,
    /// Samples of a native profiled run, beside the simulated run's.
    native_samples: Option<u64>,
    plain: Simulated,
    floor: Simulated,
    profile: Simulated,
}

impl Row {
    fn is_sled(&self) -> bool {
        self.build.ends_with("-sled")
    }

    /// The sleds' NOPs and the instrumented code's other differences:
    /// the program's side, floor over plain, % of plain.
    fn nops_pct(&self) -> f64 {
        (self.floor.sides.program_own() - self.plain.sides.program_own()).pct_of(&self.plain.sides.program_own())
    }

    /// The runtime's indirect cost: the program's side, profile over
    /// floor, % of the baseline of the build's target.
    fn indirect_pct(&self) -> f64 {
        (self.profile.sides.program_own() - self.floor.sides.program_own()).pct_of(&self.base())
    }

    /// [`Row::indirect_pct`] at the native run's sampling rate: the
    /// simulated run's epoch is stretched by the plain build's slowdown,
    /// which matches the native rate only roughly (the profiled run slows
    /// differently under Valgrind), and what the handlers and the sampler
    /// evict grows with how often they run.
    fn indirect_at_native_rate_pct(&self) -> f64 {
        match (self.native_samples, self.profile.samples) {
            (Some(n), Some(s)) if n > 0 && s > 0 => self.indirect_pct() * n as f64 / s as f64,
            _ => self.indirect_pct(),
        }
    }

    /// The runtime's own code in the profiled run, % of the baseline (the
    /// simulator's view of what `fastinst-shares` measures; no kernel time).
    fn runtime_pct(&self) -> f64 {
        (self.profile.sides.runtime - Counts::default()).pct_of(&self.base())
    }

    /// The C library's leaf functions the runtime called in the profiled
    /// run ([`Sides::runtime_calls`]), % of the baseline: taken off the
    /// program's side, as `fastinst-shares` charges them to the runtime.
    fn runtime_calls_pct(&self) -> f64 {
        (self.profile.sides.runtime_calls - Counts::default()).pct_of(&self.base())
    }

    /// What the build's target compares against: the plain build for sled
    /// builds, the floor for `-finstrument-functions` builds.
    fn base(&self) -> Counts {
        if self.is_sled() {
            self.plain.sides.program_own()
        } else {
            self.floor.sides.program_own()
        }
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Saved {
    header: String,
    rows: Vec<Row>,
}

fn valgrind_available() -> Result<()> {
    match Command::new("valgrind").arg("--version").stdout(Stdio::null()).status() {
        Ok(s) if s.success() => Ok(()),
        _ => Err(EvalError::Tool(
            "valgrind not found (Debian: apt-get install valgrind)".into(),
        )),
    }
}

/// The sample count in the profiler's one-line summary on stderr.
fn samples_in(stderr: &str) -> Option<u64> {
    let (_, rest) = stderr.split_once("fastinst: profile of ")?;
    let (_, rest) = rest.split_once('(')?;
    rest.split_once(" samples)")?.0.parse().ok()
}

/// Runs `bin args` under callgrind with `env` added.
fn simulate(bin: &Path, args: &[String], env: &[(String, String)], out: &Path) -> Result<Simulated> {
    let _ = std::fs::remove_dir_all(out);
    std::fs::create_dir_all(out).map_err(|source| EvalError::Io {
        path: out.to_path_buf(),
        source,
    })?;
    let counts = out.join("callgrind.out");
    let mut cmd = Command::new("valgrind");
    cmd.args([
        "--tool=callgrind",
        "--cache-sim=yes",
        // The runtime rewrites code the program runs.
        "--smc-check=all",
        "--I1=32768,8,64",
        "--D1=32768,8,64",
        "--LL=1048576,8,64",
    ])
    .arg(format!("--callgrind-out-file={}", counts.display()))
    .arg(bin)
    .args(args)
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let t = Instant::now();
    let o = cmd.output().map_err(|e| EvalError::Tool(format!("valgrind: {e}")))?;
    let wall_s = t.elapsed().as_secs_f64();
    let stderr = String::from_utf8_lossy(&o.stderr);
    if !o.status.success() {
        return Err(EvalError::WrongResult(format!(
            "{} under callgrind: {}\n{}",
            bin.display(),
            o.status,
            stderr.lines().rev().take(20).collect::<Vec<_>>().join("\n")
        )));
    }
    let text = std::fs::read_to_string(&counts).map_err(|source| EvalError::Io {
        path: counts.clone(),
        source,
    })?;
    Ok(Simulated {
        sides: cachesim::parse(&text)?,
        wall_s,
        samples: samples_in(&stderr),
    })
}

/// Runs `jobs` closures, `n` at a time; the first error wins.
fn in_parallel<T: Send>(n: usize, jobs: Vec<Box<dyn FnOnce() -> Result<T> + Send + '_>>) -> Result<Vec<T>> {
    let jobs: Vec<Mutex<Option<_>>> = jobs.into_iter().map(|j| Mutex::new(Some(j))).collect();
    let results: Vec<Mutex<Option<Result<T>>>> = jobs.iter().map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..n.min(jobs.len()) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(job) = jobs.get(i) else { break };
                let job = job.lock().unwrap().take().expect("each job runs once");
                *results[i].lock().unwrap() = Some(job());
            });
        }
    });
    results
        .into_iter()
        .map(|r| r.into_inner().unwrap().expect("every job ran"))
        .collect()
}

fn run(a: Args) -> Result<()> {
    // Read first: a wrong file is reported before minutes of simulation.
    let shares: Option<SharesRun> = a
        .shares
        .as_deref()
        .map(|p| fastinst_benches::read_json(p, "fastinst-shares"))
        .transpose()?;
    if let Some(p) = &a.from_json {
        let saved: Saved = fastinst_benches::read_json(p, "fastinst-cachesim")?;
        print!("{}", render(&saved, shares.as_ref()));
        return Ok(());
    }
    valgrind_available()?;
    let lib = fastinst_cli::library::find(a.common.lib.as_deref()).map_err(|e| EvalError::Tool(e.to_string()))?;
    let work = work_dir(&a.common.work)?;
    let compilers = installed(&a.common.compilers, "its builds are left out");
    let srcs = sources::fetch(&work)?;
    let bins = build_all(&work, &srcs, &a.common.programs, &compilers)?;
    let bin = |p: Program, c: Compiler, inst: bool| -> &Binary {
        bins.iter()
            .find(|b| b.program == p && b.compiler == c && b.instrumented == inst)
            .expect("built above")
    };
    let out = work.join("out").join("cachesim");
    let scratch = out.join("native");
    std::fs::create_dir_all(&scratch).map_err(|source| EvalError::Io {
        path: scratch.clone(),
        source,
    })?;

    // Natively, one at a time: the plain builds' fastest wall time and a
    // profiled run's sample count.
    let mut native = Vec::new();
    let mut native_samples = Vec::new();
    for &p in &a.common.programs {
        let args = p.workload_repeated(&work, a.common.repeat)?;
        for &c in &compilers {
            let plain = &bin(p, c, false).path;
            if !native.iter().any(|(q, _)| q == plain) {
                let mut best = f64::INFINITY;
                for _ in 0..a.native_runs {
                    best = best.min(run_once(plain, &args, &[], &scratch.join("stdout"))?.wall_s);
                }
                native.push((plain.clone(), best));
            }
            let r = run_once(
                &bin(p, c, true).path,
                &args,
                &Config::Profile.env(&lib, &scratch),
                &scratch.join("stdout"),
            )?;
            native_samples.push(((p, c), samples_in(&r.stderr)));
        }
    }

    // The plain builds under Valgrind, for the slowdown.
    let plains: Vec<PathBuf> = native.iter().map(|(p, _)| p.clone()).collect();
    let mut jobs: Vec<Box<dyn FnOnce() -> Result<Simulated> + Send + '_>> = Vec::new();
    for plain in &plains {
        let program = bins.iter().find(|b| &b.path == plain).expect("built above").program;
        let args = program.workload_repeated(&work, a.common.repeat)?;
        let dir = out.join(plain.file_name().unwrap_or_default());
        jobs.push(Box::new(move || {
            eprintln!("  simulating {}", plain.display());
            simulate(plain, &args, &[], &dir)
        }));
    }
    let simulated_plain = in_parallel(a.jobs, jobs)?;
    let slowdown_of = |plain: &Path| -> (f64, Simulated) {
        let i = plains.iter().position(|p| p == plain).expect("simulated above");
        let s = simulated_plain[i].clone();
        (s.wall_s / native[i].1.max(1e-3), s)
    };

    // Every build's floor and profiled runs.
    let mut jobs: Vec<Box<dyn FnOnce() -> Result<Simulated> + Send + '_>> = Vec::new();
    let mut subjects = Vec::new();
    for &p in &a.common.programs {
        let args = p.workload_repeated(&work, a.common.repeat)?;
        for &c in &compilers {
            let (slowdown, _) = slowdown_of(&bin(p, c, false).path);
            let inst = bin(p, c, true).path.clone();
            for config in [Config::Floor, Config::Profile] {
                let dir = out.join(format!("{}-{}-{}", p.name(), c.name(), config.name()));
                let mut env = config.env(&lib, &dir);
                if config == Config::Profile {
                    // Windows re-opened per unit of the program's work, not
                    // of wall time, which Valgrind stretches.
                    let epoch = Duration::from_millis(10).mul_f64(slowdown);
                    env.push((
                        "FASTINST_PROFILE_EPOCH_MS".into(),
                        format!("{:.3}", epoch.as_secs_f64() * 1e3),
                    ));
                }
                let (args, inst) = (args.clone(), inst.clone());
                jobs.push(Box::new(move || {
                    eprintln!("  simulating {} ({})", inst.display(), config.name());
                    simulate(&inst, &args, &env, &dir)
                }));
            }
            subjects.push((p, c, slowdown));
        }
    }
    let mut simulated = in_parallel(a.jobs, jobs)?.into_iter();
    let mut rows = Vec::new();
    for (p, c, slowdown) in subjects {
        let (floor, profile) = (
            simulated.next().expect("one per job"),
            simulated.next().expect("one per job"),
        );
        rows.push(Row {
            program: p.name().into(),
            build: c.name().into(),
            slowdown,
            native_samples: native_samples.iter().find(|(k, _)| *k == (p, c)).and_then(|(_, n)| *n),
            plain: slowdown_of(&bin(p, c, false).path).1,
            floor,
            profile,
        });
    }
    let saved = Saved {
        header: format!(
            "Callgrind's cache simulation (I1 and D1 32 KiB 8-way, LL 1 MiB 8-way, 64-byte lines; cycles estimated as Ir + 10 L1m + 100 LLm), library {}, {}.",
            lib.display(),
            fastinst_benches::provenance("fastinst-cachesim")
        ),
        rows,
    };
    print!("{}", render(&saved, shares.as_ref()));
    if let Some(p) = &a.common.json {
        fastinst_benches::write_json(p, &saved)?;
    }
    Ok(())
}

fn millions(n: u64) -> String {
    format!("{:.1}M", n as f64 / 1e6)
}

fn render(saved: &Saved, shares: Option<&SharesRun>) -> String {
    let rows = &saved.rows;
    let mut s = format!("{}\n\n", saved.header);
    s.push_str("| program | build | slowdown under Valgrind | samples native / simulated | program instructions plain / floor / profile | program L1 misses plain / floor / profile | program LL misses plain / floor / profile | NOPs etc. (floor over plain) | indirect (profile over floor) | indirect at the native rate | runtime's own code | C library under the runtime |\n");
    s.push_str("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for r in rows {
        let three = |f: fn(&Counts) -> u64| {
            format!(
                "{} / {} / {}",
                millions(f(&r.plain.sides.program_own())),
                millions(f(&r.floor.sides.program_own())),
                millions(f(&r.profile.sides.program_own()))
            )
        };
        let samples = |n: Option<u64>| n.map_or("?".to_string(), |n| n.to_string());
        let _ = writeln!(
            s,
            "| {} | {} | {:.0}x | {} / {} | {} | {} | {} | {:+.2}% | {:+.2}% | {:+.2}% | {:+.2}% | {:.2}% |",
            r.program,
            r.build,
            r.slowdown,
            samples(r.native_samples),
            samples(r.profile.samples),
            three(|c| c.instructions),
            three(|c| c.l1_misses),
            three(|c| c.ll_misses),
            r.nops_pct(),
            r.indirect_pct(),
            r.indirect_at_native_rate_pct(),
            r.runtime_pct(),
            r.runtime_calls_pct(),
        );
    }
    s.push_str("\nPercentages are of the estimated cycles of the program's side of the build's baseline: the plain build for sled builds, the floor for `-finstrument-functions` builds (whose NOPs-etc. column is then the hooks' argument set-up and calls with every probe off, not part of the target). The program's side leaves out the C library's string and allocator functions where the runtime called them (last column; `fastinst-shares` charges them to the runtime's direct cost); runs recorded before that was counted show 0.00% there and count them on the program's side.\n");
    let Some(shares) = shares else { return s };
    s.push_str(&format!(
        "\nEstimated slowdown against each target's baseline: the direct cost measured by CPU samples (`fastinst-shares`: {}) plus, from the counts above, the indirect cost (at the native sampling rate) and, for sled builds, the NOPs and the rest of what the sled build's code does differently.\n\n",
        shares.header.trim_end_matches('.')
    ));
    s.push_str("| program | build | direct (samples) | NOPs | indirect | **sum** |\n| --- | --- | ---: | ---: | ---: | ---: |\n");
    let mut builds: Vec<&str> = Vec::new();
    for r in rows {
        if !builds.contains(&r.build.as_str()) {
            builds.push(&r.build);
        }
    }
    let mut sums = Vec::new();
    for b in &builds {
        let mut ratios = Vec::new();
        for r in rows.iter().filter(|r| r.build == *b) {
            let Some(direct) = shares.direct_cost(&r.program, &r.build) else {
                continue;
            };
            let nops = if r.is_sled() { r.nops_pct() } else { 0.0 };
            let indirect = r.indirect_at_native_rate_pct();
            let sum = direct + nops + indirect;
            ratios.push(1.0 + sum / 100.0);
            let _ = writeln!(
                s,
                "| {} | {} | {direct:+.2}% | {nops:+.2}% | {indirect:+.2}% | **{sum:+.2}%** |",
                r.program, r.build
            );
        }
        if !ratios.is_empty() {
            sums.push((b, (geomean(&ratios) - 1.0) * 100.0, ratios.len()));
        }
    }
    s.push_str("\n| build | programs | geomean of the sums |\n| --- | ---: | ---: |\n");
    for (b, g, n) in sums {
        let _ = writeln!(s, "| {b} | {n} | **{g:+.2}%** |");
    }
    s
}

fn main() -> std::process::ExitCode {
    fastinst_benches::harness_main("fastinst-cachesim", USAGE, parse, run)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_line_gives_the_samples() {
        let e = "fastinst: profile of 612 functions (133198 samples) written to /tmp/x.txt (also ...)\n";
        assert_eq!(samples_in(e), Some(133198));
        assert_eq!(samples_in("no profile here"), None);
    }
}
