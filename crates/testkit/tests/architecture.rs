//! The workspace's shape, checked: no crate has a module cycle, and each
//! crate depends only on crates of lower layers.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use testkit::modgraph::ModGraph;

fn crates_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn crates() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(crates_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("Cargo.toml").is_file())
        .collect();
    v.sort();
    v
}

#[test]
fn no_crate_has_a_module_cycle() {
    let mut found = Vec::new();
    for c in crates() {
        let g = ModGraph::read(&c.join("src")).unwrap();
        for cycle in g.cycles() {
            found.push(format!("{}: {cycle:?}", c.file_name().unwrap().to_string_lossy()));
        }
    }
    assert!(found.is_empty(), "module cycles:\n{}", found.join("\n"));
}

/// The layers, lowest first: a crate may depend on crates of lower layers
/// only (`testkit` is a dev-dependency, outside them).
const LAYERS: &[&[&str]] = &[
    &["wordpatch", "fastinst-report", "fastinst-args", "fastinst-macros"],
    &["callpatch"],
    &["providers", "stress"],
    &["fastinst", "calibrate", "fastinst-attach"],
    &["fastinst-preload", "fastinst-cli"],
    &["fastinst-benches"],
];

fn field(toml: &str, key: &str) -> Option<String> {
    toml.lines().find_map(|l| {
        l.strip_prefix(key)?
            .trim_start()
            .strip_prefix('=')
            .map(|v| v.trim().trim_matches('"').to_string())
    })
}

#[test]
fn every_crate_depends_only_on_lower_layers() {
    let layer: BTreeMap<&str, usize> = LAYERS
        .iter()
        .enumerate()
        .flat_map(|(i, names)| names.iter().map(move |n| (*n, i)))
        .collect();
    let mut names = BTreeMap::new();
    let mut deps = BTreeMap::new();
    for c in crates() {
        let toml = std::fs::read_to_string(c.join("Cargo.toml")).unwrap();
        let name = field(&toml, "name").unwrap();
        let dir = c.file_name().unwrap().to_string_lossy().into_owned();
        // [dependencies] only: dev-dependencies may reach up (tests run
        // the programs of higher layers).
        let mut d = Vec::new();
        let mut on = false;
        for l in toml.lines() {
            if l.starts_with('[') {
                on = l.trim() == "[dependencies]";
            } else if on {
                if let Some(k) = l.split(['=', '.']).next().map(str::trim).filter(|k| !k.is_empty()) {
                    d.push(k.to_string());
                }
            }
        }
        names.insert(dir, name.clone());
        deps.insert(name, d);
    }
    for name in names.values() {
        if name == "testkit" {
            continue;
        }
        assert!(layer.contains_key(name.as_str()), "{name} has no layer in LAYERS");
    }
    for (name, d) in &deps {
        let Some(&own) = layer.get(name.as_str()) else { continue };
        for dep in d {
            if let Some(&l) = layer.get(dep.as_str()) {
                assert!(l < own, "{name} (layer {own}) depends on {dep} (layer {l})");
            }
            assert_ne!(dep, "testkit", "{name}: testkit is for tests only");
        }
    }
}

/// The command lines of a shell text: comments and blank lines dropped,
/// `\`-continued lines joined, runs of spaces made one.
fn commands(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for line in text.lines() {
        let l = line.trim();
        if cur.is_empty() && (l.is_empty() || l.starts_with('#')) {
            continue;
        }
        match l.strip_suffix('\\') {
            Some(part) => cur.push_str(part),
            None => {
                cur.push_str(l);
                out.push(cur.split_whitespace().collect::<Vec<_>>().join(" "));
                cur.clear();
            }
        }
    }
    out
}

#[test]
fn the_ci_runs_exactly_the_readmes_test_command() {
    let root = crates_dir().join("..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let start = readme
        .find("# The whole test suite")
        .expect("the README names its test command");
    let block = &readme[start..readme[start..].find("```").map(|e| start + e).unwrap()];
    let readme_cmd = commands(block).pop().expect("a command under the comment");
    let ci = std::fs::read_to_string(root.join(".ci/run")).unwrap();
    let ci_cmd = commands(&ci).pop().expect("a command in .ci/run");
    assert_eq!(ci_cmd, readme_cmd, ".ci/run (left) and the README (right)");
}
