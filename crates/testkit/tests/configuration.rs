//! `docs/configuration.md` is the one table of `FASTINST_*` variables: every
//! variable the code reads is in it, and every variable in it is read.

use std::collections::BTreeSet;
use std::path::Path;
use testkit::modgraph::strip_comments;

/// The names of the C API (status codes `FASTINST_E*`, probe kinds), not
/// variables.
fn is_c_name(v: &str) -> bool {
    matches!(v, "FASTINST_OK" | "FASTINST_ENTRY" | "FASTINST_EXIT") || v.starts_with("FASTINST_E")
}

/// `"FASTINST_..."` string literals in the code (not comments) of every
/// crate's sources, tests and benches.
fn read_in_code(root: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut stack = vec![root.join("crates")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let text = std::fs::read_to_string(&p).unwrap();
                // Comments blanked; string literals kept.
                let code = strip_comments(&text);
                let mut rest = code.as_str();
                while let Some(i) = rest.find("\"FASTINST_") {
                    let name: String = rest[i + 1..]
                        .chars()
                        .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                        .collect();
                    let whole = rest[i + 1 + name.len()..].starts_with('"') && !name.ends_with('_');
                    if whole && !is_c_name(&name) {
                        out.insert(name);
                    }
                    rest = &rest[i + 1..];
                }
            }
        }
    }
    out
}

fn in_table(root: &Path) -> BTreeSet<String> {
    let doc = std::fs::read_to_string(root.join("docs/configuration.md")).unwrap();
    doc.lines()
        .filter_map(|l| l.strip_prefix("| `FASTINST_"))
        .map(|l| format!("FASTINST_{}", l.split('`').next().unwrap()))
        .collect()
}

#[test]
fn the_configuration_table_names_every_variable_the_code_reads_and_no_other() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let code = read_in_code(&root);
    let table = in_table(&root);
    assert!(
        code.contains("FASTINST_TOOL") && table.contains("FASTINST_TOOL"),
        "{code:?} {table:?}"
    );
    let undocumented: Vec<_> = code.difference(&table).collect();
    let unread: Vec<_> = table.difference(&code).collect();
    assert!(
        undocumented.is_empty(),
        "read but not in docs/configuration.md: {undocumented:?}"
    );
    assert!(
        unread.is_empty(),
        "in docs/configuration.md but read nowhere: {unread:?}"
    );
}
