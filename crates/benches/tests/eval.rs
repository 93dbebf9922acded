//! `fastinst-eval` end to end on a small field: every micro-benchmark
//! section runs, the report's JSON holds every row the tables promise with
//! finite numbers, and the plots are well-formed SVG. (Table 1 needs the
//! real programs from crates.io and is left to the harness itself.)

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// How long one run may take before the test takes it for hung
/// ([`testkit::output_within`]): the quick sections take under a minute.
const LIMIT: Duration = Duration::from_secs(600);

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fastinst-eval-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn finite(v: &serde_json::Value, what: &str) -> f64 {
    let x = v.as_f64().unwrap_or_else(|| panic!("{what}: not a number: {v}"));
    assert!(x.is_finite() && x > 0.0, "{what}: {x}");
    x
}

#[test]
fn quick_sections_write_complete_tables_json_and_plots() {
    let work = scratch("work");
    let out = work.join("report");
    let mut c = Command::new(env!("CARGO_BIN_EXE_fastinst-eval"));
    c.args([
        "--quick",
        "--field",
        "1500",
        "--threads",
        "1",
        "--only",
        "table2,fig10,fig11,inactive",
    ])
    .arg("--work")
    .arg(&work)
    .arg("--out")
    .arg(&out);
    let o = testkit::output_within(c, LIMIT, "fastinst-eval --quick");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    let md = String::from_utf8_lossy(&o.stdout);
    for h in [
        "## Table 2",
        "## Fig. 10",
        "## Fig. 11-13",
        "## Section 8.5",
        "Timer resolution",
    ] {
        assert!(md.contains(h), "{h} missing from\n{md}");
    }
    assert_eq!(std::fs::read_to_string(out.join("eval.md")).unwrap(), md);
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.join("eval.json")).unwrap()).unwrap();

    // Table 2: the guard, then every strategy for both providers, both
    // classes where the field has them (the 1,500-function field has
    // straddlers of both kinds).
    let t2 = &r["table2"];
    let rows = t2["toggles"].as_array().unwrap();
    assert_eq!(rows[0]["provider"], "static-guard");
    for strategy in ["flip", "paper", "word-sync", "word-async"] {
        for provider in ["finstrument", "sled"] {
            for class in ["non-straddlers", "straddlers"] {
                let row = rows
                    .iter()
                    .find(|x| x["strategy"] == strategy && x["provider"] == provider && x["class"] == class)
                    .unwrap_or_else(|| panic!("no row {strategy} {provider} {class}"));
                let what = format!("{strategy} {provider} {class}");
                finite(&row["deactivate"]["median"], &what);
                finite(&row["activate"]["p90"], &what);
                assert!(row["probes"].as_u64().unwrap() > 0, "{what}");
            }
        }
    }
    let inv = t2["invocations"].as_array().unwrap();
    assert_eq!(inv.len(), 3 + 2 * 4 + 4 + 4, "{inv:?}");
    for x in inv {
        finite(&x["ticks"]["median"], x["case"].as_str().unwrap());
    }
    // Every invocation case is measured (how they compare is the
    // benchmark's to show, not a test's to assert on a shared machine).
    for c in [
        "finstrument, entry and exit on",
        "finstrument, off (flip)",
        "sled, entry and exit on",
        "sled, off (flip)",
        "sled, entry and exit on, 8 frames deep",
        "sled, off, 8 frames deep",
    ] {
        let x = inv
            .iter()
            .find(|x| x["case"] == c)
            .unwrap_or_else(|| panic!("case {c}"));
        assert!(x["ticks"]["median"].as_f64().is_some_and(|t| t > 0.0), "{c}: {x}");
    }

    // Fig. 10: 4 strategies x 2 operations x 2 classes, about 10% straddlers.
    let f10 = &r["fig10"];
    assert_eq!(f10["histograms"].as_array().unwrap().len(), 16);
    let (non, str_) = (
        f10["non_straddlers"].as_u64().unwrap(),
        f10["straddlers"].as_u64().unwrap(),
    );
    assert!(str_ > 0 && non >= 9 * str_, "{non} / {str_}");
    for h in f10["histograms"].as_array().unwrap() {
        assert!(!h["samples"].as_array().unwrap().is_empty(), "{h}");
    }

    // Fig. 11: two baselines, then 4 strategies x 2 modes x 4 rates.
    let pts = r["fig11"]["points"].as_array().unwrap();
    assert_eq!(pts.len(), 2 + 4 * 2 * 4);
    for p in pts {
        let what = format!("{} {} {}", p["strategy"], p["mode"], p["rate_hz"]);
        finite(&p["calls_per_s"], &what);
        if p["mode"] == "aa" || p["mode"] == "ad" {
            finite(&p["toggles_per_s"], &what);
            // Both states were seen.
            finite(&p["balance"], &what);
        }
    }

    // Section 8.5: 7 forms at 5 splits.
    assert_eq!(r["inactive"]["rows"].as_array().unwrap().len(), 35);

    for f in ["fig10.svg", "fig11-aa.svg", "fig11-ad.svg"] {
        let s = std::fs::read_to_string(out.join(f)).unwrap();
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"), "{f}");
        assert!(s.contains("<path") || s.contains("<polyline"), "{f} has no data");
    }
    std::fs::remove_dir_all(&work).unwrap();
}

#[test]
fn bad_options_are_named() {
    for (args, msg) in [
        (vec!["--only", "table9"], "no section `table9`"),
        (vec!["--threads", "0"], "--threads"),
        (vec!["--field", "x"], "--field"),
        (vec!["--bogus"], "unknown option --bogus"),
    ] {
        let mut c = Command::new(env!("CARGO_BIN_EXE_fastinst-eval"));
        c.args(&args);
        let o = testkit::output_within(c, LIMIT, &format!("fastinst-eval {}", args.join(" ")));
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(String::from_utf8_lossy(&o.stderr).contains(msg), "{args:?}");
    }
    let mut c = Command::new(env!("CARGO_BIN_EXE_fastinst-eval"));
    c.arg("--help");
    let o = testkit::output_within(c, LIMIT, "fastinst-eval --help");
    assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).contains("--quick"));
}
