//! The `-pg` provider end to end: programs built now with gcc and clang in
//! every `-pg` form (`call mcount` after the prologue, through the GOT and
//! the PLT; `call __fentry__` with `-mfentry`; gcc's `__mcount_loc` table
//! and its `-mnop-mcount` NOPs), run under the preload library. Their
//! output must equal the uninstrumented build's with every tool and with a
//! handler that clobbers every register a C function may; exact counts
//! must match the program's calls in every strategy; threads, `fork`, C++
//! exceptions, `longjmp`, a linked and a `dlopen`ed library; then 8
//! threads checking their results while one thread toggles every entry
//! and exit probe.

mod common;
use common::*;
use std::path::Path;

/// Every `-pg` form: the compiler and its flags.
const BUILDS: [(&str, &[&str]); 7] = [
    ("gcc", &["-pg"]),
    ("gcc", &["-pg", "-fno-pie", "-no-pie"]),
    ("gcc", &["-pg", "-mfentry"]),
    ("gcc", &["-pg", "-mfentry", "-mrecord-mcount", "-fno-pie", "-no-pie"]),
    (
        "gcc",
        &[
            "-pg",
            "-mfentry",
            "-mrecord-mcount",
            "-mnop-mcount",
            "-fno-pie",
            "-no-pie",
        ],
    ),
    ("clang", &["-pg"]),
    ("clang", &["-pg", "-mfentry"]),
];

fn tag(cc: &str, flags: &[&str]) -> String {
    format!("{cc}{}", flags.concat())
}

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

/// Builds `srcs` plain and with `pg` flags, runs both (the `-pg` build
/// under the clobbering client), and checks the output and that probes
/// fired on entry and exit.
fn same_under_clobber(cc: &str, srcs: &[&Path], flags: &[&str], pg: &[&str], dir: &Path, client: &Path, what: &str) {
    let plain = dir.join(format!("{what}-plain"));
    let inst = dir.join(format!("{what}-pg"));
    build(cc, srcs, flags, &plain);
    let f: Vec<&str> = flags.iter().chain(pg).copied().collect();
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
fn basic_program_every_form_strategy_and_tool_with_exact_counts() {
    let dir = scratch("pg-basic");
    let plain = dir.join("plain");
    build("gcc", &[&src("basic.c")], &["-O2"], &plain);
    let want = ok_stdout(&run(&plain, &[], &dir, false, &[]), "plain");
    for (cc, flags) in BUILDS {
        for opt in ["-O0", "-O2"] {
            let what = format!("{} {opt}", tag(cc, flags));
            let inst = dir.join(what.replace(' ', ""));
            let f: Vec<&str> = std::iter::once(opt).chain(flags.iter().copied()).collect();
            build(cc, &[&src("basic.c")], &f, &inst);
            for tool in ["none", "off", "profile"] {
                let o = run(
                    &inst,
                    &[],
                    &dir,
                    true,
                    &[("FASTINST_TOOL", tool), ("FASTINST_LOG", "info")],
                );
                assert_eq!(ok_stdout(&o, &what), want, "{what} tool {tool}");
                let err = String::from_utf8_lossy(&o.stderr);
                assert!(!err.contains("warning"), "{what} tool {tool}: {err}");
                // Registered at load as sleds, never discovered.
                let init = err.lines().find(|l| l.contains("init total ")).unwrap_or("");
                assert!(
                    init.contains(" sleds ") && !init.contains(" sleds 0,") && init.ends_with("discovery 0)"),
                    "{what} tool {tool}: {init}"
                );
            }
            for strategy in STRATEGIES {
                let out = dir.join(format!("count-{}-{strategy}", what.replace(' ', "")));
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
    }
}

/// The sites are listed by `fastinst sites`' reader as the runtime finds
/// them: one per function, none left alone.
#[test]
fn every_function_of_every_form_has_one_site() {
    let dir = scratch("pg-sites");
    for (cc, flags) in BUILDS {
        let what = tag(cc, flags);
        let inst = dir.join(&what);
        let f: Vec<&str> = std::iter::once("-O2").chain(flags.iter().copied()).collect();
        build(cc, &[&src("basic.c")], &f, &inst);
        let bytes = std::fs::read(&inst).unwrap();
        let build = providers::offline::probe_build(&bytes).unwrap();
        assert!(build.mcount && build.any(), "{what}: {build:?}");
        let found = providers::mcount::sites_in_elf(&bytes).unwrap();
        assert!(found.unusable.is_empty(), "{what}: {:?}", found.unusable);
        let mut names: Vec<String> = found
            .sites
            .iter()
            .map(|s| {
                let sym = providers::elf::SymbolTable::from_elf(&bytes, 0).unwrap();
                sym.containing(s.addr).unwrap().name.clone()
            })
            .collect();
        names.sort();
        for f in ["apply", "bump", "bump_by", "fib", "fill", "main", "square", "sum_table"] {
            assert_eq!(
                names.iter().filter(|n| *n == f).count(),
                1,
                "{what}: one site in {f}: {names:?}"
            );
        }
        let fentry = flags.contains(&"-mfentry");
        for s in &found.sites {
            let want = if fentry {
                providers::mcount::Frame::Entry
            } else {
                providers::mcount::Frame::FramePointer
            };
            assert_eq!(s.frame, want, "{what}: {s:?}");
        }
    }
}

#[test]
fn registers_survive_a_handler_that_clobbers_them() {
    let dir = scratch("pg-abi");
    let client = clobber_client(&dir);
    for (cc, flags) in BUILDS {
        for opt in ["-O0", "-O2"] {
            let what = format!("abi-{}{opt}", tag(cc, flags));
            same_under_clobber(cc, &[&src("abi.c")], &[opt, "-lm"], flags, &dir, &client, &what);
        }
    }
}

#[test]
fn cxx_exceptions_and_longjmp_with_exits_on() {
    let dir = scratch("pg-unwind");
    let client = clobber_client(&dir);
    for (cc, cxx) in [("gcc", "g++"), ("clang", "clang++")] {
        for pg in [&["-pg"][..], &["-pg", "-mfentry"]] {
            let t = tag(cxx, pg);
            for opt in ["-O0", "-O2"] {
                let what = format!("exceptions-{t}{opt}");
                same_under_clobber(cxx, &[&src("exceptions.cpp")], &[opt], pg, &dir, &client, &what);
            }
            let what = format!("jumps-{}", tag(cc, pg));
            same_under_clobber(cc, &[&src("jumps.c")], &["-O2"], pg, &dir, &client, &what);
        }
    }
}

#[test]
fn threads_fork_and_a_linked_and_a_dlopened_library() {
    let dir = scratch("pg-programs");
    for (cc, pg) in [("gcc", &["-pg"][..]), ("clang", &["-pg", "-mfentry"])] {
        let t = tag(cc, pg);
        // Threads: output unchanged with every tool.
        let plain = dir.join(format!("threads-plain-{t}"));
        let inst = dir.join(format!("threads-{t}"));
        build(cc, &[&src("threads.c")], &["-O2", "-pthread"], &plain);
        let f: Vec<&str> = ["-O2", "-pthread"].iter().chain(pg).copied().collect();
        build(cc, &[&src("threads.c")], &f, &inst);
        let want = ok_stdout(&run(&plain, &[], &dir, false, &[]), "threads plain");
        for tool in ["none", "count", "profile", "trace"] {
            let o = run(&inst, &[], &dir, true, &[("FASTINST_TOOL", tool)]);
            assert_eq!(
                ok_stdout(&o, &format!("threads {t} {tool}")),
                want,
                "threads {t} {tool}"
            );
        }
        for old in count_files(&dir) {
            std::fs::remove_file(old).unwrap();
        }
        // Fork: parent and child each count their own calls.
        let inst = dir.join(format!("forks-{t}"));
        let f: Vec<&str> = std::iter::once("-O2").chain(pg.iter().copied()).collect();
        build(cc, &[&src("forks.c")], &f, &inst);
        let out = ok_stdout(
            &run(&inst, &[], &dir, true, &[("FASTINST_TOOL", "count")]),
            "forks count",
        );
        assert!(out.contains("child:") && out.contains("parent:"), "{out}");
        let files = count_files(&dir);
        assert_eq!(files.len(), 2, "parent and child each write their counts: {files:?}");
        let layers: Vec<u64> = files.iter().map(|f| calls_of(f, "layer").unwrap()).collect();
        assert!(
            layers.contains(&1) && layers.contains(&2),
            "{t}: child counts only its own calls: {layers:?}"
        );
        for f in files {
            std::fs::remove_file(f).unwrap();
        }
    }
    // A library linked and a copy dlopened, both -pg, the program too.
    let d = dir.to_str().unwrap().to_string();
    let rp = format!("-Wl,-rpath,{d}");
    let l = format!("-L{d}");
    for so in ["libdemo.so", "copy.so"] {
        build(
            "gcc",
            &[&src("lib.c")],
            &["-O2", "-shared", "-fPIC", "-pg", "-mfentry"],
            &dir.join(so),
        );
    }
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
        &["-O2", "-pg", &l, "-ldemo", &rp, "-ldl"],
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
    // As for sleds (`sleds.rs`, `shared_library_linked_and_dlopened`):
    // lib_entry twice in the linked library, once per round of the copy
    // that the watcher thread registered in time; lib_leaf's calls bind
    // to the linked library's.
    let entry = counts("lib_entry");
    assert!(entry.contains(&2), "linked library: {text}");
    let copied: u64 = entry.iter().sum::<u64>() - 2;
    assert!((1..=3).contains(&copied), "dlopened copy registered: {text}");
    assert_eq!(counts("lib_leaf").iter().sum::<u64>(), 263, "{text}");
    assert_eq!(calls_of(&files[0], "local"), Some(2));
}

#[test]
fn eight_threads_while_every_probe_toggles() {
    let dir = scratch("pg-toggle");
    let mut total = 0u64;
    for (cc, flags) in [BUILDS[0], BUILDS[2], BUILDS[4], BUILDS[5], BUILDS[6]] {
        let t = tag(cc, flags);
        let f: Vec<&str> = ["-O2", "-pthread", "-DPG_BUILD"].iter().chain(flags).copied().collect();
        let bin = build_api_program(cc, "sled_toggle.c", &f, &dir, &format!("toggle-{t}"));
        for strategy in STRATEGIES {
            let env = [("FASTINST_TOOL", "none"), ("FASTINST_LOG", "debug")];
            let o = run(&bin, &[strategy, "200"], &dir, false, &env);
            let out = ok_stdout(&o, &format!("{t} {strategy}"));
            println!("{t} {strategy}: {}", out.trim());
            let toggles: u64 = out
                .split_whitespace()
                .find_map(|w| w.strip_prefix("toggles="))
                .unwrap_or_else(|| panic!("no toggles in {out}"))
                .parse()
                .unwrap();
            assert!(toggles > 1000, "{t} {strategy}: {toggles} toggles");
            total += toggles;
        }
    }
    println!("0 failures in {total} toggles");
}
