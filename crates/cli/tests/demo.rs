//! The README's main job, as a newcomer runs it: the `demo` example
//! (`cargo run --release -p fastinst-cli --example demo`), whose binary
//! `cargo test` builds beside this test. Its report must agree with what
//! the demo itself prints: 200,000 requests, each one `handle`, one
//! `lookup` and one `parse`, and `render` 7 times (a recursion 6 deep).
//! Its inclusive times must nest as its calls do: `lookup` holds every
//! `db_fetch` (one call in 64, which sleeps), `handle` every `lookup` and
//! `compress`, and each `worker` its `handle`s.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

fn example() -> PathBuf {
    // target/<profile>/deps/demo-<hash> -> target/<profile>/examples/demo
    let exe = std::env::current_exe().unwrap();
    let p = exe.parent().unwrap().parent().unwrap().join("examples/demo");
    assert!(p.exists(), "{} not built (cargo test builds examples)", p.display());
    p
}

/// `(calls, ±)` of `function` in the text table the demo prints.
fn calls(stdout: &str, function: &str) -> (f64, Option<f64>) {
    let line = stdout
        .lines()
        .find(|l| l.split_whitespace().last() == Some(function) && l.split_whitespace().count() >= 13)
        .unwrap_or_else(|| panic!("no row for {function} in:\n{stdout}"));
    let mut w = line.split_whitespace();
    let calls: f64 = w.next().unwrap().parse().unwrap();
    let sd = w.next().unwrap();
    (calls, if sd == "=" { None } else { Some(sd.parse().unwrap()) })
}

/// `(total ms, ±)` of `function` in the text table the demo prints.
fn total(stdout: &str, function: &str) -> (f64, f64) {
    let line = stdout
        .lines()
        .find(|l| l.split_whitespace().last() == Some(function) && l.split_whitespace().count() >= 13)
        .unwrap_or_else(|| panic!("no row for {function} in:\n{stdout}"));
    let w: Vec<&str> = line.split_whitespace().collect();
    let t: f64 = w[3].trim_end_matches(['~', '!']).parse().unwrap();
    (t, w[4].parse().unwrap())
}

#[test]
fn the_demo_runs_and_its_report_agrees_with_what_it_prints() {
    let gcc = Command::new("gcc").arg("--version").output();
    assert!(gcc.is_ok_and(|o| o.status.success()), "the demo needs gcc");
    let o = testkit::output_within(Command::new(example()), Duration::from_secs(300), "demo example");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        stdout.matches("served 200000 requests").count(),
        2,
        "plain and profiled runs:\n{stdout}"
    );
    for (f, want) in [
        ("handle", 200_000.0),
        ("lookup", 200_000.0),
        ("parse", 200_000.0),
        ("render", 1_400_000.0),
    ] {
        let (got, sd) = calls(&stdout, f);
        println!("{f}: {got} ± {sd:?} of {want}");
        assert!((got / want - 1.0).abs() <= 0.15, "{f}: {got} estimated, {want} made");
        // Estimated, not exact: the report says how uncertain it is.
        assert!(sd.is_some_and(|s| s > 0.0), "{f} has no spread");
    }
    // The four workers and main, each called a known number of times, are
    // counted exactly.
    assert_eq!(calls(&stdout, "worker"), (4.0, None));
    assert_eq!(calls(&stdout, "main"), (1.0, None));
    assert!(stdout.contains("flame graph: "), "{stdout}");
    // Inclusive times nest. `lookup`'s rare long calls (a `db_fetch`
    // each) decide its total: timed ten an epoch, as all functions once
    // were, they read it at 0.3x to 1.5x `db_fetch`'s with a spread of
    // 55-125%; and the long ones lost their exits to other threads'
    // exhausting the exit budget, which read it at half even with ten
    // times the timed calls. Censored calls are weighed in now, and
    // functions whose durations spread get more timed calls; runs here
    // read 0.8x-1.15x with a spread of 18-24%, and 1.02x on one CPU.
    let (db, _) = total(&stdout, "db_fetch");
    let (lookup, lookup_sd) = total(&stdout, "lookup");
    let (compress, _) = total(&stdout, "compress");
    let (handle, handle_sd) = total(&stdout, "handle");
    let (worker, _) = total(&stdout, "worker");
    println!(
        "totals: worker {worker}, handle {handle}, lookup {lookup} +- {lookup_sd}, db_fetch {db}, compress {compress}"
    );
    assert!(
        (0.65..=1.5).contains(&(lookup / db)),
        "lookup {lookup} ms against the {db} ms of the db_fetch calls it makes"
    );
    assert!(
        lookup_sd <= 0.4 * lookup,
        "lookup {lookup} +- {lookup_sd}: too uncertain to say anything"
    );
    assert!(
        handle + 2.0 * handle_sd >= 0.8 * (db + compress) && handle <= worker,
        "handle {handle} +- {handle_sd} ms: it holds lookup's db_fetch ({db}) and compress ({compress}), and runs inside worker ({worker})"
    );
}
