//! One name for each function of the libraries a program loads.
//!
//! A C library function has several names at one address (`free`, `cfree`
//! and `__libc_free`; `malloc_usable_size` and `__malloc_usable_size`).
//! perf names a sample by the symbol it finds first in the library's full
//! symbol table (its debug file's, when installed); the profiler names it by
//! `dladdr`, which sees only the dynamic symbols. The same function then
//! reads as two, one at 0% on each side. The harness maps every name to one
//! name per address, read from the libraries themselves.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Names by address in the libraries a program loads, each mapped to one of
/// them.
#[derive(Debug, Clone, Default)]
pub struct Aliases {
    canonical: BTreeMap<String, String>,
}

impl Aliases {
    /// The aliases of the shared libraries `bin` loads (`ldd`), read with
    /// `nm` from each library's dynamic and full symbol tables and from its
    /// debug file (`/usr/lib/debug/.build-id/`) where one is installed.
    /// Libraries or tools that cannot be read add nothing: names then stay
    /// as they are.
    pub fn of_program(bin: &Path) -> Aliases {
        let mut groups: Vec<(usize, u64, String)> = Vec::new();
        for (i, lib) in libraries(bin).iter().enumerate() {
            let mut files = vec![lib.clone()];
            files.extend(debug_file(lib));
            for f in &files {
                for dynamic in [true, false] {
                    groups.extend(nm(f, dynamic).into_iter().map(|(a, n)| (i, a, n)));
                }
            }
        }
        Aliases::from_symbols(groups)
    }

    /// The aliases of `(library, address, name)` triples: names at one
    /// address of one library are one function.
    pub fn from_symbols(symbols: impl IntoIterator<Item = (usize, u64, String)>) -> Aliases {
        let mut by_addr: BTreeMap<(usize, u64), Vec<String>> = BTreeMap::new();
        for (lib, addr, name) in symbols {
            let name = unversioned(&name).to_string();
            let names = by_addr.entry((lib, addr)).or_default();
            if !names.contains(&name) {
                names.push(name);
            }
        }
        let mut canonical = BTreeMap::new();
        for names in by_addr.values().filter(|n| n.len() > 1) {
            let Some(pick) = names.iter().min_by(|a, b| preference(a).cmp(&preference(b))) else {
                continue;
            };
            for n in names {
                canonical.entry(n.clone()).or_insert_with(|| pick.clone());
            }
        }
        Aliases { canonical }
    }

    /// The one name of `name`'s function: its symbol version and clone
    /// suffixes dropped ([`base_name`]), then its alias.
    pub fn canonical(&self, name: &str) -> String {
        let plain = unversioned(name);
        if let Some(c) = self.canonical.get(plain) {
            return base_name(c);
        }
        let base = base_name(plain);
        self.canonical.get(&base).map_or(base, |c| base_name(c))
    }
}

/// A name without the compiler's clone suffixes (`.constprop.0`,
/// `.isra.0`, `.part.0`, `.cold`), which perf and the profile may give a
/// function differently.
pub fn base_name(n: &str) -> String {
    n.split('.').next().unwrap_or(n).to_string()
}

/// The name chosen among aliases: the one a user calls (no leading
/// underscore), then the shortest, then the first in order.
fn preference(name: &str) -> (bool, usize, &str) {
    (name.starts_with('_'), name.len(), name)
}

/// `name` without its symbol version (`free@@GLIBC_2.2.5`).
fn unversioned(name: &str) -> &str {
    name.split('@').next().unwrap_or(name)
}

/// The libraries `ldd` lists for `bin`, by path.
fn libraries(bin: &Path) -> Vec<PathBuf> {
    let Ok(out) = Command::new("ldd").arg(bin).output() else {
        return Vec::new();
    };
    parse_ldd(&String::from_utf8_lossy(&out.stdout))
}

/// Paths in `ldd` output: `libc.so.6 => /lib/.../libc.so.6 (0x...)` and
/// `/lib64/ld-linux-x86-64.so.2 (0x...)`.
fn parse_ldd(text: &str) -> Vec<PathBuf> {
    text.lines()
        .filter_map(|l| {
            let l = l.split_once("=>").map_or(l, |(_, r)| r).trim();
            let path = l.split_whitespace().next()?;
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

/// The library's separate debug file, by its build ID.
fn debug_file(lib: &Path) -> Option<PathBuf> {
    let out = Command::new("readelf").arg("-n").arg(lib).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let id = text.lines().find_map(|l| l.trim().strip_prefix("Build ID:"))?.trim();
    if id.len() < 3 {
        return None;
    }
    let p = PathBuf::from(format!("/usr/lib/debug/.build-id/{}/{}.debug", &id[..2], &id[2..]));
    p.exists().then_some(p)
}

/// The defined function symbols of `file` (`nm`, `-D` for the dynamic
/// table), as (address, name).
fn nm(file: &Path, dynamic: bool) -> Vec<(u64, String)> {
    let mut cmd = Command::new("nm");
    cmd.arg("--defined-only");
    if dynamic {
        cmd.arg("-D");
    }
    let Ok(out) = cmd.arg(file).output() else {
        return Vec::new();
    };
    parse_nm(&String::from_utf8_lossy(&out.stdout))
}

/// `0000000000098ef0 T free@@GLIBC_2.2.5` lines of code symbols.
fn parse_nm(text: &str) -> Vec<(u64, String)> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let addr = u64::from_str_radix(it.next()?, 16).ok()?;
            let kind = it.next()?;
            let name = it.next()?;
            matches!(kind, "T" | "t" | "W" | "w" | "i").then(|| (addr, name.to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_at_one_address_are_one_function() {
        let nm_text = "0000000000098ef0 T __libc_free@@GLIBC_2.2.5\n\
                       0000000000098ef0 T cfree@GLIBC_2.2.5\n\
                       0000000000098ef0 T free@@GLIBC_2.2.5\n\
                       0000000000099d40 W malloc_usable_size@@GLIBC_2.2.5\n\
                       0000000000001000 D some_data\n";
        let mut syms: Vec<(usize, u64, String)> = parse_nm(nm_text).into_iter().map(|(a, n)| (0, a, n)).collect();
        // The debug file's name for malloc_usable_size.
        syms.push((0, 0x99d40, "__malloc_usable_size".into()));
        // The same address in another library is another function.
        syms.push((1, 0x98ef0, "other".into()));
        let a = Aliases::from_symbols(syms);
        for n in ["free", "cfree@GLIBC_2.2.5", "__libc_free", "free@@GLIBC_2.2.5"] {
            assert_eq!(a.canonical(n), "free", "{n}");
        }
        assert_eq!(a.canonical("__malloc_usable_size"), "malloc_usable_size");
        assert_eq!(a.canonical("other"), "other");
        assert_eq!(a.canonical("some_data"), "some_data");
        // Clone suffixes go as before.
        assert_eq!(a.canonical("unlink_chunk.constprop.0"), "unlink_chunk");
    }

    #[test]
    fn ldd_lines_give_library_paths() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                    \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f08)\n\
                    \t/lib64/ld-linux-x86-64.so.2 (0x00007f08)\n";
        assert_eq!(
            parse_ldd(text),
            vec![
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2")
            ]
        );
    }

    /// On this machine's own C library, whatever its version: `free` has
    /// aliases in every glibc the harness runs on.
    #[test]
    fn the_c_library_has_aliases_for_free() {
        let me = std::env::current_exe().unwrap();
        let a = Aliases::of_program(&me);
        if libraries(&me).is_empty() {
            eprintln!("ldd lists no libraries here: nothing to check");
            return;
        }
        assert_eq!(a.canonical("__libc_free"), "free", "{a:?}");
    }
}
