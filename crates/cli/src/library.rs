//! Finding the `libfastinst.so` that `fastinst run` preloads.
//!
//! In order: `--lib`, `$FASTINST_LIB`, then beside the `fastinst` binary:
//! `libfastinst.so`, `deps/libfastinst.so` (cargo's target directory, where
//! `cargo test` refreshes the library but not its uplifted copy) and
//! `../lib/libfastinst.so` (an installed layout). Beside the binary, the
//! most recently built candidate wins, so a stale uplifted copy is never
//! preferred to a fresh one.

use crate::error::{CliError, Result};
use std::path::{Path, PathBuf};

/// The library to preload.
pub fn find(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = explicit {
        return checked(p);
    }
    if let Some(p) = std::env::var_os("FASTINST_LIB").filter(|v| !v.is_empty()) {
        return checked(Path::new(&p));
    }
    let exe = std::env::current_exe().map_err(CliError::io("/proc/self/exe"))?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    let candidates = [
        dir.join("libfastinst.so"),
        dir.join("deps/libfastinst.so"),
        dir.join("../lib/libfastinst.so"),
    ];
    let newest = candidates
        .iter()
        .filter_map(|p| Some((std::fs::metadata(p).ok()?.modified().ok()?, p)))
        .max_by_key(|(t, _)| *t);
    match newest {
        Some((_, p)) => checked(p),
        None => Err(CliError::NoLibrary {
            looked: candidates
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

/// `p`, made absolute (the program's children may run in another
/// directory and inherit `LD_PRELOAD`), if it is a file.
fn checked(p: &Path) -> Result<PathBuf> {
    let abs = p.canonicalize().map_err(CliError::io(p))?;
    if !abs.is_file() {
        return Err(CliError::BadFile {
            path: p.into(),
            problem: "not a file".into(),
        });
    }
    Ok(abs)
}
