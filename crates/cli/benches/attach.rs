//! Attach and detach on a process with 20,000 probe sites, in one run:
//! generates a C program of 20,000 functions (each a sled, gcc -O2
//! `-fpatchable-function-entry=5`) that four threads call in turn, and
//! attaches `fastinst attach --duration 0.3` to each of several runs of it
//! three times: the first attach loads the library, the later ones start
//! it again. Prints, median and p90 over the attaches of each kind: the
//! attach until the runtime has started with its probes armed, how long
//! every thread stood stopped for it, the detach (the reports written,
//! every probe off, every site checked against the file) and how long
//! every thread stood stopped for that; and the process's resident memory
//! after each detach, the cost of the idle profilers left behind; for
//! attaches with W^X (the default) and with `--no-wx`, alternated process
//! by process. Beside them,
//! uprobes on the same functions of the same program (root only, through
//! tracefs): defining 2,000 of those probes, then enabling and disabling them
//! while the program runs, which is when the kernel writes or removes
//! their breakpoints in its pages.
//! `cargo bench -p fastinst-cli --bench attach`; results in
//! `crates/benches/results/attach.md`.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Probe sites (functions) in the generated program.
const SITES: usize = 20_000;
/// Processes, each attached [`ATTACHES`] times: half with W^X (the
/// attach's default), half with `--no-wx`, alternated.
const RUNS: usize = 6;
/// Attaches to each process: the first, then again after each detach.
const ATTACHES: usize = 3;
/// uprobes defined and enabled: the first of the functions. The kernel
/// removes about 60 definitions a second here (all 20,000 took minutes),
/// so they are fewer, and their costs are given per probe too.
const UPROBES: usize = 2_000;

/// The number after `key` in `text` (`key` ends where the number starts).
fn after(text: &str, key: &str) -> Option<f64> {
    let rest = &text[text.find(key)? + key.len()..];
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

fn stats(mut v: Vec<f64>) -> String {
    v.sort_by(f64::total_cmp);
    let q = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
    format!("{:.1} | {:.1}", q(0.5), q(0.9))
}

const TRACEFS: &str = "/sys/kernel/tracing";
const GROUP: &str = "fastinst_bench";

/// File offsets of `f0..` in `bin`, from `nm` and its executable segment.
fn offsets(bin: &Path) -> Vec<u64> {
    let text = |cmd: &mut Command| String::from_utf8(cmd.output().unwrap().stdout).unwrap();
    let segs = text(Command::new("readelf").arg("-lW").arg(bin));
    let load = segs
        .lines()
        .map(str::split_whitespace)
        .map(|w| w.collect::<Vec<_>>())
        .find(|w| w.first() == Some(&"LOAD") && w.contains(&"E"))
        .expect("an executable LOAD segment");
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
    let (seg_off, seg_vaddr) = (hex(load[1]), hex(load[2]));
    let mut by_index = vec![0u64; SITES];
    for l in text(Command::new("nm").arg(bin)).lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        if let [addr, "T" | "t", name] = w[..] {
            if let Some(i) = name.strip_prefix('f').and_then(|n| n.parse::<usize>().ok()) {
                if i < SITES {
                    by_index[i] = hex(addr) - seg_vaddr + seg_off;
                }
            }
        }
    }
    assert!(by_index.iter().all(|&o| o != 0), "a function without a symbol");
    by_index
}

fn tracefs_write(file: &str, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(Path::new(TRACEFS).join(file))?;
    f.write_all(text.as_bytes())
}

/// uprobes on the first [`UPROBES`] `f` of `bin`: (define, enable,
/// disable, remove) in ms, with a run of the program between enabling and
/// disabling; `None` where tracefs cannot be written.
fn uprobes(bin: &Path) -> Option<[f64; 4]> {
    if tracefs_write("uprobe_events", "").is_err() {
        return None;
    }
    let offs = &offsets(bin)[..UPROBES];
    let measured = measure_uprobes(bin, offs);
    // Removed whatever happened, so that no probe of ours stays defined.
    let t = std::time::Instant::now();
    for i in 0..offs.len() {
        let _ = tracefs_write("uprobe_events", &format!("-:{GROUP}/f{i}\n"));
    }
    let remove = t.elapsed().as_secs_f64() * 1e3;
    measured.map(|(d, e, x)| [d, e, x, remove])
}

fn measure_uprobes(bin: &Path, offs: &[u64]) -> Option<(f64, f64, f64)> {
    let t = std::time::Instant::now();
    for (i, off) in offs.iter().enumerate() {
        tracefs_write("uprobe_events", &format!("p:{GROUP}/f{i} {}:{off:#x}\n", bin.display())).ok()?;
    }
    let define = t.elapsed().as_secs_f64() * 1e3;
    let child = Command::new(bin)
        .arg("2")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let enable_file = format!("events/{GROUP}/enable");
    let t = std::time::Instant::now();
    let on = tracefs_write(&enable_file, "1");
    let enable = t.elapsed().as_secs_f64() * 1e3;
    std::thread::sleep(Duration::from_millis(500));
    let t = std::time::Instant::now();
    let off = tracefs_write(&enable_file, "0");
    let disable = t.elapsed().as_secs_f64() * 1e3;
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "the program under uprobes failed");
    (on.is_ok() && off.is_ok()).then_some((define, enable, disable))
}

/// Seconds of work in each overhead run, and idle before and after it.
const WORK: [&str; 3] = ["2", "0.6", "2"];
/// Overhead runs of each kind.
const REPS: usize = 3;

/// The passes over the table the program's run made (its stderr).
fn passes(stderr: &[u8]) -> f64 {
    let text = String::from_utf8_lossy(stderr);
    text.lines()
        .find_map(|l| l.strip_prefix("passes "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no passes line in:\n{text}"))
}

/// The profiler's overhead on the program's work, plain against profiled
/// under `LD_PRELOAD` (`fastinst run`) and attached, in alternation: the
/// program works `WORK[0]` s between idle stretches, so that the attach
/// (during the first) and the detach (during the last) fall outside the
/// work, and both profiled runs profile all of it. Returns the passes of
/// each kind.
fn overhead(bin: &Path, out: &Path) -> [Vec<f64>; 3] {
    let mut r: [Vec<f64>; 3] = Default::default();
    for rep in 0..REPS {
        let o = Command::new(bin).args(WORK).stdout(Stdio::null()).output().unwrap();
        r[0].push(passes(&o.stderr));
        let o = Command::new(env!("CARGO_BIN_EXE_fastinst"))
            .args(["run", "--out"])
            .arg(out.join(format!("preload{rep}")))
            .arg("--")
            .arg(bin)
            .args(WORK)
            .stdout(Stdio::null())
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        r[1].push(passes(&o.stderr));
        let child = Command::new(bin)
            .args(WORK)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let a = Command::new(env!("CARGO_BIN_EXE_fastinst"))
            .args(["attach", "--duration", "2.6", "--out"])
            .arg(out.join(format!("attached{rep}")))
            .arg(child.id().to_string())
            .output()
            .unwrap();
        assert!(a.status.success(), "{}", String::from_utf8_lossy(&a.stderr));
        let attached = String::from_utf8_lossy(&a.stderr);
        let took = attached
            .lines()
            .find(|l| l.contains("attached to"))
            .and_then(|l| after(l, " in "))
            .unwrap();
        assert!(took < 500.0, "the attach ({took} ms) ran into the work");
        let o = child.wait_with_output().unwrap();
        r[2].push(passes(&o.stderr));
    }
    r
}

fn main() {
    let out = std::env::temp_dir().join(format!("fastinst-attach-bench-{}", std::process::id()));
    std::fs::create_dir_all(&out).unwrap();
    let src = out.join("sites.c");
    std::fs::write(&src, testkit::programs::many_functions(SITES)).unwrap();
    let bin = out.join("sites");
    let st = Command::new("gcc")
        .args(["-O2", "-pthread", "-fpatchable-function-entry=5"])
        .arg(&src)
        .arg("-o")
        .arg(&bin)
        .status();
    assert!(st.is_ok_and(|s| s.success()), "gcc failed (is gcc installed?)");
    // Per kind (0: first attach, 1: again): attach, its stop, detach until
    // released, its stop, detach until the reports are written.
    let mut modes: [[[Vec<f64>; 5]; 2]; 2] = Default::default();
    let mut rss_growth = vec![];
    let mut sites = 0.0;
    for run in 0..RUNS {
        // 0: W^X (default), 1: --no-wx.
        let mode = run % 2;
        let t = &mut modes[mode];
        let child = Command::new(&bin)
            .arg("8")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Its threads are running the sites when the attach comes.
        std::thread::sleep(Duration::from_millis(300));
        let mut rss = vec![];
        for n in 0..ATTACHES {
            let reports = out.join(format!("run{run}-{n}"));
            let o = Command::new(env!("CARGO_BIN_EXE_fastinst"))
                .args(["attach", "--duration", "0.3", "--out"])
                .arg(&reports)
                .args(if mode == 1 { &["--no-wx"][..] } else { &[] })
                .arg(child.id().to_string())
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(o.status.success(), "attach {n} failed:\n{err}");
            let attached = err.lines().find(|l| l.contains("attached to")).expect("attach line");
            let detached = err.lines().find(|l| l.contains("detached from")).expect("detach line");
            let k = &mut t[usize::from(n > 0)];
            k[0].push(after(attached, " in ").unwrap());
            k[1].push(after(attached, "stopped for ").unwrap());
            sites = after(attached, "ms; ").unwrap();
            k[2].push(after(detached, "released after ").unwrap());
            k[3].push(after(detached, "threads stopped ").unwrap());
            k[4].push(after(detached, " in ").unwrap());
            let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
            // kB.
            rss.push(
                status
                    .lines()
                    .find(|l| l.starts_with("VmRSS:"))
                    .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok()),
            );
        }
        let o2 = child.wait_with_output().unwrap();
        assert!(
            o2.status.success() && String::from_utf8_lossy(&o2.stdout) == "done\n",
            "the program's run changed"
        );
        let rss: Vec<f64> = rss.into_iter().flatten().collect();
        rss_growth.extend(rss.windows(2).map(|w| (w[1] - w[0]) / 1024.0));
    }
    println!(
        "# Attach and detach, {sites} sled sites, 5 threads (4 calling them), {RUNS} processes attached {ATTACHES} times each\n"
    );
    for (mode, t) in ["W^X (the default)", "in place (`--no-wx`)"].iter().zip(&modes) {
        println!("\n{mode}, {} processes:\n", RUNS / 2);
        println!("| step | first attach: median ms | p90 ms | again: median ms | p90 ms |");
        println!("|---|---|---|---|---|");
        for (i, step) in [
            "attach, until the runtime runs with its probes armed",
            "of it, every thread stopped",
            "detach: probes off, code put back and checked, the process released",
            "of it, every thread stopped",
            "detach, until the reports are written (the process running meanwhile)",
        ]
        .iter()
        .enumerate()
        {
            println!("| {step} | {} | {} |", stats(t[0][i].clone()), stats(t[1][i].clone()));
        }
    }
    println!(
        "\nresident memory after each detach, growth from the last: {} MB (median | p90): the idle profiler each attach after the first leaves",
        stats(rss_growth)
    );
    let [plain, preload, attached] = overhead(&bin, &out);
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let base = median(plain.clone());
    println!(
        "\nprofiler overhead on {} s of the program's work, {REPS} runs each, alternated (passes over the table; median):\n",
        WORK[0]
    );
    println!("| run | passes (each run) | median | vs plain |");
    println!("|---|---|---|---|");
    for (name, v) in [
        ("plain", plain),
        ("profiled under LD_PRELOAD (`fastinst run`)", preload),
        ("profiled attached (`fastinst attach`)", attached),
    ] {
        let m = median(v.clone());
        let each: Vec<String> = v.iter().map(|p| format!("{p:.0}")).collect();
        println!("| {name} | {} | {m:.0} | {:.3}x |", each.join(", "), m / base);
    }
    match uprobes(&bin) {
        Some(ms) => {
            println!("\nuprobes on {UPROBES} of the same functions, one run (ms in all, and us a probe):\n");
            println!("| step | ms | us a probe |");
            println!("|---|---|---|");
            for (step, t) in ["define", "enable in the running process", "disable", "remove"]
                .iter()
                .zip(ms)
            {
                println!("| {step} | {t:.1} | {:.1} |", t * 1e3 / UPROBES as f64);
            }
        }
        None => println!("\nuprobes: not measured (tracefs is not writable here: root is needed)"),
    }
    let _ = std::fs::remove_dir_all(&out);
}
