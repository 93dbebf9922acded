//! The `-fpatchable-function-entry` provider end to end: programs built now
//! with gcc and clang (-O0 and -O2, PIE and non-PIE, a shared library linked
//! and `dlopen`ed, C++ exceptions, `longjmp`, signals, varargs and every
//! return-register class), run under the preload library with every probe
//! on and a handler that clobbers every register a C function may: the
//! output must equal the uninstrumented build's. Then 8 threads checking
//! their own results while one thread toggles every entry and exit probe,
//! at every straddle split, in every strategy.

mod common;
use common::*;
use std::path::Path;

const SLED: &str = "-fpatchable-function-entry=5";

fn clobber_client(dir: &Path) -> std::path::PathBuf {
    let so = dir.join("clobber.so");
    let inc = format!("-I{}", include_dir().display());
    build("gcc", &[&src("clobber.c")], &["-O2", "-shared", "-fPIC", &inc], &so);
    so
}

/// "clobber: P probes, E entries, X exits" from stderr.
fn clobber_counts(o: &std::process::Output) -> (u64, u64, u64) {
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

/// Builds `srcs` plain and with sleds, runs both (the sled build under the
/// clobbering client), and checks output and that probes fired.
fn same_under_clobber(cc: &str, srcs: &[&Path], flags: &[&str], dir: &Path, client: &Path, what: &str) {
    let plain = dir.join(format!("{what}-plain"));
    let inst = dir.join(format!("{what}-sled"));
    build(cc, srcs, flags, &plain);
    let mut f: Vec<&str> = flags.to_vec();
    f.push(SLED);
    build(cc, srcs, &f, &inst);
    let want = ok_stdout(&run(&plain, &[], dir, false, &[]), &format!("{what} plain"));
    let o = run(
        &inst,
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

#[test]
fn basic_program_every_compiler_level_layout_strategy_and_tool() {
    let dir = scratch("sled-basic");
    for cc in ["gcc", "clang"] {
        let plain = dir.join(format!("{cc}-plain"));
        build(cc, &[&src("basic.c")], &["-O2"], &plain);
        let want = ok_stdout(&run(&plain, &[], &dir, false, &[]), "plain");
        for opt in ["-O0", "-O2"] {
            for pie in ["-fPIE", "-no-pie"] {
                let what = format!("{cc} {opt} {pie}");
                let inst = dir.join(format!("{cc}{opt}{pie}"));
                let pie_link = if pie == "-fPIE" { "-pie" } else { "-no-pie" };
                build(cc, &[&src("basic.c")], &[opt, pie, pie_link, SLED], &inst);
                for tool in ["none", "off", "profile"] {
                    let o = run(
                        &inst,
                        &[],
                        &dir,
                        true,
                        &[("FASTINST_TOOL", tool), ("FASTINST_LOG", "info")],
                    );
                    assert_eq!(ok_stdout(&o, &what), want, "{what} tool {tool}");
                    // Sled probes are registered at load, never discovered.
                    let err = String::from_utf8_lossy(&o.stderr);
                    let init = err.lines().find(|l| l.contains("init total ")).unwrap_or("");
                    assert!(
                        init.contains(" sleds ") && !init.contains(" sleds 0,") && init.ends_with("discovery 0)"),
                        "{what} tool {tool}: {init}"
                    );
                }
                for strategy in STRATEGIES {
                    let out = dir.join(format!("count-{cc}{opt}{pie}-{strategy}"));
                    std::fs::create_dir_all(&out).unwrap();
                    let o = run(
                        &inst,
                        &[],
                        &dir,
                        true,
                        &[
                            ("FASTINST_TOOL", "count"),
                            ("FASTINST_STRATEGY", strategy),
                            ("FASTINST_OUT", out.to_str().unwrap()),
                        ],
                    );
                    assert_eq!(ok_stdout(&o, &what), want, "{what} count {strategy}");
                    let files = count_files(&out);
                    assert_eq!(files.len(), 1, "{what}: one count file");
                    for (f, n) in [("bump", 200), ("bump_by", 200), ("fill", 200), ("apply", 400)] {
                        assert_eq!(calls_of(&files[0], f), Some(n), "{what} {strategy}: calls of {f}");
                    }
                }
            }
        }
    }
}

#[test]
fn registers_survive_a_handler_that_clobbers_them() {
    let dir = scratch("sled-abi");
    let client = clobber_client(&dir);
    for cc in ["gcc", "clang"] {
        for opt in ["-O0", "-O2"] {
            same_under_clobber(
                cc,
                &[&src("abi.c")],
                &[opt, "-lm"],
                &dir,
                &client,
                &format!("abi-{cc}{opt}"),
            );
        }
    }
}

/// 256-bit vector arguments and results (`-mavx2`) survive the
/// trampolines: their upper halves are saved and given back whatever the
/// handler does, and a result whose upper half is zero comes back so.
#[test]
fn vector_registers_at_full_width_survive_a_clobbering_handler() {
    assert!(
        std::arch::is_x86_feature_detected!("avx2"),
        "this test needs a CPU with AVX2 (the argument registers at full width)"
    );
    let dir = scratch("sled-avx");
    let client = clobber_client(&dir);
    for cc in ["gcc", "clang"] {
        for opt in ["-O0", "-O2"] {
            same_under_clobber(
                cc,
                &[&src("avx.c")],
                &[opt, "-mavx2"],
                &dir,
                &client,
                &format!("avx-{cc}{opt}"),
            );
        }
    }
}

#[test]
fn cxx_exceptions_longjmp_and_signals_with_exits_on() {
    let dir = scratch("sled-unwind");
    let client = clobber_client(&dir);
    for cxx in ["g++", "clang++"] {
        for opt in ["-O0", "-O2"] {
            let what = format!("exceptions-{cxx}{opt}");
            same_under_clobber(cxx, &[&src("exceptions.cpp")], &[opt], &dir, &client, &what);
        }
    }
    for cc in ["gcc", "clang"] {
        same_under_clobber(cc, &[&src("jumps.c")], &["-O2"], &dir, &client, &format!("jumps-{cc}"));
    }
}

#[test]
fn shared_library_linked_and_dlopened() {
    let dir = scratch("sled-lib");
    let d = dir.to_str().unwrap().to_string();
    let rp = format!("-Wl,-rpath,{d}");
    let l = format!("-L{d}");
    build(
        "gcc",
        &[&src("lib.c")],
        &["-O2", "-shared", "-fPIC", SLED],
        &dir.join("libdemo.so"),
    );
    build(
        "gcc",
        &[&src("lib.c")],
        &["-O2", "-shared", "-fPIC", SLED],
        &dir.join("copy.so"),
    );
    build(
        "gcc",
        &[&src("lib.c")],
        &["-O2", "-shared", "-fPIC"],
        &dir.join("plaincopy.so"),
    );
    let inst = dir.join("uselib");
    build(
        "gcc",
        &[&src("uselib.c")],
        &["-O2", SLED, &l, "-ldemo", &rp, "-ldl"],
        &inst,
    );
    let want = ok_stdout(
        &run(&inst, &[dir.join("plaincopy.so").to_str().unwrap()], &dir, false, &[]),
        "no preload",
    );
    let copy = dir.join("copy.so");
    let o = run(
        &inst,
        &[copy.to_str().unwrap()],
        &dir,
        true,
        &[("FASTINST_TOOL", "count")],
    );
    assert_eq!(ok_stdout(&o, "count"), want);
    let files = count_files(&dir);
    assert_eq!(files.len(), 1);
    let text = std::fs::read_to_string(&files[0]).unwrap();
    let counts = |name: &str| -> Vec<u64> {
        text.lines()
            .filter(|l| l.split('\t').nth(1) == Some(name))
            .map(|l| l.split('\t').next().unwrap().parse().unwrap())
            .collect()
    };
    // lib_entry: twice in the linked library, once per round in the copy,
    // whose sleds the watcher thread registers (the program waits 50 ms) (three modules
    // at one address, counted together). The copy's calls of lib_leaf bind
    // to the linked library's (global scope first): 100 + 10 + 50 + 51 + 52.
    // The copy's registration is asynchronous (the watcher polls every
    // 10 ms; the program waits 50 ms per round, which a loaded machine may
    // stretch), so at least one of its three rounds is counted.
    let entry = counts("lib_entry");
    assert!(entry.contains(&2), "linked library: {text}");
    let copy: u64 = entry.iter().sum::<u64>() - 2;
    assert!((1..=3).contains(&copy), "dlopened copy registered: {text}");
    assert_eq!(counts("lib_leaf").iter().sum::<u64>(), 263, "{text}");
    assert_eq!(calls_of(&files[0], "local"), Some(2));
}

/// `dlopen` is interposed so that the sled watcher thread starts only then;
/// glibc must still resolve a bare name against the *program's*
/// `DT_RUNPATH` (`$ORIGIN/sub`), and a program that loads nothing must run
/// with no thread of the runtime's.
#[test]
fn dlopen_by_name_keeps_the_callers_runpath_and_starts_the_watcher() {
    let dir = scratch("sled-origin");
    let sub = dir.join("sub");
    std::fs::create_dir_all(&sub).unwrap();
    let so = |name: &str| {
        build(
            "gcc",
            &[&src("lib.c")],
            &["-O2", "-shared", "-fPIC", SLED],
            &sub.join(name),
        );
    };
    so("libdemo.so");
    so("copy.so");
    let inst = dir.join("uselib");
    let l = format!("-L{}", sub.display());
    build(
        "gcc",
        &[&src("uselib.c")],
        &[
            "-O2",
            SLED,
            &l,
            "-ldemo",
            "-Wl,--enable-new-dtags,-rpath,$ORIGIN/sub",
            "-ldl",
        ],
        &inst,
    );
    let stderr = |o: &std::process::Output| String::from_utf8_lossy(&o.stderr).into_owned();
    // No library loaded: no watcher thread.
    let o = run(&inst, &[], &dir, true, &[("FASTINST_TOOL", "count")]);
    let out = ok_stdout(&o, "no dlopen");
    assert!(!out.contains("dlopen round"), "{out}");
    assert!(stderr(&o).contains("threads before dlopen: 1\n"), "{}", stderr(&o));
    assert!(stderr(&o).contains("threads after dlopen: 1\n"), "{}", stderr(&o));
    for f in count_files(&dir) {
        std::fs::remove_file(f).unwrap();
    }
    // `copy.so` by bare name: found only through the program's RUNPATH.
    let o = run(&inst, &["copy.so"], &dir, true, &[("FASTINST_TOOL", "count")]);
    let out = ok_stdout(&o, "dlopen by name");
    assert!(out.contains("dlopen round 2"), "{out}");
    assert!(stderr(&o).contains("threads before dlopen: 1\n"), "{}", stderr(&o));
    assert!(stderr(&o).contains("threads after dlopen: 2\n"), "{}", stderr(&o));
    let files = count_files(&dir);
    assert_eq!(files.len(), 1);
    let text = std::fs::read_to_string(&files[0]).unwrap();
    // Twice from the linked library; the copy's rounds as the watcher, now
    // started, registers it (see `shared_library_linked_and_dlopened`).
    let entry: u64 = text
        .lines()
        .filter(|l| l.split('\t').nth(1) == Some("lib_entry"))
        .map(|l| l.split('\t').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert!((3..=5).contains(&entry), "copy registered after dlopen: {text}");
}

#[test]
fn eight_threads_while_every_probe_toggles_at_every_split() {
    let dir = scratch("sled-toggle");
    let mut total = 0u64;
    for cc in ["gcc", "clang"] {
        let bin = build_api_program(
            cc,
            "sled_toggle.c",
            &["-O2", SLED, "-pthread"],
            &dir,
            &format!("toggle-{cc}"),
        );
        for strategy in STRATEGIES {
            // debug: a failed toggle's C status comes with the error behind it.
            let env = [("FASTINST_TOOL", "none"), ("FASTINST_LOG", "debug")];
            let o = run(&bin, &[strategy, "300"], &dir, false, &env);
            let out = ok_stdout(&o, &format!("{cc} {strategy}"));
            println!("{cc} {strategy}: {}", out.trim());
            let field = |k: &str| -> String {
                out.split_whitespace()
                    .find_map(|w| w.strip_prefix(k))
                    .unwrap_or_else(|| panic!("{k} missing in {out}"))
                    .to_string()
            };
            let toggles: u64 = field("toggles=").parse().unwrap();
            let splits: Vec<u32> = field("splits=").split(',').map(|x| x.parse().unwrap()).collect();
            assert!(splits[1..].iter().all(|&n| n >= 1), "a sled at every split: {splits:?}");
            assert!(toggles > 1000, "{toggles} toggles");
            total += toggles;
        }
    }
    println!("0 failures in {total} toggles");
}
