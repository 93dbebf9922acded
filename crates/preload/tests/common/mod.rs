//! Helpers for the end-to-end tests: build C programs with the system
//! compilers, run them with and without the preload library.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// How long one test program may run before it is taken for hung. Every
/// program here finishes in seconds, even on a loaded 2-core CI machine;
/// the bound turns a hang into a failure that shows where each thread
/// was, instead of a CI run that never ends.
pub const RUN_LIMIT: Duration = Duration::from_secs(180);

/// The cdylib cargo built beside this test binary.
pub fn lib() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    // `cargo test` refreshes deps/libfastinst.so; the uplifted copy one
    // level up is only refreshed by `cargo build`.
    for cand in [deps.join("libfastinst.so"), deps.join("../libfastinst.so")] {
        if cand.exists() {
            return cand.canonicalize().unwrap();
        }
    }
    panic!(
        "libfastinst.so not found next to {}: `cargo test --workspace` builds it, or `cargo build --release -p fastinst-preload` first",
        exe.display()
    );
}

/// The directory holding `fastinst.h`.
pub fn include_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("include")
}

/// A C source of the tests.
pub fn src(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c").join(name)
}

/// A fresh scratch directory.
pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fastinst-e2e-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Panics with a useful message if `cc` is missing.
pub fn require(cc: &str) {
    let ok = Command::new(cc)
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        ok,
        "`{cc}` is needed by the end-to-end tests (see the README: apt-get install clang)"
    );
}

/// Builds the C API program `source` (in `tests/c`) with `cc` and `flags`,
/// linked against the library under test (`-lfastinst`, found at run time
/// by its RUNPATH, and by [`run`]'s `LD_LIBRARY_PATH`), as `dir/name`.
pub fn build_api_program(cc: &str, source: &str, flags: &[&str], dir: &Path, name: &str) -> PathBuf {
    let libdir = lib().parent().expect("a directory").to_string_lossy().into_owned();
    let bin = dir.join(name);
    let inc = format!("-I{}", include_dir().display());
    let l = format!("-L{libdir}");
    let rp = format!("-Wl,-rpath,{libdir}");
    let mut all: Vec<&str> = flags.to_vec();
    all.extend([inc.as_str(), &l, "-lfastinst", &rp]);
    build(cc, &[&src(source)], &all, &bin);
    bin
}

/// Compiles `srcs` with `cc` and `flags` into `out`.
pub fn build(cc: &str, srcs: &[&Path], flags: &[&str], out: &Path) {
    require(cc);
    let o = Command::new(cc)
        .args(srcs)
        .args(flags)
        .arg("-o")
        .arg(out)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{cc} {flags:?} failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Runs `bin` with `args` in `dir`, with the preload library if `preload`,
/// and the given environment.
pub fn run(bin: &Path, args: &[&str], dir: &Path, preload: bool, env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(bin);
    c.args(args).current_dir(dir);
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("FASTINST_")) {
        c.env_remove(k);
    }
    if preload {
        c.env("LD_PRELOAD", lib());
    }
    // A program linked with -lfastinst loads the library under test.
    c.env(
        "LD_LIBRARY_PATH",
        testkit::library_path_first(lib().parent().expect("a directory")),
    );
    c.envs(env.iter().copied());
    output_within(c, RUN_LIMIT, &bin.display().to_string())
}

pub use testkit::output_within;

/// Stdout of a successful run.
pub fn ok_stdout(o: &Output, what: &str) -> String {
    assert!(
        o.status.success(),
        "{what}: {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The count files (`fastinst-count.*.txt`) in `dir`.
pub fn count_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("fastinst-count."))
        .collect();
    v.sort();
    v
}

/// Calls of `function` in a count file.
pub fn calls_of(file: &Path, function: &str) -> Option<u64> {
    std::fs::read_to_string(file).unwrap().lines().find_map(|l| {
        let mut it = l.split('\t');
        let n = it.next()?.parse().ok()?;
        (it.next()? == function).then_some(n)
    })
}

/// The strategies.
pub const STRATEGIES: [&str; 4] = ["flip", "paper", "word-sync", "word-async"];

/// The register-clobbering client (`clobber.c`), built into `dir`.
pub fn clobber_client(dir: &Path) -> PathBuf {
    let so = dir.join("clobber.so");
    let inc = format!("-I{}", include_dir().display());
    build("gcc", &[&src("clobber.c")], &["-O2", "-shared", "-fPIC", &inc], &so);
    so
}

/// "clobber: P probes, E entries, X exits" from stderr.
pub fn clobber_counts(o: &Output) -> (u64, u64, u64) {
    let e = String::from_utf8_lossy(&o.stderr);
    let l = e
        .lines()
        .find_map(|l| l.strip_prefix("clobber: "))
        .unwrap_or_else(|| panic!("no clobber line in {e}"));
    let n: Vec<u64> = l
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    (n[0], n[1], n[2])
}

/// Builds `srcs` plain (`flags`) and instrumented (`flags` and `inst`),
/// runs both, the instrumented one under the clobbering `client` with
/// every probe on, and checks that the output is the same and that probes
/// fired on entry and exit.
pub fn same_under_clobber(
    cc: &str,
    srcs: &[&Path],
    flags: &[&str],
    inst: &[&str],
    dir: &Path,
    client: &Path,
    what: &str,
) {
    let plain = dir.join(format!("{what}-plain"));
    let instrumented = dir.join(format!("{what}-inst"));
    build(cc, srcs, flags, &plain);
    let f: Vec<&str> = flags.iter().chain(inst).copied().collect();
    build(cc, srcs, &f, &instrumented);
    let want = ok_stdout(&run(&plain, &[], dir, false, &[]), &format!("{what} plain"));
    let o = run(
        &instrumented,
        &[],
        dir,
        true,
        &[("FASTINST_TOOL", "none"), ("FASTINST_CLIENT", client.to_str().unwrap())],
    );
    let got = ok_stdout(&o, &format!("{what} under the clobbering client"));
    assert_eq!(got, want, "{what}: output changed with every probe on");
    let (probes, entries, exits) = clobber_counts(&o);
    println!("{what}: {probes} probes, {entries} entries, {exits} exits");
    assert!(probes >= 4 && entries > 0 && exits > 0, "{what}: probes did not fire");
}

/// Runs `basic.c`'s build `inst` under the count tool in every strategy
/// and checks the exact calls `basic.c` makes, and that its output is
/// `want`.
pub fn basic_counts_in_every_strategy(inst: &Path, dir: &Path, what: &str, want: &str) {
    for strategy in STRATEGIES {
        let out = dir.join(format!("count-{}-{strategy}", what.replace(' ', "")));
        std::fs::create_dir_all(&out).unwrap();
        let o = run(
            inst,
            &[],
            dir,
            true,
            &[
                ("FASTINST_TOOL", "count"),
                ("FASTINST_STRATEGY", strategy),
                ("FASTINST_OUT", out.to_str().unwrap()),
            ],
        );
        assert_eq!(ok_stdout(&o, what), want, "{what} count {strategy}");
        let files = count_files(&out);
        assert_eq!(files.len(), 1, "{what}: one count file");
        for (f, n) in [
            ("bump", 200),
            ("bump_by", 200),
            ("fill", 200),
            ("apply", 400),
            ("main", 1),
        ] {
            assert_eq!(calls_of(&files[0], f), Some(n), "{what} {strategy}: calls of {f}");
        }
    }
}

/// Runs the build `inst` with tools none, off and profile, checking that
/// its output is `want`, that its probes were registered at load (sleds,
/// never discovered) and, with `quiet`, that nothing was warned of.
pub fn sled_build_under_every_tool(inst: &Path, dir: &Path, what: &str, want: &str, quiet: bool) {
    for tool in ["none", "off", "profile"] {
        let o = run(
            inst,
            &[],
            dir,
            true,
            &[("FASTINST_TOOL", tool), ("FASTINST_LOG", "info")],
        );
        assert_eq!(ok_stdout(&o, what), want, "{what} tool {tool}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!quiet || !err.contains("warning"), "{what} tool {tool}: {err}");
        let init = err.lines().find(|l| l.contains("init total ")).unwrap_or("");
        assert!(
            init.contains(" sleds ") && !init.contains(" sleds 0,") && init.ends_with("discovery 0)"),
            "{what} tool {tool}: {init}"
        );
    }
}

/// `uselib.c` built with `prog` flags, linked against `lib.c` built with
/// `lib` flags (`libdemo.so`), loading a copy of it (`copy.so`) with
/// `dlopen`, under the count tool: exact counts in the linked library,
/// the copy's probes registered by the watcher thread.
pub fn linked_and_dlopened(dir: &Path, lib: &[&str], prog: &[&str]) {
    let d = dir.to_str().unwrap().to_string();
    let rp = format!("-Wl,-rpath,{d}");
    let l = format!("-L{d}");
    let shared: Vec<&str> = ["-O2", "-shared", "-fPIC"].iter().chain(lib).copied().collect();
    for so in ["libdemo.so", "copy.so"] {
        build("gcc", &[&src("lib.c")], &shared, &dir.join(so));
    }
    build(
        "gcc",
        &[&src("lib.c")],
        &["-O2", "-shared", "-fPIC"],
        &dir.join("plaincopy.so"),
    );
    let inst = dir.join("uselib");
    let f: Vec<&str> = std::iter::once("-O2")
        .chain(prog.iter().copied())
        .chain([l.as_str(), "-ldemo", &rp, "-ldl"])
        .collect();
    build("gcc", &[&src("uselib.c")], &f, &inst);
    let want = ok_stdout(
        &run(&inst, &[dir.join("plaincopy.so").to_str().unwrap()], dir, false, &[]),
        "no preload",
    );
    let copy = dir.join("copy.so");
    let o = run(
        &inst,
        &[copy.to_str().unwrap()],
        dir,
        true,
        &[("FASTINST_TOOL", "count")],
    );
    assert_eq!(ok_stdout(&o, "count"), want);
    let files = count_files(dir);
    assert_eq!(files.len(), 1);
    let text = std::fs::read_to_string(&files[0]).unwrap();
    let counts = |name: &str| -> Vec<u64> {
        text.lines()
            .filter(|l| l.split('\t').nth(1) == Some(name))
            .map(|l| l.split('\t').next().unwrap().parse().unwrap())
            .collect()
    };
    // lib_entry: twice in the linked library, once per round in the copy,
    // whose probes the watcher thread registers (the program waits 50 ms)
    // (three modules at one address, counted together). The copy's calls
    // of lib_leaf bind to the linked library's (global scope first): 100 +
    // 10 + 50 + 51 + 52. The copy's registration is asynchronous (the
    // watcher polls every 10 ms; the program waits 50 ms per round, which a
    // loaded machine may stretch), so at least one of its three rounds is
    // counted.
    let entry = counts("lib_entry");
    assert!(entry.contains(&2), "linked library: {text}");
    let copied: u64 = entry.iter().sum::<u64>() - 2;
    assert!((1..=3).contains(&copied), "dlopened copy registered: {text}");
    assert_eq!(counts("lib_leaf").iter().sum::<u64>(), 263, "{text}");
    assert_eq!(calls_of(&files[0], "local"), Some(2));
}
