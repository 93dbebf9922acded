//! Attaching to an upstream multi-threaded program while it works: zstd
//! 1.5.7's multi-threaded compressor (crate `zstd-sys`, the accuracy
//! harness's host, `programs/zstd_host.c`) compressing 160 MB with four
//! worker threads of libzstd's own pool, on however many CPUs (two in CI:
//! more threads than CPUs). gcc and clang, sled and
//! `-finstrument-functions` builds, `-O2`, PIE. Each is attached in its
//! multi-threaded phase with the attach crate (W^X, the command's
//! default), profiled, and detached; then:
//! - every sled and every byte of its code, read from `/proc/PID/mem`,
//!   equals the file's, its hook slots hold what they held, and no CPU
//!   sample event of the profiler is left open;
//! - the program's output (its compressed stream's checksum, after its
//!   own round-trip check) and exit status are those of an unattached run;
//! - the attached profile holds libzstd's functions with counted calls
//!   and CPU samples.
//!
//! The command-line layer over the same calls (`fastinst attach`) is
//! tested on the project's own programs in `crates/cli/tests/attach.rs`.

use fastinst_attach::{bindings, code, files::Files, maps, mem::Mem, sleds};
use fastinst_benches::programs::{self, Compiler, Program};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Megabytes compressed: about 4 s on two CPUs unattached, so the
/// program is well inside its compression when the attach ends.
const MEGABYTES: &str = "160";
const WORKERS: &str = "4";
/// How long each build stays attached.
const ATTACHED: Duration = Duration::from_millis(600);

fn scratch() -> PathBuf {
    let d = std::env::temp_dir().join(format!("fastinst-attach-upstream-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn spawn(bin: &Path) -> Child {
    Command::new(bin)
        .args([MEGABYTES, WORKERS])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count())
}

/// What the probed code holds: its hook slots' values.
fn slot_values(mem: &Mem, slots: &[bindings::Slot]) -> Vec<u64> {
    slots
        .iter()
        .map(|s| {
            let mut b = [0u8; 8];
            mem.read(s.addr, &mut b).unwrap();
            u64::from_le_bytes(b)
        })
        .collect()
}

/// Attaches to a run of `bin` in its multi-threaded phase, detaches, and
/// checks the process and its output.
fn attach_and_check(bin: &Path, compiler: Compiler, library: &Path, out: &Path) {
    let what = compiler.name();
    let (want, want_err, want_rc) = testkit::process::finish(spawn(bin));
    assert_eq!(want_rc, Some(0), "{what}: the unattached run failed: {want_err}");
    assert!(want.contains("checksum"), "{what}: {want}");
    let child = spawn(bin);
    let pid = child.id();
    // The text is generated on one thread first; the workers start with
    // the compression.
    let began = Instant::now();
    while threads(pid) < 5 {
        assert!(began.elapsed() < Duration::from_secs(30), "{what}: no worker threads");
        std::thread::sleep(Duration::from_millis(10));
    }
    let sleds_build = matches!(compiler, Compiler::GccSled | Compiler::ClangSled);
    let found = maps::of(pid as i32).unwrap();
    let program: Vec<_> = maps::modules(&found).into_iter().filter(|m| m.path == bin).collect();
    let regions = code::regions(&found, &program, &mut Files::new());
    let slots = bindings::of_modules(&program, &mut Files::new()).unwrap();
    assert_eq!(slots.is_empty(), sleds_build, "{what}: hook slots {slots:?}");
    let mem = Mem::open(pid as i32).unwrap();
    let slots_before = slot_values(&mem, &slots);

    let settings = vec![
        ("FASTINST_OUT".to_string(), out.display().to_string()),
        ("FASTINST_WX".to_string(), "1".to_string()),
    ];
    let session = fastinst_attach::attach(
        pid as i32,
        &fastinst_attach::Options {
            library: library.to_path_buf(),
            settings,
        },
    )
    .unwrap_or_else(|e| panic!("{what}: attach: {e}"));
    let t = session.timings.clone();
    println!(
        "{what}: attached in {:.1} ms, {} threads stopped for {:.2} ms, {} sleds, {} hook slots",
        t.total.as_secs_f64() * 1e3,
        t.threads,
        t.all_stopped.as_secs_f64() * 1e3,
        t.sites,
        t.slots
    );
    assert!(t.threads >= 5, "{what}: {} threads stopped", t.threads);
    if sleds_build {
        assert!(t.sites > 500, "{what}: {} sleds", t.sites);
    } else {
        assert!(t.slots >= 2, "{what}: {} hook slots bound", t.slots);
    }
    std::thread::sleep(ATTACHED);
    assert!(
        Path::new(&format!("/proc/{pid}")).exists(),
        "{what}: the program ended while attached"
    );
    let d = session.detach().unwrap_or_else(|e| panic!("{what}: detach: {e}"));
    println!(
        "{what}: detached, released after {:.1} ms (threads stopped {:.2} ms); {} sites checked, {} hook slots and {} runs of code put back",
        d.released.as_secs_f64() * 1e3,
        d.all_stopped.as_secs_f64() * 1e3,
        d.sites_checked,
        d.slots_restored,
        d.code_restored
    );
    assert_eq!(d.slots_restored, slots.len(), "{what}");

    // Left as it was, read independently of the detach's own checks.
    let now = maps::of(pid as i32).unwrap_or_else(|e| panic!("{what}: ended at the detach: {e}"));
    let sites = sleds::of_modules(&maps::modules(&now), &mut Files::new()).unwrap();
    let wrong = sleds::differing(&mem, &sites).unwrap();
    assert!(wrong.is_empty(), "{what}: sleds differ from the file: {wrong:x?}");
    let changed = code::differing(&mem, &regions).unwrap();
    assert!(changed.is_empty(), "{what}: code differs from the file: {changed:x?}");
    assert_eq!(
        slot_values(&mem, &slots),
        slots_before,
        "{what}: hook slots not put back"
    );
    assert_eq!(
        testkit::process::perf_events_open(pid),
        0,
        "{what}: perf events left open after the detach"
    );

    let (got, err, rc) = testkit::process::finish(child);
    assert_eq!(got, want, "{what}: the output changed (stderr: {err})");
    assert_eq!(rc, want_rc, "{what}: exit status");

    let json = out.join(format!("fastinst-profile.{pid}.json"));
    assert!(d.files.contains(&json), "{what}: {:?}", d.files);
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let counted: Vec<&str> = r["functions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["calls_estimated"].as_f64().unwrap_or(0.0) > 0.0)
        .filter_map(|f| f["name"].as_str())
        .filter(|n| n.starts_with("ZSTD_") || n.starts_with("HUF_") || n.starts_with("FSE_"))
        .collect();
    assert!(
        counted.len() >= 5,
        "{what}: libzstd's functions with calls: {counted:?}"
    );
    assert!(r["cpu"]["samples"].as_u64().unwrap_or(0) > 0, "{what}: no CPU samples");
    assert_eq!(r["began_running"], serde_json::Value::Bool(true), "{what}");
}

#[test]
fn an_upstream_multi_threaded_compressor_is_attached_profiled_and_left_as_it_was() {
    let work = scratch();
    let sources = fastinst_benches::sources::fetch(&work).unwrap();
    let compilers = programs::installed(&Compiler::ALL, "the attach test");
    assert!(
        compilers.contains(&Compiler::GccSled) && compilers.contains(&Compiler::Gcc),
        "gcc is needed"
    );
    let library = fastinst_cli::library::find(None).unwrap();
    let bins = programs::build_instrumented(&work, &sources, &[Program::Zstd], &compilers).unwrap();
    for b in &bins {
        let out = work.join(format!("out-{}", b.compiler.name()));
        attach_and_check(&b.path, b.compiler, &library, &out);
    }
    std::fs::remove_dir_all(&work).unwrap();
}
