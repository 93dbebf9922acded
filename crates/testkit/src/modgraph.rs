//! The module graph of a crate, read from its sources, and its cycles.
//!
//! A module depends on another when its code (not its comments, strings
//! or `#[cfg(test)]` items) names it: `crate::a::b`, `super::x`,
//! `self::child`, a `use` tree (`use crate::{a, b::{c, d}}`), or a child
//! module by its bare name (`window::Window`). A path is taken for the
//! longest module it starts with; the crate root is left out (it declares
//! and re-exports everything). A parent that uses its child and a child
//! that uses its parent make a cycle like any other two modules: the items
//! both need belong in a module of their own.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Modules (`a::b`, the root is `""`) and the modules each one names.
#[derive(Debug, Default)]
pub struct ModGraph {
    /// Module → the modules its code names.
    pub edges: BTreeMap<String, BTreeSet<String>>,
}

impl ModGraph {
    /// Reads every `.rs` file under `src` (a crate's source directory).
    pub fn read(src: &Path) -> std::io::Result<ModGraph> {
        let mut files = Vec::new();
        collect(src, src, &mut files)?;
        let mut code = BTreeMap::new();
        for (module, path) in files {
            code.insert(module, strip_tests(&strip(&std::fs::read_to_string(path)?)));
        }
        Ok(ModGraph::from_sources(&code))
    }

    /// The graph of modules given as cleaned source text by module path.
    fn from_sources(code: &BTreeMap<String, String>) -> ModGraph {
        let names: BTreeSet<&str> = code.keys().map(String::as_str).collect();
        let mut edges = BTreeMap::new();
        for (module, text) in code {
            let mut to = BTreeSet::new();
            let here: Vec<&str> = if module.is_empty() {
                vec![]
            } else {
                module.split("::").collect()
            };
            for path in paths(text, &here, &children(module, &names)) {
                if let Some(t) = longest_module(&path, &names) {
                    if !t.is_empty() && t != *module {
                        to.insert(t.to_string());
                    }
                }
            }
            edges.insert(module.clone(), to);
        }
        ModGraph { edges }
    }

    /// Every cycle: the strongly connected components of more than one
    /// module, each sorted, with the edges inside it.
    pub fn cycles(&self) -> Vec<Vec<(String, Vec<String>)>> {
        let nodes: Vec<&String> = self.edges.keys().collect();
        let index: BTreeMap<&String, usize> = nodes.iter().enumerate().map(|(i, n)| (*n, i)).collect();
        let adj: Vec<Vec<usize>> = nodes
            .iter()
            .map(|n| self.edges[*n].iter().filter_map(|t| index.get(t).copied()).collect())
            .collect();
        let comps = tarjan(&adj);
        comps
            .into_iter()
            .filter(|c| c.len() > 1)
            .map(|c| {
                let set: BTreeSet<usize> = c.iter().copied().collect();
                let mut v: Vec<(String, Vec<String>)> = c
                    .iter()
                    .map(|&i| {
                        let inside = adj[i]
                            .iter()
                            .filter(|j| set.contains(j))
                            .map(|&j| nodes[j].clone())
                            .collect();
                        (nodes[i].clone(), inside)
                    })
                    .collect();
                v.sort();
                v
            })
            .collect()
    }
}

fn collect(root: &Path, dir: &Path, out: &mut Vec<(String, std::path::PathBuf)>) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p.is_dir() {
            // `src/bin` holds binaries, each a crate of its own.
            if p != root.join("bin") {
                collect(root, &p, out)?;
            }
        } else if p.extension().is_some_and(|x| x == "rs") {
            let rel = p.strip_prefix(root).expect("under root").with_extension("");
            let mut parts: Vec<String> = rel.iter().map(|s| s.to_string_lossy().into_owned()).collect();
            if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
                parts.pop();
            }
            out.push((parts.join("::"), p));
        }
    }
    Ok(())
}

/// The source with comments, string and character literals blanked out
/// (same length, newlines kept).
pub fn strip(s: &str) -> String {
    blank(s, true)
}

/// The source with its comments blanked out and its literals kept.
pub fn strip_comments(s: &str) -> String {
    blank(s, false)
}

fn blank(s: &str, literals: bool) -> String {
    let b: Vec<char> = s.chars().collect();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    let blank = |out: &mut String, c: char| out.push(if c == '\n' { '\n' } else { ' ' });
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                blank(&mut out, b[i]);
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && !ident_before(&b, i) {
            // A raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            while j < b.len() {
                if b[j] == '"' && (0..hashes).all(|k| b.get(j + 1 + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            for &ch in &b[i..j.min(b.len())] {
                keep_or_blank(&mut out, ch, literals);
            }
            i = j;
        } else if c == '"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != '"' {
                j += if b[j] == '\\' { 2 } else { 1 };
            }
            for &ch in &b[i..(j + 1).min(b.len())] {
                keep_or_blank(&mut out, ch, literals);
            }
            i = j + 1;
        } else if c == '\'' {
            // A character literal, or a lifetime (left as it is).
            let end = if next == Some('\\') {
                (i + 2..b.len()).find(|&j| b[j] == '\'')
            } else if b.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            match end {
                Some(e) => {
                    for &ch in &b[i..=e] {
                        keep_or_blank(&mut out, ch, literals);
                    }
                    i = e + 1;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn keep_or_blank(out: &mut String, c: char, blank: bool) {
    out.push(if !blank || c == '\n' { c } else { ' ' });
}

fn ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

fn ident_before(b: &[char], i: usize) -> bool {
    i > 0 && ident_char(b[i - 1])
}

/// `code` (already [`strip`]ped) without its `#[cfg(test)]` items.
fn strip_tests(code: &str) -> String {
    let mut s: Vec<char> = code.chars().collect();
    let pat: Vec<char> = "#[cfg(test)]".chars().collect();
    let mut i = 0;
    while i + pat.len() <= s.len() {
        if s[i..i + pat.len()] != pat[..] {
            i += 1;
            continue;
        }
        // The item ends at its first `;` outside braces, or at the brace
        // that closes its body.
        let mut j = i + pat.len();
        let mut depth = 0usize;
        while j < s.len() {
            match s[j] {
                '{' => depth += 1,
                '}' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        break;
                    }
                }
                ';' if depth == 0 => break,
                _ => {}
            }
            j += 1;
        }
        for ch in &mut s[i..(j + 1).min(code.chars().count())] {
            if *ch != '\n' {
                *ch = ' ';
            }
        }
        i = j + 1;
    }
    s.into_iter().collect()
}

/// The child modules `module` declares, as they appear among `names`.
fn children<'a>(module: &str, names: &BTreeSet<&'a str>) -> Vec<&'a str> {
    names
        .iter()
        .filter_map(|n| {
            let rest = if module.is_empty() {
                Some(*n)
            } else {
                n.strip_prefix(module)?.strip_prefix("::")
            };
            rest.filter(|r| !r.is_empty() && !r.contains("::"))
        })
        .collect()
}

/// Every module path the code names, made absolute.
fn paths(code: &str, here: &[&str], children: &[&str]) -> Vec<Vec<String>> {
    let b: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if !ident_char(b[i]) || ident_before(&b, i) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && ident_char(b[i]) {
            i += 1;
        }
        let word: String = b[start..i].iter().collect();
        // A path's first segment only: not `x::word`.
        let after_colons = start >= 2 && b[start - 1] == ':' && b[start - 2] == ':';
        if after_colons || !b[i..].starts_with(&[':', ':']) {
            continue;
        }
        let base: Vec<String> = match word.as_str() {
            "crate" => vec![],
            "super" => here[..here.len().saturating_sub(1)]
                .iter()
                .map(|s| s.to_string())
                .collect(),
            "self" => here.iter().map(|s| s.to_string()).collect(),
            w if children.contains(&w) => {
                let mut v: Vec<String> = here.iter().map(|s| s.to_string()).collect();
                v.push(w.to_string());
                v
            }
            _ => continue,
        };
        let mut j = i;
        use_tree(&b, &mut j, base, &mut out);
        i = j;
    }
    out
}

/// Reads `::a::b`, `::{a, b::c}` or `::*` at `b[*i]` onto `prefix`.
fn use_tree(b: &[char], i: &mut usize, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    let mut path = prefix;
    loop {
        skip_ws(b, i);
        if !b[*i..].starts_with(&[':', ':']) {
            out.push(path);
            return;
        }
        *i += 2;
        skip_ws(b, i);
        match b.get(*i) {
            Some('{') => {
                *i += 1;
                loop {
                    skip_ws(b, i);
                    match b.get(*i) {
                        None => return,
                        Some('}') => {
                            *i += 1;
                            return;
                        }
                        Some(',') => *i += 1,
                        Some(c) if ident_char(*c) => {
                            let s = *i;
                            while *i < b.len() && ident_char(b[*i]) {
                                *i += 1;
                            }
                            let w: String = b[s..*i].iter().collect();
                            let mut p = path.clone();
                            if w != "self" {
                                p.push(w);
                            }
                            use_tree(b, i, p, out);
                            // `as name`.
                            skip_ws(b, i);
                            if b[*i..].starts_with(&['a', 's']) {
                                *i += 2;
                                skip_ws(b, i);
                                while *i < b.len() && ident_char(b[*i]) {
                                    *i += 1;
                                }
                            }
                        }
                        Some(_) => *i += 1,
                    }
                }
            }
            Some(c) if ident_char(*c) => {
                let s = *i;
                while *i < b.len() && ident_char(b[*i]) {
                    *i += 1;
                }
                path.push(b[s..*i].iter().collect());
            }
            _ => {
                out.push(path);
                return;
            }
        }
    }
}

fn skip_ws(b: &[char], i: &mut usize) {
    while *i < b.len() && b[*i].is_whitespace() {
        *i += 1;
    }
}

fn longest_module<'a>(path: &[String], names: &BTreeSet<&'a str>) -> Option<&'a str> {
    (0..=path.len())
        .rev()
        .find_map(|n| names.get(path[..n].join("::").as_str()).copied())
}

/// Tarjan's strongly connected components.
fn tarjan(adj: &[Vec<usize>]) -> Vec<Vec<usize>> {
    struct T<'a> {
        adj: &'a [Vec<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    fn visit(t: &mut T, v: usize) {
        t.index[v] = Some(t.next);
        t.low[v] = t.next;
        t.next += 1;
        t.stack.push(v);
        t.on[v] = true;
        for k in 0..t.adj[v].len() {
            let w = t.adj[v][k];
            match t.index[w] {
                None => {
                    visit(t, w);
                    t.low[v] = t.low[v].min(t.low[w]);
                }
                Some(iw) if t.on[w] => t.low[v] = t.low[v].min(iw),
                _ => {}
            }
        }
        if Some(t.low[v]) == t.index[v] {
            let mut c = Vec::new();
            loop {
                let w = t.stack.pop().expect("on the stack");
                t.on[w] = false;
                c.push(w);
                if w == v {
                    break;
                }
            }
            t.out.push(c);
        }
    }
    let n = adj.len();
    let mut t = T {
        adj,
        index: vec![None; n],
        low: vec![0; n],
        on: vec![false; n],
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if t.index[v].is_none() {
            visit(&mut t, v);
        }
    }
    t.out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(files: &[(&str, &str)]) -> ModGraph {
        let code = files
            .iter()
            .map(|(m, s)| (m.to_string(), strip_tests(&strip(s))))
            .collect();
        ModGraph::from_sources(&code)
    }

    #[test]
    fn paths_in_code_and_use_trees_are_edges_and_comments_strings_and_tests_are_not() {
        let g = graph(&[
            ("", "mod a; mod b; mod c; mod d;"),
            (
                "a",
                "use crate::{b::X, c::{self, Y}};\n// crate::d::Z\nfn f() { let s = \"crate::d\"; }",
            ),
            (
                "b",
                "#[cfg(test)]\nmod tests { use crate::d::W; }\nfn g() -> char { 'x' }",
            ),
            ("c", "fn h<'a>(x: &'a u8) { super::d::k(); }"),
            ("d", "/* crate::a::Q */ fn k() {}"),
        ]);
        let e = |m: &str| g.edges[m].iter().cloned().collect::<Vec<_>>();
        assert_eq!(e("a"), ["b", "c"]);
        assert!(e("b").is_empty(), "{:?}", e("b"));
        assert_eq!(e("c"), ["d"]);
        assert!(e("d").is_empty());
        assert!(g.cycles().is_empty());
    }

    #[test]
    fn a_parent_and_a_child_that_use_each_other_are_a_cycle() {
        let g = graph(&[
            ("", "mod p;"),
            ("p", "mod q; fn f() { q::g(); }"),
            ("p::q", "use super::f;"),
        ]);
        let c = g.cycles();
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].iter().map(|(m, _)| m.as_str()).collect::<Vec<_>>(), ["p", "p::q"]);
    }
}
