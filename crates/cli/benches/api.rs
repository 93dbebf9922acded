//! The API benchmark harness: builds `benches/c/bench.c` (driver, not
//! instrumented) and `benches/c/probes.c` (instrumented) with gcc and with
//! clang, links them against `libfastinst.so`, runs them, and prints their
//! tables: invocation cost beside a plain call and a static guard measured
//! in the same run, and activation/deactivation per strategy, straddlers
//! separately. Ticks are TSC ticks, median and p90 over batches of 1000.

mod common;

use common::lib_dir;
use std::path::Path;
use std::process::Command;

fn main() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let c = here.join("benches/c");
    let inc = here.join("../preload/include");
    let libdir = lib_dir();
    let out = std::env::temp_dir().join(format!("fastinst-bench-{}", std::process::id()));
    std::fs::create_dir_all(&out).unwrap();
    for (cc, flags) in [("gcc", "-O2"), ("clang", "-O2")] {
        let bin = out.join(format!("bench-{cc}"));
        let obj = out.join(format!("probes-{cc}.o"));
        let inst = Command::new(cc)
            .args([flags, "-fPIE", "-c", "-finstrument-functions"])
            .arg(c.join("probes.c"))
            .arg("-o")
            .arg(&obj)
            .status();
        if !inst.is_ok_and(|s| s.success()) {
            eprintln!("skipping {cc}: cannot build the instrumented code");
            continue;
        }
        let st = Command::new(cc)
            .arg(flags)
            .arg(format!("-I{}", inc.display()))
            .arg(c.join("bench.c"))
            .arg(&obj)
            .arg(format!("-L{}", libdir.display()))
            .arg("-lfastinst")
            .arg(format!("-Wl,-rpath,{}", libdir.display()))
            .arg("-o")
            .arg(&bin)
            .status();
        match st {
            Ok(s) if s.success() => {}
            _ => {
                eprintln!("skipping {cc}: cannot build the benchmark");
                continue;
            }
        }
        println!("# fastinst API benchmark, {cc} {flags} -finstrument-functions\n");
        // The benchmark drives its probes through the API; the default tool
        // (the profiler) would add its own handlers and write reports here.
        let o = Command::new(&bin)
            .env("FASTINST_TOOL", "none")
            .env("LD_LIBRARY_PATH", testkit::library_path_first(&libdir))
            .output()
            .unwrap();
        print!("{}", String::from_utf8_lossy(&o.stdout));
        if !o.status.success() {
            eprintln!("{}", String::from_utf8_lossy(&o.stderr));
        }
        println!();
    }
}
