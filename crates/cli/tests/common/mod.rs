//! What the `fastinst` command's integration tests share.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// How long one command here may run (each takes seconds) before the test
/// takes it for hung ([`testkit::output_within`]).
pub const LIMIT: Duration = Duration::from_secs(180);

/// `fastinst args` run in `dir`, without the caller's `FASTINST_LIB` and
/// `FASTINST_OUT`.
pub fn fastinst(args: &[&str], dir: &Path) -> Output {
    fastinst_with(args, dir, &[])
}

/// [`fastinst`] with `env` set besides.
pub fn fastinst_with(args: &[&str], dir: &Path, env: &[(&str, &Path)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_fastinst"));
    c.args(args)
        .current_dir(dir)
        .env_remove("FASTINST_LIB")
        .env_remove("FASTINST_OUT");
    for (k, v) in env {
        c.env(k, v);
    }
    testkit::output_within(c, LIMIT, &format!("fastinst {}", args.join(" ")))
}

/// Output bytes as text.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A fresh directory for one test.
pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fastinst-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}
