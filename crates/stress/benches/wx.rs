//! W^X side by side: toggle costs with code written in place (pages
//! read+write+execute) and through a writable alias (pages read+execute
//! only, `wordpatch::WriteMode::Alias`), and the alternatives to an alias
//! that keep W^X: a `pwrite` to `/proc/self/mem`, and `mprotect` around
//! the store.
//!
//! The write mode is chosen once a process, so each measurement runs in a
//! forked child of this single-threaded bench; the modes alternate, round
//! after round, so a noisy spell of the shared machine hits both. Prints a
//! Markdown table: the median over rounds of each round's median (and of
//! its p90), in TSC ticks, and alias/in-place.
//!
//! `cargo bench -p stress --bench wx` (`-- --rounds N`, default 7).

use callpatch::Form;
use std::io::{Read, Write};
use stress::bench::{toggle_busy, toggle_idle, Stats};
use stress::{Fixture, Method};
use wordpatch::{Wait, WriteMode};

const REPS: usize = 2000;

/// A timed operation: its label and how to time it.
type Operation = (&'static str, Box<dyn Fn() -> Result<Stats, String>>);
/// Per operation, over the rounds: label, medians, p90s.
type Series = Vec<(String, Vec<f64>, Vec<f64>)>;

/// The operations timed in each mode: label and how.
fn operations() -> Vec<Operation> {
    vec![
        (
            "call-paper toggle, call rel32, in line",
            Box::new(|| toggle_idle(Method::CallPaper, Form::CallRel32, 0, REPS)),
        ),
        (
            "call-paper toggle, call rel32, straddling 2|3",
            Box::new(|| toggle_idle(Method::CallPaper, Form::CallRel32, 2, REPS)),
        ),
        (
            "call-flip toggle, call rel32, in line",
            Box::new(|| toggle_idle(Method::CallFlip, Form::CallRel32, 0, REPS)),
        ),
        (
            "call-paper toggle while a thread runs the site",
            Box::new(|| toggle_busy(Method::CallPaper, Form::CallRel32, 0, REPS)),
        ),
        (
            "wordpatch 5-byte patch, in line",
            Box::new(|| toggle_idle(Method::WordSync(Wait::SyncCore), Form::CallRel32, 0, REPS)),
        ),
        (
            "wordpatch 5-byte patch, straddling (SyncCore)",
            Box::new(|| toggle_idle(Method::WordSync(Wait::SyncCore), Form::CallRel32, 2, REPS / 10)),
        ),
    ]
}

/// The W^X alternatives to an alias, measured in one mode only: a 5-byte
/// `pwrite` to `/proc/self/mem` on a read+execute page (the kernel writes
/// it, copy-on-write, whatever the protection), and `mprotect` to
/// read+write, a 5-byte store, `mprotect` back to read+execute. Neither is
/// usable as a toggle: the first is not atomic (a byte copy in the kernel),
/// the second faults every thread that runs the page meanwhile.
fn alternatives() -> Vec<(&'static str, Stats)> {
    let fx = Fixture::new(Form::CallRel32, 0).expect("fixture");
    let page = fx.site as usize & !4095;
    let on = fx.on_bytes();
    let mem = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/proc/self/mem")
        .expect("/proc/self/mem");
    // SAFETY: the fixture's own page becomes read+execute; its bytes stay.
    unsafe { libc::mprotect(page as *mut _, 4096, libc::PROT_READ | libc::PROT_EXEC) };
    let pwrite = stress::bench::batched(1, REPS, |i| {
        let b: &[u8] = if i % 2 == 0 { &wordpatch::NOP5 } else { &on };
        std::os::unix::fs::FileExt::write_all_at(&mem, b, fx.site as u64).expect("pwrite");
    });
    let mprotect = stress::bench::batched(1, REPS, |i| {
        let b: &[u8] = if i % 2 == 0 { &wordpatch::NOP5 } else { &on };
        // SAFETY: the fixture's page, which no other thread runs here; it is
        // read+execute again after the store.
        unsafe {
            libc::mprotect(page as *mut _, 4096, libc::PROT_READ | libc::PROT_WRITE);
            std::ptr::copy_nonoverlapping(b.as_ptr(), fx.site, 5);
            libc::mprotect(page as *mut _, 4096, libc::PROT_READ | libc::PROT_EXEC);
        }
    });
    assert_eq!((fx.entry)(), 1, "the fixture runs active after the alternatives");
    vec![
        ("pwrite to /proc/self/mem, 5 bytes", pwrite),
        ("mprotect RW, store, mprotect RX", mprotect),
    ]
}

/// Runs `f` in a forked child with write mode `mode`; returns what it
/// printed (a line per result: label, median, p90).
fn in_child(mode: WriteMode, f: impl FnOnce() -> Vec<(String, Stats)>) -> Vec<(String, f64, f64)> {
    let mut fds = [0; 2];
    // SAFETY: a fresh pipe into the array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: this bench is single-threaded here; the child measures,
    // writes to the pipe and leaves with `_exit`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        wordpatch::set_write_mode(mode);
        let rows = f();
        // SAFETY: the pipe's write end, ours.
        let mut w = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fds[1]) };
        for (label, s) in rows {
            let _ = writeln!(w, "{label}\t{}\t{}", s.median, s.p90);
        }
        drop(w);
        // SAFETY: ends the child without running the parent's exit code.
        unsafe { libc::_exit(0) };
    }
    // SAFETY: the write end is the child's; the read end ours.
    unsafe { libc::close(fds[1]) };
    // SAFETY: as above.
    let mut r = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fds[0]) };
    let mut text = String::new();
    r.read_to_string(&mut text).expect("read");
    let mut status = 0;
    // SAFETY: our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child failed: {status:#x}"
    );
    text.lines()
        .filter_map(|l| {
            let mut f = l.split('\t');
            Some((f.next()?.to_string(), f.next()?.parse().ok()?, f.next()?.parse().ok()?))
        })
        .collect()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rounds = args
        .iter()
        .position(|a| a == "--rounds")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(7usize);
    let measure = || {
        operations()
            .into_iter()
            .map(|(label, op)| (label.to_string(), op().expect(label)))
            .collect::<Vec<_>>()
    };
    // results[mode][op] = (medians, p90s) over rounds.
    let mut results: Vec<Series> = vec![Vec::new(), Vec::new()];
    let mut alt: Series = Vec::new();
    let add = |into: &mut Series, rows: Vec<(String, f64, f64)>| {
        for (label, m, p) in rows {
            match into.iter_mut().find(|r| r.0 == label) {
                Some(r) => {
                    r.1.push(m);
                    r.2.push(p);
                }
                None => into.push((label, vec![m], vec![p])),
            }
        }
    };
    for round in 0..rounds {
        // Alternate which mode goes first.
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for k in order {
            let mode = [WriteMode::InPlace, WriteMode::Alias][k];
            let rows = in_child(mode, measure);
            add(&mut results[k], rows);
        }
        let rows = in_child(WriteMode::InPlace, || {
            alternatives().into_iter().map(|(l, s)| (l.to_string(), s)).collect()
        });
        add(&mut alt, rows);
        eprintln!("round {} of {rounds} done", round + 1);
    }
    println!("W^X toggle costs, TSC ticks, median over {rounds} rounds of each round's median (p90)\n");
    println!("| operation | in place (rwx) | alias (W^X) | alias / in place |");
    println!("|---|---|---|---|");
    for (i, (label, m0, p0)) in results[0].clone().into_iter().enumerate() {
        let (_, m1, p1) = results[1][i].clone();
        let (a, ap) = (median(&mut m0.clone()), median(&mut p0.clone()));
        let (b, bp) = (median(&mut m1.clone()), median(&mut p1.clone()));
        println!("| {label} | {a:.1} ({ap:.1}) | {b:.1} ({bp:.1}) | {:.2}x |", b / a);
    }
    let base = median(&mut results[0][0].1.clone());
    println!("\nAlternatives that keep W^X without an alias (not usable as toggles; ratio against the first row in place):\n");
    println!("| operation | ticks | / call-paper in place |");
    println!("|---|---|---|");
    for (label, m, p) in alt {
        let (a, ap) = (median(&mut m.clone()), median(&mut p.clone()));
        println!("| {label} | {a:.0} ({ap:.0}) | {:.0}x |", a / base);
    }
}
