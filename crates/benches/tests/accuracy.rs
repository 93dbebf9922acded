//! A small version of the accuracy harness (`fastinst-accuracy`), bounded
//! for CI: the bundled demo (gcc `-finstrument-functions` and sled builds)
//! and Lua 5.4 from crates.io (sled build), each against the count tool
//! (exact calls), the trace tool (every call timed) and the build's
//! probes-off run.
//!
//! The bounds are wide enough for a noisy two-CPU machine and tight
//! enough that the estimator before this harness existed fails them: it
//! read the demo's calls at 0.37 to 0.64 of their counts (four threads on
//! two CPUs) and real interpreters' busiest functions at 0.02 to 0.14.
//! - demo: every function with at least 1% of the calls within ±25% of its
//!   count, `main`'s inclusive time within 0.75 to 1.6 times the
//!   probes-off run (it waits for threads that outnumber the CPUs, so it
//!   holds their hooks' overhead: an impossible total fails), and
//!   the p50 of most functions of at least 1 µs (mean of three profiler
//!   runs) within ±40% of the trace (in one of two sittings: the trace
//!   is another process); every run's calls checked. (The
//!   trace is another process, run at another moment: on a quiet machine
//!   the sled build's p50s agree within 5%, but under the suite's load a
//!   run of 2 µs calls slowed by 20-40% against the trace's (CI read the
//!   sled build's `compress` at 2.42-2.81 µs against 2.0).)
//! - Lua: the geometric mean of estimated over exact calls within 0.7 to
//!   1.4, and at least half the functions with at least 1% of the calls
//!   within ±40% (one run; a few of its busiest functions are bursty enough
//!   that one run's windows put them 1.5 to 2 times off, with a standard
//!   deviation that says so).

use fastinst_benches::accuracy::Config;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(900);

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fastinst-accuracy-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn harness(work: &Path, programs: &str, compilers: &str, runs: &str) -> Vec<Config> {
    let json = work.join(format!("{programs}.json"));
    let mut c = Command::new(env!("CARGO_BIN_EXE_fastinst-accuracy"));
    c.args([
        "--programs",
        programs,
        "--compilers",
        compilers,
        "--runs",
        runs,
        "--work",
    ])
    .arg(work)
    .arg("--json")
    .arg(&json);
    let o = testkit::output_within(c, LIMIT, "fastinst-accuracy");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    println!("{}", String::from_utf8_lossy(&o.stdout));
    serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap()
}

fn ratio_within(got: f64, want: f64, tol: f64) -> bool {
    want > 0.0 && (got / want - 1.0).abs() <= tol
}

/// Of the functions with a p50 to compare, how many read within ±40% of
/// the trace (the mean of the profiler runs' p50s: from a few timed calls
/// an epoch, one run's varies), and how many there are.
fn p50s_within(c: &Config) -> (usize, usize) {
    let ok = c
        .percentiles
        .iter()
        .filter(|p| {
            ratio_within(
                p.profile.iter().map(|x| x.0).sum::<f64>() / p.profile.len() as f64,
                p.trace.0,
                0.40,
            )
        })
        .count();
    (ok, c.percentiles.len())
}

#[test]
fn the_profiler_reads_the_demo_and_lua_within_bounds() {
    let work = scratch("work");
    for c in harness(&work, "demo", "gcc,gcc-sled", "3") {
        for k in &c.calls {
            for &e in &k.estimated {
                assert!(
                    ratio_within(e, k.exact as f64, 0.25),
                    "demo {}: {} estimated at {e:.0} of {}",
                    c.build,
                    k.name,
                    k.exact
                );
            }
        }
        let main = c
            .inclusive
            .iter()
            .find(|i| i.name == "main")
            .expect("main's inclusive time");
        // `main` waits for its four workers on two CPUs, so its time also
        // holds what the workers' hooks took from it: more than the
        // probes-off run by up to the profiler's overhead, never less.
        let r = main.profile_ms[0] / main.reference_ms;
        assert!(
            (0.75..=1.6).contains(&r),
            "demo {}: main {:.0} ms, probes-off run {:.0} ms",
            c.build,
            main.profile_ms[0],
            main.reference_ms
        );
        let (mut ok, mut n) = p50s_within(&c);
        if ok * 2 < n {
            // The trace is another process, run at another moment, and
            // under the suite's load the two can run at different speeds
            // (once 1 of 3 within 40%, the next run 3 of 3): a second
            // sitting, profiler and trace both again. An estimator that
            // is wrong fails both.
            let again = harness(&work, "demo", &c.build, "3");
            (ok, n) = p50s_within(&again[0]);
        }
        assert!(
            ok * 2 >= n,
            "demo {}: {ok} of {n} p50s within 40% in two sittings",
            c.build
        );
    }
    let lua = harness(&work, "lua", "gcc-sled", "1");
    let c = &lua[0];
    let g = c.calls_geomean();
    assert!(
        (0.7..=1.4).contains(&g),
        "lua: estimated over exact calls, geomean {g:.3}"
    );
    let ok = c
        .calls
        .iter()
        .filter(|k| ratio_within(k.estimated[0], k.exact as f64, 0.40))
        .count();
    assert!(
        ok * 2 >= c.calls.len(),
        "lua: {ok} of {} functions within 40%",
        c.calls.len()
    );
}
