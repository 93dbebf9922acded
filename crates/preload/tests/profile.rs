//! The latency profiler on a program with a known call tree and known
//! durations (`tests/c/tree.c`), built now with gcc and clang: estimated
//! call counts and times within 10% of the truth, the call edges and every
//! flame-graph step exactly the tree's, the program's output unchanged, and
//! every report readable.
//!
//! Accuracy runs take a lock: the sampler thread must get a CPU when its
//! epoch comes, not only when an application thread blocks (a sampler that
//! runs only then re-opens windows while the program is slow, and the rates
//! it measures are low; the README says so).

mod common;
use common::*;
use fastinst::profile::report::Report;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Mutex;

static SERIAL: Mutex<()> = Mutex::new(());

struct Truth {
    calls: HashMap<String, f64>,
    leaf_total_ms: f64,
    nap_total_ms: f64,
    /// The exact median of the naps the program timed.
    nap_p50_us: f64,
}

fn truth(stdout: &str, stderr: &str) -> Truth {
    let mut calls = HashMap::new();
    for l in stdout.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        if w.len() >= 4 && w[0] == "expect" && w[2] == "calls" {
            calls.insert(w[1].to_string(), w[3].parse().unwrap());
        }
    }
    let m = stderr
        .lines()
        .find(|l| l.starts_with("measured"))
        .expect("measured line");
    let w: Vec<&str> = m.split_whitespace().collect();
    Truth {
        calls,
        leaf_total_ms: w[3].parse::<f64>().unwrap() / 1e3,
        nap_total_ms: w[6].parse::<f64>().unwrap() / 1e3,
        nap_p50_us: match w.get(7..9) {
            Some(["nap", "p50_us"]) => w[9].parse().unwrap(),
            _ => panic!("no nap median in {m:?}"),
        },
    }
}

fn report(dir: &Path) -> Report {
    let json = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().ends_with(".json"))
        .expect("a JSON report");
    serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).expect("the JSON report parses")
}

fn within(what: &str, got: f64, want: f64, tol: f64) {
    let err = (got - want) / want;
    println!("{what}: {got:.1} vs {want:.1} ({:+.1}%)", err * 100.0);
    assert!(
        err.abs() <= tol,
        "{what}: reported {got:.1}, true {want:.1} ({:+.1}%)",
        err * 100.0
    );
}

/// Edges between instrumented functions that the tree has.
const TREE: [(&str, &str); 3] = [("worker", "step"), ("step", "leaf"), ("step", "nap")];
/// The one other call of an instrumented function the program makes: main
/// parses its argument with `atoi`, which clang inlines together with its
/// hooks (this_fn is libc's `atoi`), so the edge is real and may be
/// reported; gcc calls libc's uninstrumented `atoi`.
const OUTSIDE_TREE: [(&str, &str); 1] = [("main", "atoi")];
const INSTRUMENTED: [&str; 5] = ["main", "worker", "step", "leaf", "nap"];

/// No sampled call outlasts the run, and no function's estimated time
/// (its sampled mean times its estimated calls, so up to the estimate's
/// error) exceeds the run's on the threads it ran on: an exit paired with
/// a call that ended unseen long before breaks both (it did on SQLite's
/// interpreter, whose inlined helpers share one frame: 75 s in a 1.2 s
/// run).
fn no_call_outlasts_the_run(r: &Report) {
    for f in &r.functions {
        let threads = f.threads.len().max(1) as f64;
        assert!(
            f.max_us / 1e3 <= r.wall_ms * 1.01 + 1.0 && f.total_ms <= r.wall_ms * threads * 1.25 + 1.0,
            "{}: max {:.1} us, total {:.1} ms in a {:.1} ms run",
            f.name,
            f.max_us,
            f.total_ms,
            r.wall_ms
        );
    }
}

fn check_structure(r: &Report) {
    no_call_outlasts_the_run(r);
    let tree: HashSet<(&str, &str)> = TREE.into_iter().collect();
    let calls: HashSet<(&str, &str)> = TREE.into_iter().chain(OUTSIDE_TREE).collect();
    let edges: HashSet<(&str, &str)> = r
        .edges
        .iter()
        .filter(|e| INSTRUMENTED.contains(&e.caller.as_str()))
        .map(|e| (e.caller.as_str(), e.callee.as_str()))
        .collect();
    assert!(
        tree.is_subset(&edges) && edges.is_subset(&calls),
        "edges between instrumented functions: {edges:?}, want the tree {tree:?} (and at most {OUTSIDE_TREE:?})"
    );
    assert!(!r.stacks.is_empty());
    for s in &r.stacks.paths {
        let frames: Vec<&str> = r.stacks.frames(s).collect();
        for w in frames.windows(2) {
            let (a, b) = (w[0], w[1]);
            if a == "[...]" || b == "[...]" || !INSTRUMENTED.contains(&a) {
                continue;
            }
            assert!(
                calls.contains(&(a, b)),
                "stack {frames:?} joins {a} -> {b}, not a call the program makes"
            );
        }
    }
}

/// Runs `bin` under the profiler (the preload library's default tool) with
/// its reports in `out` and `env` besides.
fn profiled(bin: &Path, args: &[&str], dir: &Path, out: &Path, env: &[(&str, &str)]) -> std::process::Output {
    let mut e = vec![("FASTINST_OUT", out.to_str().unwrap())];
    e.extend_from_slice(env);
    run(bin, args, dir, true, &e)
}

/// The flag of each provider's builds.
const FINSTRUMENT: &str = "-finstrument-functions";
const SLED: &str = "-fpatchable-function-entry=5";

/// Rounds of `step` per worker in the accuracy runs (~2.2 s). An estimate
/// is a sum over windows, one per 10 ms epoch, and on this bursty tree
/// each window's error is large: at the program's default 8,000 rounds
/// (0.55 s), `step` and `leaf` spread with a standard deviation of ~3%
/// around +1% to +4%, and 3 of 160 estimates (40 runs) fell past the 10%
/// bound. Four times the windows halve the spread (1.1% to 2.0%
/// measured, none past 9%).
const ACCURACY_ROUNDS: &str = "32000";

fn run_tree(cc: &str, flag: &str, args: &[&str], name: &str) -> (Report, Truth, std::path::PathBuf) {
    let dir = scratch(name);
    let plain = dir.join("plain");
    let inst = dir.join("inst");
    build(cc, &[&src("tree.c")], &["-O2", "-pthread"], &plain);
    build(cc, &[&src("tree.c")], &["-O2", "-pthread", flag], &inst);
    let want = ok_stdout(&run(&plain, args, &dir, false, &[]), "plain");
    let out = dir.join("out");
    let o = profiled(&inst, args, &dir, &out, &[]);
    let got = ok_stdout(&o, "profiled");
    assert_eq!(got, want, "the program's output changed under the profiler");
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(stderr.contains("fastinst: profile of"), "no summary line: {stderr}");
    let r = report(&out);
    let t = truth(&got, &stderr);
    println!("{}", fastinst::profile::report::render_text(&r));
    (r, t, out)
}

fn check_accuracy(cc: &str, flag: &str) {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (r, t, out) = run_tree(cc, flag, &["1", ACCURACY_ROUNDS], &format!("acc-{cc}{flag}"));
    let f = |n: &str| {
        r.functions
            .iter()
            .find(|f| f.name == n)
            .unwrap_or_else(|| panic!("{n} missing"))
    };
    // Calls within 10% or, where the report says it is less certain than
    // that, within three of its standard deviations; and no estimate may
    // claim a spread past 8%. On CI's loaded machine one run of the gcc
    // build read `leaf` 11.3% high with a stated 6.9%: the windows of a
    // run whose threads share the CPUs with other tests' programs hold
    // fewer calls, and the report said so.
    for (name, calls) in &t.calls {
        let g = f(name);
        assert!(
            g.calls_sd <= 0.08 * g.calls_estimated,
            "{cc} {name} calls: {:.1} +- {:.1}, a spread past 8%",
            g.calls_estimated,
            g.calls_sd
        );
        let tol = (3.0 * g.calls_sd / calls).max(0.10);
        within(
            &format!("{cc} {name} calls (+- {:.1})", g.calls_sd),
            g.calls_estimated,
            *calls,
            tol,
        );
    }
    // The sampler woke ~200 times: its CPU time is reported, and is a
    // small part of the run.
    let o = &r.overhead;
    assert!(
        o.sampler_ms > 0.0,
        "the sampler's CPU time is read: {:.2} ms",
        o.sampler_ms
    );
    // A total is within 10% or, where the report says it is less certain
    // than that, within three of its standard deviations: on a loaded
    // machine a 20 us `leaf` now and then runs for milliseconds (its
    // thread preempted), and whether the ~1,200 timed calls caught one or
    // three such calls moves their mean by 10%. Where the report warns
    // that the threads waited for a CPU (`cpu_wait_share`), it says the
    // totals may be off by more than their spread: the waits fall in a few
    // calls, which a sample of timed calls most often misses (the program,
    // which times every call, counts them all). There the total may miss
    // up to the share of the time the threads waited: beside busy loops
    // on 2 CPUs, `leaf` read low by about that share, far outside its
    // stated spread.
    let waited = r
        .overhead
        .cpu_wait_share
        .filter(|&w| w >= fastinst_report::CONTENDED_PERCENT)
        .map_or(0.0, |w| w / 100.0);
    for (name, want) in [("leaf", t.leaf_total_ms), ("nap", t.nap_total_ms)] {
        let g = f(name);
        let all_timed = g.calls_exact && g.calls_sampled as f64 == g.calls_estimated;
        // Timed calls alone leave only the charges taken off inside them
        // (a sample's signal, a hook) uncertain, at 5% of those charges:
        // calls that mostly spin hold under a tenth of their time in them.
        if all_timed {
            assert!(
                g.total_sd <= 0.005 * g.total_ms,
                "{name}: a total of timed calls alone has the charges' spread only: {} of {}",
                g.total_sd,
                g.total_ms
            );
        } else {
            assert!(g.total_sd > 0.0, "{name}: a total of sampled calls has a spread");
        }
        let tol = (3.0 * g.total_sd / want).max(0.10).max(waited + 0.05);
        within(
            &format!(
                "{cc} {name} total ms (+- {:.1}, threads waited {:.0}%)",
                g.total_sd,
                waited * 100.0
            ),
            g.total_ms,
            want,
            tol,
        );
    }
    // Self time is where the CPU samples fall: leaf's own code is a call
    // to `spin`, whose clock reads hold nearly all the run's CPU time; an
    // estimate that took leaf's callees' time off its total (the old one)
    // or charged the spin to its instrumented caller would not say so.
    let cpu = r.cpu.as_ref().expect("CPU samples were taken");
    // Every kept sample is its thread's (each sampled thread has a clock),
    // and each sampled thread ran hooks, which were charged.
    let kept = cpu.samples - cpu.lost;
    assert_eq!(
        cpu.threads.iter().map(|t| t.samples).sum::<u64>(),
        kept,
        "{:?}",
        cpu.threads
    );
    assert_eq!(
        cpu.threads.iter().map(|t| t.profiler_samples).sum::<u64>(),
        cpu.profiler_samples
    );
    let tids: std::collections::BTreeSet<i32> = cpu.threads.iter().map(|t| t.tid).collect();
    assert_eq!(tids.len(), cpu.threads.len(), "a row per thread: {:?}", cpu.threads);
    for t in &cpu.threads {
        assert!(t.charged_ms > 0.0, "thread {}'s hooks were charged", t.tid);
    }
    let spinning: f64 = cpu
        .other
        .iter()
        .filter(|o| {
            ["spin", "now_us", "clock_gettime", "[vdso]"]
                .iter()
                .any(|n| o.name.contains(n))
        })
        .map(|o| o.share)
        .sum();
    let leaf_share = f("leaf").self_share.expect("leaf's share");
    println!("{cc}: spin and the clock {spinning:.1}% of the CPU samples, leaf {leaf_share:.1}%");
    assert!(spinning > 80.0, "{:?}", cpu.other);
    // Samples outside instrumented code are named by symbol, as perf names
    // them; a file's name in brackets (a PLT stub, a symbol-less gap) is
    // rare. A wrong load bias once named all of libc `[libc.so.6]`.
    let unnamed: f64 = cpu
        .other
        .iter()
        .filter(|o| o.name.starts_with('[') && o.name != "[vdso]")
        .map(|o| o.share)
        .sum();
    assert!(unnamed < 2.0, "{unnamed:.1}% unnamed: {:?}", cpu.other);
    assert!(leaf_share < 10.0, "leaf's own code is a call: {leaf_share:.1}%");
    let shares: f64 =
        r.functions.iter().filter_map(|f| f.self_share).sum::<f64>() + cpu.other.iter().map(|o| o.share).sum::<f64>();
    assert!((shares - 100.0).abs() < 1.0, "the shares sum to {shares:.2}%");
    within(&format!("{cc} leaf p50 us"), f("leaf").p50_us, 20.0, 0.10);
    // Against the exact median of the naps the program timed (their mean
    // is no reference: on a loaded machine some naps wake late by
    // milliseconds, which pulls the mean far above the median).
    within(&format!("{cc} nap p50 us"), f("nap").p50_us, t.nap_p50_us, 0.10);
    check_structure(&r);
    // Every report is there and readable.
    let pid = r.pid;
    for ext in ["txt", "json", "pb.gz", "folded", "svg"] {
        let p = out.join(format!("fastinst-profile.{pid}.{ext}"));
        let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert!(!bytes.is_empty(), "{} is empty", p.display());
    }
    let svg = std::fs::read_to_string(out.join(format!("fastinst-profile.{pid}.svg"))).unwrap();
    assert!(svg.contains("<svg") && svg.contains("step"), "flame graph");
    for line in std::fs::read_to_string(out.join(format!("fastinst-profile.{pid}.folded")))
        .unwrap()
        .lines()
    {
        let (stack, w) = line.rsplit_once(' ').expect("folded line: stack weight");
        assert!(!stack.is_empty() && w.parse::<u64>().is_ok(), "{line}");
    }
    assert!(r.overhead.samples > 0 && r.overhead.toggles > 0);
}

#[test]
fn gcc_known_tree_within_ten_percent() {
    check_accuracy("gcc", FINSTRUMENT);
}

#[test]
fn clang_known_tree_within_ten_percent() {
    check_accuracy("clang", FINSTRUMENT);
}

#[test]
fn gcc_sled_known_tree_within_ten_percent() {
    check_accuracy("gcc", SLED);
}

#[test]
fn clang_sled_known_tree_within_ten_percent() {
    check_accuracy("clang", SLED);
}

#[test]
fn four_threads_pair_and_attribute_correctly() {
    for flag in [FINSTRUMENT, SLED] {
        four_threads(flag);
    }
}

fn four_threads(flag: &str) {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (r, t, _) = run_tree("gcc", flag, &["4"], &format!("threads{flag}"));
    check_structure(&r);
    let worker = r.functions.iter().find(|f| f.name == "worker").expect("worker");
    assert_eq!(worker.calls_sampled, 4, "every thread's worker call paired");
    assert_eq!(worker.threads.len(), 4);
    assert!(r.functions.iter().any(|f| f.name == "leaf" && f.threads.len() >= 2));
    let _ = t;
}

/// `tests/c/rearm.c` with 50 us epochs: windows open and close at every
/// phase of the program's calls, on four threads at once, and none may
/// leave its function's probes off for good. (When timing filled a quota
/// per epoch, a handler that switched its probe off at the quota raced the
/// sampler reopening that window: before that race was closed, 7 or 8 of
/// `f0..f7` lost their entry probe in every run, and even one-threaded
/// QuickJS and SQLite lost 1 to 3 functions per run at these epochs.
/// Handlers now switch only exit probes off, against the same race.)
#[test]
fn short_epochs_leave_no_function_switched_off() {
    for flag in [FINSTRUMENT, SLED] {
        let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let dir = scratch(&format!("rearm{flag}"));
        let inst = dir.join("inst");
        build("gcc", &[&src("rearm.c")], &["-O2", "-pthread", flag], &inst);
        let out = dir.join("out");
        let o = profiled(&inst, &[], &dir, &out, &[("FASTINST_PROFILE_EPOCH_MS", "0.05")]);
        assert_eq!(ok_stdout(&o, "profiled"), "each of f0..f7 called 20000 times\n");
        let r = report(&out);
        for i in 0..8 {
            let name = format!("f{i}");
            let f = r
                .functions
                .iter()
                .find(|f| f.name == name)
                .unwrap_or_else(|| panic!("{name} missing"));
            // Loose: a function that lost its probe read 2% to 26% of its
            // calls, and at these epochs a sled build's estimates spread
            // from -32% to +10% (12 runs).
            within(&format!("{flag} {name} calls"), f.calls_estimated, 20000.0, 0.5);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// `tests/c/deep.c` on sled builds: recursion 200 deep whose sampled calls
/// return only after every level under them has been entered. A sled
/// function's exit probe follows its entry probe, so once the window
/// closes and the entry probe goes off, the levels below run with the sled
/// off: the window's sampled calls still return through the exit
/// trampoline (their return addresses were substituted on entry) and are
/// measured, and no other exit reaches the handler. Before, the exit probe kept the
/// sled on for the calls in flight: each level below went through both
/// trampolines to be dropped as an unmatched exit, 64 a window, after
/// which the exit probe went off and the window's sampled calls, still in
/// flight, were lost.
#[test]
fn a_sled_exit_probe_sees_only_the_calls_sampled_on_entry() {
    for cc in ["gcc", "clang"] {
        let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let dir = scratch(&format!("deep-{cc}"));
        let (plain, inst) = (dir.join("plain"), dir.join("inst"));
        build(cc, &[&src("deep.c")], &["-O2"], &plain);
        build(cc, &[&src("deep.c")], &["-O2", SLED], &inst);
        let want = ok_stdout(&run(&plain, &[], &dir, false, &[]), "plain");
        let out = dir.join("out");
        let o = profiled(&inst, &[], &dir, &out, &[]);
        assert_eq!(ok_stdout(&o, "profiled"), want, "{cc}: the program's output changed");
        let r = report(&out);
        println!("{}", fastinst::profile::report::render_text(&r));
        let descend = r.functions.iter().find(|f| f.name == "descend").expect("descend");
        let o = &r.overhead;
        // Every window's sampled calls return and are paired: at most a
        // call racing the entry probe's switch now and then is unmatched.
        // Preemption widens that race on a loaded machine (with two busy
        // loops on two CPUs, a few in a few hundred; under the suite's load
        // once 18 in 350); the bug this guards against left 64 a window,
        // thousands in a run, so a 10% bound still catches it.
        assert!(
            descend.calls_sampled >= 10 * 20 && o.unmatched_exits * 10 <= descend.calls_sampled,
            "{cc}: {} unmatched exits, {} abandoned frames, {} sampled calls of descend",
            o.unmatched_exits,
            o.abandoned_frames,
            descend.calls_sampled
        );
        // Every sampled level lasts the 50 us spin under it, and none
        // outlasts the run. (Its total time does: recursion counts nested
        // time in every enclosing activation, as gprof does.) A level timed
        // in a window holds up to 200 counted calls under it, whose hooks'
        // unseen cost is taken off as calibrated once at start: under the
        // suite's load the shortest level once read 49.1 us, as if that
        // calibration were ~10 ticks a hook too high; 3% allows for that.
        // A level a CPU sample's signal landed in reads that signal's
        // charge shorter besides: the spin runs to its deadline whatever
        // interrupts it (docs/limits.md, work paced by the wall clock),
        // and it holds one signal at most (a sample every 500 us of CPU).
        let signal_us = r.cpu.as_ref().map_or(0.0, |c| c.signal_us);
        assert!(
            descend.min_us >= 48.5 - signal_us && descend.max_us <= r.wall_ms * 1e3,
            "{cc}: sampled calls of {:.1} to {:.1} us in a {:.1} ms run (a signal charged {signal_us:.1} us)",
            descend.min_us,
            descend.max_us,
            r.wall_ms
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// `tests/c/jumps.c`: `longjmp` out of instrumented recursion, and
/// instrumented calls inside a signal handler that interrupts instrumented
/// code. The frames `longjmp` skips are dropped and counted; the steady
/// function beside them is still estimated within 10%; the handler's calls
/// are sampled; and no edge or flame-graph step joins two functions that
/// were not caller and callee (the handler's frame sits on top of the
/// interrupted one, but the signal frame between them is a gap).
///
/// gcc's `-finstrument-functions` build is run twice: by default the hooks
/// of `now_ns`, which gcc inlines into `spin_us`, are switched off at
/// discovery and `now_ns` is not in the report; with
/// `FASTINST_PROFILE_INLINED=1` they are sampled, and the edge names
/// `spin_us` as the caller (the hooks pass `spin_us`'s return address).
#[test]
fn longjmp_and_signal_handlers_pair_without_inventing_paths() {
    for (flag, inlined) in [(FINSTRUMENT, false), (FINSTRUMENT, true), (SLED, false)] {
        jumps(flag, inlined);
    }
}

fn jumps(flag: &str, inlined: bool) {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch(&format!("jumps{flag}{}", if inlined { "-inlined" } else { "" }));
    let (plain, inst) = (dir.join("plain"), dir.join("inst"));
    build("gcc", &[&src("jumps.c")], &["-O2"], &plain);
    build("gcc", &[&src("jumps.c")], &["-O2", flag], &inst);
    let want = ok_stdout(&run(&plain, &[], &dir, false, &[]), "plain");
    let out = dir.join("out");
    let o = profiled(
        &inst,
        &[],
        &dir,
        &out,
        &[("FASTINST_PROFILE_INLINED", if inlined { "1" } else { "0" })],
    );
    let got = ok_stdout(&o, "profiled");
    assert_eq!(got, want, "the program's output changed under the profiler");
    let stderr = String::from_utf8_lossy(&o.stderr);
    let signals: f64 = stderr
        .lines()
        .find_map(|l| l.strip_prefix("signals "))
        .expect("signals line")
        .parse()
        .unwrap();
    let r = report(&out);
    println!("{}", fastinst::profile::report::render_text(&r));
    no_call_outlasts_the_run(&r);
    let f = |n: &str| {
        r.functions
            .iter()
            .find(|f| f.name == n)
            .unwrap_or_else(|| panic!("{n} missing"))
    };
    assert!(
        r.overhead.abandoned_frames > 0,
        "thrower activations skipped by longjmp are dropped and counted"
    );
    if flag == SLED {
        // `after` tail-jumps to `spin_us`: both frames share one CFA and
        // both must pair (an exit is only watched once its entry fired).
        // Before that was so, every one of `after`'s 420 sampled exits went
        // unmatched; a few may, when a frame is entered while its exit
        // probe is being switched off (it is then dropped, not misread).
        let sampled = r
            .functions
            .iter()
            .find(|f| f.name == "after")
            .map_or(0, |f| f.calls_sampled);
        assert!(
            r.overhead.unmatched_exits * 20 <= sampled,
            "{} unmatched exits for {sampled} sampled calls of `after`",
            r.overhead.unmatched_exits
        );
    }
    assert_eq!(r.settings.inlined, inlined);
    let now_ns = r.functions.iter().find(|f| f.name == "now_ns");
    if flag == FINSTRUMENT && !inlined {
        assert!(now_ns.is_none(), "now_ns's inlined copies were sampled: {now_ns:?}");
        assert!(
            r.overhead.inlined_copies_off >= 2,
            "{} inlined-copy probes off",
            r.overhead.inlined_copies_off
        );
    } else {
        assert_eq!(r.overhead.inlined_copies_off, 0);
    }
    if flag == FINSTRUMENT && inlined {
        assert!(now_ns.is_some_and(|f| f.calls_sampled > 0), "now_ns not sampled");
        // `now_ns`'s exits, called from below any timed call in flight
        // (`spin_us`'s), take the exit hook's cheap path and never reach
        // a handler: the handlers see the unpaired exits of calls at or
        // above the timed one, which vary with where the windows fall: tens
        // of thousands, now and then past a bound of 40,000 (CI once read
        // 40,386). Every exit reaching its handler, as before the cheap
        // path, they saw 144,000-157,000: half that still tells the two
        // apart.
        assert!(
            r.overhead.unmatched_exits < 72_000,
            "{} exits reached their handler unpaired: the cheap exits are not taken",
            r.overhead.unmatched_exits
        );
        assert!(
            r.edges.iter().any(|e| e.caller == "spin_us" && e.callee == "now_ns"),
            "no spin_us -> now_ns edge"
        );
    }
    // With inlined copies on, `now_ns`'s hooks run inside `spin_us`, which
    // spins to a deadline on the wall clock: there the hooks' time replaces
    // the program's own instead of adding to it, so the windows that meet
    // `now_ns`'s read the calls around them at several times their rate
    // per tick of the program's time, and the estimates scatter more. The
    // report says so in its deviation: the bound is then three of them.
    let tol = |n: &str| {
        let g = f(n);
        if inlined {
            (3.0 * g.calls_sd / g.calls_estimated.max(1.0)).max(0.10)
        } else {
            0.10
        }
    };
    within("after calls", f("after").calls_estimated, 20000.0, tol("after"));
    within("after p50 us", f("after").p50_us, 20.0, 0.10);
    within("catcher calls", f("catcher").calls_estimated, 20000.0, tol("catcher"));
    assert!(signals > 100.0, "the timer fired: {signals}");
    assert!(f("in_handler").calls_sampled > 0 && f("on_signal").calls_sampled > 0);
    // now_ns is inlined into spin_us: its hooks pass spin_us's return
    // address (in after), but the edge must name spin_us.
    const CALLS: [(&str, &str); 7] = [
        ("main", "catcher"),
        ("main", "after"),
        ("catcher", "thrower"),
        ("thrower", "thrower"),
        ("after", "spin_us"),
        ("spin_us", "now_ns"),
        ("on_signal", "in_handler"),
    ];
    const FUNCS: [&str; 8] = [
        "main",
        "catcher",
        "thrower",
        "after",
        "spin_us",
        "now_ns",
        "on_signal",
        "in_handler",
    ];
    let calls: HashSet<(&str, &str)> = CALLS.into_iter().collect();
    // A sled build sees machine frames: `after` ends in a tail jump to
    // `spin_us`, so unless `after`'s own exit is being watched, `spin_us`
    // returns straight to `main` and is reported as called from there. A
    // chain of real calls must still connect the two.
    let sled = flag == SLED;
    let happened = |a: &str, b: &str| {
        if calls.contains(&(a, b)) {
            return true;
        }
        let mut seen = vec![a];
        let mut i = 0;
        while sled && i < seen.len() {
            let x = seen[i];
            for &(p, q) in &CALLS {
                if p == x && !seen.contains(&q) {
                    if q == b {
                        return true;
                    }
                    seen.push(q);
                }
            }
            i += 1;
        }
        false
    };
    for e in &r.edges {
        if FUNCS.contains(&e.caller.as_str()) {
            assert!(
                happened(e.caller.as_str(), e.callee.as_str()),
                "edge {} -> {} did not happen",
                e.caller,
                e.callee
            );
        }
    }
    for s in &r.stacks.paths {
        let frames: Vec<&str> = r.stacks.frames(s).collect();
        for w in frames.windows(2) {
            let (a, b) = (w[0], w[1]);
            if FUNCS.contains(&a) && FUNCS.contains(&b) {
                assert!(happened(a, b), "stack {frames:?} joins {a} -> {b}");
            }
        }
    }
}

/// `tests/c/clones.c` at gcc -O3: the hooks of a clone (`scale.constprop.0`)
/// pass the original function's address from outside its symbol, yet the
/// clone is the function's own code, not a copy inlined elsewhere: with
/// inlined copies off (the default) its calls are still sampled, and no
/// probe is taken for an inlined copy.
#[test]
fn a_functions_clones_are_sampled_with_inlined_copies_off() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("clones");
    let (plain, inst) = (dir.join("plain"), dir.join("inst"));
    build("gcc", &[&src("clones.c")], &["-O3"], &plain);
    build("gcc", &[&src("clones.c")], &["-O3", FINSTRUMENT], &inst);
    let want = ok_stdout(&run(&plain, &[], &dir, false, &[]), "plain");
    let out = dir.join("out");
    let o = profiled(&inst, &[], &dir, &out, &[]);
    assert_eq!(
        ok_stdout(&o, "profiled"),
        want,
        "the program's output changed under the profiler"
    );
    let r = report(&out);
    println!("{}", fastinst::profile::report::render_text(&r));
    assert!(!r.settings.inlined);
    assert_eq!(
        r.overhead.inlined_copies_off, 0,
        "a clone's probes were taken for inlined copies"
    );
    let scale = r.functions.iter().find(|f| f.name == "scale").expect("scale sampled");
    // 30,000 calls through the clone (~9 us each) and one of scale itself.
    assert!(
        scale.calls_sampled >= 10,
        "{} sampled calls of scale",
        scale.calls_sampled
    );
    within("scale calls", scale.calls_estimated, 30_001.0, 0.25);
    // The clone is called from check: its return address names the
    // caller, not the clone's own symbol (which never called scale).
    assert!(
        r.edges.iter().any(|e| e.caller == "check" && e.callee == "scale"),
        "no check -> scale edge"
    );
    for e in &r.edges {
        assert!(!e.caller.contains(".constprop"), "edge {} -> {}", e.caller, e.callee);
    }
    for st in &r.stacks.paths {
        let frames: Vec<&str> = r.stacks.frames(st).collect();
        assert!(!frames.iter().any(|f| f.contains(".constprop")), "stack {frames:?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A function whose entry probe is off at the fork (counted whole past its
/// overflow, or between windows) has it off in the child too; the child
/// re-arms it at once, so the child's report samples and counts the
/// child's own calls of it (before, it was never sampled again in the
/// child).
#[test]
fn a_forked_child_samples_functions_whose_probe_was_off_in_the_parent() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("fork_profile");
    let inst = dir.join("inst");
    build("gcc", &[&src("fork_profile.c")], &["-O2", FINSTRUMENT], &inst);
    let out = dir.join("out");
    // A long epoch: the parent's sampler does not re-arm `work` between
    // its 5,000 calls and the fork (its overflow is 1,920 calls).
    let o = profiled(&inst, &[], &dir, &out, &[("FASTINST_PROFILE_EPOCH_MS", "300")]);
    let got = ok_stdout(&o, "profiled");
    let child: u32 = got
        .lines()
        .find_map(|l| l.strip_prefix("child "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("no child line: {got}"));
    assert!(got.contains("parent ") && got.contains("status 0"), "{got}");
    let json = out.join(format!("fastinst-profile.{child}.json"));
    let r: Report = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).expect("the child's report parses");
    println!("{}", fastinst::profile::report::render_text(&r));
    let work = r
        .functions
        .iter()
        .find(|f| f.name == "work")
        .expect("the child sampled `work`");
    assert!(work.calls_sampled >= 10, "{} sampled calls", work.calls_sampled);
    within("child's work calls", work.calls_estimated, 200.0, 0.25);
}

/// The default sampler is a thread glibc does not know: a single-threaded
/// program keeps glibc's single-threaded mode (its `malloc` takes no lock)
/// while the sampler re-opens windows all through the run; the regular
/// thread (`FASTINST_PROFILE_SAMPLER=pthread`) does the same work and ends
/// glibc's single-threaded mode.
#[test]
fn the_clone_sampler_keeps_glibc_single_threaded() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("single");
    let inst = dir.join("inst");
    build("gcc", &[&src("single.c")], &["-O2", FINSTRUMENT], &inst);
    for (sampler, single) in [("clone", 1), ("pthread", 0)] {
        let out = dir.join(sampler);
        let o = profiled(&inst, &[], &dir, &out, &[("FASTINST_PROFILE_SAMPLER", sampler)]);
        ok_stdout(&o, sampler);
        let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(
            stderr.contains(&format!("single-threaded: {single}, threads: 2")),
            "{sampler}: {stderr}"
        );
        let r = report(&out);
        let hot = r.functions.iter().find(|f| f.name == "hot").expect("hot profiled");
        // 10 samples per window, a window per 10 ms epoch of a 300 ms run:
        // far more than one window's worth means the sampler re-armed it.
        assert!(
            hot.calls_sampled >= 100,
            "{sampler}: hot sampled {} times",
            hot.calls_sampled
        );
        assert!(r.overhead.toggles > 0, "{sampler}: no toggles");
    }
}

/// With twice as many busy processes as CPUs beside it, the program's
/// threads wait for a CPU much of the time they could run: the report
/// says so, and warns that timed durations may be biased (on such a
/// machine the leaf's total read -47% of the program's own measure, with
/// a spread of 5%: the timed calls, which begin right after the sampler
/// ran, were preempted less than calls at large).
#[test]
fn cpu_contention_is_measured_and_warned_of() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    let busy: Vec<std::process::Child> = (0..2 * cpus)
        .map(|_| {
            std::process::Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .spawn()
                .expect("a busy loop")
        })
        .collect();
    let (r, _, out) = run_tree("gcc", SLED, &["2", "4000"], "contention");
    for mut b in busy {
        let _ = b.kill();
        let _ = b.wait();
    }
    let w = r.overhead.cpu_wait_share.expect("the run delay is read");
    assert!(w >= 20.0, "{w:.1}% waiting beside {} busy processes", 2 * cpus);
    let txt = std::fs::read_dir(&out)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().ends_with(".txt"))
        .expect("a text report");
    let text = std::fs::read_to_string(txt).unwrap();
    assert!(text.contains("cpu contention: the threads waited for a CPU"), "{text}");
}

/// `tests/c/phases.c`: a function whose calls are short in a dense phase
/// and long in a sparse one that takes about as much time, for both build
/// kinds. Its profiled mean against its profiled median (almost every call
/// is short), and its total against the `trace` tool's (every call timed)
/// on the same binary. When the profiler timed the first calls of each
/// function after the start of an epoch, about half of them fell in the
/// sparse phase: the mean read eight times the median and the trace's
/// mean (the bias that made short, hot interpreter functions read five to
/// ten times their time).
#[test]
fn a_phased_functions_timed_calls_are_a_sample_of_all_its_calls() {
    for flag in [FINSTRUMENT, SLED] {
        let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let dir = scratch(&format!("phases{flag}"));
        let inst = dir.join("inst");
        build("gcc", &[&src("phases.c")], &["-O2", flag], &inst);
        let want = "work called 2008000 times\n";
        let (prof, trace) = (dir.join("profile"), dir.join("trace"));
        let o = profiled(&inst, &[], &dir, &prof, &[]);
        assert_eq!(ok_stdout(&o, "profiled"), want);
        let o = profiled(&inst, &[], &dir, &trace, &[("FASTINST_TOOL", "trace")]);
        assert_eq!(ok_stdout(&o, "traced"), want);
        let r = report(&prof);
        let t: Report = serde_json::from_str(
            &std::fs::read_to_string(
                std::fs::read_dir(&trace)
                    .unwrap()
                    .map(|e| e.unwrap().path())
                    .find(|p| p.extension().is_some_and(|x| x == "json"))
                    .expect("the trace's JSON report"),
            )
            .unwrap(),
        )
        .expect("the trace report parses");
        println!("{}", fastinst::profile::report::render_text(&r));
        let work = |r: &Report| r.functions.iter().find(|f| f.name == "work").cloned().expect("work");
        let (p, t) = (work(&r), work(&t));
        assert_eq!(t.calls_estimated, 2_008_000.0, "{flag}: the trace counts every call");
        assert!(p.calls_sampled >= 100, "{flag}: {} timed calls", p.calls_sampled);
        // The bias this guards against read the mean at eight times the
        // median: half the timed calls were long. Of all calls, 8,000 in
        // 2,008,000 are long (>= 2 us), so in a fair sample of them the
        // 90th percentile is a short call too (the 99th may not be, in a
        // sample of a few hundred: a few long calls more than expected
        // reach it). (The mean is no
        // guard: one short call preempted for a fraction of a time slice
        // moves it past twice the median, as it did once in CI under
        // load, at 0.315 us against a median of 0.085.)
        println!(
            "{flag}: mean {:.3} us, p50 {:.3} us, p90 {:.3} us, p99 {:.3} us; trace {:.3} / {:.3}",
            p.mean_us, p.p50_us, p.p90_us, p.p99_us, t.mean_us, t.p50_us
        );
        assert!(
            p.p90_us < 1.0,
            "{flag}: p90 {} us: long calls are over-sampled",
            p.p90_us
        );
        assert!(
            p.mean_us >= 0.8 * p.p50_us,
            "{flag}: mean {} us against a median of {} us",
            p.mean_us,
            p.p50_us
        );
        assert!(p.p50_us < 1.0, "{flag}: the median is a short call's: {} us", p.p50_us);
        // Against the trace, another run whose every-call hooks slow it and
        // whose speed varies with the machine's load (its total of this
        // function read 195 to 430 ms in CI): within a factor of two, or
        // three stated deviations.
        let ratio = p.total_ms / t.total_ms;
        assert!(
            (0.5..=2.0).contains(&ratio) || (p.total_ms - t.total_ms).abs() <= 3.0 * p.total_sd,
            "{flag}: total {:.1} +- {:.1} ms against the trace's {:.1}",
            p.total_ms,
            p.total_sd,
            t.total_ms
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// A burst of a function's calls shorter than an epoch (`tests/c/burst.c`):
/// its count passes the epoch's whole-counting limit at once. The stubs
/// count the rest of the epoch, so the estimate is exact: a sled build's,
/// and a `-finstrument-functions` build's, whose entry calls get counting
/// stubs of their own. Switching the probe off instead, as a
/// `-finstrument-functions` build did before, left the rest of the burst
/// to the next epoch's windows, which come after it (QuickJS's sort
/// comparator read 130 of a million calls). Long epochs keep the burst
/// inside one.
#[test]
fn a_burst_inside_one_epoch_is_counted_exactly_by_the_stubs() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for (cc, flag) in [("gcc", SLED), ("gcc", FINSTRUMENT), ("clang", FINSTRUMENT)] {
        let dir = scratch(&format!("burst-{cc}{flag}"));
        let r = profile_build(
            &dir,
            &src("burst.c"),
            (cc, flag),
            &[],
            &[("FASTINST_PROFILE_EPOCH_MS", "400")],
            "hot called 300000 times\n",
        );
        let hot = r.functions.iter().find(|f| f.name == "hot").expect("hot is profiled");
        assert_eq!(
            hot.calls_estimated, 300_000.0,
            "{cc} {flag}: every call counted, {} of them by the handlers before the stubs took over",
            hot.calls_sampled
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// A program of many short functions (`testkit::programs::many_functions`: 20,000 of a few
/// nanoseconds each, called in turn by 4 threads). Each is called far more
/// often than the profiler counts whole, but with every call hooked the
/// program slows so much that each epoch holds only a call or two of each:
/// judged by that count, every function stayed whole, every call hooked and
/// timed, and the program ran at a fiftieth of its speed. Judged in the
/// program's own time, they go windowed.
///
/// The program's own time was first the CPU time less the hooks'
/// charges, which miss what no stamp covers: on a slower 2-CPU machine
/// (CI's, then this one) the charges held under two thirds of the
/// profiler's time that the CPU samples found, the slowing read about 2
/// where it was 50, and the functions stayed whole again (18,880 of
/// 20,000; 2.2 M of 3 M calls timed in CI). The slowing is now also read
/// from the CPU samples, and the larger wins. Each function is also
/// counted whole until 32 of its calls (`STRETCH_AFTER_CALLS`), a fixed
/// number of timed calls whatever the machine's speed, so the bound on
/// the timed share is loose: only the bug (every call timed) fails it.
#[test]
fn the_profilers_own_slowing_does_not_keep_short_functions_whole() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("many");
    let c = dir.join("many.c");
    std::fs::write(&c, testkit::programs::many_functions(20_000)).unwrap();
    let r = sled_profile(&dir, &c, &["1.5"], &[], "done\n");
    let fs: Vec<_> = r.functions.iter().filter(|f| f.name.starts_with('f')).collect();
    assert!(fs.len() >= 19_000, "{} functions profiled", fs.len());
    let whole = fs.iter().filter(|f| f.calls_exact).count();
    let (timed, calls): (u64, f64) = fs
        .iter()
        .fold((0, 0.0), |(t, c), f| (t + f.calls_sampled, c + f.calls_estimated));
    println!(
        "{whole} of {} functions whole; {timed} timed calls of {calls:.0}",
        fs.len()
    );
    assert!(
        whole * 10 < fs.len(),
        "{whole} of {} functions were counted whole all run",
        fs.len()
    );
    assert!(
        (timed as f64) < 0.5 * calls,
        "{timed} timed calls of {calls:.0}: nearly every call hooked"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// 200 short functions called in turn by one thread: each is called once
/// a pass, so the program's count of its passes is every function's
/// calls. A log of every window against the program's own count of its
/// passes found each window's count exact and the estimates 10-40% low:
/// the windows left gaps at each wake-up and each epoch's turn in which
/// the program ran with fewer hooks, faster than in any window, uncounted
/// (now they swap with no gap and run on across epochs); and the timed
/// calls filled nine tenths of the program's time, so a window's exposure
/// was mostly what the hooks' charges missed (now their number is
/// scaled to hold the profiler's share, `settings.timing_scale`).
#[test]
fn many_short_functions_read_their_calls_near_the_count() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("many200");
    let c = dir.join("many.c");
    std::fs::write(&c, testkit::programs::many_functions(200)).unwrap();
    let inst = dir.join("inst");
    build("gcc", &[&c], &["-O2", SLED, "-pthread"], &inst);
    let prof = dir.join("profile");
    let o = profiled(&inst, &["1.0", "0", "0", "1"], &dir, &prof, &[]);
    assert_eq!(ok_stdout(&o, "profiled"), "done\n");
    let passes = stderr_figure(&o, "passes");
    let r = report(&prof);
    let fs: Vec<_> = r.functions.iter().filter(|f| f.name.starts_with('f')).collect();
    assert_eq!(fs.len(), 200, "every function profiled");
    let mean = fs.iter().map(|f| f.calls_estimated).sum::<f64>() / fs.len() as f64;
    let inside = fs
        .iter()
        .filter(|f| (f.calls_estimated - passes).abs() <= 3.0 * f.calls_sd.max(1.0))
        .count();
    println!(
        "{passes} passes; mean estimate {mean:.0} ({:+.1}%); {inside} of 200 within 3 sd; timing scale {:.2}",
        100.0 * (mean / passes - 1.0),
        r.settings.timing_scale
    );
    assert!(
        (mean / passes - 1.0).abs() < 0.1,
        "mean estimate {mean:.0} against {passes} calls each"
    );
    assert!(inside >= 180, "{inside} of 200 estimates within 3 sd of their calls");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The sampler wakes to open and close windows, and sleeps through a
/// stretch in which none opens or closes: it used to wake at its least
/// interval whatever the schedule held, and each wake-up preempted a
/// thread of a program that kept the CPUs busy, and cost an idle service
/// CPU time of its own (`crates/benches/results/accuracy.md`). `quiet.c`
/// sleeps around a burst of `hot`: its wake-ups must fit in the burst at
/// the least interval between them (75 us, the shortest draw), where the
/// quiet stretches alone would make thousands; and the burst's calls are
/// still estimated from its windows.
#[test]
fn the_sampler_sleeps_through_a_quiet_stretch() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("quiet");
    let want = "hot called 40000000 times\n";
    let (o, r) = profile_build_output(&dir, &src("quiet.c"), ("gcc", SLED), &[], &[], want);
    let burst_ms = stderr_figure(&o, "burst_ms");
    let wakeups = r.overhead.sampler_wakeups;
    // The least interval is half the mean, 75 us, and `hot` may keep
    // windows for an epoch or two past the burst; the epochs' turns are
    // not wake-ups. The quiet stretches' 1.6 s at the old interval (at
    // most 225 us) would make over 7,000.
    let most = ((burst_ms + 50.0) * 1000.0 / 75.0) as u64;
    println!(
        "{wakeups} wake-ups in a {:.0} ms run, {burst_ms:.1} ms of it busy (at most {most})",
        r.wall_ms
    );
    assert!(
        wakeups <= most,
        "{wakeups} wake-ups, {most} at most in a {burst_ms:.1} ms burst"
    );
    let hot = r.functions.iter().find(|f| f.name == "hot").expect("hot is profiled");
    assert!(!hot.calls_exact, "hot was windowed");
    assert!(wakeups > 0, "hot's windows opened at wake-ups");
    // A sanity bound, not an accuracy one: a function of a few
    // instructions called back to back reads low by what its counting
    // costs beyond its charge (docs/limits.md). It guards the burst's
    // switch from whole to windowed, whose rate, read over an epoch the
    // thread had slept through, made the estimate many times the calls
    // now and then (`window::Estimate::go_windowed_after_epoch`).
    let ratio = hot.calls_estimated / 4e7;
    assert!(
        (1.0 / 3.0..3.0).contains(&ratio),
        "hot's calls read {ratio:.3} of the truth"
    );
    let handle = r
        .functions
        .iter()
        .find(|f| f.name == "handle")
        .expect("handle is profiled");
    assert_eq!(handle.calls_estimated, 640.0, "handle counted whole");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A function the filter leaves out costs its callers its NOPs and little
/// more: in a `-finstrument-functions` build its exit calls too are
/// discovered and switched off. The exit hook's cheap path (an exit with
/// no timed call to pair with returns at once, before any look-up) had
/// kept them from ever being discovered: `mid` and `leaf` ran the exit
/// hook at every call all run, and with only `main` probed an
/// interpreter spent a third of its CPU time there. Now one cheap exit in
/// 4,096 runs the whole hook, which discovers its site. The report counts
/// every probe the filter switched off: the three refused functions'
/// entries and the exits of `mid` and `leaf` (millions of calls); `main`'s
/// one exit may stay on, cheap.
#[test]
fn a_function_the_filter_leaves_out_keeps_no_exit_hook_on() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("filtered");
    let plain = dir.join("plain");
    build("gcc", &[&src("filtered.c")], &["-O2"], &plain);
    let want = ok_stdout(&std::process::Command::new(&plain).output().unwrap(), "plain");
    let only_work = [("FASTINST_FUNCTIONS", "work")];
    let r = profile_build(&dir, &src("filtered.c"), ("gcc", FINSTRUMENT), &[], &only_work, &want);
    let work = r.functions.iter().find(|f| f.name == "work").expect("work is profiled");
    // Counted whole, its count is exact; where a fast stretch held more
    // than a window's threshold of its calls in one epoch it went windowed,
    // and its estimate is held to the harness's bound.
    println!(
        "work: {} calls (exact: {}, sd {}); {} probes switched off",
        work.calls_estimated, work.calls_exact, work.calls_sd, r.overhead.filtered_off
    );
    if work.calls_exact {
        assert_eq!(work.calls_estimated, 20.0, "work counted whole");
    } else {
        let tol = (3.0 * work.calls_sd).max(0.15 * 20.0);
        assert!(
            (work.calls_estimated - 20.0).abs() <= tol,
            "work's 20 calls estimated at {} +- {}",
            work.calls_estimated,
            work.calls_sd
        );
    }
    assert!(
        r.functions.iter().all(|f| f.name == "work" || f.calls_sampled == 0),
        "only work is profiled: {:?}",
        r.functions.iter().map(|f| &f.name).collect::<Vec<_>>()
    );
    assert!(
        r.overhead.filtered_off >= 5,
        "{} probes switched off: main's, mid's and leaf's entries, mid's and leaf's exits",
        r.overhead.filtered_off
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The number a test program printed on stderr after `key` and a space.
fn stderr_figure(o: &std::process::Output, key: &str) -> f64 {
    String::from_utf8_lossy(&o.stderr)
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no `{key}` line on stderr"))
        .trim()
        .parse()
        .unwrap()
}

/// Builds C program `source` in `dir` with gcc -O2 and sleds, runs it
/// profiled with `args` and `env`, checks that it printed `stdout`, and
/// reads its report.
fn sled_profile(dir: &Path, source: &Path, args: &[&str], env: &[(&str, &str)], stdout: &str) -> Report {
    profile_build(dir, source, ("gcc", SLED), args, env, stdout)
}

/// [`sled_profile`] with compiler and instrumentation flag `build`.
fn profile_build(
    dir: &Path,
    source: &Path,
    build: (&str, &str),
    args: &[&str],
    env: &[(&str, &str)],
    stdout: &str,
) -> Report {
    profile_build_output(dir, source, build, args, env, stdout).1
}

/// [`profile_build`], with the profiled run's output (its stderr).
fn profile_build_output(
    dir: &Path,
    source: &Path,
    (cc, flag): (&str, &str),
    args: &[&str],
    env: &[(&str, &str)],
    stdout: &str,
) -> (std::process::Output, Report) {
    let inst = dir.join("inst");
    build(cc, &[source], &["-O2", flag, "-pthread"], &inst);
    let prof = dir.join("profile");
    let o = profiled(&inst, args, dir, &prof, env);
    assert_eq!(ok_stdout(&o, "profiled"), stdout);
    (o, report(&prof))
}

/// A CPU sample is a signal, and a signal costs the thread it lands on
/// time no hook stamps and no sample sees: the kernel's interrupt, the
/// signal frame, the return (microseconds; in a virtual machine, several
/// percent of a thread's time at the sampling period). The profiler
/// measures it at start and charges it to
/// the thread at each sample, so it is taken off the call it lands in:
/// `grind`'s one call (`tests/c/grind.c`), timed whole, reads the
/// program's own measure of it less its signals, which the report states.
/// Uncharged, the call read the whole measure, signals and all. Both ways
/// of sampling: a `cpu-clock` event's `SIGTRAP`, and, where the program
/// does not leave `SIGTRAP` to the profiler (here it ignores it), the
/// process timer's `SIGPROF`.
#[test]
fn a_sampling_signals_cost_is_taken_off_the_call_it_lands_in() {
    use std::os::unix::process::CommandExt;
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("grind");
    let inst = dir.join("inst");
    build("gcc", &[&src("grind.c")], &["-O2", SLED], &inst);
    for timer in [false, true] {
        let out = dir.join(format!("out-{timer}"));
        let mut c = std::process::Command::new(&inst);
        c.current_dir(&dir).env("LD_PRELOAD", lib()).env("FASTINST_OUT", &out);
        if timer {
            // SAFETY: runs in the forked child before it executes the
            // program; `signal` is async-signal-safe.
            unsafe {
                c.pre_exec(|| {
                    libc::signal(libc::SIGTRAP, libc::SIG_IGN);
                    Ok(())
                })
            };
        }
        let o = output_within(c, RUN_LIMIT, "grind");
        ok_stdout(&o, "profiled");
        let stderr = String::from_utf8_lossy(&o.stderr);
        let measured_ms = stderr
            .lines()
            .find_map(|l| l.strip_prefix("grind took "))
            .and_then(|l| l.trim_end_matches(" ns").parse::<f64>().ok())
            .expect("the program's measure")
            / 1e6;
        let r = report(&out);
        let cpu = r.cpu.as_ref().expect("CPU samples");
        assert_eq!(cpu.interval_us, if timer { 997.0 } else { 500.0 }, "timer: {timer}");
        assert!(
            cpu.signal_us > 0.0 && cpu.signal_us < 1000.0,
            "a signal's cost is measured: {} us",
            cpu.signal_us
        );
        let text = fastinst::profile::report::render_text(&r);
        assert!(text.contains("sampling signals: each cost its thread"), "{text}");
        let g = r.functions.iter().find(|f| f.name == "grind").expect("grind");
        assert!(g.calls_exact && g.calls_sampled == 1, "its one call is timed");
        // The thread's samples nearly all fell in the call.
        let signals_ms = cpu.samples as f64 * cpu.signal_us / 1e3;
        let taken_off = measured_ms - g.total_ms;
        println!(
            "timer {timer}: grind {:.2} ms, the program measured {measured_ms:.2}; {} samples of {:.1} us: {signals_ms:.2} ms",
            g.total_ms, cpu.samples, cpu.signal_us
        );
        assert!(cpu.samples >= 20, "{} samples", cpu.samples);
        assert!(
            taken_off >= 0.5 * signals_ms && taken_off <= 1.5 * signals_ms + 1.0,
            "timer {timer}: {taken_off:.2} ms taken off grind's call, its signals {signals_ms:.2} ms"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A program that installs its own handler for the samples' signal after
/// the profiler started (`grind.c own-trap`) takes their signals from then
/// on: the report says the samples stopped, where it used to show a run
/// without samples and say nothing.
#[test]
fn a_program_that_takes_the_sampling_signal_is_said_to_have_stopped_the_samples() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("grind-own-trap");
    let inst = dir.join("inst");
    build("gcc", &[&src("grind.c")], &["-O2", SLED], &inst);
    let out = dir.join("out");
    let o = profiled(&inst, &["own-trap"], &dir, &out, &[]);
    ok_stdout(&o, "profiled");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("its own handler for the CPU samples' signal"),
        "{stderr}"
    );
    let r = report(&out);
    let cpu = r.cpu.as_ref().expect("CPU samples");
    assert!(cpu.handler_lost, "{cpu:?}");
    let text = fastinst::profile::report::render_text(&r);
    assert!(text.contains("cpu samples stopped"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A CPU sample that lands on an instrumented function's first
/// instruction is that function's. The program calls `hot` in a loop, laid
/// out (functions packed, no padding) right where `never`, which is never
/// called, ends: a sample on `hot`'s entry, which a return address's
/// rule (a function's end is its own) charged to `never`, gave a function
/// of no calls self time (Lua's `lua_copy`, before `lua_pushvalue`).
#[test]
fn a_cpu_sample_on_a_functions_entry_is_its_own() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("entry");
    // gcc: clang keeps its functions 16-byte aligned whatever it is told,
    // and a gap between them hides the mistake.
    let cc = "gcc";
    let inst = dir.join(format!("inst-{cc}"));
    build(cc, &[&src("entry.c")], &["-O2", SLED, "-falign-functions=1"], &inst);
    // The layout the check needs: `never` ends where `hot` begins.
    let nm = std::process::Command::new("nm")
        .arg("-S")
        .arg(&inst)
        .output()
        .expect("nm (binutils)");
    let symbols = String::from_utf8_lossy(&nm.stdout);
    let at = |name: &str| -> (u64, u64) {
        symbols
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|w| w.len() == 4 && w[3] == name)
            .map(|w| {
                (
                    u64::from_str_radix(w[0], 16).unwrap(),
                    u64::from_str_radix(w[1], 16).unwrap(),
                )
            })
            .unwrap_or_else(|| panic!("{cc}: no sized symbol {name}:\n{symbols}"))
    };
    let ((never, never_size), (hot, _)) = (at("never"), at("hot"));
    assert_eq!(never + never_size, hot, "{cc}: `never` does not end where `hot` begins");
    let out = dir.join(format!("out-{cc}"));
    let o = profiled(&inst, &["300000000"], &dir, &out, &[]);
    ok_stdout(&o, cc);
    let r = report(&out);
    assert!(!r.began_running, "a preloaded profile began with the process");
    let samples = |name: &str| r.functions.iter().find(|f| f.name == name).map_or(0, |f| f.cpu_samples);
    println!("{cc}: hot {} samples, never {}", samples("hot"), samples("never"));
    assert!(samples("hot") >= 20, "{cc}: hot has {} CPU samples", samples("hot"));
    assert_eq!(samples("never"), 0, "{cc}: a function never called has CPU samples");
}
