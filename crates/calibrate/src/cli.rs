//! The command line of `fastinst-calibrate` (and `fastinst calibrate`).

use crate::machine::Machine;
use crate::output::{self, Findings};
use crate::plan::{Budget, Plan};
use crate::progress::Progress;
use crate::recommend::{self, Thresholds, WaitCosts};
use crate::sweep::{run_cell, Sweep, Tally};
use crate::{cost, svg, table};
use fastinst_args::{ArgError, Argv, Item};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};
use stress::{Method, TrialSpec};

/// Usage text.
pub const USAGE: &str = "\
usage: fastinst calibrate [options]   (also: fastinst-calibrate [options])

Measures T_max, the longest a core may execute a stale copy of a code line,
by the paper's stress test: a straddling call at each split S=1..4, N executor
threads running it, one patcher toggling it with wordpatch's INT3 protocol and
a wait of W ticks, for each W; every trial in a forked child, so a crash is a
counted failure. Prints the failure table per W and S, plots it as SVG,
recommends T_max = (smallest W clean from there up) x margin, measures the
SyncCore (membarrier) wait, and writes the machine config wordpatch reads.

options:
  --quick             W = 0..3000 step 500, 2 trials; under 60 s
                      (default: W = 0..3000 step 100, 3 trials; under 10 min)
  --waits SPEC        waits to test: A..B:STEP or a list (e.g. 0..2000:250)
  --splits LIST       splits to test, subset of 1,2,3,4
  --executors LIST    executor counts (default: 1..cores-1 and cores)
  --trials N          trials per (W, S, N)
  --toggles N         toggles per trial at most
  --seconds F         seconds per trial (default: fitted to the time budget)
  --margin F          safety margin on the smallest clean wait (default 2)
  --min-evidence N    co-run toggles at W >= W* needed to trust T_max
                      (default 20000000)
  --out PATH          config to write (default: $FASTINST_CONFIG, else
                      $XDG_CONFIG_HOME/fastinst/machine.toml, else
                      ~/.config/fastinst/machine.toml)
  --svg PATH          plot to write (default: fastinst-calibration.svg)
  --log PATH          crash reports of failed trials (default: the plot's
                      path with .log)
  --no-write          print the result, write no config
  --show              print the config wordpatch would use now, and exit
  --check             stress the wait wordpatch would use now (from the
                      config) at every split, sync and async; exit 1 on any
                      failure (--trials, --seconds, --executors apply)
  -h, --help          this text
";

#[derive(Debug)]
struct Args {
    plan: Plan,
    th: Thresholds,
    out: Option<PathBuf>,
    svg: PathBuf,
    log: Option<PathBuf>,
    write: bool,
    show: bool,
    check: bool,
}

/// Parses `A..B:STEP` or `a,b,c`.
pub fn parse_waits(s: &str) -> Result<Vec<u64>, String> {
    let bad = || format!("bad --waits `{s}` (A..B:STEP or a comma list)");
    if let Some((range, step)) = s.split_once(':') {
        let (a, b) = range.split_once("..").ok_or_else(bad)?;
        let (a, b, step): (u64, u64, u64) = (
            a.parse().map_err(|_| bad())?,
            b.parse().map_err(|_| bad())?,
            step.parse().map_err(|_| bad())?,
        );
        if step == 0 || a > b {
            return Err(bad());
        }
        return Ok((a..=b).step_by(step as usize).collect());
    }
    s.split(',').map(|x| x.trim().parse().map_err(|_| bad())).collect()
}

fn parse(args: &[String]) -> Result<Option<Args>, String> {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let quick = args.iter().any(|a| a == "--quick");
    let mut plan = if quick { Plan::quick(cores) } else { Plan::full(cores) };
    let mut th = Thresholds {
        margin: plan.margin,
        min_evidence: crate::recommend::MIN_EVIDENCE,
    };
    let mut a = Args {
        plan: plan.clone(),
        th,
        out: None,
        svg: PathBuf::from("fastinst-calibration.svg"),
        log: None,
        write: true,
        show: false,
        check: false,
    };
    let mut seconds = None;
    let mut argv = Argv::new(args);
    while let Some(item) = argv.next_item() {
        match item {
            Item::Opt("-h" | "--help", _) => return Ok(None),
            Item::Opt("--quick", None) => {}
            Item::Opt(n @ "--waits", i) => plan.waits = parse_waits(argv.value(n, i)?)?,
            Item::Opt(n @ "--splits", i) => plan.splits = argv.list(n, i, "a split")?,
            Item::Opt(n @ "--executors", i) => plan.executors = argv.list(n, i, "a count")?,
            Item::Opt(n @ "--trials", i) => plan.trials = argv.parsed(n, i, "a count")?,
            Item::Opt(n @ "--toggles", i) => plan.toggles = argv.parsed(n, i, "a count")?,
            Item::Opt(n @ "--seconds", i) => {
                let v: f64 = argv.parsed(n, i, "a number of seconds")?;
                if !(v > 0.0 && v.is_finite()) {
                    return Err(format!("{n}: `{v}` is not a positive number of seconds"));
                }
                seconds = Some(v);
            }
            Item::Opt(n @ "--margin", i) => plan.margin = argv.parsed(n, i, "a number")?,
            Item::Opt(n @ "--min-evidence", i) => th.min_evidence = argv.parsed(n, i, "a number")?,
            Item::Opt(n @ "--out", i) => a.out = Some(PathBuf::from(argv.value(n, i)?)),
            Item::Opt(n @ "--svg", i) => a.svg = PathBuf::from(argv.value(n, i)?),
            Item::Opt(n @ "--log", i) => a.log = Some(PathBuf::from(argv.value(n, i)?)),
            Item::Opt("--no-write", None) => a.write = false,
            Item::Opt("--show", None) => a.show = true,
            Item::Opt("--check", None) => a.check = true,
            Item::Opt(other, _) => return Err(ArgError::unknown(other).into()),
            Item::Positional(p) => return Err(format!("unexpected argument `{p}`")),
            Item::EndOfOptions => {}
        }
    }
    plan.fit(if quick { Budget::QUICK } else { Budget::FULL });
    if let Some(s) = seconds {
        plan.trial_time = Duration::from_secs_f64(s);
        plan.verify_time = Duration::from_secs_f64(s);
    }
    plan.validate()?;
    th.margin = plan.margin;
    a.plan = plan;
    a.th = th;
    Ok(Some(a))
}

fn show() -> ExitCode {
    let path = wordpatch::config_path();
    println!("config path: {}", path.display());
    match wordpatch::MachineConfig::load(&path) {
        Ok(c) => print!("{}", c.render()),
        Err(e) => println!("({e})"),
    }
    let (w, src) = wordpatch::default_wait();
    println!(
        "wordpatch default wait: {w:?} (from {src:?}); T_max for Tmax waits: {}",
        wordpatch::default_tmax()
    );
    if src == wordpatch::WaitSource::Unproven {
        println!(
            "no wait is proven on this machine: a straddler patch that takes the default is refused \
             (`fastinst calibrate` writes a config that names one; `--check` stresses the T_max above)"
        );
    }
    ExitCode::SUCCESS
}

/// Stresses the wait wordpatch resolves now, sync and async, at every split.
fn check(plan: &Plan, seconds_given: bool) -> ExitCode {
    let (wait, src) = wordpatch::default_wait();
    let executors = *plan.executors.iter().max().unwrap_or(&2);
    let time = if seconds_given {
        plan.trial_time
    } else {
        Duration::from_secs(1)
    };
    println!(
        "check: {wait:?} (from {src:?}), {executors} executors, {} trials x {:.1} s",
        plan.trials,
        time.as_secs_f64()
    );
    let (mut toggles, mut failures, mut uncounted) = (0, 0, 0);
    for strategy in [Method::WordSync(wait), Method::WordAsync(wait)] {
        for &split in &plan.splits {
            let spec = TrialSpec {
                strategy,
                form: callpatch::Form::CallRel32,
                place: stress::Place::of_split(split),
                executors,
                fetch: stress::Fetch::Warm,
                max_toggles: plan.toggles,
                max_time: time,
                wx: false,
            };
            let r = stress::run_config(&spec, plan.trials, false);
            println!("{r}");
            println!("{}", r.result_line());
            toggles += r.toggles;
            failures += r.failures;
            uncounted += u64::from(r.counted == 0);
        }
    }
    println!("check: {toggles} toggles, {failures} failures; {uncounted} configurations without co-run evidence");
    if failures == 0 && uncounted == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Runs the command; `args` excludes the program name.
pub fn main(args: &[String]) -> ExitCode {
    let a = match parse(args) {
        Ok(Some(a)) => a,
        Ok(None) => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("fastinst-calibrate: {e}\n(--help for usage)");
            return ExitCode::from(2);
        }
    };
    if a.show {
        return show();
    }
    if a.check {
        return check(&a.plan, args.iter().any(|x| x == "--seconds"));
    }
    let out = match a.out.clone().map(Ok).unwrap_or_else(output::default_out_path) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("fastinst-calibrate: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&a, &out) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fastinst-calibrate: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Crash reports go to this file while it is open, to stderr again after.
struct CrashLog {
    // Held so the descriptor the crash handler writes to stays open.
    _file: std::fs::File,
}

impl CrashLog {
    fn open(path: &std::path::Path) -> Result<CrashLog, String> {
        let f = std::fs::File::create(path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        stress::set_report_fd(std::os::fd::AsRawFd::as_raw_fd(&f));
        Ok(CrashLog { _file: f })
    }
}

impl Drop for CrashLog {
    fn drop(&mut self) {
        stress::set_report_fd(2);
    }
}

fn run(a: &Args, out: &std::path::Path) -> Result<(), String> {
    let t0 = Instant::now();
    let plan = &a.plan;
    for p in [Some(&a.svg), a.log.as_ref()].into_iter().flatten() {
        if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
    }
    let log_path = a.log.clone().unwrap_or_else(|| a.svg.with_extension("log"));
    let _log = CrashLog::open(&log_path)?;
    let machine = Machine::detect();
    println!(
        "machine: {} ({} CPUs), kernel {}, TSC {:.0} MHz, {}",
        machine.cpu_model, machine.cores, machine.kernel, machine.tsc_mhz, machine.date
    );
    println!(
        "sweep: waits {:?} x splits {:?} x executors {:?} x {} trials ({} at W = {} until a failure), \
         <= {:.2} s / {} toggles per trial; at most {:.0} s",
        plan.waits,
        plan.splits,
        plan.executors,
        plan.trials,
        plan.control_trials,
        plan.waits[0],
        plan.trial_time.as_secs_f64(),
        plan.toggles,
        plan.time_bound().as_secs_f64()
    );
    println!();
    println!("Failures per wait W and split S (the paper's Fig. 9):");
    let splits = plan.splits.clone();
    println!("{}", table::header(&splits));
    let mut bar = Progress::new();
    let per_row = plan.splits.len() * plan.executors.len();
    let mut partial = Sweep::default();
    let sweep = Sweep::run(plan, |done, total, c| {
        partial.cells.push(c.clone());
        if done % per_row == 0 {
            bar.clear();
            println!("{}", table::row(&partial, c.wait, &splits));
        }
        bar.update(
            done,
            total,
            &format!("W={} S={} N={}: {}", c.wait, c.split, c.executors, c.result.failures),
        );
    });
    bar.clear();
    println!("{}", table::legend());
    let failed = sweep.tally(|_| true).failures;
    if failed > 0 {
        println!("crash reports of the {failed} failed trials: {}", log_path.display());
    }
    println!();

    let w_star = recommend::min_clean_wait(&sweep);
    let mut verify: Option<Tally> = None;
    if let Ok(w) = &w_star {
        let t = recommend::with_margin(*w, plan.margin);
        let mut v = Tally::default();
        for &s in &plan.splits {
            for &n in &plan.executors {
                v.add(&run_cell(t, s, n, 1, plan.toggles, plan.verify_time).result);
            }
        }
        println!(
            "verification at T_max = {t}: {} toggles, {} failed of {} trials ({} counted, co-run {:.0}%)",
            v.toggles,
            v.failures,
            v.trials,
            v.counted,
            v.corun_ratio() * 100.0
        );
        verify = Some(v);
    }
    let cost_at = match &w_star {
        Ok(w) => recommend::with_margin(*w, plan.margin).max(1),
        Err(_) => wordpatch::BUILTIN_TMAX,
    };
    let costs: WaitCosts = cost::measure(cost_at, if plan.quick { 51 } else { 201 })?;
    match (costs.synccore_idle, costs.synccore_busy) {
        (Some(i), Some(b)) => println!(
            "cost per straddler patch (median ticks): SyncCore {i:.0} idle, {b:.0} with an executor; \
             Tmax({}) {:.0} idle, {:.0} with an executor",
            costs.tmax_ticks, costs.tmax_idle, costs.tmax_busy
        ),
        _ => println!(
            "cost per straddler patch (median ticks): SyncCore unavailable (kernel); Tmax({}) {:.0} idle, {:.0} busy",
            costs.tmax_ticks, costs.tmax_idle, costs.tmax_busy
        ),
    }
    let rec = recommend::recommend(&sweep, verify.as_ref(), Some(&costs), &a.th);
    println!();
    for r in &rec.reasons {
        println!("- {r}");
    }
    let verdict = match (rec.tmax, rec.wait) {
        (_, Some(wordpatch::Wait::Tmax(t))) => format!("recommended: wait = tmax, T_max = {t} ticks"),
        (Some(t), Some(_)) => {
            format!("recommended: wait = synccore (T_max = {t} ticks recorded for explicit Tmax waits)")
        }
        (None, Some(_)) => "recommended: wait = synccore (no T_max)".to_string(),
        (_, None) => "recommended: none (straddling word patches are unsafe on this machine)".to_string(),
    };
    println!("{verdict}");

    let mut marks = Vec::new();
    if let Ok(w) = &w_star {
        marks.push(("W*", *w));
        if let Some(t) = rec.tmax {
            marks.push(("T_max", t));
        }
    }
    let title = format!(
        "T_max sweep: {} ({} CPUs), {}",
        machine.cpu_model, machine.cores, machine.date
    );
    std::fs::write(&a.svg, svg::render(&sweep, &title, &marks))
        .map_err(|e| format!("cannot write {}: {e}", a.svg.display()))?;
    println!("plot: {}", a.svg.display());
    let cfg = output::config(&Findings {
        machine: &machine,
        plan,
        sweep: &sweep,
        verify: verify.as_ref(),
        costs: Some(&costs),
        rec: &rec,
    });
    if a.write {
        output::write(&cfg, out)?;
        println!("config: {}", out.display());
    } else {
        println!("config (not written, --no-write):\n{}", cfg.render());
    }
    println!("took {:.0} s", t0.elapsed().as_secs_f64());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_specs() {
        assert_eq!(parse_waits("0..300:100").unwrap(), vec![0, 100, 200, 300]);
        assert_eq!(parse_waits("0, 50,900").unwrap(), vec![0, 50, 900]);
        assert!(parse_waits("0..300:0").is_err());
        assert!(parse_waits("lots").is_err());
    }

    #[test]
    fn options_and_errors() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let a = parse(&s(&["--quick", "--waits", "0,100", "--margin", "3"]))
            .unwrap()
            .unwrap();
        assert!(a.plan.quick);
        assert_eq!(a.plan.waits, vec![0, 100]);
        assert_eq!(a.th.margin, 3.0);
        assert_eq!(a.th.min_evidence, crate::recommend::MIN_EVIDENCE);
        assert!(parse(&s(&["--help"])).unwrap().is_none());
        assert!(parse(&s(&["--bogus"])).unwrap_err().contains("--bogus"));
        assert!(parse(&s(&["--splits", "0"])).unwrap_err().contains("splits"));
        assert!(parse(&s(&["--trials"])).unwrap_err().contains("needs a value"));
    }
}
