//! `fastinst-stress`: cross-modification stress runs, a live demo, and tick
//! benchmarks for wordpatch and callpatch. `fastinst-stress --help` for usage.

use callpatch::{Form, Mode};
use fastinst_args::{split_list, ArgError, Argv, Item};
use std::process::ExitCode;
use std::time::Duration;
use stress::bench::{self, Row};
use stress::{run_config, Fetch, Method, Place, TrialSpec};
use wordpatch::Wait;

const USAGE: &str = "\
usage: fastinst-stress <command> [options]

commands:
  run     stress: executor threads run a site at each split while one patcher
          toggles it; each trial in a forked child; prints `N toggles, F failures`
  sleds   gcc sleds (five one-byte NOPs) made one NOP while more threads than
          CPUs run them, the threads checked out of them (wordpatch::evacuate),
          then armed and put back, round after round; each trial in a forked
          child; prints `N rounds, F failures`
  demo    toggle a live call site while threads run it, print what they saw
  bench   ticks per operation (median, p90) for every mode and split

run options:
  --strategies LIST   word-synccore,word-async-synccore,word-tmax[:T],
                      word-async[:T],word-naive,call-paper,call-flip,
                      call-naive (default: all but the two naive controls)
  --forms LIST        call,ind,jmp,jmpind (default: all the strategy supports)
  --splits LIST       e.g. 0,1,2 (default: every split of the form; 0 is a
                      site inside one line, at each of --offsets)
  --offsets LIST      where a site inside one line starts in it (default
                      8,4,12,28: inside a quadword, then across an 8-, a
                      16- and a 32-byte boundary)
  --executors N       executor threads (default: max(2, cores))
  --fetch LIST        warm,cold: executors call the site back to back, or
                      flush the line of its back part before each call, the
                      adversarial case (default: warm,cold)
  --trials N          trials per configuration (default 3)
  --toggles N         toggles per trial at most (default 10000000)
  --seconds F         seconds per trial at most (default 1.0)
  --long              >= 1e8 toggles per configuration (no time limit)
  --wx                W^X: the code is read+execute only and written through
                      a writable alias (wordpatch::WriteMode::Alias)
  --expect-failure    negative control: succeed only if every configuration
                      fails, stopping each at its first failure
sleds options:
  --functions N       sleds in the page, at every line offset (default 64)
  --executors N       executor threads (default: 4 x cores, at least 8)
  --trials N          trials (default 3)
  --seconds F         seconds per trial (default 1.0)
  --no-evacuate       negative control: arm without checking the threads
                      out; succeeds only if some trial fails
  --wx                W^X: the page is read+execute only and written through
                      an alias
bench options:
  --quick             fewer repetitions
";

fn parse_form(s: &str) -> Result<Form, String> {
    match s {
        "call" => Ok(Form::CallRel32),
        "ind" => Ok(Form::CallRipIndirect),
        "jmp" => Ok(Form::JmpRel32),
        "jmpind" => Ok(Form::JmpRipIndirect),
        _ => Err(format!("unknown form `{s}` (call, ind, jmp, jmpind)")),
    }
}

struct RunArgs {
    strategies: Vec<Method>,
    forms: Option<Vec<Form>>,
    splits: Option<Vec<usize>>,
    offsets: Vec<usize>,
    executors: usize,
    fetch: Vec<Fetch>,
    trials: u64,
    toggles: u64,
    seconds: f64,
    expect_failure: bool,
    wx: bool,
}

fn parse_run(args: &[String]) -> Result<RunArgs, String> {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
    let mut r = RunArgs {
        strategies: split_list(
            "word-synccore,word-async-synccore,word-tmax,word-async,call-paper,call-flip",
            |s| s.parse(),
        )?,
        forms: None,
        splits: None,
        offsets: stress::Place::INSIDE.to_vec(),
        executors: cores.max(2),
        fetch: Fetch::ALL.to_vec(),
        trials: 3,
        toggles: 10_000_000,
        seconds: 1.0,
        expect_failure: false,
        wx: false,
    };
    let mut argv = Argv::new(args);
    while let Some(item) = argv.next_item() {
        match item {
            Item::Opt(n @ "--strategies", i) => r.strategies = split_list(argv.value(n, i)?, |s| s.parse())?,
            Item::Opt(n @ "--forms", i) => r.forms = Some(split_list(argv.value(n, i)?, parse_form)?),
            Item::Opt(n @ "--splits", i) => r.splits = Some(argv.list(n, i, "a split")?),
            Item::Opt(n @ "--offsets", i) => r.offsets = argv.list(n, i, "an offset")?,
            Item::Opt(n @ "--executors", i) => r.executors = argv.parsed(n, i, "a count")?,
            Item::Opt(n @ "--fetch", i) => r.fetch = split_list(argv.value(n, i)?, |s| s.parse())?,
            Item::Opt(n @ "--trials", i) => r.trials = argv.parsed(n, i, "a count")?,
            Item::Opt(n @ "--toggles", i) => r.toggles = argv.parsed(n, i, "a count")?,
            Item::Opt(n @ "--seconds", i) => r.seconds = argv.parsed(n, i, "a number of seconds")?,
            Item::Opt("--long", None) => {
                r.toggles = 100_000_000;
                r.trials = 1;
                r.seconds = 1e7;
            }
            Item::Opt("--expect-failure", None) => r.expect_failure = true,
            Item::Opt("--wx", None) => r.wx = true,
            Item::Opt(other, _) => return Err(ArgError::unknown(other).into()),
            Item::Positional(p) => return Err(format!("unexpected argument `{p}`")),
            Item::EndOfOptions => {}
        }
    }
    if r.executors == 0 || r.trials == 0 {
        return Err("--executors and --trials must be at least 1".into());
    }
    if let Some(o) = r.offsets.iter().find(|&&o| !(2..=58).contains(&o)) {
        return Err(format!("--offsets: {o} leaves no room in the line (2 to 58)"));
    }
    Ok(r)
}

/// Every configuration `a` asks for: strategy, then form, place and fetch.
fn specs(a: &RunArgs) -> Vec<TrialSpec> {
    let mut v = Vec::new();
    for &strategy in &a.strategies {
        let forms = a.forms.clone().unwrap_or_else(|| Form::ALL.to_vec());
        for form in forms.into_iter().filter(|&f| strategy.supports(f)) {
            let splits: Vec<usize> = a.splits.clone().unwrap_or_else(|| (0..form.len()).collect());
            let places = splits
                .into_iter()
                .filter(|&s| s < form.len() && strategy.supports_split(s))
                .flat_map(|s| match s {
                    0 => a.offsets.iter().map(|&o| Place::Inside(o)).collect(),
                    s => vec![Place::Split(s)],
                });
            for place in places {
                for &fetch in &a.fetch {
                    v.push(TrialSpec {
                        strategy,
                        form,
                        place,
                        executors: a.executors,
                        fetch,
                        max_toggles: a.toggles,
                        max_time: Duration::from_secs_f64(a.seconds),
                        wx: a.wx,
                    });
                }
            }
        }
    }
    v
}

/// `model name` from `/proc/cpuinfo`: whether a control tears is the CPU's
/// business, so every run says which one it ran on.
fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default()
}

fn cmd_run(args: &[String]) -> Result<bool, String> {
    let a = parse_run(args)?;
    let mut all_ok = true;
    let mut total_toggles = 0u64;
    let mut total_failures = 0u64;
    println!(
        "stress on {}: {} executors, {} trials x <= {} toggles / {:.1} s per configuration; a trial counts when >= {} toggles and >= {:.0}% of them overlapped executor progress",
        cpu_model(),
        a.executors, a.trials, a.toggles, a.seconds, stress::MIN_CORUN_TOGGLES, stress::MIN_CORUN_RATIO * 100.0
    );
    for spec in specs(&a) {
        let r = run_config(&spec, a.trials, a.expect_failure);
        println!("{r}");
        println!("{}", r.result_line());
        total_toggles += r.toggles;
        total_failures += r.failures;
        let ok = if a.expect_failure {
            r.failures > 0
        } else {
            r.failures == 0 && r.counted > 0
        };
        if !ok {
            all_ok = false;
            println!(
                "  ^ {}",
                if a.expect_failure {
                    "expected a failure and saw none"
                } else if r.failures > 0 {
                    "FAILED"
                } else {
                    "no trial had enough co-run evidence"
                }
            );
        }
    }
    println!("total: {total_toggles} toggles, {total_failures} failures");
    Ok(all_ok)
}

fn cmd_sleds(args: &[String]) -> Result<bool, String> {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
    let mut spec = stress::SledSpec {
        functions: 64,
        executors: (4 * cores).max(8),
        max_rounds: u64::MAX,
        max_time: Duration::from_secs(1),
        evacuate: true,
        wx: false,
    };
    let mut trials = 3u64;
    let mut argv = Argv::new(args);
    while let Some(item) = argv.next_item() {
        match item {
            Item::Opt(n @ "--functions", i) => spec.functions = argv.parsed(n, i, "a count")?,
            Item::Opt(n @ "--executors", i) => spec.executors = argv.parsed(n, i, "a count")?,
            Item::Opt(n @ "--trials", i) => trials = argv.parsed(n, i, "a count")?,
            Item::Opt(n @ "--seconds", i) => {
                spec.max_time = Duration::from_secs_f64(argv.parsed(n, i, "a number of seconds")?)
            }
            Item::Opt("--no-evacuate", None) => spec.evacuate = false,
            Item::Opt("--wx", None) => spec.wx = true,
            Item::Opt(other, _) => return Err(ArgError::unknown(other).into()),
            Item::Positional(p) => return Err(format!("unexpected argument `{p}`")),
            Item::EndOfOptions => {}
        }
    }
    if spec.executors == 0 || trials == 0 {
        return Err("--executors and --trials must be at least 1".into());
    }
    println!(
        "sleds on {}: {} sleds, {} executors on {cores} CPUs, {trials} trials of {:.1} s, threads {}checked out before arming{}",
        cpu_model(),
        spec.functions,
        spec.executors,
        spec.max_time.as_secs_f64(),
        if spec.evacuate { "" } else { "NOT " },
        if spec.wx { ", W^X" } else { "" }
    );
    let (mut rounds, mut failures, mut moved, mut calls, mut armed) = (0u64, 0u64, 0u64, 0u64, 0u64);
    for t in 0..trials {
        let o = stress::run_sleds_forked(&spec);
        println!("  trial {t}: {o:?}");
        failures += u64::from(o.is_failure());
        match o {
            stress::SledOutcome::Completed(s) => {
                rounds += s.rounds;
                moved += s.moved;
                calls += s.calls;
                armed += s.armed;
            }
            stress::SledOutcome::Crashed { rounds: r, .. } | stress::SledOutcome::Hung { rounds: r } => rounds += r,
            stress::SledOutcome::Error(e) => return Err(e),
        }
    }
    println!("{calls} calls, {armed} of them through an armed sled; {moved} threads moved out of a sled");
    println!(
        "sleds: {rounds} rounds of {} sleds, {failures} failures",
        spec.functions
    );
    Ok(if spec.evacuate {
        failures == 0 && rounds > 0
    } else {
        failures > 0
    })
}

fn cmd_demo() -> Result<bool, String> {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    println!("A live `call` at a 3|2 cache-line split, run by 2 threads in a loop,");
    println!("switched off and on by each strategy for 300 ms:\n");
    println!(
        "{:<16} {:>10} {:>14} {:>14} {:>8}",
        "strategy", "toggles", "calls active", "calls off", "torn"
    );
    for strategy in ["call-flip", "call-paper", "word-synccore", "word-async-synccore"] {
        let strategy: Method = strategy.parse()?;
        let fx = Arc::new(stress::Fixture::new(Form::CallRel32, 3).map_err(|e| e.to_string())?);
        let t = stress::Toggler::new(&fx, strategy)?;
        let stop = Arc::new(AtomicBool::new(false));
        let counts: Arc<[AtomicU64; 3]> = Arc::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]);
        let hs: Vec<_> = (0..2)
            .map(|_| {
                let (fx, stop, counts) = (fx.clone(), stop.clone(), counts.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let k = match fx.classify((fx.entry)()) {
                            Some(true) => 0,
                            Some(false) => 1,
                            None => 2,
                        };
                        counts[k].fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        let t0 = std::time::Instant::now();
        let mut toggles = 0u64;
        while t0.elapsed() < Duration::from_millis(300) {
            t.set(toggles % 2 == 1)?;
            toggles += 1;
        }
        t.ensure_on()?;
        stop.store(true, Ordering::Relaxed);
        for h in hs {
            let _ = h.join();
        }
        let c: Vec<u64> = counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        println!(
            "{:<16} {:>10} {:>14} {:>14} {:>8}",
            strategy.to_string(),
            toggles,
            c[0],
            c[1],
            c[2]
        );
    }
    println!("\n`torn` counts calls that saw half-old, half-new code: it must be 0.");
    println!("The site straddles a cache line: callpatch toggles it with one store and no wait;");
    println!("wordpatch INT3-locks it, so threads arriving mid-patch wait in the trap handler,");
    println!("and a patcher that never pauses (as here) keeps them there most of the time.");
    Ok(true)
}

fn cmd_bench(args: &[String]) -> Result<bool, String> {
    let quick = args.iter().any(|a| a == "--quick");
    let reps = if quick { 101 } else { 501 };
    let field_n = 20_000;
    let field = bench::SiteField::new(field_n)?;
    let passes = if quick { 11 } else { 31 };
    let base_a = bench::field_store_pass(&field, passes);
    let base_b = bench::baseline_locked_store(reps);
    let base_c = bench::baseline_busy_store(reps);
    let base_d = bench::invoke_cost(Form::CallRel32, 0, "nop", reps)?;
    let mut rows: Vec<Row> = Vec::new();
    let mut row = |op: String, stats: bench::Stats, label: char| {
        let baseline = match label {
            'A' => base_a.median,
            'B' => base_b.median,
            'C' => base_c.median,
            _ => base_d.median,
        };
        rows.push(Row {
            op,
            stats,
            baseline_label: label,
            baseline,
        });
    };
    row(
        format!("baseline A: plain 1-byte store to each of {field_n} sites, per site"),
        base_a,
        'A',
    );
    row(
        "baseline B: locked 1-byte exchange in an idle code line".into(),
        base_b,
        'B',
    );
    row(
        "baseline C: plain 1-byte store to a line another core executes".into(),
        base_c,
        'C',
    );
    row(
        "baseline D: execute a 5-byte NOP (via call/ret of the fixture)".into(),
        base_d,
        'D',
    );
    for mode in [Mode::Flip, Mode::Paper] {
        let (off, on) = bench::field_passes(&field, mode, passes);
        row(
            format!(
                "callpatch {mode:?}: deactivate pass over {field_n} idle probes ({} straddle), per probe",
                field.straddlers()
            ),
            off,
            'A',
        );
        row(
            format!("callpatch {mode:?}: activate pass over {field_n} idle probes, per probe"),
            on,
            'A',
        );
    }
    for (name, strategy) in [
        ("callpatch flip", Method::CallFlip),
        ("callpatch paper", Method::CallPaper),
    ] {
        for form in Form::ALL {
            for split in 0..form.len() {
                row(
                    format!("{name}: toggle idle {form:?} split {split}"),
                    bench::toggle_idle(strategy, form, split, reps)?,
                    'B',
                );
            }
        }
    }
    for split in 0..5 {
        row(
            format!("callpatch flip: toggle CallRel32 split {split}, other core executing"),
            bench::toggle_busy(Method::CallFlip, Form::CallRel32, split, reps)?,
            'C',
        );
        row(
            format!("callpatch paper: toggle CallRel32 split {split}, other core executing"),
            bench::toggle_busy(Method::CallPaper, Form::CallRel32, split, reps)?,
            'C',
        );
    }
    let tmax = wordpatch::default_tmax();
    let wreps = if quick { 51 } else { 201 };
    row(
        "wordpatch: patch non-straddling word (call<->nop)".into(),
        bench::toggle_idle(Method::WordSync(Wait::Tmax(tmax)), Form::CallRel32, 0, reps)?,
        'B',
    );
    for split in 1..5 {
        row(
            format!("wordpatch sync Tmax({tmax}): straddler split {split}"),
            bench::toggle_idle(Method::WordSync(Wait::Tmax(tmax)), Form::CallRel32, split, wreps)?,
            'B',
        );
        row(
            format!("wordpatch sync SyncCore: straddler split {split}, idle"),
            bench::toggle_idle(Method::WordSync(Wait::SyncCore), Form::CallRel32, split, wreps)?,
            'B',
        );
        row(
            format!("wordpatch sync SyncCore: straddler split {split}, other core executing"),
            bench::toggle_busy(Method::WordSync(Wait::SyncCore), Form::CallRel32, split, wreps)?,
            'C',
        );
        row(
            format!("wordpatch async: start_patch straddler split {split}"),
            bench::async_start(split, wreps)?,
            'B',
        );
    }
    for split in [0, 1, 3] {
        for state in ["active", "flip", "paper"] {
            row(
                format!("invoke CallRel32 split {split}: site {state}"),
                bench::invoke_cost(Form::CallRel32, split, state, reps)?,
                'D',
            );
        }
    }
    let cpu = cpu_model();
    println!(
        "cpu: {cpu}; cores: {}; TSC resolution: {} ticks; batches of up to 256 ops",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        bench::tsc_resolution()
    );
    println!("ticks per operation (median, p90); ratio = median / the median of the baseline named (A-D), same run\n");
    println!("| operation | median | p90 | ratio |\n| --- | --- | --- | --- |");
    for r in &rows {
        println!("{}", r.markdown());
    }
    Ok(true)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let r = match args.first().map(String::as_str) {
        Some("run") => cmd_run(&args[1..]),
        Some("sleds") => cmd_sleds(&args[1..]),
        Some("demo") => cmd_demo(),
        Some("bench") => cmd_bench(&args[1..]),
        Some("--help" | "-h" | "help") => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Some(other) => Err(format!("unknown command `{other}`\n\n{USAGE}")),
        None => Err(USAGE.to_string()),
    };
    match r {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("fastinst-stress: {e}");
            ExitCode::from(2)
        }
    }
}
