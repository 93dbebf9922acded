//! The XRay provider end to end: programs built now with clang
//! `-fxray-instrument -fxray-instruction-threshold=1` (-O0 and -O2, PIE and
//! not, XRay's runtime linked or not), run under the preload library. Their
//! output must equal the uninstrumented build's with every tool and with a
//! handler that clobbers every register a C function may; exact counts in
//! every strategy; C++ exceptions and `longjmp` with exits on; 8 threads
//! checking their results while every probe toggles; and XRay's own
//! runtime patching beside fastinst on one code page.

mod common;
use common::*;
use std::path::Path;

const XRAY: [&str; 2] = ["-fxray-instrument", "-fxray-instruction-threshold=1"];

/// Builds `src` with XRay sleds into `out`: compiled with them, and linked
/// with XRay's runtime (`runtime`) or without (the sleds and their table
/// only).
fn build_xray(cc: &str, src: &Path, flags: &[&str], runtime: bool, out: &Path) {
    if runtime {
        let f: Vec<&str> = flags.iter().chain(&XRAY).copied().collect();
        build(cc, &[src], &f, out);
        return;
    }
    let obj = out.with_extension("o");
    let mut f: Vec<&str> = flags.iter().chain(&XRAY).copied().collect();
    f.push("-c");
    build(cc, &[src], &f, &obj);
    let link: Vec<&str> = flags.iter().copied().filter(|x| !x.starts_with("-f")).collect();
    build(cc, &[&obj], &link, out);
}

#[test]
fn basic_program_every_build_strategy_and_tool_with_exact_counts() {
    let dir = scratch("xray-basic");
    let plain = dir.join("plain");
    build("clang", &[&src("basic.c")], &["-O2"], &plain);
    let want = ok_stdout(&run(&plain, &[], &dir, false, &[]), "plain");
    for opt in ["-O0", "-O2"] {
        for (pie, link) in [("-fPIE", "-pie"), ("-fno-pie", "-no-pie")] {
            for runtime in [true, false] {
                let what = format!("{opt} {pie} runtime {runtime}");
                let inst = dir.join(what.replace(' ', ""));
                build_xray("clang", &src("basic.c"), &[opt, pie, link], runtime, &inst);
                let bytes = std::fs::read(&inst).unwrap();
                let syms = String::from_utf8_lossy(&bytes).contains("__xray_patch_function");
                assert_eq!(syms, runtime, "{what}: XRay's runtime linked");
                sled_build_under_every_tool(&inst, &dir, &what, &want, true);
                basic_counts_in_every_strategy(&inst, &dir, &what, &want);
            }
        }
    }
}

#[test]
fn registers_exceptions_and_longjmp_under_a_clobbering_handler() {
    let dir = scratch("xray-abi");
    let client = clobber_client(&dir);
    for (cc, source, flags) in [
        ("clang", "abi.c", &["-O0", "-lm"][..]),
        ("clang", "abi.c", &["-O2", "-lm"]),
        ("clang++", "exceptions.cpp", &["-O0"]),
        ("clang++", "exceptions.cpp", &["-O2"]),
        ("clang", "jumps.c", &["-O2"]),
    ] {
        let what = format!("{source}{}", flags[0]);
        same_under_clobber(cc, &[&src(source)], flags, &XRAY, &dir, &client, &what);
    }
}

#[test]
fn eight_threads_while_every_probe_toggles() {
    let dir = scratch("xray-toggle");
    let mut total = 0u64;
    let f: Vec<&str> = ["-O2", "-pthread", "-DXRAY_BUILD"]
        .iter()
        .chain(&XRAY)
        .copied()
        .collect();
    let bin = build_api_program("clang", "sled_toggle.c", &f, &dir, "toggle-xray");
    for strategy in STRATEGIES {
        let env = [("FASTINST_TOOL", "none"), ("FASTINST_LOG", "debug")];
        let o = run(&bin, &[strategy, "250"], &dir, false, &env);
        let out = ok_stdout(&o, &format!("xray {strategy}"));
        println!("xray {strategy}: {}", out.trim());
        let toggles: u64 = out
            .split_whitespace()
            .find_map(|w| w.strip_prefix("toggles="))
            .unwrap_or_else(|| panic!("no toggles in {out}"))
            .parse()
            .unwrap();
        assert!(toggles > 1000, "{strategy}: {toggles} toggles");
        total += toggles;
    }
    println!("0 failures in {total} toggles");
}

/// XRay's runtime patching one function while fastinst toggles another on
/// the same code page: XRay puts the page back to read+execute after each
/// patch, and fastinst's next write there faults, which wordpatch's handler
/// resolves (`wordpatch::reprotect`).
#[test]
fn xrays_runtime_and_fastinst_patch_one_page_turn_by_turn() {
    let dir = scratch("xray-coexist");
    let f: Vec<&str> = ["-O2"].iter().chain(&XRAY).copied().collect();
    let bin = build_api_program("clang", "xray_coexist.c", &f, &dir, "coexist");
    let o = run(
        &bin,
        &[],
        &dir,
        false,
        &[("FASTINST_TOOL", "none"), ("FASTINST_LOG", "info")],
    );
    let out = ok_stdout(&o, "coexist");
    assert_eq!(out.trim(), "ok fastinst=1000 xray=1000");
    // Each XRay patch made the page read-only again: fastinst's next toggle
    // there faulted, and went through.
    let err = String::from_utf8_lossy(&o.stderr);
    let undone: u64 = err
        .lines()
        .find_map(|l| l.split("info: ").nth(1)?.strip_suffix(" writes to code pages that another patcher had made read-only again were let through (wordpatch made the page writable again)"))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(undone >= 1000, "{undone} faults resolved:\n{err}");
}
