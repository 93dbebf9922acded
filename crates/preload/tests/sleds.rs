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

const SLED: &str = "-fpatchable-function-entry=5";

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
                sled_build_under_every_tool(&inst, &dir, &what, &want, false);
                basic_counts_in_every_strategy(&inst, &dir, &what, &want);
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
                &[SLED],
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
                &[SLED],
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
            same_under_clobber(cxx, &[&src("exceptions.cpp")], &[opt], &[SLED], &dir, &client, &what);
        }
    }
    for cc in ["gcc", "clang"] {
        same_under_clobber(
            cc,
            &[&src("jumps.c")],
            &["-O2"],
            &[SLED],
            &dir,
            &client,
            &format!("jumps-{cc}"),
        );
    }
}

#[test]
fn shared_library_linked_and_dlopened() {
    linked_and_dlopened(&scratch("sled-lib"), &[SLED], &[SLED]);
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

/// gcc's one-byte-NOP sleds of a library `dlopen`ed while more threads
/// than CPUs run it: the watcher makes each sled one NOP and the count
/// tool arms it at once, while threads preempted between two of the old
/// NOPs wait to resume. Each must be moved to its sled's end before the
/// sled becomes a `call` (here 3 of 6 such runs died by SIGILL, inside the
/// armed sled, before it was). Every run must print the plain run's
/// checksum and count the library's functions (its probes were missed
/// when the watcher, started by this very `dlopen`, read the loader's
/// module count after the library was in it).
#[test]
fn a_gcc_sled_library_dlopened_while_more_threads_than_cpus_run_it() {
    let dir = scratch("sled-late-threads");
    let (so, bin, go) = (dir.join("libplugin.so"), dir.join("late_loader"), dir.join("go"));
    build("gcc", &[&src("plugin.c")], &["-O2", "-fPIC", "-shared", SLED], &so);
    build(
        "gcc",
        &[&src("late_loader.c")],
        &["-O2", "-pthread", SLED, "-ldl"],
        &bin,
    );
    std::fs::write(&go, "").unwrap();
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    let threads = (4 * cpus).clamp(8, 64).to_string();
    let args = [so.to_str().unwrap(), go.to_str().unwrap(), threads.as_str(), "3", "300"];
    let want = ok_stdout(&run(&bin, &args, &dir, false, &[]), "no preload");
    let env = [("FASTINST_TOOL", "count"), ("FASTINST_LOG", "info")];
    let mut moved = 0u64;
    for k in 0..6 {
        let o = run(&bin, &args, &dir, true, &env);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert_eq!(ok_stdout(&o, &format!("run {k}")), want, "run {k}: {err}");
        let files = count_files(&dir);
        assert_eq!(files.len(), 1, "{err}");
        for f in ["plugin_leaf", "plugin_step"] {
            assert!(
                calls_of(&files[0], f).unwrap_or(0) > 0,
                "run {k}: {f} not counted: {err}"
            );
        }
        std::fs::remove_file(&files[0]).unwrap();
        moved += err
            .split(" moved to a sled's end")
            .next()
            .filter(|head| head.len() < err.len())
            .and_then(|head| head.rsplit(' ').next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
    }
    println!("{moved} threads moved out of a sled in 6 runs");
    std::fs::remove_dir_all(&dir).unwrap();
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
