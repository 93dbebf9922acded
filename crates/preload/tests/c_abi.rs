//! The C ABI has one shape in two languages: the header
//! (`include/fastinst.h`) against the Rust side.
//! - Status codes: the header, [`fastinst::Error::code`] and
//!   `fastinst_strerror`; a code renumbered in any one of them fails here.
//! - Struct layouts: every field of `fastinst_probe_meta` and
//!   `fastinst_stats`, in order, at the offset a C compiler gives it,
//!   against the Rust structs; a field added, moved or resized on one side
//!   only fails here.

mod common;

use common::{build, include_dir, require, scratch};
use fastinst::c_abi::{message, CProbeMeta, STATUSES};
use fastinst::Error;
use std::collections::BTreeMap;
use std::mem::{offset_of, size_of};

/// `FASTINST_E*` and `FASTINST_OK` as the header defines them.
fn header_codes() -> BTreeMap<String, i32> {
    let h = include_str!("../include/fastinst.h");
    let mut codes = BTreeMap::new();
    for line in h.lines() {
        let mut w = line.split_whitespace();
        if w.next() != Some("#define") {
            continue;
        }
        let (Some(name), Some(value)) = (w.next(), w.next()) else {
            continue;
        };
        if name == "FASTINST_OK"
            || name.starts_with("FASTINST_E") && name != "FASTINST_ENTRY" && name != "FASTINST_EXIT"
        {
            let v: i32 = value
                .trim_matches(|c| c == '(' || c == ')')
                .parse()
                .unwrap_or_else(|e| panic!("{name} {value}: {e}"));
            codes.insert(name.to_string(), v);
        }
    }
    codes
}

/// What `fastinst_strerror` returns for `code` (it returns this table's
/// message as it is).
fn strerror(code: i32) -> String {
    message(code).to_str().unwrap().to_string()
}

#[test]
fn the_header_the_rust_errors_and_strerror_agree_on_every_code() {
    let h = header_codes();
    let rust: [(&str, Error); 8] = [
        ("FASTINST_ENOPROBE", Error::NoSuchProbe(fastinst::ProbeId::new(0))),
        ("FASTINST_EUNLOADED", Error::Unloaded(fastinst::ProbeId::new(0))),
        ("FASTINST_ENOFUNCTION", Error::NoSuchFunction(0)),
        ("FASTINST_EINVAL", Error::InvalidArgument(String::new())),
        ("FASTINST_ECALLBACKS", Error::TooManyCallbacks(16)),
        (
            "FASTINST_EPATCH",
            Error::Patch {
                id: fastinst::ProbeId::new(0),
                source: callpatch::Error::Patch(wordpatch::Error::InvalidLength(9)),
            },
        ),
        (
            "FASTINST_EPATCH",
            Error::WordPatch {
                id: fastinst::ProbeId::new(0),
                source: wordpatch::Error::InvalidLength(9),
            },
        ),
        ("FASTINST_EINTERNAL", Error::Internal("")),
    ];
    assert_eq!(h.get("FASTINST_OK"), Some(&0));
    assert_eq!(h.len(), 8, "the header's codes: {h:?}");
    let table: BTreeMap<String, i32> = STATUSES.iter().map(|s| (s.name.to_string(), s.code)).collect();
    assert_eq!(h, table, "the header (left) against the runtime's table (right)");
    for (name, e) in &rust {
        assert_eq!(h.get(*name), Some(&e.code()), "{name} against {e:?}");
    }
    // strerror names each code, each differently, and none as unknown.
    let unknown = strerror(-1000);
    assert_eq!(unknown, "unknown status code");
    let mut seen = std::collections::BTreeSet::new();
    for (name, &code) in &h {
        let s = strerror(code);
        assert_ne!(s, unknown, "{name} ({code}) has no description");
        assert!(seen.insert(s.clone()), "{name} ({code}) shares its description `{s}`");
    }
    for code in [1, -8, i32::MIN] {
        assert_eq!(strerror(code), unknown, "code {code}");
    }
}

/// The fields of `typedef struct NAME {...} NAME;` in the header, in order.
fn header_fields(name: &str) -> Vec<String> {
    let h = include_str!("../include/fastinst.h");
    let start = h
        .find(&format!("typedef struct {name} {{"))
        .unwrap_or_else(|| panic!("{name} in the header"));
    let body = &h[start..];
    let body = &body[body.find('{').unwrap() + 1..body.find(&format!("}} {name};")).unwrap()];
    let mut fields = Vec::new();
    for line in body.lines() {
        let code = line.split("/*").next().unwrap().trim();
        if let Some(decl) = code.strip_suffix(';') {
            let last = decl
                .split(|c: char| c.is_whitespace() || c == '*')
                .rfind(|w| !w.is_empty())
                .unwrap();
            fields.push(last.split('[').next().unwrap().to_string());
        }
    }
    fields
}

/// `(field, offset)` of each field and the struct's size, as gcc lays
/// them out.
fn c_layout(dir: &std::path::Path, name: &str, fields: &[String]) -> (Vec<(String, usize)>, usize) {
    let mut c = String::from("#include <stddef.h>\n#include <stdio.h>\n#include \"fastinst.h\"\nint main(void) {\n");
    for f in fields {
        c += &format!("    printf(\"{f} %zu\\n\", offsetof({name}, {f}));\n");
    }
    c += &format!("    printf(\"sizeof %zu\\n\", sizeof({name}));\n    return 0;\n}}\n");
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, c).unwrap();
    let bin = dir.join(name);
    build("gcc", &[&src], &[&format!("-I{}", include_dir().display())], &bin);
    let out = std::process::Command::new(&bin).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let mut offsets = Vec::new();
    let mut size = 0;
    for line in text.lines() {
        let (f, v) = line.split_once(' ').unwrap();
        let v: usize = v.parse().unwrap();
        if f == "sizeof" {
            size = v;
        } else {
            offsets.push((f.to_string(), v));
        }
    }
    (offsets, size)
}

macro_rules! rust_layout {
    ($t:ty, $($f:ident),* $(,)?) => {
        (vec![$((stringify!($f).to_string(), offset_of!($t, $f))),*], size_of::<$t>())
    };
}

#[test]
fn the_header_structs_are_laid_out_as_the_rust_structs() {
    require("gcc");
    let dir = scratch("c_abi");
    let meta = rust_layout!(
        CProbeMeta,
        id,
        kind,
        form,
        split,
        site_len,
        provider,
        arg_rewritten,
        inlined,
        reserved,
        function,
        function_name,
        site
    );
    let stats = rust_layout!(
        fastinst::Stats,
        size,
        probes,
        unrecognised,
        arg_rewritten,
        tail_ambiguous,
        dropped_nested,
        dropped_in_discovery,
        discoveries,
        discovery_ticks,
        refused_full,
        modules_ticks,
        sled_load_ticks,
        sled_functions,
        sled_exits,
        sled_shadow_full,
        sled_abandoned,
        sled_restored
    );
    for (name, rust) in [("fastinst_probe_meta", meta), ("fastinst_stats", stats)] {
        let fields = header_fields(name);
        let c = c_layout(&dir, name, &fields);
        assert_eq!(c, rust, "{name}: the header (left) against Rust (right)");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
