//! The main job on the bundled example: builds `examples/c/demo.c` with
//! `gcc -O2 -finstrument-functions`, runs it plain and under
//! `LD_PRELOAD=libfastinst.so` with the `count` tool, and prints the report.
//!
//! `cargo run --release -p fastinst --example demo`

use std::path::Path;
use std::process::Command;
use std::time::Instant;

fn main() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let exe = std::env::current_exe().expect("current exe");
    // examples/ sits beside deps/, where cargo keeps libfastinst.so fresh.
    let lib = exe.parent().unwrap().parent().unwrap().join("deps/libfastinst.so");
    if !lib.exists() {
        eprintln!("libfastinst.so not found at {}", lib.display());
        std::process::exit(1);
    }
    let out = std::env::temp_dir().join(format!("fastinst-demo-{}", std::process::id()));
    std::fs::create_dir_all(&out).unwrap();
    let bin = out.join("demo");
    let src = here.join("examples/c/demo.c");
    println!("building {} with gcc -O2 -finstrument-functions", src.display());
    let st = Command::new("gcc")
        .args(["-O2", "-pthread", "-finstrument-functions"])
        .arg(&src)
        .arg("-o")
        .arg(&bin)
        .status();
    if !st.is_ok_and(|s| s.success()) {
        eprintln!("gcc failed (is gcc installed?)");
        std::process::exit(1);
    }
    let t = Instant::now();
    let plain = Command::new(&bin).current_dir(&out).output().unwrap();
    let plain_t = t.elapsed();
    print!(
        "\nplain run (every probe on, no runtime): {}",
        String::from_utf8_lossy(&plain.stdout)
    );
    println!("  {:.1} ms", plain_t.as_secs_f64() * 1e3);
    let t = Instant::now();
    let o = Command::new(&bin)
        .current_dir(&out)
        .env("LD_PRELOAD", &lib)
        .env("FASTINST_TOOL", "count")
        .env("FASTINST_OUT", &out)
        .env("FASTINST_LOG", "info")
        .output()
        .unwrap();
    let inst_t = t.elapsed();
    print!(
        "\nunder LD_PRELOAD={} FASTINST_TOOL=count: {}",
        lib.display(),
        String::from_utf8_lossy(&o.stdout)
    );
    println!(
        "  {:.1} ms (entry probes counting, exit probes switched off)",
        inst_t.as_secs_f64() * 1e3
    );
    for l in String::from_utf8_lossy(&o.stderr).lines() {
        println!("  {l}");
    }
    let report = std::fs::read_dir(&out)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("fastinst-count."));
    match report {
        Some(p) => {
            println!("\ncall counts ({}):\n", p.display());
            print!("{}", std::fs::read_to_string(&p).unwrap());
        }
        None => {
            eprintln!("no report was written");
            std::process::exit(1);
        }
    }
}
