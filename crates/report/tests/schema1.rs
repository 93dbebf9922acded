//! A whole report as version 1 of the schema wrote it (frames spelled out
//! by name, no call spread, no CPU samples) is read and rendered: the
//! text table, the folded stacks and the flame graph.

use fastinst_report::{render_folded, render_svg, render_text, Report, SCHEMAS_READ};

#[test]
fn a_schema_1_report_is_read_and_rendered_whole() {
    let text = include_str!("data/schema1.json");
    let r: Report = serde_json::from_str(text).expect("a version 1 report parses");
    assert!(SCHEMAS_READ.contains(&r.schema.as_str()));
    assert_eq!(r.functions.len(), 3);
    let work = r.functions.iter().find(|f| f.name == "work").unwrap();
    assert_eq!(work.calls_estimated, 3000.0);
    // Fields version 1 did not have take their defaults.
    assert_eq!(work.calls_sd, 0.0);
    assert!(!work.calls_exact && !work.recursive && work.self_share.is_none());
    assert!(r.cpu.is_none());
    assert_eq!(r.stacks.names.len(), 3, "each name once");
    let table = render_text(&r);
    for f in ["main", "work", "fib", "main -> work", "work -> fib"] {
        assert!(table.contains(f), "{f} in:\n{table}");
    }
    let folded = render_folded(&r);
    assert!(folded.lines().any(|l| l.starts_with("main;work;fib ")), "{folded}");
    let svg = render_svg(&r).expect("a flame graph");
    assert!(svg.contains("<svg") && svg.contains("fib"), "flame graph");
    // Written again, it is the current schema and reads back the same.
    let again: Report = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
    assert_eq!(again, r);
}
