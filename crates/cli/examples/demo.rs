//! The main job on the bundled example: builds `examples/c/demo.c` (four
//! worker threads serving requests) with `gcc -O2 -finstrument-functions`,
//! runs it plain and then under `LD_PRELOAD=libfastinst.so` with the
//! default tool, the latency profiler, and prints the profile and where the
//! flame graph is.
//!
//! `cargo run --release -p fastinst-cli --example demo`

use std::path::Path;
use std::process::{Command, ExitCode};
use std::time::Instant;

fn fail(msg: &str) -> ExitCode {
    eprintln!("demo: {msg}");
    ExitCode::FAILURE
}

fn main() -> ExitCode {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let exe = std::env::current_exe().expect("current exe");
    // examples/ sits beside deps/, where cargo keeps libfastinst.so fresh.
    let lib = exe.parent().unwrap().parent().unwrap().join("deps/libfastinst.so");
    if !lib.exists() {
        return fail(&format!("libfastinst.so not found at {}", lib.display()));
    }
    let out = std::env::temp_dir().join(format!("fastinst-demo-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&out) {
        return fail(&format!("{}: {e}", out.display()));
    }
    let bin = out.join("demo");
    let src = here.join("examples/c/demo.c");
    println!(
        "building {} with gcc -O2 -pthread -finstrument-functions",
        src.display()
    );
    let st = Command::new("gcc")
        .args(["-O2", "-pthread", "-finstrument-functions"])
        .arg(&src)
        .arg("-o")
        .arg(&bin)
        .status();
    if !st.is_ok_and(|s| s.success()) {
        return fail("gcc failed (is gcc installed?)");
    }
    let t = Instant::now();
    let plain = match Command::new(&bin).current_dir(&out).output() {
        Ok(o) => o,
        Err(e) => return fail(&format!("{}: {e}", bin.display())),
    };
    let plain_t = t.elapsed();
    print!(
        "\nplain run (hooks compiled in, no runtime): {}",
        String::from_utf8_lossy(&plain.stdout)
    );
    println!("  {:.1} ms", plain_t.as_secs_f64() * 1e3);
    let t = Instant::now();
    let o = match Command::new(&bin)
        .current_dir(&out)
        .env("LD_PRELOAD", &lib)
        .env("FASTINST_OUT", &out)
        .output()
    {
        Ok(o) => o,
        Err(e) => return fail(&format!("{}: {e}", bin.display())),
    };
    let inst_t = t.elapsed();
    print!(
        "\nunder LD_PRELOAD={} (the latency profiler): {}",
        lib.display(),
        String::from_utf8_lossy(&o.stdout)
    );
    println!("  {:.1} ms", inst_t.as_secs_f64() * 1e3);
    if o.stdout != plain.stdout {
        return fail("the program's output changed under the profiler");
    }
    let report = |ext: &str| {
        std::fs::read_dir(&out)
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| {
                let n = p.file_name().unwrap().to_string_lossy().into_owned();
                n.starts_with("fastinst-profile.") && n.ends_with(ext)
            })
    };
    let (Some(txt), Some(svg)) = (report(".txt"), report(".svg")) else {
        eprint!("{}", String::from_utf8_lossy(&o.stderr));
        return fail(&format!("no profile was written to {}", out.display()));
    };
    println!("\n{}", std::fs::read_to_string(&txt).unwrap_or_default());
    println!("flame graph: {}", svg.display());
    println!("all reports: {} (.txt .json .pb.gz .folded .svg)", out.display());
    println!(
        "\nthe same with the CLI: cargo build --release && target/release/fastinst run -- {}",
        bin.display()
    );
    ExitCode::SUCCESS
}
