//! The speedscope output is valid against speedscope's own file-format
//! schema (`tests/data/speedscope-file-format-schema.json`, from the
//! `speedscope` npm package 1.20.0, `dist/release/file-format-schema.json`,
//! MIT): for a report with stacks, one without, and one whose names need
//! escaping.

use fastinst_report::{render_speedscope, Report, Stacks};

fn validator() -> jsonschema::Validator {
    let schema: serde_json::Value =
        serde_json::from_str(include_str!("data/speedscope-file-format-schema.json")).unwrap();
    jsonschema::validator_for(&schema).expect("speedscope's schema compiles")
}

fn report(paths: Vec<(Vec<&str>, u64, f64)>) -> Report {
    Report {
        schema: fastinst_report::SCHEMA.into(),
        program: "/tmp/app \"x\"".into(),
        pid: 42,
        stacks: Stacks::from_named(paths),
        ..Default::default()
    }
}

#[test]
fn the_speedscope_file_is_valid_against_speedscopes_schema() {
    let v = validator();
    for r in [
        report(vec![
            (vec!["main", "work"], 3, 1.5),
            (vec!["main", "work", "leaf"], 9, 0.25),
        ]),
        report(vec![]),
        report(vec![(vec!["main", "ns::f<int>(\"a\\b\")", "[...]"], 1, 2.0)]),
    ] {
        let doc: serde_json::Value = serde_json::from_str(&render_speedscope(&r)).unwrap();
        let errors: Vec<String> = v.iter_errors(&doc).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "{errors:?}\n{doc}");
    }
    // A document that breaks the schema is refused: the check can fail.
    let mut bad: serde_json::Value = serde_json::from_str(&render_speedscope(&report(vec![]))).unwrap();
    bad["profiles"][0]["type"] = "sampling".into();
    assert!(!v.is_valid(&bad));
}
