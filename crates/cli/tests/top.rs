//! `fastinst top` through a pseudo-terminal, as a user sees it: the
//! `rust_service` example runs under it; the view is redrawn (cleared and
//! homed) several times with the table's header and the service's
//! functions, the program's own output goes to the log file, and at the
//! end the program's status and where its output and reports are.

mod common;
use common::*;
use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{Command, Stdio};

#[test]
fn the_live_view_refreshes_in_a_terminal_and_ends_with_the_programs_status() {
    let dir = scratch("top");
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent().unwrap().parent().unwrap().join("examples/rust_service");
    assert!(bin.exists(), "{} not built (cargo test builds examples)", bin.display());
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty writes two descriptors into the out-parameters; the
    // name, termios and window size are not asked for.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: fresh descriptors, each owned once from here.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    let mut child = Command::new(env!("CARGO_BIN_EXE_fastinst"))
        .args(["top", "--interval", "0.2", "--rows", "5", "--out"])
        .arg(&dir)
        .arg("--")
        .arg(&bin)
        .args(["3000000", "4"])
        .current_dir(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::from(slave.try_clone().unwrap()))
        .stderr(Stdio::from(slave))
        .spawn()
        .unwrap();
    // Read until every writer is gone (EIO on a pty).
    let reader = std::thread::spawn(move || {
        let mut f = std::fs::File::from(master);
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match f.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
        String::from_utf8_lossy(&seen).into_owned()
    });
    let status = child.wait().unwrap();
    let screen = reader.join().unwrap();
    assert!(status.success(), "{screen}");
    let frames = screen.matches("\x1b[H\x1b[2J").count();
    assert!(frames >= 2, "{frames} redraws:\n{screen}");
    assert!(screen.contains("p50 us") && screen.contains("p99 us"), "{screen}");
    for f in ["rust_service::handle", "rust_service::render"] {
        assert!(screen.contains(f), "{f} not shown:\n{screen}");
    }
    assert!(screen.contains("exited with status 0"), "{screen}");
    // The program's output went to the log, not over the table.
    assert!(!screen.contains("served 3000000 requests"), "{screen}");
    let log = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().contains("fastinst-top."))
        .expect("the program's log");
    assert!(
        std::fs::read_to_string(&log)
            .unwrap()
            .contains("served 3000000 requests"),
        "{}",
        log.display()
    );
    // The reports at exit, as under `fastinst run`.
    assert!(
        std::fs::read_dir(&dir).unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with("fastinst-profile.")),
        "no reports in {}",
        dir.display()
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `fastinst ctl` against a program run with `--control`: its status, a
/// snapshot of its profile as JSON, and its reports on demand.
#[test]
fn ctl_asks_a_running_program_for_status_snapshot_and_reports() {
    let dir = scratch("ctl");
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent().unwrap().parent().unwrap().join("examples/rust_service");
    let sock = dir.join("control");
    let mut run = Command::new(env!("CARGO_BIN_EXE_fastinst"))
        .args(["run", "--control"])
        .arg(&sock)
        .arg("--out")
        .arg(&dir)
        .arg("--")
        .arg(&bin)
        .args(["8000000", "4"])
        .current_dir(&dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let began = std::time::Instant::now();
    while !sock.exists() && began.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    let s = sock.to_str().unwrap();
    let o = fastinst(&["ctl", "--socket", s, "status"], &dir);
    assert_eq!(text(&o.stdout).trim(), "ok running Profile", "{}", text(&o.stderr));
    let o = fastinst(&["ctl", "--socket", s, "snapshot"], &dir);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let json = text(&o.stdout);
    let r: serde_json::Value = serde_json::from_str(json.trim().strip_prefix("ok ").unwrap()).unwrap();
    assert!(
        r["functions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["name"] == "rust_service::handle"),
        "{json}"
    );
    // Sampling settings changed while it runs: all or nothing, and the
    // report says what they became and that they changed.
    let o = fastinst(&["ctl", "--socket", s, "set", "samples=40", "windows=0"], &dir);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stdout));
    assert!(text(&o.stdout).contains("out of bounds"), "{}", text(&o.stdout));
    let o = fastinst(
        &["ctl", "--socket", s, "set", "samples=40", "epoch-ms=20", "share=30"],
        &dir,
    );
    assert_eq!(
        text(&o.stdout).trim(),
        "ok samples=40 windows=2 density=20 share=30 epoch-ms=20",
        "{}",
        text(&o.stderr)
    );
    let o = fastinst(&["ctl", "--socket", s, "snapshot"], &dir);
    let r: serde_json::Value = serde_json::from_str(text(&o.stdout).trim().strip_prefix("ok ").unwrap()).unwrap();
    assert_eq!(
        (
            &r["settings"]["samples_per_window"],
            &r["settings"]["epoch_ms"],
            &r["settings"]["share"],
            &r["settings"]["changed"]
        ),
        (
            &serde_json::json!(40),
            &serde_json::json!(20.0),
            &serde_json::json!(30),
            &serde_json::json!(1)
        ),
        "{}",
        r["settings"]
    );
    let o = fastinst(&["ctl", "--socket", s, "report"], &dir);
    let answer = text(&o.stdout);
    assert!(o.status.success() && answer.contains("fastinst-profile."), "{answer}");
    // Refused: detach, here and anywhere but through `fastinst attach`.
    let o = fastinst(&["ctl", "--socket", s, "detach"], &dir);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    let status = run.wait().unwrap();
    assert!(status.success());
    let mut out = String::new();
    run.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    assert!(out.starts_with("served 8000000 requests"), "{out}");
    assert!(!sock.exists(), "the socket is removed at exit");
    std::fs::remove_dir_all(&dir).unwrap();
}
