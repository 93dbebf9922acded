//! A Rust program as a target: the `rust_service` example, instrumented
//! with `#[fastinst::instrument]` and `fastinst::probe!`, run under
//! `fastinst run` with 8 threads (more than CI's CPUs). Its output must not
//! change; the exact tools must agree with what it prints; the profile
//! must name its functions, their callers and their self time.

mod common;
use common::*;
use std::path::PathBuf;
use std::process::Command;

fn example() -> PathBuf {
    // target/<profile>/deps/rust_service-<hash> -> target/<profile>/examples/
    let exe = std::env::current_exe().unwrap();
    let p = exe.parent().unwrap().parent().unwrap().join("examples/rust_service");
    assert!(p.exists(), "{} not built (cargo test builds examples)", p.display());
    p
}

/// The numbers the service prints: requests, misses, parts.
fn truth(stdout: &str) -> (u64, u64, u64) {
    let n: Vec<u64> = stdout
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    assert!(n.len() >= 4, "{stdout}");
    (n[0], n[2], n[3])
}

/// `(calls, column 2)` of `name` in a text report or count file.
fn row<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
    text.lines()
        .find(|l| l.split_whitespace().last() == Some(name) || l.split('\t').nth(1) == Some(name))
        .unwrap_or_else(|| panic!("no row for {name} in:\n{text}"))
        .split_whitespace()
        .collect()
}

fn only_file(dir: &std::path::Path, prefix: &str, ext: &str) -> String {
    let files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.starts_with(prefix) && n.ends_with(ext)
        })
        .collect();
    assert_eq!(files.len(), 1, "{prefix}*{ext} in {}: {files:?}", dir.display());
    std::fs::read_to_string(&files[0]).unwrap()
}

#[test]
fn a_rust_service_counts_exactly_and_its_profile_names_its_functions() {
    let dir = scratch("rust-service");
    let bin = example();
    let bin_s = bin.to_str().unwrap();
    let args = ["300000", "8"];
    let plain = testkit::output_within(
        {
            let mut c = Command::new(&bin);
            c.args(args);
            c
        },
        LIMIT,
        "rust_service",
    );
    assert!(plain.status.success());
    let want = text(&plain.stdout);
    let (requests, misses, parts) = truth(&want);
    assert_eq!((requests, misses, parts), (300_000, 5000, 900_000), "{want}");

    // The sites: one sled per instrumented function, the point apart.
    let o = fastinst(&["sites", bin_s], &dir);
    let sites = text(&o.stdout);
    assert!(o.status.success(), "{sites}");
    for f in ["parse", "handle", "expensive", "Cache::lookup"] {
        assert!(
            sites.contains(&format!("rust_service::{f}")),
            "no sled for {f}:\n{sites}"
        );
    }
    assert!(sites.contains("point cache-miss"), "{sites}");

    // The point is a USDT probe too (`perf probe sdt_fastinst:cache_miss`,
    // bpftrace's `usdt:`): its note names a one-byte NOP right after the
    // point's own NOP, which fastinst never writes.
    let notes = Command::new("readelf")
        .args(["-nW", bin_s])
        .output()
        .expect("readelf (binutils)");
    let notes = text(&notes.stdout);
    let at = notes
        .find("Name: cache_miss")
        .unwrap_or_else(|| panic!("no USDT note:\n{notes}"));
    assert!(notes[..at].trim_end().ends_with("Provider: fastinst"), "{notes}");
    let loc = notes[at..]
        .split_whitespace()
        .skip_while(|w| *w != "Location:")
        .nth(1)
        .and_then(|w| u64::from_str_radix(w.trim_end_matches(',').trim_start_matches("0x"), 16).ok())
        .unwrap_or_else(|| panic!("{notes}"));
    let segs = Command::new("readelf").args(["-lW", bin_s]).output().unwrap();
    let off = text(&segs.stdout)
        .lines()
        .filter(|l| l.trim_start().starts_with("LOAD"))
        .find_map(|l| {
            let w: Vec<u64> = l
                .split_whitespace()
                .skip(1)
                .take(5)
                .map(|x| u64::from_str_radix(x.trim_start_matches("0x"), 16).unwrap())
                .collect();
            (loc >= w[1] && loc < w[1] + w[3]).then(|| loc - w[1] + w[0])
        })
        .expect("the note's address in a segment") as usize;
    let bytes = std::fs::read(&bin).unwrap();
    assert_eq!(
        bytes[off - 5..=off],
        [0x0F, 0x1F, 0x44, 0x00, 0x00, 0x90],
        "at {loc:#x}"
    );

    // Exact counts, and the point counted as often as the misses printed.
    let o = fastinst(&["run", "--tool", "count", "--", bin_s, args[0], args[1]], &dir);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), want, "output under count");
    let counts = only_file(&dir, "fastinst-count.", ".txt");
    for (f, n) in [
        ("rust_service::handle", requests),
        ("rust_service::parse", requests),
        ("rust_service::Cache::lookup", requests),
        ("rust_service::render", parts),
        ("rust_service::expensive", misses),
        ("cache-miss", misses),
    ] {
        assert_eq!(row(&counts, f)[0], n.to_string(), "{f}:\n{counts}");
    }

    // Exact trace: the same calls.
    let o = fastinst(&["run", "--tool", "trace", "--", bin_s, "20000", args[1]], &dir);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let trace = only_file(&dir, "fastinst-trace.", ".txt");
    assert_eq!(row(&trace, "rust_service::handle")[..2], ["20000", "="], "{trace}");
    assert_eq!(row(&trace, "rust_service::render")[..2], ["60000", "="], "{trace}");

    // The profile: every function by its path, callers by name, and the
    // body's CPU samples charged to the function (the body is a function
    // of its own the sled function jumps to).
    let o = fastinst(&["run", "--", bin_s, args[0], args[1]], &dir);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), want, "output under the profiler");
    let profile = only_file(&dir, "fastinst-profile.", ".txt");
    for f in ["handle", "render", "Cache::lookup", "parse"] {
        row(&profile, &format!("rust_service::{f}"));
    }
    assert!(
        profile.contains("rust_service::handle -> rust_service::render"),
        "callers named by the function, not its body:\n{profile}"
    );
    assert!(!profile.contains("__fastinst_"), "{profile}");
    let cpu_samples = profile
        .lines()
        .any(|l| l.starts_with("cpu samples: ") && !l.starts_with("cpu samples: 0 "));
    if cpu_samples {
        // A self time of few samples is marked `?`.
        let self_ms: f64 = row(&profile, "rust_service::render")[5]
            .trim_end_matches('?')
            .parse()
            .unwrap();
        assert!(self_ms > 0.0, "render's body has CPU samples:\n{profile}");
    }
}
