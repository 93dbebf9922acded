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
