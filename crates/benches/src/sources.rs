//! The real programs' sources, obtained from crates.io with cargo.
//!
//! Five crates bundle the C sources of real programs: bzip2 1.0.8
//! (`bzip2-sys`, with the `bzip2` command), QuickJS 2021-03-27
//! (`libquickjs-sys`, with the `qjs` interpreter), SQLite
//! (`libsqlite3-sys` with `bundled`, the amalgamation), Lua 5.4.9
//! (`lua-src`) and zstd 1.5.7 (`zstd-sys`). A throw-away
//! manifest that depends on exact versions is fetched with `cargo fetch`
//! (from the local cache when it already holds them) and `cargo metadata`
//! says where cargo unpacked each one. Nothing is vendored into this
//! repository.

use crate::error::{EvalError, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Exact versions, so every machine measures the same code.
pub const CRATES: [(&str, &str); 5] = [
    ("bzip2-sys", "=0.1.13"),
    ("libquickjs-sys", "=0.10.0"),
    ("libsqlite3-sys", "=0.39.1"),
    ("lua-src", "=551.1.0"),
    ("zstd-sys", "=2.1.3"),
];

const MANIFEST: &str = r#"[package]
name = "fastinst-eval-sources"
version = "0.0.0"
edition = "2021"
publish = false

[lib]
path = "lib.rs"

[dependencies]
bzip2-sys = "=0.1.13"
libquickjs-sys = "=0.10.0"
libsqlite3-sys = { version = "=0.39.1", features = ["bundled"] }
lua-src = "=551.1.0"
zstd-sys = "=2.1.3"

[workspace]
"#;

/// Where each crate's sources are, by crate name.
pub fn fetch(work: &Path) -> Result<HashMap<String, PathBuf>> {
    let dir = work.join("sources");
    std::fs::create_dir_all(&dir).map_err(EvalError::io(&dir))?;
    let manifest = dir.join("Cargo.toml");
    std::fs::write(&manifest, MANIFEST).map_err(EvalError::io(&manifest))?;
    std::fs::write(dir.join("lib.rs"), "").map_err(EvalError::io(dir.join("lib.rs")))?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let fetched = Command::new(&cargo)
        .args(["fetch", "--manifest-path"])
        .arg(&manifest)
        .status()
        .map_err(|e| EvalError::Tool(format!("cargo fetch: {e}")))?;
    if !fetched.success() {
        return Err(EvalError::Tool(format!(
            "cargo fetch of {} failed (no registry access and not cached?)",
            CRATES.map(|c| c.0).join(", ")
        )));
    }
    let out = Command::new(&cargo)
        .args(["metadata", "--format-version", "1", "--offline", "--manifest-path"])
        .arg(&manifest)
        .output()
        .map_err(|e| EvalError::Tool(format!("cargo metadata: {e}")))?;
    if !out.status.success() {
        return Err(EvalError::Tool(format!(
            "cargo metadata: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    let meta: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| EvalError::Tool(format!("cargo metadata output: {e}")))?;
    let mut found = HashMap::new();
    for p in meta["packages"].as_array().into_iter().flatten() {
        let (Some(name), Some(m)) = (p["name"].as_str(), p["manifest_path"].as_str()) else {
            continue;
        };
        if CRATES.iter().any(|c| c.0 == name) {
            found.insert(
                name.to_string(),
                Path::new(m).parent().unwrap_or(Path::new("/")).to_path_buf(),
            );
        }
    }
    for (name, _) in CRATES {
        if !found.contains_key(name) {
            return Err(EvalError::Tool(format!("cargo metadata did not list {name}")));
        }
    }
    Ok(found)
}
