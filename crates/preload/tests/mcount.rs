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
            sled_build_under_every_tool(&inst, &dir, &what, &want, true);
            basic_counts_in_every_strategy(&inst, &dir, &what, &want);
        }
    }
}

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
    linked_and_dlopened(&dir, &["-pg", "-mfentry"], &["-pg"]);
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
