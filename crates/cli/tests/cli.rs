//! The `fastinst` command end to end: `sites` agrees with what the runtime
//! discovers, `run` passes the program's output and exit status through and
//! leaves the reports, `report` re-renders them byte for byte, and every
//! error names its file.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn have(cc: &str) -> bool {
    Command::new(cc)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Builds `tests/c/app.c` with `cc flags`. A missing compiler fails the
/// test, naming the Debian package to install: a skipped build proves
/// nothing.
fn build(cc: &str, flags: &[&str], dir: &Path, name: &str) -> PathBuf {
    assert!(
        have(cc),
        "`{cc}` is needed by the CLI tests (Debian package `{cc}`; see the README: apt-get install -y clang)"
    );
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/app.c");
    let out = dir.join(name);
    let st = Command::new(cc)
        .args(flags)
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .status()
        .unwrap();
    assert!(st.success(), "{cc} {flags:?} failed");
    out
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The timeline `{prefix}PID.timeline.json.gz` in `dir`, parsed.
fn timeline(dir: &Path, prefix: &str) -> serde_json::Value {
    use std::io::Read;
    let path = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.starts_with(prefix) && n.ends_with(".timeline.json.gz")
        })
        .unwrap_or_else(|| panic!("no {prefix}*.timeline.json.gz in {}", dir.display()));
    let mut s = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(&path).unwrap())
        .read_to_string(&mut s)
        .expect("gzipped text");
    serde_json::from_str(&s).expect("Chrome trace-event JSON")
}

/// The complete slices (`"ph": "X"`) of a timeline.
fn slices(tl: &serde_json::Value) -> Vec<&serde_json::Value> {
    tl["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X")
        .collect()
}

fn builds(dir: &Path) -> Vec<(String, PathBuf)> {
    let mut v = Vec::new();
    let configs: [(&str, &[&str]); 8] = [
        ("gcc", &["-O2", "-finstrument-functions"]),
        ("gcc", &["-O0", "-finstrument-functions"]),
        ("gcc", &["-O2", "-fno-plt", "-finstrument-functions"]),
        ("clang", &["-O2", "-finstrument-functions-after-inlining"]),
        ("clang", &["-O1", "-no-pie", "-fno-pie", "-finstrument-functions"]),
        ("gcc", &["-O2", "-fpatchable-function-entry=5"]),
        ("gcc", &["-O0", "-no-pie", "-fno-pie", "-fpatchable-function-entry=5"]),
        ("clang", &["-O2", "-fpatchable-function-entry=5"]),
    ];
    for (i, (cc, flags)) in configs.iter().enumerate() {
        let name = format!("app{i}");
        v.push((format!("{cc} {}", flags.join(" ")), build(cc, flags, dir, &name)));
    }
    v
}

#[test]
fn sites_lists_what_the_runtime_discovers() {
    let dir = scratch("sites");
    for (what, app) in builds(&dir) {
        let app_s = app.to_str().unwrap();
        let listed = fastinst(&["sites", "--json", app_s], &dir);
        assert!(listed.status.success(), "{what}: {}", text(&listed.stderr));
        let s: serde_json::Value = serde_json::from_str(&text(&listed.stdout)).unwrap();
        let sites = s["sites"].as_array().unwrap();
        assert_eq!(sites.len() as u64, s["sites_total"].as_u64().unwrap());
        assert_eq!(
            s["entry"].as_u64().unwrap() + s["exit"].as_u64().unwrap(),
            s["sites_total"].as_u64().unwrap()
        );
        let funcs: std::collections::BTreeSet<&str> = sites.iter().map(|x| x["function"].as_str().unwrap()).collect();
        for f in ["main", "work"] {
            assert!(funcs.contains(f), "{what}: no site in {f}: {funcs:?}");
        }
        // With an argument every site of this program runs (including those
        // of an inlined `atoi`), so the runtime discovers exactly the sites
        // listed.
        let out = dir.join(format!("out-{}", app.file_name().unwrap().to_str().unwrap()));
        let run = fastinst(&["run", "--out", out.to_str().unwrap(), "--", app_s, "0"], &dir);
        assert!(run.status.success(), "{what}: {}", text(&run.stderr));
        let report = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|e| e == "json"))
            .expect("a JSON report");
        let probes = json(&report)["overhead"]["probes"].as_u64().unwrap();
        println!(
            "{what}: {} sites listed ({} straddling), {probes} discovered",
            sites.len(),
            s["straddling"]
        );
        // A sled site stands for its function's entry and exit probe, both
        // registered at start-up.
        let per_site = if what.contains("patchable") { 2 } else { 1 };
        assert_eq!(probes, per_site * sites.len() as u64, "{what}: listed vs discovered");
        let summary = fastinst(&["sites", "--summary", app_s], &dir);
        let t = text(&summary.stdout);
        assert!(t.contains(&format!("{} sites", sites.len())), "{t}");
        assert!(t.contains("straddling a 64-byte line:"), "{t}");
        if what.contains("fno-plt") {
            assert!(s["forms"]["got"].as_u64().unwrap() > 0, "{what}: {}", s["forms"]);
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn run_passes_output_and_status_through_and_report_re_renders() {
    let dir = scratch("run");
    let app = build("gcc", &["-O2", "-finstrument-functions"], &dir, "app");
    let app_s = app.to_str().unwrap();
    let mut c = Command::new(&app);
    c.arg("3");
    let plain = testkit::output_within(c, LIMIT, "app 3");
    assert_eq!(plain.status.code(), Some(3));
    // With a timeline, which the profiler writes only when asked.
    let run = fastinst_with(
        &["run", "--out", "reports", "--", app_s, "3"],
        &dir,
        &[("FASTINST_TIMELINE", Path::new("100000"))],
    );
    assert_eq!(run.status.code(), Some(3), "{}", text(&run.stderr));
    assert_eq!(run.stdout, plain.stdout, "the program's stdout is its own");
    let err = text(&run.stderr);
    assert_eq!(err.lines().count(), 1, "one line on stderr: {err}");
    assert!(err.contains("fastinst-profile.") && err.contains("reports/"), "{err}");
    let files: Vec<PathBuf> = std::fs::read_dir(dir.join("reports"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let find = |ext: &str| {
        files
            .iter()
            .find(|p| p.extension().is_some_and(|e| e == ext))
            .unwrap_or_else(|| panic!("no .{ext} report in {files:?}"))
    };
    let (jsonp, txt, folded, svg) = (find("json"), find("txt"), find("folded"), find("svg"));
    let pid = json(jsonp)["pid"].as_u64().unwrap();
    // The timeline: a slice per timed call (fewer than its bound here),
    // each saying how many calls it stands for where more than one.
    let tl = timeline(&dir.join("reports"), "fastinst-profile.");
    let samples = json(jsonp)["overhead"]["samples"].as_u64().unwrap();
    assert_eq!(slices(&tl).len() as u64, samples);
    assert_eq!(tl["otherData"]["tool"], "fastinst profile");
    assert!(slices(&tl)
        .iter()
        .all(|e| e["args"]["calls"].as_u64().is_none_or(|w| w > 1) && e["dur"].as_f64().unwrap() >= 0.0));
    assert!(jsonp
        .to_str()
        .unwrap()
        .ends_with(&format!("fastinst-profile.{pid}.json")));
    let j = jsonp.to_str().unwrap();
    // Re-rendered from the JSON: the same text and stacks as written at exit.
    let again = fastinst(&["report", j], &dir);
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert_eq!(text(&again.stdout), std::fs::read_to_string(txt).unwrap());
    let again = fastinst(&["report", "--format", "folded", j], &dir);
    assert_eq!(text(&again.stdout), std::fs::read_to_string(folded).unwrap());
    let again = fastinst(&["report", "--svg", "again.svg", "-o", "again.txt", j], &dir);
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert_eq!(
        std::fs::read_to_string(dir.join("again.svg")).unwrap(),
        std::fs::read_to_string(svg).unwrap()
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("again.txt")).unwrap(),
        std::fs::read_to_string(txt).unwrap()
    );
    // A program killed by a signal: 128 + N, as a shell reports it.
    let killed = fastinst(&["run", "--tool", "off", "--", "sh", "-c", "kill -TERM $$"], &dir);
    assert_eq!(killed.status.code(), Some(128 + 15));
    // --print shows the text report after the program's own output.
    let printed = fastinst(&["run", "--out", "p", "--print", "--", app_s], &dir);
    assert!(
        text(&printed.stderr).contains("calls(est)"),
        "{}",
        text(&printed.stderr)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A run of about one epoch: `app` calls `work` and `spin` 3,000 times
/// each in a few milliseconds. Their counts overflow the first, short
/// epoch, and at most a window or two opens before the exit, so their
/// calls are carried at the first epoch's rate: never claimed exact. In
/// each of four runs, each estimate is within three standard deviations
/// (plus 10%) of the truth, or the report warns of CPU contention, under
/// which a run of a few epochs is known to read its calls beyond their
/// `+-` (docs/limits.md); and at least two of the four runs are within
/// the bounds. Beside the other CLI tests the program's thread waits for
/// a CPU about half its time, and about one run in ten is outside.
///
/// Under load the estimate once read half the calls with a small
/// deviation and no warning to say so. Two causes are fixed: a hook's time
/// read while its thread waited for a CPU inside it ran ahead of what the
/// hook was charged, so the next stretch's hooks read as the program's own
/// time; and a lone window in the exit path, whose rate of none stood for
/// the whole run with the deviation of one window (measurements in
/// `crates/benches/results/accuracy.md`). (Not yet `fib`, with millions of
/// calls in those milliseconds: its estimate is still far off with a small
/// deviation; see the accuracy issue.)
#[test]
fn a_run_of_one_epoch_reports_its_busy_functions_honestly() {
    let dir = scratch("short");
    let app = build("gcc", &["-O2", "-finstrument-functions"], &dir, "app");
    let mut outside = Vec::new();
    let mut within = 0;
    for run in 0..4 {
        let out = format!("r{run}");
        let o = fastinst(&["run", "--out", &out, "--", app.to_str().unwrap()], &dir);
        assert!(o.status.success(), "{}", text(&o.stderr));
        let jsonp = reports(&dir.join(&out), "fastinst-profile.")
            .into_iter()
            .find(|p| p.extension().is_some_and(|e| e == "json"))
            .expect("a JSON report");
        let j = json(&jsonp);
        let wait = j["overhead"]["cpu_wait_share"].as_f64();
        let warned = wait.is_some_and(|w| w >= fastinst_report::CONTENDED_PERCENT);
        let mut ok = true;
        for name in ["work", "spin"] {
            let f = j["functions"]
                .as_array()
                .unwrap()
                .iter()
                .find(|f| f["name"] == name)
                .unwrap_or_else(|| panic!("no {name}"));
            let (est, sd) = (f["calls_estimated"].as_f64().unwrap(), f["calls_sd"].as_f64().unwrap());
            let exact = f["calls_exact"].as_bool().unwrap();
            assert!(
                !exact || est == 3000.0,
                "run {run}: {name} read {est:.0}, called exact, of 3000"
            );
            let line = format!("run {run}: {name} read {est:.0} +- {sd:.0} of 3000 (cpu wait {wait:?}%)");
            println!("{line}");
            if !exact && (est - 3000.0).abs() > 3.0 * sd + 300.0 {
                ok = false;
                assert!(warned, "outside 3 sd + 10% with no contention warning: {line}");
                outside.push(line);
            }
        }
        within += usize::from(ok);
    }
    assert!(
        within >= 2,
        "{within} of 4 runs within 3 sd + 10%:\n{}",
        outside.join("\n")
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A program the runtime would find no probe in is named before it runs,
/// with how to build one; instrumented and sled builds are not.
#[test]
fn run_says_when_a_program_has_no_probe_sites() {
    let dir = scratch("noprobes");
    let plain = build("gcc", &["-O2"], &dir, "plain");
    let o = fastinst(&["run", "--out", "r", "--", plain.to_str().unwrap(), "3"], &dir);
    assert_eq!(o.status.code(), Some(3), "the program still runs");
    let err = text(&o.stderr);
    assert!(
        err.contains("has no probe sites") && err.contains("-finstrument-functions"),
        "{err}"
    );
    for flags in [
        &["-O2", "-finstrument-functions"][..],
        &["-O2", "-fpatchable-function-entry=5"],
    ] {
        let app = build("gcc", flags, &dir, "probed");
        let o = fastinst(&["run", "--out", "r", "--", app.to_str().unwrap(), "3"], &dir);
        assert!(
            !text(&o.stderr).contains("no probe sites"),
            "{flags:?}: {}",
            text(&o.stderr)
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `report --diff`: a run against itself shows no change; a build whose
/// `spin` does ten times the work puts `spin` first, grown, and writes a
/// differential flame graph.
#[test]
fn report_diff_puts_the_slowed_function_first() {
    let dir = scratch("diff");
    let profile = |flags: &[&str], name: &str| {
        let app = build("gcc", flags, &dir, &format!("app-{name}"));
        let o = fastinst(&["run", "--out", name, "--", app.to_str().unwrap()], &dir);
        assert!(o.status.success(), "{}", text(&o.stderr));
        let json = reports(&dir.join(name), "fastinst-profile.")
            .into_iter()
            .find(|p| p.extension().is_some_and(|e| e == "json"))
            .expect("a JSON report");
        json.to_str().unwrap().to_string()
    };
    let before = profile(&["-O2", "-finstrument-functions"], "before");
    let after = profile(&["-O2", "-finstrument-functions", "-DSPIN=20000"], "after");
    let same = fastinst(&["report", "--diff", &before, &before], &dir);
    assert!(same.status.success(), "{}", text(&same.stderr));
    assert!(text(&same.stdout).contains("no change"), "{}", text(&same.stdout));
    let d = fastinst(&["report", "--diff", "--svg", "d.svg", &before, &after], &dir);
    assert!(d.status.success(), "{}", text(&d.stderr));
    let out = text(&d.stdout);
    let first = out
        .lines()
        .skip_while(|l| !l.trim_end().ends_with("function"))
        .nth(1)
        .unwrap_or_else(|| panic!("no rows:\n{out}"));
    assert!(first.ends_with(" spin"), "spin is not first:\n{out}");
    let delta: f64 = first.split_whitespace().nth(5).unwrap().parse().unwrap();
    assert!(delta > 0.0, "spin's self time grew:\n{out}");
    let svg = std::fs::read_to_string(dir.join("d.svg")).unwrap();
    assert!(svg.contains("<svg") && svg.contains("spin"), "differential flame graph");
    let bad = fastinst(&["report", "--diff", &before], &dir);
    assert_eq!(bad.status.code(), Some(2), "--diff needs two profiles");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The pprof output: written by `run` beside the other reports and by
/// `report --format pprof`, byte for byte the same; decoded, its
/// per-function samples are the JSON's columns; and `go tool pprof -top`,
/// the real client, reads it and ranks the same function first (when Go is
/// installed: Debian's `golang-go`, which `.ci/run` installs).
#[test]
fn pprof_output_is_read_by_go_tool_pprof() {
    use fastinst_report::pprof::{Profile, SAMPLE_TYPES};
    use prost::Message;
    use std::io::Read;
    let dir = scratch("pprof");
    let app = build("gcc", &["-O2", "-finstrument-functions"], &dir, "app");
    let run = fastinst(&["run", "--out", "r", "--", app.to_str().unwrap(), "3"], &dir);
    assert_eq!(run.status.code(), Some(3), "{}", text(&run.stderr));
    let written = reports(&dir.join("r"), "fastinst-profile.");
    let find = |suffix: &str| written.iter().find(|p| p.to_string_lossy().ends_with(suffix)).cloned();
    let (jsonp, pb) = (
        find(".json").expect("json"),
        find(".pb.gz").expect("the run writes pprof"),
    );
    let again = fastinst(
        &[
            "report",
            "--format",
            "pprof",
            "-o",
            "again.pb.gz",
            jsonp.to_str().unwrap(),
        ],
        &dir,
    );
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert_eq!(
        std::fs::read(dir.join("again.pb.gz")).unwrap(),
        std::fs::read(&pb).unwrap()
    );
    let no_o = fastinst(&["report", "--format", "pprof", jsonp.to_str().unwrap()], &dir);
    assert_eq!(no_o.status.code(), Some(2), "binary output needs -o");

    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(&std::fs::read(&pb).unwrap()[..])
        .read_to_end(&mut raw)
        .unwrap();
    let p = Profile::decode(&raw[..]).unwrap();
    let s = |i: i64| p.string_table[i as usize].clone();
    assert_eq!(
        p.sample_type
            .iter()
            .map(|t| (s(t.r#type), s(t.unit)))
            .collect::<Vec<_>>(),
        SAMPLE_TYPES.map(|(a, b)| (a.to_string(), b.to_string()))
    );
    let j = json(&jsonp);
    let name_of = |loc: u64| {
        let f = p.location.iter().find(|l| l.id == loc).unwrap().line[0].function_id;
        s(p.function.iter().find(|x| x.id == f).unwrap().name)
    };
    for f in j["functions"].as_array().unwrap() {
        let name = f["name"].as_str().unwrap();
        let one = p
            .sample
            .iter()
            .find(|x| x.location_id.len() == 1 && x.value[3] == 0 && name_of(x.location_id[0]) == name)
            .unwrap_or_else(|| panic!("no sample for {name}"));
        assert_eq!(
            one.value[1],
            f["calls_estimated"].as_f64().unwrap().round() as i64,
            "{name} calls"
        );
        assert_eq!(
            one.value[0],
            (f["self_ms"].as_f64().unwrap() * 1e6).round() as i64,
            "{name} self"
        );
        assert_eq!(
            one.value[2],
            (f["total_ms"].as_f64().unwrap() * 1e6).round() as i64,
            "{name} total"
        );
    }

    let go = Command::new("go")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !go {
        eprintln!("NOT CHECKED by go tool pprof: `go` is not installed (apt-get install golang-go)");
        std::fs::remove_dir_all(&dir).unwrap();
        return;
    }
    for (index, column) in [("calls", "calls_estimated"), ("total_time", "total_ms")] {
        let mut c = Command::new("go");
        c.args(["tool", "pprof", "-top", &format!("-sample_index={index}")])
            .arg(&pb)
            .env("HOME", &dir)
            .env("GOCACHE", dir.join("gocache"));
        let o = testkit::output_within(c, LIMIT, "go tool pprof");
        assert!(o.status.success(), "{}", text(&o.stderr));
        let out = text(&o.stdout);
        // The first row under the header is the heaviest function.
        let first = out
            .lines()
            .skip_while(|l| !l.trim_start().starts_with("flat"))
            .nth(1)
            .and_then(|l| l.split_whitespace().last())
            .unwrap_or_else(|| panic!("no rows in:\n{out}"))
            .to_string();
        // The heaviest by the report; several when they tie (two totals
        // capped at a short run's length), which pprof orders its own way.
        let functions = j["functions"].as_array().unwrap();
        let value = |f: &serde_json::Value| f[column].as_f64().unwrap();
        let max = functions.iter().map(value).fold(f64::MIN, f64::max);
        let heaviest: Vec<&str> = functions
            .iter()
            .filter(|f| value(f) == max)
            .map(|f| f["name"].as_str().unwrap())
            .collect();
        assert!(
            heaviest.contains(&first.as_str()),
            "go tool pprof -sample_index={index} ranks {first} first, the report {heaviest:?}:\n{out}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn errors_name_the_file_and_the_problem() {
    let dir = scratch("errors");
    std::fs::write(dir.join("notes.txt"), "not a program").unwrap();
    std::fs::write(dir.join("other.json"), "{\"schema\": \"something/2\"}").unwrap();
    let cases: [(&[&str], i32, &str); 9] = [
        (&["sites", "notes.txt"], 1, "notes.txt: not a readable ELF file"),
        (&["sites", "missing"], 1, "missing: No such file"),
        (&["sites", "/bin/sh"], 1, "/bin/sh: no probe sites"),
        (&["report", "notes.txt"], 1, "notes.txt: not JSON"),
        (&["report", "other.json"], 1, "other.json: schema `something/2`"),
        (
            &["run", "--", "./missing-program"],
            1,
            "./missing-program: cannot run it",
        ),
        (&["run", "--lib", "nolib.so", "--", "true"], 1, "nolib.so: No such file"),
        (
            &["run", "--strategy", "fast", "true"],
            2,
            "--strategy: `fast` is not one of",
        ),
        (&["frobnicate"], 2, "no command `frobnicate`"),
    ];
    for (args, code, want) in cases {
        let o = fastinst(args, &dir);
        let e = text(&o.stderr);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {e}");
        assert!(e.contains(want), "{args:?}: {e}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn every_command_has_help() {
    let dir = std::env::temp_dir();
    let top = fastinst(&["help"], &dir);
    assert!(top.status.success());
    for cmd in ["run", "report", "sites", "calibrate"] {
        assert!(text(&top.stdout).contains(cmd));
        let o = fastinst(&[cmd, "--help"], &dir);
        assert!(o.status.success(), "{cmd}");
        assert!(
            text(&o.stdout).starts_with(&format!("usage: fastinst {cmd}")),
            "{cmd}: {}",
            text(&o.stdout)
        );
        let o = fastinst(&["help", cmd], &dir);
        assert!(text(&o.stdout).starts_with(&format!("usage: fastinst {cmd}")));
    }
}

/// `fastinst calibrate` for real, through the CLI: `--show` names the
/// built-in wait where no config exists; a short sweep (two waits at one
/// split, one trial each, every trial a forked child) prints the failure
/// table and a recommendation and writes the config and the plot where
/// asked; `--show` then reads that config back; and `--no-write` writes
/// none.
#[test]
fn calibrate_writes_a_config_that_show_reads_back() {
    let dir = scratch("calibrate");
    let cfg = dir.join("machine.toml");
    let o = fastinst_with(&["calibrate", "--show"], &dir, &[("FASTINST_CONFIG", &cfg)]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(text(&o.stdout).contains("(from BuiltIn)"), "{}", text(&o.stdout));
    let svg = dir.join("cal.svg");
    let sweep = |out: &Path, extra: &[&str]| {
        let mut args = vec![
            "calibrate",
            "--waits",
            "0,3000",
            "--splits",
            "2",
            "--executors",
            "2",
            "--trials",
            "1",
            "--seconds",
            "0.2",
            "--out",
        ];
        args.push(out.to_str().unwrap());
        args.extend(["--svg", svg.to_str().unwrap()]);
        args.extend(extra);
        let o = fastinst(&args, &dir);
        assert!(o.status.success(), "{}", text(&o.stderr));
        text(&o.stdout)
    };
    let out = sweep(&cfg, &[]);
    for want in [
        "Failures per wait W and split S",
        "S=2",
        "recommended: wait = ",
        "config: ",
    ] {
        assert!(out.contains(want), "no `{want}` in:\n{out}");
    }
    let written = std::fs::read_to_string(&cfg).expect("the config was written");
    assert!(
        written.contains("wait = ") && written.contains("waits_tested = \"0,3000\""),
        "{written}"
    );
    assert!(std::fs::read_to_string(&svg).expect("the plot").contains("<svg"));
    let o = fastinst_with(&["calibrate", "--show"], &dir, &[("FASTINST_CONFIG", &cfg)]);
    assert!(text(&o.stdout).contains("(from Config("), "{}", text(&o.stdout));
    let other = dir.join("other.toml");
    let out = sweep(&other, &["--no-write"]);
    assert!(out.contains("recommended: "), "{out}");
    assert!(!other.exists(), "--no-write wrote {}", other.display());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_reader_that_stops_early_is_not_an_error() {
    use std::os::fd::FromRawFd;
    // `fastinst ... | head`: the reader is gone before anything is written.
    let mut fds = [0; 2];
    // SAFETY: pipe(2) fills the two descriptors it is given.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: both descriptors were just opened and are owned here alone.
    let (reader, writer) = unsafe { (std::fs::File::from_raw_fd(fds[0]), std::fs::File::from_raw_fd(fds[1])) };
    drop(reader);
    let o = Command::new(env!("CARGO_BIN_EXE_fastinst"))
        .arg("help")
        .stdout(writer)
        .output()
        .expect("fastinst runs");
    assert!(o.status.success(), "{:?}: {}", o.status, text(&o.stderr));
    assert!(o.stderr.is_empty(), "{}", text(&o.stderr));
}

/// The files under `dir` whose names start with `prefix`.
fn reports(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    v.retain(|p| p.file_name().unwrap().to_string_lossy().starts_with(prefix));
    v.sort();
    v
}

/// Every `run` option changes what it says it changes: each is checked by
/// its effect on the program's reports or log, so an option parsed and
/// then dropped fails here.
#[test]
fn every_run_option_reaches_the_runtime() {
    let dir = scratch("options");
    let app = build("gcc", &["-O2", "-finstrument-functions"], &dir, "app");
    let app_s = app.to_str().unwrap();
    let ok = |o: &Output| assert!(o.status.success(), "{}", text(&o.stderr));

    // --tool count: exact calls, no profile.
    let o = fastinst(&["run", "--tool", "count", "--out", "count", "--", app_s], &dir);
    ok(&o);
    assert_eq!(reports(&dir.join("count"), "fastinst-count.").len(), 1);
    assert!(reports(&dir.join("count"), "fastinst-profile.").is_empty());
    // --tool trace: every call, `work` exactly 3000 times.
    let o = fastinst(&["run", "--tool", "trace", "--out", "trace", "--", app_s], &dir);
    ok(&o);
    let t = reports(&dir.join("trace"), "fastinst-trace.");
    let j = json(
        t.iter()
            .find(|p| p.extension().is_some_and(|e| e == "json"))
            .expect("trace json"),
    );
    let work = j["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "work")
        .expect("work traced");
    assert_eq!(work["calls_estimated"].as_f64(), Some(3000.0));
    assert_eq!(work["calls_exact"].as_bool(), Some(true));
    // ... and its timeline: a slice per call up to its bound (100,000 by
    // default; fib makes 2.4 M calls), the rest counted as dropped; the
    // bound is FASTINST_TIMELINE.
    let calls: u64 = j["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["calls_estimated"].as_f64().unwrap() as u64)
        .sum();
    let tl = timeline(&dir.join("trace"), "fastinst-trace.");
    let kept = slices(&tl).len() as u64;
    assert_eq!(kept, calls.min(100_000), "{calls} calls");
    // Calls nest: any two slices of a thread are disjoint or one holds the
    // other (to within the file's nanosecond rounding).
    let mut open: Vec<(f64, f64)> = Vec::new();
    for e in slices(&tl) {
        let (ts, end) = (
            e["ts"].as_f64().unwrap(),
            e["ts"].as_f64().unwrap() + e["dur"].as_f64().unwrap(),
        );
        while open.last().is_some_and(|&(_, pe)| pe <= ts + 0.002) {
            open.pop();
        }
        if let Some(&(ps, pe)) = open.last() {
            assert!(ps <= ts && end <= pe + 0.002, "{e} overlaps the slice [{ps}, {pe}]");
        }
        open.push((ts, end));
    }
    assert_eq!(tl["otherData"]["dropped_calls"].as_u64(), Some(calls - kept));
    let o = fastinst_with(
        &["run", "--tool", "trace", "--out", "trace100", "--", app_s],
        &dir,
        &[("FASTINST_TIMELINE", Path::new("100"))],
    );
    ok(&o);
    let tl = timeline(&dir.join("trace100"), "fastinst-trace.");
    assert_eq!(slices(&tl).len(), 100);
    assert_eq!(tl["otherData"]["dropped_calls"].as_u64(), Some(calls - 100));
    // --min-duration: only calls that lasted 1 ms or more are kept (`main`,
    // and the few calls a preemption stretched), each inside the longer
    // calls around it; the others are counted as filtered.
    let o = fastinst(
        &[
            "run",
            "--tool",
            "trace",
            "--min-duration",
            "1ms",
            "--out",
            "slow",
            "--",
            app_s,
        ],
        &dir,
    );
    ok(&o);
    let tl = timeline(&dir.join("slow"), "fastinst-trace.");
    let kept = slices(&tl);
    assert!(
        kept.iter().all(|e| e["dur"].as_f64().unwrap() >= 999.99),
        "a call under 1 ms kept: {kept:?}"
    );
    assert!(kept.iter().any(|e| e["name"] == "main"), "{kept:?}");
    let filtered = tl["otherData"]["filtered_calls"].as_u64().unwrap();
    let dropped = tl["otherData"]["dropped_calls"].as_u64().unwrap();
    assert_eq!(kept.len() as u64 + filtered + dropped, calls);
    assert!(kept.len() < 1_000, "{} calls of 1 ms or more", kept.len());
    // --depth 2: `main` and the calls it makes (`work`, 3,000 times), none
    // deeper.
    let o = fastinst(
        &[
            "run", "--tool", "trace", "--depth", "2", "--out", "shallow", "--", app_s,
        ],
        &dir,
    );
    ok(&o);
    let tl = timeline(&dir.join("shallow"), "fastinst-trace.");
    let kept = slices(&tl);
    let named = |n: &str| kept.iter().filter(|e| e["name"] == n).count();
    assert_eq!((named("main"), named("work"), kept.len()), (1, 3000, 3001));
    assert_eq!(tl["otherData"]["filtered_calls"].as_u64(), Some(calls - 3001));
    // --tool off: the program runs, nothing is written.
    let o = fastinst(&["run", "--tool", "off", "--out", "off", "--", app_s], &dir);
    ok(&o);
    assert!(reports(&dir.join("off"), "fastinst-").is_empty());

    // --exclude: fib is never counted; the others are, exactly.
    let o = fastinst(
        &[
            "run",
            "--tool",
            "count",
            "--exclude",
            "fi?",
            "--out",
            "nofib",
            "--",
            app_s,
        ],
        &dir,
    );
    ok(&o);
    let counts = std::fs::read_to_string(&reports(&dir.join("nofib"), "fastinst-count.")[0]).unwrap();
    let count_of = |name: &str| {
        counts
            .lines()
            .find_map(|l| {
                let mut w = l.split_whitespace();
                let n = w.next()?.parse::<u64>().ok()?;
                (w.next()? == name).then_some(n)
            })
            .unwrap_or(0)
    };
    assert_eq!(
        (count_of("fib"), count_of("work"), count_of("spin")),
        (0, 3000, 3000),
        "{counts}"
    );
    // --functions: the profile names only the functions asked for, and
    // says how many probes it left off.
    let o = fastinst(&["run", "--functions", "work,sp*", "--out", "only", "--", app_s], &dir);
    ok(&o);
    let p = reports(&dir.join("only"), "fastinst-profile.");
    let j = json(p.iter().find(|p| p.extension().is_some_and(|e| e == "json")).unwrap());
    let mut names: Vec<&str> = j["functions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["calls_sampled"].as_u64() > Some(0))
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    names.sort_unstable();
    assert_eq!(names, ["spin", "work"], "{j}");
    assert!(
        !p.iter().any(|f| f.to_string_lossy().ends_with(".timeline.json.gz")),
        "the profiler writes no timeline unless asked: {p:?}"
    );
    assert!(
        j["overhead"]["filtered_off"].as_u64() >= Some(2),
        "fib's and main's probes: {}",
        j["overhead"]
    );
    let txt = std::fs::read_to_string(p.iter().find(|p| p.extension().is_some_and(|e| e == "txt")).unwrap()).unwrap();
    assert!(txt.contains("filtered: "), "{txt}");
    // --modules: none of the program's functions is in a module so named.
    let o = fastinst(
        &[
            "run",
            "--tool",
            "count",
            "--modules",
            "libnothing*",
            "--out",
            "nomod",
            "--",
            app_s,
        ],
        &dir,
    );
    ok(&o);
    let counts = std::fs::read_to_string(&reports(&dir.join("nomod"), "fastinst-count.")[0]).unwrap();
    assert!(
        counts
            .lines()
            .filter(|l| !l.starts_with('#'))
            .all(|l| l.starts_with("0\t")),
        "{counts}"
    );

    // The profiler's settings land in its report.
    let o = fastinst(
        &[
            "run",
            "--samples",
            "20",
            "--epoch-ms",
            "5",
            "--windows",
            "3",
            "--density",
            "15",
            "--share",
            "25",
            "--no-cpu",
            "--inlined",
            "--out",
            "s",
            "--",
            app_s,
        ],
        &dir,
    );
    ok(&o);
    let p = reports(&dir.join("s"), "fastinst-profile.");
    let j = json(
        p.iter()
            .find(|p| p.extension().is_some_and(|e| e == "json"))
            .expect("profile json"),
    );
    let s = &j["settings"];
    assert_eq!(s["samples_per_window"].as_u64(), Some(20), "{s}");
    assert_eq!(s["epoch_ms"].as_f64(), Some(5.0), "{s}");
    assert_eq!(s["windows"].as_u64(), Some(3), "{s}");
    assert_eq!(s["density"].as_u64(), Some(15), "{s}");
    assert_eq!(s["share"].as_u64(), Some(25), "{s}");
    assert_eq!(s["inlined"].as_bool(), Some(true), "{s}");
    assert_eq!(s["cpu_samples"].as_bool(), Some(false), "{s}");
    assert!(j["cpu"].is_null(), "no CPU samples were asked for");
    // `report --format json` pretty-prints the same report.
    let again = fastinst(&["report", "--format", "json", p[1].to_str().unwrap()], &dir);
    ok(&again);
    let back: serde_json::Value = serde_json::from_str(&text(&again.stdout)).unwrap();
    assert_eq!(back, j, "json round trip");

    // --strategy and --log: the runtime says which strategy it started with.
    let o = fastinst(
        &["run", "--strategy", "paper", "--log", "info", "--out", "l", "--", app_s],
        &dir,
    );
    ok(&o);
    assert!(text(&o.stderr).contains("strategy paper"), "{}", text(&o.stderr));
    let o = fastinst(&["run", "--log", "debug", "--out", "l", "--", app_s], &dir);
    assert!(text(&o.stderr).contains("straddler wait"), "{}", text(&o.stderr));

    // --signal: a report while the program runs, and one at exit.
    let mut c = Command::new(env!("CARGO_BIN_EXE_fastinst"));
    c.args(["run", "--signal", "USR1", "--out", "sig", "--", app_s])
        .current_dir(&dir)
        .env("APP_RAISE", libc_sigusr1().to_string());
    let o = testkit::output_within(c, LIMIT, "fastinst run --signal");
    ok(&o);
    let written = text(&o.stderr).matches("fastinst: profile of").count();
    assert_eq!(written, 2, "one report on the signal, one at exit: {}", text(&o.stderr));

    // --client: the client library's init runs in the program.
    let client_c = dir.join("client.c");
    std::fs::write(
        &client_c,
        "#include <stdio.h>\nint fastinst_client_init(void) { fprintf(stderr, \"client here\\n\"); return 0; }\n",
    )
    .unwrap();
    let client = dir.join("client.so");
    let st = Command::new("gcc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&client)
        .arg(&client_c)
        .status()
        .unwrap();
    assert!(st.success());
    let o = fastinst(
        &[
            "run",
            "--tool",
            "none",
            "--client",
            client.to_str().unwrap(),
            "--",
            app_s,
        ],
        &dir,
    );
    ok(&o);
    assert!(text(&o.stderr).contains("client here"), "{}", text(&o.stderr));

    // --lib: the library named is the one loaded; a missing one is an error
    // naming it, before the program runs.
    let o = fastinst(&["run", "--lib", "/nonexistent/libfastinst.so", "--", app_s], &dir);
    assert!(!o.status.success());
    assert!(
        text(&o.stderr).contains("/nonexistent/libfastinst.so"),
        "{}",
        text(&o.stderr)
    );
    assert!(o.stdout.is_empty(), "the program did not run");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// SIGUSR1 on x86-64 Linux.
fn libc_sigusr1() -> i32 {
    10
}
