//! `fastinst attach PID` on running multi-threaded programs, gcc and clang
//! sled builds (PIE, -O2): the program's output and exit status are those
//! of an unattached run, the reports are written, and after the detach
//! every sled's bytes in the process equal its file's while the program
//! runs on. Every refusal leaves the target untouched and says why.

mod common;
use common::{fastinst, scratch, text};
use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// `tests/c/tree.c` of the preload crate built with `cc flags`.
fn build(cc: &str, flags: &[&str], out: &Path) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../preload/tests/c/tree.c");
    let st = Command::new(cc)
        .args(["-O2", "-pthread"])
        .args(flags)
        .arg(&src)
        .arg("-o")
        .arg(out)
        .status()
        .unwrap_or_else(|e| panic!("{cc}: {e} (Debian package `{cc}`)"));
    assert!(st.success(), "{cc} {flags:?} failed");
}

fn spawn(bin: &Path, args: &[&str]) -> Child {
    Command::new(bin)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for `c` and returns its stdout and exit status.
fn finish(mut c: Child) -> (String, Option<i32>) {
    let mut out = String::new();
    c.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    (out, c.wait().unwrap().code())
}

/// `fastinst attach --duration SECS --out OUT PID`, run from `dir`:
/// whether it succeeded, and what it said on stderr.
fn attach_for(pid: u32, secs: &str, out: &Path, dir: &Path) -> (bool, String) {
    attach_for_with(pid, secs, out, dir, &[])
}

/// [`attach_for`] with `extra` options.
fn attach_for_with(pid: u32, secs: &str, out: &Path, dir: &Path, extra: &[&str]) -> (bool, String) {
    let pid = pid.to_string();
    let mut args = vec!["attach", "--duration", secs, "--out", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    args.push(&pid);
    let o = fastinst(&args, dir);
    (o.status.success(), text(&o.stderr))
}

/// The runtime's calibration of what a hook's stamps miss, from its log
/// line: (`-finstrument-functions`, sled) ticks.
fn stamps_miss(log: &str) -> Option<(f64, f64)> {
    let rest = log.split("stamps miss (").nth(1)?;
    let (fi, rest) = rest.split_once(", ")?;
    let sled = rest.split(')').next()?;
    Some((fi.trim().parse().ok()?, sled.trim().parse().ok()?))
}

/// `fastinst attach --duration SECS --out OUT PID` started in the
/// background from `dir`, once its runtime answers as attached (asked for
/// up to 5 s: an attach takes a while on a loaded machine).
fn attach_in_background(pid: &str, secs: &str, out: &Path, dir: &Path) -> Child {
    attach_in_background_with(pid, secs, out, dir, &[])
}

/// [`attach_in_background`] with `extra` options.
fn attach_in_background_with(pid: &str, secs: &str, out: &Path, dir: &Path, extra: &[&str]) -> Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_fastinst"))
        .args(["attach", "--duration", secs, "--out"])
        .arg(out)
        .args(extra)
        .arg(pid)
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    for _ in 0..250 {
        if text(&fastinst(&["ctl", pid, "status"], dir).stdout).starts_with("ok attached") {
            return child;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let o = child.wait_with_output().unwrap();
    panic!("the attach to {pid} never answered: {}", text(&o.stderr));
}

fn maps_have_runtime(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|m| m.contains("libfastinst.so"))
}

fn attach_profile_detach(cc: &str, flag: &str) {
    let dir = scratch(&format!("attach-{cc}{flag}"));
    let (plain, inst) = (dir.join("plain"), dir.join("inst"));
    build(cc, &[], &plain);
    build(cc, &[flag], &inst);
    let sleds = flag.starts_with("-fpatchable");
    // Four threads on however many CPUs, ~3 s.
    let args = ["4", "40000"];
    let (want, want_rc) = finish(spawn(&plain, &args));
    let child = spawn(&inst, &args);
    let pid = child.id();
    std::thread::sleep(Duration::from_millis(300));
    // What the program's code and hook slots hold before the attach.
    let maps = fastinst_attach::maps::of(pid as i32).unwrap();
    let modules = fastinst_attach::maps::modules(&maps);
    let program: Vec<_> = modules.iter().filter(|m| m.path == inst).cloned().collect();
    let regions = fastinst_attach::code::regions(&maps, &program, &mut fastinst_attach::files::Files::new());
    let slots = fastinst_attach::bindings::of_modules(&program, &mut fastinst_attach::files::Files::new()).unwrap();
    let mem = fastinst_attach::mem::Mem::open(pid as i32).unwrap();
    let slot_values = |mem: &fastinst_attach::mem::Mem| -> Vec<u64> {
        slots
            .iter()
            .map(|s| {
                let mut b = [0u8; 8];
                mem.read(s.addr, &mut b).unwrap();
                u64::from_le_bytes(b)
            })
            .collect()
    };
    let slots_before = slot_values(&mem);
    assert_eq!(slots.is_empty(), sleds, "hook slots: {slots:?}");
    let out = dir.join("out");
    let (ok, err) = attach_for_with(pid, "0.7", &out, &dir, &["--log", "info"]);
    println!("{err}");
    assert!(ok, "{err}");
    assert!(err.contains("attached to") && err.contains("detached from"), "{err}");
    // The program still runs: its code is its file's bytes again, and its
    // hook slots hold what they held.
    let maps = fastinst_attach::maps::of(pid as i32).expect("still running");
    let sites = fastinst_attach::sleds::of_modules(
        &fastinst_attach::maps::modules(&maps),
        &mut fastinst_attach::files::Files::new(),
    )
    .unwrap();
    assert_eq!(sites.len() >= 4, sleds, "{} sites", sites.len());
    let wrong = fastinst_attach::sleds::differing(&mem, &sites).unwrap();
    assert!(wrong.is_empty(), "sites differ from the file after detach: {wrong:x?}");
    let code = fastinst_attach::code::differing(&mem, &regions).unwrap();
    assert!(code.is_empty(), "code differs from the file after detach: {code:x?}");
    assert_eq!(slot_values(&mem), slots_before, "hook slots not put back");
    if !sleds {
        assert!(err.contains("2 -finstrument-functions hook slots bound"), "{err}");
        assert!(
            !err.contains(" 0 runs of code put back"),
            "no hook call was switched: {err}"
        );
    }
    // Nothing of the profiler keeps firing: its CPU sample events closed.
    assert_eq!(
        testkit::process::perf_events_open(pid),
        0,
        "perf events left open after the detach"
    );
    let (got, log, rc) = testkit::process::finish(child);
    assert_eq!(got, want, "the program's output changed");
    assert_eq!(rc, want_rc);
    // Both hook paths calibrated inside the attached process cost about
    // the same beyond their stamps. (The `-finstrument-functions` one
    // once timed the C library's no-op hook, which the exported name
    // reaches there, at many times the sled path's figure.)
    assert!(
        !log.contains("reached no hook"),
        "a calibration reached no hook:\n{log}"
    );
    let (fi, sled) = stamps_miss(&log).unwrap_or_else(|| panic!("no calibration in the runtime's log:\n{log}"));
    assert!(
        fi <= 4.0 * sled + 100.0 && sled <= 4.0 * fi + 100.0,
        "what a hook's stamps miss: finstrument {fi}, sled {sled} ticks"
    );
    let json = out.join(format!("fastinst-profile.{pid}.json"));
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let names: Vec<&str> = r["functions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["name"].as_str())
        .collect();
    for f in ["step", "leaf"] {
        assert!(names.contains(&f), "{f} not in the attached profile: {names:?}");
    }
    let cpu = r["cpu"]["samples"].as_u64().unwrap_or(0);
    assert!(cpu > 0, "no CPU samples in the attached run");
    // What a sample's signal costs was measured and is charged: the
    // borrowed thread that starts the runtime holds every signal blocked,
    // and a measurement there saw none (0, nothing charged).
    // It says that it began in a running process, whose calls in flight
    // it never timed.
    assert_eq!(r["began_running"], serde_json::Value::Bool(true), "began_running");
    let signal_us = r["cpu"]["signal_us"].as_f64().unwrap_or(0.0);
    assert!(
        signal_us > 0.0 && signal_us < 1_000.0,
        "a sampling signal's cost, measured in the attached process: {signal_us} us"
    );
    let wall = r["wall_ms"].as_f64().unwrap();
    assert!((500.0..5_000.0).contains(&wall), "profiled {wall} ms of a 0.7 s attach");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Compiles the preload crate's `tests/c/NAME` (shared with its
/// late-library test) with `cc` and `flags` into `out`.
fn compile(cc: &str, name: &str, flags: &[&str], out: &Path) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../preload/tests/c")
        .join(name);
    let st = Command::new(cc)
        .args(flags)
        .arg(&src)
        .arg("-o")
        .arg(out)
        .status()
        .unwrap_or_else(|e| panic!("{cc}: {e} (Debian package `{cc}`)"));
    assert!(st.success(), "{cc} {flags:?} {name} failed");
}

/// A library the process loads while attached, `dlopen`ed once the attach
/// answered, built by `cc` with `flag`: the runtime's watcher registers its
/// sleds or binds its hook slots, the report holds its functions with
/// their calls, and the detach puts back its sleds, its hook slots and its
/// code, checked against its file and the C library; the program's output
/// and exit status are an unattached run's. gcc's one-byte-NOP sleds are
/// made one NOP by the runtime while the program's threads run them, and
/// any thread found between two of the old NOPs is moved to the sled's end
/// before the sled is armed.
fn late_library(cc: &str, flag: &str) {
    let dir = scratch(&format!("attach-late-library-{cc}{flag}"));
    let (so, bin, go) = (dir.join("libplugin.so"), dir.join("late_loader"), dir.join("go"));
    compile(cc, "plugin.c", &["-O2", "-fPIC", "-shared", flag], &so);
    compile(
        "gcc",
        "late_loader.c",
        &["-O2", "-pthread", "-fpatchable-function-entry=5", "-ldl"],
        &bin,
    );
    let sleds = flag.starts_with("-fpatchable");
    let (so_s, go_s) = (so.to_str().unwrap(), go.to_str().unwrap());
    // Three threads, each a second or more of the library's work here.
    let args = [so_s, go_s, "3", "1000"];
    std::fs::write(&go, "").unwrap();
    let (want, want_rc) = finish(spawn(&bin, &args));
    std::fs::remove_file(&go).unwrap();
    let child = spawn(&bin, &args);
    let pid = child.id();
    std::thread::sleep(Duration::from_millis(200));
    let out = dir.join("out");
    let attach = attach_in_background(&pid.to_string(), "1.0", &out, &dir);
    // Attached: now the program loads the library.
    std::fs::write(&go, "").unwrap();
    let o = attach.wait_with_output().unwrap();
    let err = text(&o.stderr);
    println!("{err}");
    assert!(o.status.success(), "{err}");
    let said = |what: &str| -> usize {
        err.split(what)
            .next()
            .and_then(|head| head.rsplit([',', ' ']).find(|w| !w.is_empty()))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no `{what}` in {err}"))
    };
    let (late_sites, late_slots) = (
        said(" of them in libraries loaded while attached"),
        said(" hook slots;"),
    );
    // The library's sleds, hook slots and code, read from its file, all
    // hold what they held before the runtime came.
    let maps = fastinst_attach::maps::of(pid as i32).expect("still running");
    let library: Vec<_> = fastinst_attach::maps::modules(&maps)
        .into_iter()
        .filter(|m| m.path == so)
        .collect();
    assert_eq!(library.len(), 1, "the library is mapped once: {library:?}");
    let mut files = fastinst_attach::files::Files::new();
    let sites = fastinst_attach::sleds::of_modules(&library, &mut files).unwrap();
    let slots = fastinst_attach::bindings::of_modules(&library, &mut files).unwrap();
    assert_eq!((sites.len() >= 3, slots.len()), (sleds, if sleds { 0 } else { 2 }));
    assert_eq!((late_sites, late_slots), (sites.len(), slots.len()), "{err}");
    let wrong =
        fastinst_attach::sleds::differing(&fastinst_attach::mem::Mem::open(pid as i32).unwrap(), &sites).unwrap();
    assert!(wrong.is_empty(), "the library's sleds differ from its file: {wrong:x?}");
    let mem = fastinst_attach::mem::Mem::open(pid as i32).unwrap();
    let regions = fastinst_attach::code::regions(&maps, &library, &mut files);
    let code = fastinst_attach::code::differing(&mem, &regions).unwrap();
    assert!(code.is_empty(), "the library's code differs from its file: {code:x?}");
    let runtime: Vec<_> = maps.iter().filter(|m| m.path.ends_with("libfastinst.so")).collect();
    for s in &slots {
        let mut b = [0u8; 8];
        mem.read(s.addr, &mut b).unwrap();
        let to = u64::from_le_bytes(b);
        assert!(
            !runtime.iter().any(|m| m.contains(to)),
            "hook slot {:#x} still points into the runtime ({to:#x})",
            s.addr
        );
    }
    let (got, log, rc) = testkit::process::finish(child);
    assert_eq!((got.as_str(), rc), (want.as_str(), want_rc), "{log}");
    let json = out.join(format!("fastinst-profile.{pid}.json"));
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let calls = |name: &str| {
        r["functions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["name"] == name)
            .and_then(|f| f["calls_estimated"].as_f64())
    };
    for f in ["plugin_step", "plugin_leaf"] {
        let c = calls(f).unwrap_or_else(|| panic!("{f} not in the report: {}", r["functions"]));
        assert!(c > 0.0, "{f}: {c} calls");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_sled_library_loaded_while_attached_is_probed_and_put_back() {
    late_library("clang", "-fpatchable-function-entry=5");
}

/// gcc's one-byte-NOP sleds, made one NOP while the program's threads run.
#[test]
fn a_gcc_sled_library_loaded_while_attached_is_probed_and_put_back() {
    late_library("gcc", "-fpatchable-function-entry=5");
}

/// Its hook calls, bound by the loader to the C library's no-op hooks,
/// are bound to the runtime's by the runtime itself, and put back by the
/// detach.
#[test]
fn a_finstrument_library_loaded_while_attached_is_probed_and_put_back() {
    late_library("gcc", "-finstrument-functions");
}

/// A thread stopped in `nanosleep` sleeps its whole length: when another
/// thread can be borrowed for the runtime's start, and when the sleeping
/// one must be. (Restored as it stood, a borrowed thread's `nanosleep`
/// returned at once: the record the kernel restarts it from does not
/// survive the runtime's start.)
#[test]
fn a_sleeping_thread_sleeps_its_whole_length_through_an_attach() {
    let dir = scratch("sleeper");
    let bin = dir.join("sleeper");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/sleeper.c");
    let st = Command::new("gcc")
        .args(["-O2", "-pthread", "-fpatchable-function-entry=5"])
        .arg(&src)
        .arg("-o")
        .arg(&bin)
        .status()
        .expect("gcc (Debian package gcc)");
    assert!(st.success());
    let want = "nanosleep returned 0 after its whole length: yes\n";
    for threads in ["1", "0"] {
        let child = spawn(&bin, &[threads]);
        let pid = child.id();
        std::thread::sleep(Duration::from_millis(300));
        let (ok, err) = attach_for(pid, "0.3", &dir, &dir);
        assert!(ok && err.contains("detached from"), "{err}");
        let (got, rc) = finish(child);
        assert_eq!(
            (got.as_str(), rc),
            (want, Some(0)),
            "{threads} worker thread(s):\n{err}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn gcc_sled_build_is_attached_profiled_and_left_as_it_was() {
    attach_profile_detach("gcc", "-fpatchable-function-entry=5");
}

#[test]
fn clang_sled_build_is_attached_profiled_and_left_as_it_was() {
    attach_profile_detach("clang", "-fpatchable-function-entry=5");
}

/// `-finstrument-functions` builds: their hook calls, bound to the C
/// library's no-op functions, are bound to the runtime's hooks through
/// their GOT slots for the attach, and put back after it.
#[test]
fn gcc_finstrument_build_is_attached_profiled_and_left_as_it_was() {
    attach_profile_detach("gcc", "-finstrument-functions");
}

#[test]
fn clang_finstrument_build_is_attached_profiled_and_left_as_it_was() {
    attach_profile_detach("clang", "-finstrument-functions");
}

/// The `rust_service` example, serving 8,000,000 requests on 4 threads
/// (about 3 s).
fn rust_service() -> Child {
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent().unwrap().parent().unwrap().join("examples/rust_service");
    assert!(bin.exists(), "{} not built (cargo test builds examples)", bin.display());
    spawn(&bin, &["8000000", "4"])
}

/// A Rust program instrumented with `#[fastinst::instrument]` (the
/// `rust_service` example): its sleds are in the same table as a C sled
/// build's, so attach finds, profiles and restores them alike.
#[test]
fn a_rust_service_is_attached_profiled_and_left_as_it_was() {
    let dir = scratch("attach-rust");
    let child = rust_service();
    let pid = child.id();
    std::thread::sleep(Duration::from_millis(300));
    let out = dir.join("out");
    let attach = Command::new(env!("CARGO_BIN_EXE_fastinst"))
        .args(["attach", "--duration", "1.2", "--out"])
        .arg(&out)
        .arg(pid.to_string())
        .current_dir(&dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // While attached, `fastinst ctl PID` reaches its runtime (the attach
    // may take a while on a loaded machine: asked until it answers).
    let mut status = String::new();
    for _ in 0..250 {
        status = text(&fastinst(&["ctl", &pid.to_string(), "status"], &dir).stdout);
        if status.starts_with("ok") {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(status.trim(), "ok attached Profile");
    let o = fastinst(&["ctl", &pid.to_string(), "snapshot"], &dir);
    assert!(
        text(&o.stdout).starts_with("ok {") && text(&o.stdout).contains("rust_service::handle"),
        "{}",
        text(&o.stderr)
    );
    let o = attach.wait_with_output().unwrap();
    let err = text(&o.stderr);
    assert!(o.status.success(), "{err}");
    let o = fastinst(&["ctl", &pid.to_string(), "status"], &dir);
    assert!(
        !o.status.success() && text(&o.stderr).contains("not attached"),
        "after the detach: {}",
        text(&o.stderr)
    );
    let maps = fastinst_attach::maps::of(pid as i32).expect("still running");
    let sites = fastinst_attach::sleds::of_modules(
        &fastinst_attach::maps::modules(&maps),
        &mut fastinst_attach::files::Files::new(),
    )
    .unwrap();
    assert!(sites.len() >= 5, "{} sites", sites.len());
    let mem = fastinst_attach::mem::Mem::open(pid as i32).unwrap();
    let wrong = fastinst_attach::sleds::differing(&mem, &sites).unwrap();
    assert!(wrong.is_empty(), "sites differ from the file after detach: {wrong:x?}");
    let (got, rc) = finish(child);
    assert_eq!(rc, Some(0));
    assert!(
        got.starts_with("served 8000000 requests on 4 threads: 5000 cache misses, 24000000 parts"),
        "{got}"
    );
    let json = out.join(format!("fastinst-profile.{pid}.json"));
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let names: Vec<&str> = r["functions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["name"].as_str())
        .collect();
    for f in [
        "rust_service::handle",
        "rust_service::render",
        "rust_service::Cache::lookup",
    ] {
        assert!(names.contains(&f), "{f} not in the attached profile: {names:?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `fastinst top --pid`: the live view of a running process, through
/// attach, then the detach at --duration.
#[test]
fn top_attaches_shows_the_live_view_and_detaches() {
    let dir = scratch("attach-top");
    let child = rust_service();
    let pid = child.id();
    std::thread::sleep(Duration::from_millis(300));
    let o = fastinst(
        &[
            "top",
            "--pid",
            &pid.to_string(),
            "--duration",
            "0.8",
            "--interval",
            "0.2",
            "--out",
            dir.to_str().unwrap(),
        ],
        &dir,
    );
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{out}\n{err}");
    assert!(out.matches("p50 us").count() >= 2, "refreshed tables:\n{out}");
    assert!(out.contains("rust_service::handle"), "{out}");
    assert!(err.contains("attached to") && err.contains("detached from"), "{err}");
    let (got, rc) = finish(child);
    assert_eq!(rc, Some(0));
    assert!(got.starts_with("served 8000000 requests"), "{got}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn refusals_name_their_reason_and_leave_the_target_untouched() {
    // No such process.
    let tmp = std::env::temp_dir();
    let o = fastinst(&["attach", "--duration", "1", "4194311"], &tmp);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("no process 4194311"), "{}", text(&o.stderr));
    // Nothing to probe: `sleep` has no sleds.
    let mut sleep = Command::new("sleep").arg("30").spawn().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let o = fastinst(&["attach", "--duration", "1", &sleep.id().to_string()], &tmp);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("has no probe sites"), "{}", text(&o.stderr));
    assert!(!maps_have_runtime(sleep.id()), "the library was loaded anyway");
    assert!(sleep.try_wait().unwrap().is_none(), "the target died");
    let _ = sleep.kill();
    let _ = sleep.wait();
    // Not a number.
    let o = fastinst(&["attach", "x"], &tmp);
    assert_eq!(o.status.code(), Some(2));
    // A handler left in the process after the detach: refused.
    let o = fastinst(&["attach", "--signal", "USR1", "1"], &tmp);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr).contains("not for a running process"),
        "{}",
        text(&o.stderr)
    );
}

/// 100 attach/detach cycles on one running process (4 threads, gcc sled
/// build): the library is loaded once and the runtime started again at
/// each attach, one cycle in ten with the count tool instead of the
/// profiler. After every detach each sled's bytes in the process equal its
/// file's; every cycle's report is of its own attach; and the program's
/// output and exit status are those of an unattached run.
#[test]
fn a_process_is_attached_and_detached_100_times_and_runs_on_unchanged() {
    const CYCLES: usize = 100;
    let dir = scratch("attach-cycles");
    let (plain, inst) = (dir.join("plain"), dir.join("inst"));
    build("gcc", &[], &plain);
    build("gcc", &["-fpatchable-function-entry=5"], &inst);
    // Long enough for the cycles (about 0.1 s each here) several times
    // over: the program must outlive them.
    let args = ["4", "200000"];
    let reference = spawn(&plain, &args);
    let child = spawn(&inst, &args);
    let pid = child.id();
    std::thread::sleep(Duration::from_millis(200));
    let maps = fastinst_attach::maps::of(pid as i32).unwrap();
    let sites = fastinst_attach::sleds::of_modules(
        &fastinst_attach::maps::modules(&maps),
        &mut fastinst_attach::files::Files::new(),
    )
    .unwrap();
    assert!(sites.len() >= 4, "{} sites", sites.len());
    let began = std::time::Instant::now();
    for i in 0..CYCLES {
        let out = dir.join(format!("out{i}"));
        let tool = if i % 10 == 9 { "count" } else { "profile" };
        let o = fastinst(
            &[
                "attach",
                "--duration",
                "0.01",
                "--tool",
                tool,
                "--out",
                out.to_str().unwrap(),
                &pid.to_string(),
            ],
            &dir,
        );
        let err = text(&o.stderr);
        assert!(o.status.success(), "cycle {i}: {err}");
        assert!(err.contains("sites checked equal to their files"), "cycle {i}: {err}");
        let mem = fastinst_attach::mem::Mem::open(pid as i32).unwrap();
        let wrong = fastinst_attach::sleds::differing(&mem, &sites).unwrap();
        assert!(
            wrong.is_empty(),
            "cycle {i}: sites differ from the file after detach: {wrong:x?}"
        );
        let report = if tool == "count" {
            out.join(format!("fastinst-count.{pid}.txt"))
        } else {
            out.join(format!("fastinst-profile.{pid}.json"))
        };
        let text = std::fs::read_to_string(&report).unwrap_or_else(|e| panic!("cycle {i}: {}: {e}", report.display()));
        if tool == "count" {
            assert!(text.contains("\tstep\t"), "cycle {i}: step not counted:\n{text}");
        } else {
            let r: serde_json::Value = serde_json::from_str(&text).unwrap();
            // Each report is of its own attach, not of all so far.
            let wall = r["wall_ms"].as_f64().unwrap();
            assert!(wall < 2_000.0, "cycle {i}: {wall} ms profiled in a 10 ms attach");
        }
    }
    println!("{CYCLES} cycles in {:?}", began.elapsed());
    assert_eq!(
        std::fs::read_to_string(format!("/proc/{pid}/maps"))
            .unwrap()
            .lines()
            .filter(|l| l.ends_with("libfastinst.so") && l.contains("r-xp"))
            .count(),
        1,
        "the library was loaded more than once"
    );
    let (want, want_rc) = finish(reference);
    let (got, rc) = finish(child);
    assert_eq!(got, want, "the program's output changed");
    assert_eq!(rc, want_rc);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A process attached now, or started with the runtime preloaded, is
/// refused with its reason, and runs on untouched.
#[test]
fn an_attached_or_preloaded_process_is_refused_with_its_reason() {
    let dir = scratch("attach-refused-again");
    let inst = dir.join("inst");
    build("gcc", &["-fpatchable-function-entry=5"], &inst);
    let child = spawn(&inst, &["2", "30000"]);
    let pid = child.id().to_string();
    std::thread::sleep(Duration::from_millis(200));
    let first = attach_in_background(&pid, "2", &dir.join("out"), &dir);
    let again = fastinst(&["attach", "--duration", "0.3", &pid], &dir);
    assert_eq!(again.status.code(), Some(1));
    assert!(
        text(&again.stderr).contains("is attached already"),
        "{}",
        text(&again.stderr)
    );
    let o = first.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let (_, rc) = finish(child);
    assert_eq!(rc, Some(0));

    // Where `fastinst run` finds it (`cargo test` refreshes the copy in
    // deps/, not always the one beside the binary).
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_fastinst")).parent().unwrap();
    let lib = ["libfastinst.so", "deps/libfastinst.so"]
        .iter()
        .map(|n| bin_dir.join(n))
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
        .max_by_key(|(t, _)| *t)
        .map(|(_, p)| p)
        .expect("libfastinst.so built beside the fastinst binary (cargo build -p fastinst-preload)");
    let preloaded = Command::new(&inst)
        .args(["2", "30000"])
        .env("LD_PRELOAD", &lib)
        .env("FASTINST_TOOL", "off")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let o = fastinst(&["attach", "--duration", "0.3", &preloaded.id().to_string()], &dir);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("runs the fastinst runtime preloaded"),
        "{}",
        text(&o.stderr)
    );
    let (_, rc) = finish(preloaded);
    assert_eq!(rc, Some(0));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A `fastinst attach` killed while attached leaves the runtime attached,
/// its probes armed; the next `fastinst attach` sees that no command holds
/// the process any more, detaches it first (sleds, hook slots and every
/// changed byte of code put back), then attaches as usual. Sled and
/// `-finstrument-functions` builds; output and exit status unchanged.
#[test]
fn a_process_left_attached_by_a_killed_command_is_detached_by_the_next() {
    for flag in ["-fpatchable-function-entry=5", "-finstrument-functions"] {
        let dir = scratch(&format!("attach-killed{flag}"));
        let (plain, inst) = (dir.join("plain"), dir.join("inst"));
        build("gcc", &[], &plain);
        build("gcc", &[flag], &inst);
        let args = ["4", "30000"];
        let reference = spawn(&plain, &args);
        let child = spawn(&inst, &args);
        let pid = child.id().to_string();
        std::thread::sleep(Duration::from_millis(200));
        let maps = fastinst_attach::maps::of(child.id() as i32).unwrap();
        let modules = fastinst_attach::maps::modules(&maps);
        let program: Vec<_> = modules.iter().filter(|m| m.path == inst).cloned().collect();
        let regions = fastinst_attach::code::regions(&maps, &program, &mut fastinst_attach::files::Files::new());
        let mut first = attach_in_background(&pid, "60", &dir.join("out1"), &dir);
        // Probes armed for a while, then the command is killed outright.
        std::thread::sleep(Duration::from_millis(300));
        first.kill().unwrap();
        first.wait().unwrap();
        let o = fastinst(
            &[
                "attach",
                "--duration",
                "0.2",
                "--out",
                dir.join("out2").to_str().unwrap(),
                &pid,
            ],
            &dir,
        );
        let err = text(&o.stderr);
        assert!(o.status.success(), "{flag}: {err}");
        assert!(
            err.contains("was left attached by a `fastinst attach` that was killed"),
            "{flag}: {err}"
        );
        let o = fastinst(&["ctl", &pid, "status"], &dir);
        assert!(!o.status.success(), "{flag}: still attached: {}", text(&o.stdout));
        let mem = fastinst_attach::mem::Mem::open(child.id() as i32).unwrap();
        let code = fastinst_attach::code::differing(&mem, &regions).unwrap();
        assert!(code.is_empty(), "{flag}: code differs from the file: {code:x?}");
        let (want, want_rc) = finish(reference);
        let (got, rc) = finish(child);
        assert_eq!(got, want, "{flag}: the program's output changed");
        assert_eq!(rc, want_rc);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// The mappings of `pid` that are writable and executable, and those of
/// code the runtime aliased for W^X.
fn wx_and_aliased(pid: u32) -> (Vec<String>, Vec<String>) {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    let perms = |l: &str| l.split_whitespace().nth(1).unwrap_or("").to_string();
    let wx = maps
        .lines()
        .filter(|l| perms(l).contains('w') && perms(l).contains('x'))
        .map(str::to_string)
        .collect();
    let aliased = maps
        .lines()
        .filter(|l| l.contains("/memfd:fastinst-code:"))
        .map(str::to_string)
        .collect();
    (wx, aliased)
}

/// W^X is the attach's default: while attached, no page of the process is
/// writable and executable; the program's code is aliased, and after the
/// detach its bytes (read through the code mapping) equal the file's.
/// With `--no-wx` the patched pages are writable and executable, so the
/// check above can fail.
#[test]
fn an_attached_process_has_no_page_writable_and_executable_unless_asked() {
    let dir = scratch("attach-wx");
    let (plain, inst) = (dir.join("plain"), dir.join("inst"));
    build("gcc", &[], &plain);
    build("gcc", &["-fpatchable-function-entry=5"], &inst);
    let args = ["4", "60000"];
    let (want, want_rc) = finish(spawn(&plain, &args));
    for wx in [true, false] {
        let child = spawn(&inst, &args);
        let pid = child.id();
        std::thread::sleep(Duration::from_millis(200));
        let maps = fastinst_attach::maps::of(pid as i32).unwrap();
        let program: Vec<_> = fastinst_attach::maps::modules(&maps)
            .into_iter()
            .filter(|m| m.path == inst)
            .collect();
        let regions = fastinst_attach::code::regions(&maps, &program, &mut fastinst_attach::files::Files::new());
        assert!(!regions.is_empty());
        let out = dir.join(format!("out-{wx}"));
        let extra: &[&str] = if wx { &[] } else { &["--no-wx"] };
        let attach = attach_in_background_with(&pid.to_string(), "1", &out, &dir, extra);
        // Seen while attached and profiling.
        let (wx_maps, aliased) = wx_and_aliased(pid);
        let o = attach.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", text(&o.stderr));
        if wx {
            assert!(
                wx_maps.is_empty(),
                "writable and executable while attached: {wx_maps:#?}"
            );
            assert!(
                aliased
                    .iter()
                    .any(|l| l.contains(" r-xs ") && l.contains(inst.to_str().unwrap())),
                "the program's code is not aliased: {aliased:#?}"
            );
        } else {
            assert!(!wx_maps.is_empty(), "--no-wx: no page patched in place");
            assert!(aliased.is_empty(), "--no-wx: code aliased: {aliased:#?}");
        }
        // Put back: the code as the file has it, read through the code
        // mapping, and the maps parsed with the aliased code as the module's.
        let maps = fastinst_attach::maps::of(pid as i32).unwrap();
        let mem = fastinst_attach::mem::Mem::open(pid as i32).unwrap();
        let sites = fastinst_attach::sleds::of_modules(
            &fastinst_attach::maps::modules(&maps),
            &mut fastinst_attach::files::Files::new(),
        )
        .unwrap();
        assert!(sites.len() >= 4, "{} sites", sites.len());
        assert!(fastinst_attach::sleds::differing(&mem, &sites).unwrap().is_empty());
        let regions = fastinst_attach::code::regions(&maps, &program, &mut fastinst_attach::files::Files::new());
        assert!(!regions.is_empty(), "the aliased code is not found as the program's");
        let code = fastinst_attach::code::differing(&mem, &regions).unwrap();
        assert!(code.is_empty(), "code differs from the file after detach: {code:x?}");
        // Attached again, the aliased code is found and patched again.
        if wx {
            let (ok, err) = attach_for(pid, "0.2", &dir.join("again"), &dir);
            assert!(ok && err.contains("sites checked equal to their files"), "{err}");
        }
        let (got, rc) = finish(child);
        assert_eq!(got, want, "the program's output changed");
        assert_eq!(rc, want_rc);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The thread the attach borrows for its remote calls (`dlopen`, the
/// runtime's start) gets its vector registers back, not only its general
/// ones: `tests/c/vector.c`, one thread holding values in xmm0-xmm15
/// across a long loop, says whether they changed. (Before the attach saved
/// the XSAVE area, every attach clobbered them; in the Rust service a
/// thread stopped inside a hash table's SSE2 probe then missed a key it
/// held, once in a CI run.)
#[test]
fn the_borrowed_thread_keeps_its_vector_registers() {
    let dir = scratch("attach-vector");
    let bin = dir.join("vector");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/vector.c");
    let st = Command::new("gcc")
        .args(["-O2", "-fpatchable-function-entry=5"])
        .arg(&src)
        .arg("-o")
        .arg(&bin)
        .status()
        .expect("gcc");
    assert!(st.success());
    for round in 0..3 {
        let child = spawn(&bin, &["2"]);
        std::thread::sleep(Duration::from_millis(300));
        let (ok, err) = attach_for(child.id(), "0.2", &dir.join(format!("out{round}")), &dir);
        assert!(ok, "{err}");
        let (got, rc) = finish(child);
        assert_eq!((got.as_str(), rc), ("intact\n", Some(0)), "round {round}: {err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
