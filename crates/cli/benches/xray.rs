//! XRay's toggle against fastinst's, in one run: builds `benches/c/xray.c`
//! with `clang -O2 -fxray-instrument` (XRay's runtime linked) and
//! `-lfastinst`, runs it, and prints its tables: switching a function's
//! probes on and off with `__xray_patch_function`/`__xray_unpatch_function`
//! and with `fastinst_activate`/`fastinst_deactivate`, and a call with its
//! probes on, each in TSC ticks, median and p90.
//! `cargo bench -p fastinst-cli --bench xray`; results in
//! `crates/benches/results/xray.md`.

mod common;

use common::lib_dir;
use std::path::Path;
use std::process::Command;

fn main() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let inc = here.join("../preload/include");
    let libdir = lib_dir();
    let out = std::env::temp_dir().join(format!("fastinst-xray-bench-{}", std::process::id()));
    std::fs::create_dir_all(&out).unwrap();
    let bin = out.join("xray");
    let st = Command::new("clang")
        .args(["-O2", "-fxray-instrument", "-fxray-instruction-threshold=1"])
        .arg(format!("-I{}", inc.display()))
        .arg(here.join("benches/c/xray.c"))
        .arg(format!("-L{}", libdir.display()))
        .arg("-lfastinst")
        .arg(format!("-Wl,-rpath,{}", libdir.display()))
        .arg("-o")
        .arg(&bin)
        .status();
    if !st.is_ok_and(|s| s.success()) {
        eprintln!("cannot build the XRay benchmark (clang with XRay's runtime is needed)");
        std::process::exit(1);
    }
    println!("# XRay against fastinst, clang -O2 -fxray-instrument\n");
    // The benchmark drives the probes itself; the default tool would too.
    let o = Command::new(&bin)
        .env("FASTINST_TOOL", "none")
        .env("LD_LIBRARY_PATH", testkit::library_path_first(&libdir))
        .output()
        .unwrap();
    print!("{}", String::from_utf8_lossy(&o.stdout));
    if !o.status.success() {
        eprintln!("{}", String::from_utf8_lossy(&o.stderr));
        std::process::exit(1);
    }
    let _ = std::fs::remove_dir_all(&out);
}
