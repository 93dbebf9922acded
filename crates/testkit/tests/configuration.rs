//! `docs/configuration.md` is the one table of `FASTINST_*` variables: every
//! variable the code reads is in it, and every variable in it is read.

use std::collections::BTreeSet;
use std::path::Path;
use testkit::modgraph::strip_comments;

/// The names the C header defines (status codes, probe kinds): the C
/// API's, not variables. Read from the header itself, so that a variable
/// whose name merely looks like a status code (`FASTINST_EXCLUDE`) is
/// still checked.
fn c_names(root: &Path) -> BTreeSet<String> {
    let header = std::fs::read_to_string(root.join("crates/preload/include/fastinst.h")).unwrap();
    header
        .lines()
        .filter_map(|l| l.trim().strip_prefix("#define "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with("FASTINST_"))
        .map(String::from)
        .collect()
}

/// `"FASTINST_..."` string literals in the code (not comments) of every
/// crate's sources, tests and benches.
fn read_in_code(root: &Path) -> BTreeSet<String> {
    let c = c_names(root);
    assert!(c.contains("FASTINST_EINVAL"), "the header's status codes: {c:?}");
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
                    // A prefix of the header's names (`"FASTINST_E"`, to
                    // match status codes) is not a variable either.
                    let c_prefix = c.iter().any(|n| n.len() > name.len() && n.starts_with(&name));
                    if whole && !c.contains(&name) && !c_prefix {
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
