//! End-to-end: real C and C++ programs, built now with gcc and clang, run
//! under `LD_PRELOAD=libfastinst.so`; every output must equal the
//! uninstrumented build's, for every strategy and tool.

mod common;
use common::*;
use std::path::Path;

const COMPILERS: [&str; 2] = ["gcc", "clang"];
const LAYOUTS: [(&str, &[&str]); 3] = [
    ("pie", &["-fPIE", "-pie"]),
    ("nopie", &["-fno-pie", "-no-pie"]),
    ("noplt", &["-fPIE", "-pie", "-fno-plt"]),
];

fn check_program(dir: &Path, plain: &Path, inst: &Path, args: &[&str], what: &str) -> String {
    let want = ok_stdout(&run(plain, args, dir, false, &[]), &format!("{what} uninstrumented"));
    let none = run(inst, args, dir, true, &[("FASTINST_TOOL", "none")]);
    assert_eq!(ok_stdout(&none, what), want, "{what}, tool none");
    // The default tool: the latency profiler.
    let prof = run(inst, args, dir, true, &[]);
    assert_eq!(ok_stdout(&prof, what), want, "{what}, default tool (profile)");
    // W^X: the same, with the code patched through its alias.
    let wx = run(inst, args, dir, true, &[("FASTINST_WX", "1")]);
    assert_eq!(ok_stdout(&wx, what), want, "{what}, default tool, W^X");
    for strategy in STRATEGIES {
        for tool in ["off", "count"] {
            let o = run(
                inst,
                args,
                dir,
                true,
                &[("FASTINST_STRATEGY", strategy), ("FASTINST_TOOL", tool)],
            );
            assert_eq!(ok_stdout(&o, what), want, "{what}, {strategy}, {tool}");
            assert!(
                !String::from_utf8_lossy(&o.stderr).contains("warning"),
                "{what}, {strategy}, {tool}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
    }
    want
}

#[test]
fn basic_program_every_compiler_level_layout_strategy_and_tool() {
    let dir = scratch("basic");
    for cc in COMPILERS {
        for opt in ["-O0", "-O2"] {
            for (layout, flags) in LAYOUTS {
                let what = format!("basic {cc} {opt} {layout}");
                let plain = dir.join(format!("plain-{cc}{opt}-{layout}"));
                let inst = dir.join(format!("inst-{cc}{opt}-{layout}"));
                let mut f: Vec<&str> = flags.to_vec();
                f.push(opt);
                build(cc, &[&src("basic.c")], &f, &plain);
                f.push("-finstrument-functions");
                build(cc, &[&src("basic.c")], &f, &inst);
                check_program(&dir, &plain, &inst, &[], &what);
                // The count tool's numbers are the program's call counts.
                for old in count_files(&dir) {
                    std::fs::remove_file(old).unwrap();
                }
                let o = run(&inst, &[], &dir, true, &[("FASTINST_TOOL", "count")]);
                ok_stdout(&o, &what);
                let files = count_files(&dir);
                assert_eq!(files.len(), 1, "{what}: one count file");
                assert!(
                    files[0].to_string_lossy().contains(&format!(".{}.", o_pid(&o))),
                    "{what}: pid in the name"
                );
                assert_eq!(calls_of(&files[0], "bump"), Some(200), "{what}");
                assert_eq!(calls_of(&files[0], "main"), Some(1), "{what}");
                assert_eq!(calls_of(&files[0], "fill"), Some(200), "{what}");
                std::fs::remove_file(&files[0]).unwrap();
            }
        }
    }
}

/// The pid in the runtime's stderr summary line.
fn o_pid(o: &std::process::Output) -> String {
    let e = String::from_utf8_lossy(&o.stderr);
    e.split("fastinst-count.")
        .nth(1)
        .and_then(|s| s.split('.').next())
        .unwrap_or("?")
        .to_string()
}

#[test]
fn threads_fork_exceptions_and_shared_libraries() {
    let dir = scratch("programs");
    for (cc, cxx) in [("gcc", "g++"), ("clang", "clang++")] {
        for opt in ["-O0", "-O2"] {
            let tag = format!("{cc}{opt}");
            for (name, compiler, extra) in [
                ("threads.c", cc, &["-pthread"][..]),
                ("forks.c", cc, &[][..]),
                ("exceptions.cpp", cxx, &[][..]),
            ] {
                let plain = dir.join(format!("plain-{tag}-{name}"));
                let inst = dir.join(format!("inst-{tag}-{name}"));
                let mut f = vec![opt];
                f.extend_from_slice(extra);
                build(compiler, &[&src(name)], &f, &plain);
                f.push("-finstrument-functions");
                build(compiler, &[&src(name)], &f, &inst);
                let out = check_program(&dir, &plain, &inst, &[], &format!("{name} {tag}"));
                if name == "forks.c" {
                    assert!(out.contains("child:") && out.contains("parent:"));
                    for old in count_files(&dir) {
                        std::fs::remove_file(old).unwrap();
                    }
                    ok_stdout(
                        &run(&inst, &[], &dir, true, &[("FASTINST_TOOL", "count")]),
                        "forks count",
                    );
                    let files = count_files(&dir);
                    assert_eq!(files.len(), 2, "parent and child each write their counts: {files:?}");
                    let layers: Vec<u64> = files.iter().map(|f| calls_of(f, "layer").unwrap()).collect();
                    assert!(
                        layers.contains(&1) && layers.contains(&2),
                        "child counts only its own calls: {layers:?}"
                    );
                    for f in files {
                        std::fs::remove_file(f).unwrap();
                    }
                    // W^X: the child gets its own copy of the aliased
                    // code, so each process's probes and counts are its own.
                    let wx = ok_stdout(
                        &run(
                            &inst,
                            &[],
                            &dir,
                            true,
                            &[("FASTINST_TOOL", "count"), ("FASTINST_WX", "1")],
                        ),
                        "forks count W^X",
                    );
                    assert_eq!(wx, out, "forks.c's output under W^X");
                    let files = count_files(&dir);
                    assert_eq!(
                        files.len(),
                        2,
                        "W^X: parent and child each write their counts: {files:?}"
                    );
                    let mut layers: Vec<u64> = files.iter().map(|f| calls_of(f, "layer").unwrap()).collect();
                    layers.sort_unstable();
                    assert_eq!(layers, [1, 2], "W^X: each process counts only its own calls");
                    for f in files {
                        std::fs::remove_file(f).unwrap();
                    }
                }
                if name == "exceptions.cpp" {
                    assert!(out.contains("caught: bottom at depth 15"), "{out}");
                    ok_stdout(
                        &run(&inst, &[], &dir, true, &[("FASTINST_TOOL", "count")]),
                        "exceptions count",
                    );
                    let f = count_files(&dir).pop().unwrap();
                    assert_eq!(calls_of(&f, "shapes::guarded(int)"), Some(5), "demangled C++ names");
                    std::fs::remove_file(f).unwrap();
                }
            }
            // An instrumented shared library, linked and dlopen'd (a copy,
            // so dlclose really unloads it).
            let libdir = dir.join(format!("lib-{tag}"));
            std::fs::create_dir_all(&libdir).unwrap();
            let so = libdir.join("libdemo.so");
            let copy = libdir.join("libdemo-copy.so");
            let plain_so = libdir.join("plain/libdemo.so");
            std::fs::create_dir_all(plain_so.parent().unwrap()).unwrap();
            build(
                cc,
                &[&src("lib.c")],
                &[opt, "-fPIC", "-shared", "-finstrument-functions"],
                &so,
            );
            build(cc, &[&src("lib.c")], &[opt, "-fPIC", "-shared"], &plain_so);
            std::fs::copy(&so, &copy).unwrap();
            let link = |l: &Path| {
                let d = l.parent().unwrap().to_string_lossy().into_owned();
                vec![format!("-L{d}"), "-ldemo".to_string(), format!("-Wl,-rpath,{d}")]
            };
            let plain = libdir.join("plain-uselib");
            let inst = libdir.join("inst-uselib");
            let mut f: Vec<String> = vec![opt.into()];
            f.extend(link(&plain_so));
            build(
                cc,
                &[&src("uselib.c")],
                &f.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
                &plain,
            );
            let mut f: Vec<String> = vec![opt.into(), "-finstrument-functions".into()];
            f.extend(link(&so));
            build(
                cc,
                &[&src("uselib.c")],
                &f.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
                &inst,
            );
            let copy_s = copy.to_string_lossy().into_owned();
            let out = check_program(&libdir, &plain, &inst, &[&copy_s], &format!("uselib {tag}"));
            assert!(out.contains("dlopen round 2"), "{out}");
        }
    }
}

#[test]
fn c_api_program_every_strategy() {
    let dir = scratch("capi");
    for cc in COMPILERS {
        for opt in ["-O0", "-O2"] {
            let bin = build_api_program(
                cc,
                "api_test.c",
                &[opt, "-finstrument-functions", "-pthread"],
                &dir,
                &format!("api-{cc}{opt}"),
            );
            for strategy in STRATEGIES {
                // The program drives every probe itself: no tool may switch
                // them too (the profiler's epochs switch every probe on).
                let o = run(&bin, &[strategy], &dir, false, &[("FASTINST_TOOL", "none")]);
                let out = ok_stdout(&o, &format!("api_test {cc} {opt} {strategy}"));
                assert!(out.starts_with(&format!("ok strategy={strategy} ")), "{out}");
                println!("{cc} {opt}: {}", out.trim());
            }
        }
    }
}

/// A probe whose library `dlclose` unloaded answers exactly
/// `FASTINST_EUNLOADED` to activation and deactivation, from C built by
/// gcc and clang.
#[test]
fn a_dlclosed_librarys_probes_answer_eunloaded() {
    let dir = scratch("unloaded");
    for cc in COMPILERS {
        let so = dir.join(format!("libgone-{cc}.so"));
        build(
            cc,
            &[&src("lib.c")],
            &["-O2", "-fPIC", "-shared", "-finstrument-functions"],
            &so,
        );
        let bin = build_api_program(cc, "unloaded.c", &["-O2", "-ldl"], &dir, &format!("unloaded-{cc}"));
        let so_s = so.to_string_lossy().into_owned();
        let o = run(&bin, &[&so_s], &dir, false, &[("FASTINST_TOOL", "none")]);
        let out = ok_stdout(&o, &format!("unloaded {cc}"));
        assert!(out.starts_with("ok "), "{out}");
        println!("{cc}: {}", out.trim());
    }
}

/// A call site rewritten behind the runtime's back is refused with exactly
/// `FASTINST_EPATCH`, unwritten, and switches again once its bytes are
/// back, from C built by gcc and clang.
#[test]
fn a_site_written_behind_the_runtimes_back_answers_epatch() {
    let dir = scratch("epatch");
    for cc in COMPILERS {
        let bin = build_api_program(
            cc,
            "foreign_write.c",
            &["-O2", "-finstrument-functions"],
            &dir,
            &format!("foreign-{cc}"),
        );
        let o = run(&bin, &[], &dir, false, &[("FASTINST_TOOL", "none")]);
        let out = ok_stdout(&o, &format!("foreign_write {cc}"));
        assert!(out.starts_with("ok "), "{out}");
    }
}

/// A crash in a program whose code the runtime patched still kills it by
/// SIGSEGV (the runtime's fault handler raises it again), or by SIGILL for
/// an illegal instruction, and the handler says where, with the code
/// there: a signal raised again is not logged by the kernel as a fault
/// is, and the kernel logs no illegal instruction at all.
#[test]
fn a_crash_is_fatal_as_before_and_says_where() {
    use std::os::unix::process::ExitStatusExt;
    let dir = scratch("crash");
    for cc in COMPILERS {
        let bin = dir.join(format!("crash-{cc}"));
        build(cc, &[&src("crash.c")], &["-O2", "-finstrument-functions"], &bin);
        let o = run(&bin, &[], &dir, true, &[("FASTINST_TOOL", "count")]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.signal(), Some(libc::SIGSEGV), "{cc}: {:?} {err}", o.status);
        assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "5000050000", "{cc}");
        assert!(
            err.contains("fastinst: fatal signal 11 at address 0x10, ip 0x"),
            "{cc}: {err}"
        );
        // An illegal instruction, which the kernel reports nowhere: killed
        // by SIGILL as before, with the bytes that ran (`ud2` at ip).
        let o = run(&bin, &["ill"], &dir, true, &[("FASTINST_TOOL", "count")]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.signal(), Some(libc::SIGILL), "{cc}: {:?} {err}", o.status);
        assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "5000050000", "{cc}");
        let report = err
            .lines()
            .find(|l| l.starts_with("fastinst: fatal signal 4 at address 0x"))
            .unwrap_or_else(|| panic!("{cc}: no SIGILL report in {err}"));
        let at_ip = report
            .split_once(':')
            .and_then(|(_, r)| r.split_once(':'))
            .map(|(_, b)| b);
        let ip = report.split(", ip ").nth(1).and_then(|r| r.split(',').next());
        let back = report.split(" from ip-").nth(1).and_then(|r| r.split(':').next());
        let (Some(bytes), Some(ip), Some(back)) = (at_ip, ip, back) else {
            panic!("{cc}: {report}")
        };
        assert!(report.contains(&format!("at address {ip},")), "{cc}: {report}");
        let back: usize = back.parse().expect("a count");
        let bytes: Vec<&str> = bytes.split_whitespace().collect();
        assert_eq!(bytes.get(back..back + 2), Some(&["0f", "0b"][..]), "{cc}: {report}");
    }
}

/// A function's own tail-jump exit is keyed by the function; the exits of
/// its copies inlined elsewhere are `call`s that must still be discovered
/// (and switched off) on their own, not taken for the tail site's calls,
/// whether the tail site is off or on.
#[test]
fn inlined_copies_of_a_tail_exit_function_are_discovered_and_switched_off() {
    let dir = scratch("tail-inlined");
    let bin = build_api_program(
        "gcc",
        "tail_inlined.c",
        &["-O2", "-finstrument-functions"],
        &dir,
        "tail-inlined",
    );
    for strategy in ["flip", "word-sync"] {
        let o = run(
            &bin,
            &["100000"],
            &dir,
            false,
            &[("FASTINST_TOOL", "none"), ("FASTINST_STRATEGY", strategy)],
        );
        let out = ok_stdout(&o, &format!("tail_inlined {strategy}"));
        println!("{strategy}: {}", out.trim());
    }
    // With every probe on, the copies' exits are still their own probes,
    // not the tail probe's (they return inside `twice`, a tail jump to
    // `relv`'s caller).
    let o = run(&bin, &["100000", "on"], &dir, false, &[("FASTINST_TOOL", "none")]);
    let out = ok_stdout(&o, "tail_inlined on");
    println!("on: {}", out.trim());
}

#[test]
fn client_library_drives_the_c_api() {
    let dir = scratch("client");
    let client = dir.join("libclient.so");
    let inc = format!("-I{}", include_dir().display());
    build("gcc", &[&src("client.c")], &["-O2", "-fPIC", "-shared", &inc], &client);
    let inst = dir.join("basic");
    build("gcc", &[&src("basic.c")], &["-O2", "-finstrument-functions"], &inst);
    let client_s = client.to_string_lossy().into_owned();
    let o = run(&inst, &[], &dir, true, &[("FASTINST_CLIENT", &client_s)]);
    ok_stdout(&o, "client");
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    let entries: u64 = err
        .split("probes, ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no client report in {err}"));
    // The count tool counts the same entries (inlined copies included: the
    // client activates every probe).
    ok_stdout(
        &run(
            &inst,
            &[],
            &dir,
            true,
            &[("FASTINST_TOOL", "count"), ("FASTINST_INLINED", "1")],
        ),
        "count",
    );
    let f = count_files(&dir).pop().unwrap();
    let total: u64 = std::fs::read_to_string(&f)
        .unwrap()
        .lines()
        .filter_map(|l| l.split('\t').next()?.parse::<u64>().ok())
        .sum();
    assert_eq!(entries, total, "client and count tool agree");
    assert!(entries > 200 * 5, "{entries}");
}

#[test]
fn invalid_settings_warn_and_fall_back() {
    let dir = scratch("invalid");
    let plain = dir.join("plain");
    let inst = dir.join("inst");
    build("gcc", &[&src("basic.c")], &["-O2"], &plain);
    build("gcc", &[&src("basic.c")], &["-O2", "-finstrument-functions"], &inst);
    let want = ok_stdout(&run(&plain, &[], &dir, false, &[]), "plain");
    let o = run(
        &inst,
        &[],
        &dir,
        true,
        &[
            ("FASTINST_TOOL", "bogus"),
            ("FASTINST_STRATEGY", "sideways"),
            ("FASTINST_LOG", "loud"),
            ("FASTINST_CLIENT", "/nonexistent/client.so"),
            ("FASTINST_REWRITE", "maybe"),
        ],
    );
    assert_eq!(ok_stdout(&o, "invalid"), want);
    let err = String::from_utf8_lossy(&o.stderr);
    for needle in [
        "FASTINST_TOOL",
        "FASTINST_STRATEGY",
        "FASTINST_LOG",
        "FASTINST_CLIENT",
        "FASTINST_REWRITE",
    ] {
        assert!(err.contains(needle), "no message about {needle}: {err}");
    }
    // An unwritable output directory falls back to the current one.
    let o = run(
        &inst,
        &[],
        &dir,
        true,
        &[("FASTINST_TOOL", "count"), ("FASTINST_OUT", "/proc/nope")],
    );
    assert_eq!(ok_stdout(&o, "bad out"), want);
    assert_eq!(count_files(&dir).len(), 1);
}

#[test]
fn uninstrumented_programs_are_unaffected() {
    let dir = scratch("plainchild");
    let plain = dir.join("plain");
    build("gcc", &[&src("forks.c")], &["-O2"], &plain);
    let want = ok_stdout(&run(&plain, &[], &dir, false, &[]), "plain");
    let o = run(&plain, &[], &dir, true, &[("FASTINST_TOOL", "count")]);
    assert_eq!(ok_stdout(&o, "preloaded plain"), want);
    assert!(o.stderr.is_empty(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(count_files(&dir).is_empty());
}
